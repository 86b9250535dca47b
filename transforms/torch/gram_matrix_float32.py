"""Gram matrix functions of another project module, made to compute in float32.

pytorch/examples' fast_neural_style (and its many descendants) keeps the style loss's Gram matrix in
utils.py, which the training script calls under autocast:

    def gram_matrix(y):
        (b, ch, h, w) = y.size()
        features = y.view(b, ch, w * h)
        features_t = features.transpose(1, 2)
        gram = features.bmm(features_t) / (ch * h * w)
        return gram

In float16 the product sums h*w terms past 65504 before the division: the style loss is inf and
GradScaler skips every step (AMP238). The fix the warning asks for, written as the change set's
companion edit of that module:

    def gram_matrix(y):
        with torch.autocast(device_type=y.device.type, enabled=False):
            y = y.float()
            (b, ch, h, w) = y.size()
            ...
            return gram

With autocast off inside the function, and the feature map a float32 copy, every operation in it
runs in float32, exactly as in the fp32 script; the caller's autocast region resumes on return
(mse_loss, which the style loss feeds, runs in float32 under autocast anyway). Not on apex: its
`amp.disable_casts()` would do the same under O1, but raises in any script that calls the function
before `amp.initialize` (the handle it switches off does not exist yet), so apex keeps AMP330.

Only a module-level function whose one required parameter is the feature map (others, if any,
have defaults) is rewritten: a Gram matrix of two tensors, a method, a generator or `*args` is
refused with that reason, as before. gram_matrix_functions.py does not count a Gram matrix written
inside such a block, so a second run changes nothing.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.positions import Positions
from ampify.transforms.torch.companion_modules import ModuleRewrite, plan_companion_rewrites
from ampify.transforms.torch.gram_matrix_functions import gram_matrix_line
from ampify.transforms.torch.torch_import import add_import_torch, module_level_aliases


@dataclass
class Float32Grams:
    """The module with its Gram matrix functions rewritten, and (name, line) of each."""

    module: cst.Module
    rewritten: List[Tuple[str, int]] = field(default_factory=list)

    def describe(self, where: str = "") -> str:
        shown = ", ".join(f"{name}() (line {line})" for name, line in self.rewritten)
        place = f"{where}: " if where else ""
        return (f"{place}{shown} now compute{'s' if len(self.rewritten) == 1 else ''} the Gram matrix in float32 "
                "(autocast off inside, on a float32 copy of the feature map), so that the float16 style loss stays "
                "finite")


def float32_gram_functions(module: cst.Module,
                           functions: Sequence[str]) -> Tuple[Optional[Float32Grams], Optional[str]]:
    """Rewrite each module-level function named in `functions` (each computes a Gram matrix) to
    compute in float32. Returns (the result, None); (None, None) when there is nothing to rewrite;
    (None, the reason) when one of them cannot be rewritten safely."""
    wanted: Set[str] = set(functions)
    found_all = {name: _definitions(module, name) for name in wanted}
    for name in sorted(wanted):
        if len(found_all[name]) > 1:
            return None, f"{name}() is defined {len(found_all[name])} times, so ampify cannot tell which one runs"
    definitions = {name: found[0] for name, found in found_all.items() if found}
    for name in sorted(wanted):
        if name not in definitions:
            return None, f"{name}() is not a function defined at the module's top level, nor a method of a class there"
        if not _computes_in_reduced_precision(definitions[name], module):
            del definitions[name]  # rewritten already (by another training file's change set of this run)
            continue
        reason = _not_rewritable(definitions[name], _is_method(name))
        if reason is not None:
            return None, f"{name}() {reason}"
    if not definitions:
        return None, None
    positions = Positions(module)
    torch_names = module_level_aliases(module, "torch")
    torch_name = "torch" if "torch" in torch_names else (sorted(torch_names)[0] if torch_names else None)
    rewritten: List[Tuple[str, int]] = []
    replacements = {}
    for name, function in definitions.items():
        parameter = _feature_map_parameter(function, _is_method(name))
        context = f"{torch_name or 'torch'}.autocast(device_type={parameter}.device.type, enabled=False)"
        replacements[id(function)] = _wrapped(function, context, parameter, module)
        rewritten.append((name, positions[function].start.line))
    new = module.visit(_Replace(replacements))
    if torch_name is None:
        new = add_import_torch(new)
    return Float32Grams(new, sorted(rewritten, key=lambda item: item[1])), None


def _computes_in_reduced_precision(function: cst.FunctionDef, module: cst.Module) -> bool:
    """Does `function` still hold a Gram matrix outside a float32 block (gram_matrix_functions.py)?"""
    try:
        tree = ast.parse(textwrap.dedent(module.code_for_node(function.with_changes(decorators=[], leading_lines=[]))))
    except (SyntaxError, ValueError, RecursionError):
        return True
    names = (frozenset({"torch"} | module_level_aliases(module, "torch")), frozenset())
    return any(gram_matrix_line(node, names) for node in tree.body)


def _definitions(module: cst.Module, name: str) -> List[cst.FunctionDef]:
    """The module-level functions `name`, or the methods `Class.method` of module-level classes
    (more than one: defined again, and only the last runs)."""
    owner, _, method = name.rpartition(".")
    bodies = [module.body]
    if owner:
        bodies = [s.body.body for s in module.body
                  if isinstance(s, cst.ClassDef) and s.name.value == owner and isinstance(s.body, cst.IndentedBlock)]
    return [s for body in bodies for s in body if isinstance(s, cst.FunctionDef) and s.name.value == method]


def _is_method(name: str) -> bool:
    return "." in name


def _positional(function: cst.FunctionDef, method: bool) -> List[cst.Param]:
    """The positional parameters, `self` of a method left out (a staticmethod has none)."""
    params = [*function.params.posonly_params, *function.params.params]
    static = any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in function.decorators)
    return params[1:] if method and not static else params


def _not_rewritable(function: cst.FunctionDef, method: bool = False) -> Optional[str]:
    """Why `function` cannot be wrapped, or None."""
    if function.asynchronous is not None:
        return "is a coroutine"
    params = function.params
    if params.star_arg is not None and isinstance(params.star_arg, cst.Param) or params.star_kwarg is not None:
        return "takes *args or **kwargs, so ampify cannot tell which argument is the feature map"
    required = [p for p in _positional(function, method) if p.default is None]
    if len(required) != 1:
        return ("takes more than one required argument, so ampify cannot tell which of them to copy to float32"
                if len(required) > 1 else "takes no feature map")
    if any(isinstance(node, (cst.Yield, cst.Await)) for node in _own_nodes(function)):
        return "is a generator"
    if any(isinstance(node, (cst.Global, cst.Nonlocal)) for node in _own_nodes(function)):
        return "rebinds names outside itself"
    parameter = _feature_map_parameter(function, method)
    for node in _own_nodes(function):
        # `y.div_(...)`, `y[...] = ...`: the caller sees the change; on a float32 copy it would not
        if (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value.endswith("_")
                and not node.func.attr.value.startswith("_") and _names(node.func.value, parameter)):
            return f"changes its argument {parameter} in place, which a float32 copy would no longer do for the caller"
        if isinstance(node, (cst.Assign, cst.AugAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            if any(isinstance(t, (cst.Subscript, cst.Attribute)) and _names(t.value, parameter) for t in targets):
                return (f"writes into its argument {parameter}, which a float32 copy would no longer do for the "
                        "caller")
    return None


def _names(node: cst.BaseExpression, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _feature_map_parameter(function: cst.FunctionDef, method: bool = False) -> str:
    return next(p for p in _positional(function, method) if p.default is None).name.value


def _own_nodes(function: cst.FunctionDef):
    pending: List[cst.CSTNode] = [function.body]
    while pending:
        node = pending.pop()
        yield node
        for child in node.children:
            if not isinstance(child, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                pending.append(child)


def _wrapped(function: cst.FunctionDef, context: str, parameter: str, module: cst.Module) -> cst.FunctionDef:
    """`function` with its body (after the docstring) inside `with <context>:`, the parameter
    copied to float32 first."""
    body = list(function.body.body)
    docstring = []
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) and isinstance(
            body[0].body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
        docstring, body = body[:1], body[1:]
    template = cst.parse_statement(f"with {context}:\n    {parameter} = {parameter}.float()\n",
                                   config=module.config_for_parsing)
    assert isinstance(template, cst.With)
    cast = template.body.body[0]
    leading = body[0].leading_lines if body else ()
    if body:
        body[0] = body[0].with_changes(leading_lines=[])
    block = template.with_changes(
        leading_lines=leading,
        body=template.body.with_changes(body=[cast, *body]),
    )
    return function.with_changes(body=function.body.with_changes(body=[*docstring, block]))


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements) -> None:
        self.replacements = replacements

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self.replacements.get(id(original_node), updated_node)


def plan_float32_grams(project, here: str, code: str) -> Tuple[List[CompanionChange], List[str], Optional[str]]:
    """The training module `here` calls Gram matrix functions of other project modules: each such
    module gets them rewritten to float32, as companions of this module's change (one change set).
    Returns (companions, one line per module for this module's report, None), or ([], [], the
    reason it cannot be done)."""
    found = project.gram_matrix_modules()
    functions_of = {key: functions for key, _, functions, _ in found}

    def rewrite(key: str, display: str, source: bytes, module: cst.Module):
        rewritten, refused = float32_gram_functions(module, functions_of[key])
        if refused is not None:
            return f"in {display}, {refused}"
        if rewritten is None:
            return None
        return ModuleRewrite(rewritten.module, rewritten.rewritten[0][1], rewritten.describe(),
                             rewritten.describe(display))

    return plan_companion_rewrites(
        project, here, [(key, display, trains) for key, display, _, trains in found], rewrite, code,
        "its Gram matrices are computed in float32, so that the float16 style loss of that training step stays finite")
