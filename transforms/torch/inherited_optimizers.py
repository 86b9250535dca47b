"""How a base class of the project sets the optimizer its subclasses step.

victoresque/pytorch-template's `Trainer(BaseTrainer)` steps `self.optimizer` in `_train_epoch()`,
and never assigns it: `BaseTrainer.__init__` does (`self.optimizer = optimizer`), in another
module. The subclass's GradScaler can be created right after its `super().__init__(...)` call,
provided the base sets the attribute once, in `__init__`, to an optimizer: a parameter (what the
driver hands in) or an optimizer built there (`torch.optim.SGD(...)`, or one named by the config:
`getattr(torch.optim, name)(...)`, `get_instance(torch.optim, 'optimizer', config, params)`).

This module reads the base class (stdlib ast: the repository index parses no other module with
LibCST) and says what it does; scaler_placement.py decides.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from ampify.transforms.kit.ast_names import ast_dotted
from ampify.transforms.torch.names import is_optimizer_qualname

#: local name -> (module, imported name or None, relative level), as ModuleOutline.imports
Imports = Dict[str, Tuple[str, Optional[str], int]]


@dataclass(frozen=True)
class InheritedAttribute:
    """What a base class does with `self.<attribute>`, for a subclass that steps it."""

    base: str  # "BaseTrainer"
    #: "base/base_trainer.py:18": its (first) assignment in the base's __init__
    where: str
    #: why a subclass's scaler cannot rely on it ("" when it can)
    problem: str = ""
    #: "base/base_trainer.py:120" for each place the base saves `self.<attribute>.state_dict()`
    state_saved_at: Tuple[str, ...] = ()


@dataclass(frozen=True)
class _Binding:
    method: ast.FunctionDef
    line: int
    value: Optional[ast.AST]  # None when it is no plain assignment
    how: str  # what it is then


def class_named(tree: ast.Module, name: str) -> Optional[ast.ClassDef]:
    """The module-level class `name` of `tree`."""
    return next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name), None)


def inherited_attribute(klass: ast.ClassDef, attribute: str, imports: Imports,
                        where: Callable[[int], str]) -> Optional[InheritedAttribute]:
    """What `klass` does with `self.<attribute>`; None when it never assigns it and has no base of
    its own that might. `where(line)` names a line of its module ("base/base_trainer.py:18")."""
    assignments = sorted(_self_assignments(klass, attribute), key=lambda binding: binding.line)
    if not assignments:
        if klass.bases and any(ast_dotted(base) not in (None, "object") for base in klass.bases):
            return InheritedAttribute(
                klass.name, where(klass.lineno),
                f"self.{attribute} is not set by {klass.name} ({where(klass.lineno)}) either, and ampify follows one "
                "base class, not the bases of a base")
        return None
    first = assignments[0]
    shown = where(first.line)
    saves = tuple(where(node.lineno) for node in _state_dict_calls(klass, attribute))
    outside = [binding for binding in assignments if binding.method.name != "__init__"]
    if outside:
        return InheritedAttribute(klass.name, shown, (
            f"{klass.name} sets self.{attribute} in {outside[0].method.name}() ({where(outside[0].line)}), not only "
            "in __init__: "
            "which optimizer a subclass's step runs on, and when, is not followed"), saves)
    steps = [node for node in _method_calls(klass, attribute, "step")]
    if steps:
        return InheritedAttribute(klass.name, shown, (
            f"{klass.name} steps self.{attribute} itself ({where(steps[0].lineno)}) besides its subclass: one "
            "GradScaler would have to serve both modules; convert them together by hand"), saves)
    parameters = _parameters(first.method)
    for binding in assignments:
        if binding.value is None or not _is_an_optimizer(binding.value, parameters, imports):
            text = f"`{ast.unparse(binding.value)}`" if binding.value is not None else f"a value through {binding.how}"
            return InheritedAttribute(klass.name, shown, (
                f"{klass.name} sets self.{attribute} to {text} ({where(binding.line)}), which ampify does not follow "
                "to an optimizer (a parameter of its __init__, or an optimizer of torch.optim built there)"), saves)
    return InheritedAttribute(klass.name, shown, "", saves)


def _methods(klass: ast.ClassDef) -> Iterator[ast.FunctionDef]:
    for node in klass.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node  # type: ignore[misc]


def _is_self_attribute(node: ast.AST, attribute: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == attribute
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, (ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        yield node


def _self_assignments(klass: ast.ClassDef, attribute: str) -> Iterator["_Binding"]:
    """Every binding of `self.<attribute>` in the class's methods, in source order; one by a tuple
    target, `+=`, a loop or a `with` has no plain value."""
    for method in _methods(klass):
        for node in ast.walk(method):
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in _targets(target)]
                if any(_is_self_attribute(t, attribute) for t in targets):
                    plain = all(_is_self_attribute(target, attribute) for target in node.targets)
                    yield _Binding(method, node.lineno, node.value if plain else None, "an unpacking")
            elif isinstance(node, ast.AnnAssign) and _is_self_attribute(node.target, attribute):
                yield _Binding(method, node.lineno, node.value, "an annotation without a value")
            elif isinstance(node, ast.AugAssign) and _is_self_attribute(node.target, attribute):
                yield _Binding(method, node.lineno, None, "an augmented assignment")
            elif isinstance(node, (ast.For, ast.With, ast.comprehension)):
                bound = [node.target] if isinstance(node, (ast.For, ast.comprehension)) else [
                    item.optional_vars for item in node.items if item.optional_vars is not None]
                if any(_is_self_attribute(t, attribute) for target in bound for t in _targets(target)):
                    yield _Binding(method, getattr(node, "lineno", method.lineno), None, "a loop or with target")


def _method_calls(klass: ast.ClassDef, attribute: str, method: str) -> Iterator[ast.Call]:
    for node in ast.walk(klass):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
                and _is_self_attribute(node.func.value, attribute)):
            yield node


def _state_dict_calls(klass: ast.ClassDef, attribute: str) -> List[ast.Call]:
    return list(_method_calls(klass, attribute, "state_dict"))


def _parameters(function: ast.FunctionDef) -> List[str]:
    arguments = function.args
    every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
    return [a.arg for a in every if a.arg != "self"]


def _qualified(node: ast.AST, imports: Imports) -> Optional[str]:
    """`torch.optim.SGD` for `optim.SGD` under `from torch import optim`, `torch.optim` for
    `torch.optim` under `import torch`."""
    dotted = ast_dotted(node)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    if head not in imports:
        return None
    module, name, level = imports[head]
    if level:
        return None
    base = f"{module}.{name}" if name else module
    return f"{base}.{rest}" if rest else base


def _is_an_optimizer(value: ast.AST, parameters: List[str], imports: Imports) -> bool:
    """A parameter of __init__ (the optimizer handed in), or a call that builds a torch.optim
    optimizer: by its class, or by name from the module (`getattr(torch.optim, name)(...)`,
    `get_instance(torch.optim, 'optimizer', config, params)`)."""
    if isinstance(value, ast.Name):
        return value.id in parameters
    if not isinstance(value, ast.Call):
        return False
    qualified = _qualified(value.func, imports)
    if qualified is not None and is_optimizer_qualname(qualified):
        return True
    function = value.func
    if isinstance(function, ast.Call) and ast_dotted(function.func) == "getattr" and function.args:
        return _qualified(function.args[0], imports) == "torch.optim"
    return any(_qualified(argument, imports) == "torch.optim" for argument in value.args)
