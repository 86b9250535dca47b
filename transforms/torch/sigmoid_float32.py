"""Sigmoids whose probability the code takes the log of, computed on a float32 copy.

kwotsin/mimicry's non-saturating generator loss (torch_mimicry/modules/losses.py):

    output_fake = torch.sigmoid(output_fake)
    return -torch.mean(torch.log(output_fake + 1e-8))

Under autocast the logits arrive in float16 and the sigmoid keeps their dtype: below a logit of
about -17 the probability is 0, the `+ 1e-8` is lost, and the log is -inf (AMP229,
kit/log_of_sigmoid.py). Written here:

    output_fake = torch.sigmoid(output_fake.float())

`.float()` of a float32 tensor is the tensor itself, so the fp32 script computes exactly what it
did; under autocast (and apex O1) the sigmoid and the log then run in float32, as in the fp32
script. Only sigmoids written out are rewritten (`torch.sigmoid(x)`, `F.sigmoid(x)`,
`torch.special.expit(x)`, `x.sigmoid()`), those whose value reaches the log through names bound
in the same function; a probability a model returns (a Sequential ending in nn.Sigmoid) is not,
and then nothing is. The rewrite is kept only when kit/log_of_sigmoid.py finds no such log in the
result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.log_of_sigmoid import TORCH, log_of_probability_calls
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.companion_modules import ModuleRewrite, plan_companion_rewrites


@dataclass
class Float32Sigmoids:
    """The module with its logged sigmoids taking float32 copies, and (line, sigmoid as it was)."""

    module: cst.Module
    rewritten: List[Tuple[int, str]] = field(default_factory=list)

    def describe(self, where: str = "") -> str:
        place = f"{where}: " if where else ""
        shown = "; ".join(f"line {line} {text}" for line, text in self.rewritten[:3]) + (
            f"; and {len(self.rewritten) - 3} more" if len(self.rewritten) > 3 else "")
        many = len(self.rewritten) != 1
        return (f"{place}the sigmoid{'s' if many else ''} whose probability a log reads ({shown}) now take"
                f"{'' if many else 's'} a float32 copy of the logits (`.float()`): the probability and its log are "
                "computed in float32, as in the fp32 script, and stay finite when the logit is confident")


def float32_sigmoids(module: cst.Module) -> Optional[Float32Sigmoids]:
    """The module with every written-out sigmoid feeding a log of its probability taking a float32
    copy of its argument; None when there is no such log, or when a log would still read a float16
    probability after the rewrite (a model's own nn.Sigmoid)."""
    imports = ImportMap.from_module(module)
    found = log_of_probability_calls(module, imports)
    if not found:
        return None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    parents = wrapper.resolve(ParentNodeProvider)
    positions = wrapper.resolve(PositionProvider)
    sigmoids: Dict[int, cst.Call] = {}
    for log_call, _ in found:
        scope = _scope_of(log_call, parents, module)
        bound = _assignments(scope)
        pending: List[cst.CSTNode] = [arg.value for arg in log_call.args]
        if isinstance(log_call.func, cst.Attribute) and not log_call.args:
            pending.append(log_call.func.value)  # `p.log()`
        followed: Set[str] = set()
        while pending:
            expression = pending.pop()
            for call in statements.nodes_of_type(expression, cst.Call):
                if _is_sigmoid(call, imports):
                    sigmoids[id(call)] = call
            for name in _names_in(expression):
                if name in bound and name not in followed:
                    followed.add(name)
                    pending.extend(bound[name])
    if not sigmoids:
        return None
    rewritten = sorted((positions[call].start.line, statements.code_of(call)) for call in sigmoids.values())
    new_module = module.visit(_OnFloat32Copies(set(sigmoids)))
    if log_of_probability_calls(new_module, ImportMap.from_module(new_module)):
        return None
    return Float32Sigmoids(new_module, rewritten)


def _scope_of(node: cst.CSTNode, parents, module: cst.Module) -> cst.CSTNode:
    current = parents.get(node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        current = parents.get(current)
    return current if current is not None else module


def _assignments(scope: cst.CSTNode) -> Dict[str, List[cst.BaseExpression]]:
    """name -> the values the scope assigns to it (`p = torch.sigmoid(x)`, `p = p.clamp(...)`)."""
    bound: Dict[str, List[cst.BaseExpression]] = {}
    for assign in statements.nodes_of_type(scope, cst.Assign):
        assert isinstance(assign, cst.Assign)
        for target in assign.targets:
            name = dotted_name(target.target)
            if name is not None:
                bound.setdefault(name, []).append(assign.value)
    return bound


def _names_in(expression: cst.CSTNode) -> Set[str]:
    names = {node.value for node in statements.nodes_of_type(expression, cst.Name)}  # type: ignore[attr-defined]
    names |= {dotted for node in statements.nodes_of_type(expression, cst.Attribute)
              if (dotted := dotted_name(node)) is not None}
    return names


def _is_sigmoid(call: cst.Call, imports: ImportMap) -> bool:
    qualified = imports.resolve(call.func)
    if qualified in TORCH.sigmoid_functions:
        return bool(call.args) and call.args[0].keyword is None and not call.args[0].star
    return (qualified is None and isinstance(call.func, cst.Attribute) and call.func.attr.value == "sigmoid"
            and not call.args)


class _OnFloat32Copies(cst.CSTTransformer):
    """`torch.sigmoid(x)` -> `torch.sigmoid(x.float())`, `x.sigmoid()` -> `x.float().sigmoid()`."""

    def __init__(self, targets: Set[int]) -> None:
        self.targets = targets

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self.targets:
            return updated_node
        if updated_node.args:
            first = updated_node.args[0]
            return updated_node.with_changes(args=[first.with_changes(value=_float_copy(first.value)),
                                                   *updated_node.args[1:]])
        func = updated_node.func
        assert isinstance(func, cst.Attribute)
        return updated_node.with_changes(func=func.with_changes(value=_float_copy(func.value)))


def _float_copy(node: cst.BaseExpression) -> cst.Call:
    if not isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not node.lpar:
        node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(value=node, attr=cst.Name("float")))


def plan_float32_sigmoids(project, here: str, code: str, modules: List[Tuple[str, str, bool]]
                          ) -> Tuple[List[CompanionChange], List[str], Optional[str]]:
    """The training module `here` imports code that takes the log of a sigmoid it writes out
    (`modules`: key, display, it trains): each such module gets those sigmoids rewritten to take
    float32 copies, as companions of this module's change (one change set). Returns (companions,
    one line per module for this module's report, None), or ([], [], the reason it cannot be done)."""
    def rewrite(key: str, display: str, source: bytes, module: cst.Module):
        if not log_of_probability_calls(module, ImportMap.from_module(module)):
            return None  # rewritten already, by the change set of another training file of this run
        sigmoids = float32_sigmoids(module)
        if sigmoids is None:
            return (f"in {display}, a log reads a probability that is not a sigmoid written out there (a model "
                    "ending in nn.Sigmoid, or a value ampify cannot follow), which ampify does not rewrite")
        return ModuleRewrite(sigmoids.module, sigmoids.rewritten[0][0], sigmoids.describe(), sigmoids.describe(display))

    return plan_companion_rewrites(
        project, here, modules, rewrite, code,
        "its sigmoids whose probability a log reads take float32 copies, so that the loss of that training step "
        "stays finite")
