"""Probability clamps made to keep their bound: the clamp takes a float32 copy of the probability.

yhenon/pytorch-retinanet's focal loss, in model code its training file runs under autocast:

    classification = torch.clamp(classification, 1e-4, 1.0 - 1e-4)
    bce = -(targets * torch.log(classification) + (1.0 - targets) * torch.log(1.0 - classification))

The probability arrives in float16 and the clamp keeps its dtype, where 1 - 1e-4 rounds to 1: the
loss turns inf or NaN (AMP244, probability_clamps.py). The fix the warning asks for, written here:

    classification = torch.clamp(classification.float(), 1e-4, 1.0 - 1e-4)

(`p.clamp(lo, hi)` becomes `p.float().clamp(lo, hi)`). In float32 `.float()` returns the tensor
itself, so the fp32 script computes exactly what it did; under autocast the clamp, and everything
computed from the clamped name, runs in float32, where 1 - 1e-4 is kept. The clamps rewritten are
the ones probability_clamps.py finds, so a second run finds none.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import libcst as cst

from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.kit.positions import Positions
from ampify.transforms.torch.companion_modules import ModuleRewrite, plan_companion_rewrites
from ampify.transforms.torch.probability_clamps import probability_clamps

#: names a clamp is called through as a function, not as a tensor's method (as probability_clamps.py)
_FUNCTION_ROOTS = ("torch", "np", "numpy")


@dataclass
class Float32Clamps:
    """The module with its probability clamps taking float32 copies, and (line, clamp as it was)."""

    module: cst.Module
    rewritten: List[Tuple[int, str]] = field(default_factory=list)
    #: (line, clamp) of the clamps found but not rewritten (`torch.clamp(input=p, ...)`)
    left: List[Tuple[int, str]] = field(default_factory=list)

    def describe(self, where: str = "") -> str:
        place = f"{where}: " if where else ""
        shown = "; ".join(f"line {line} {text}" for line, text in self.rewritten[:3]) + (
            f"; and {len(self.rewritten) - 3} more" if len(self.rewritten) > 3 else "")
        return (f"{place}the probability clamp{'s' if len(self.rewritten) != 1 else ''} ({shown}) now clamp"
                f"{'' if len(self.rewritten) != 1 else 's'} a float32 copy (`.float()`): the bound 1 - eps, which float16 "
                "rounds to 1, is kept and log(1 - p) stays finite")


def float32_clamps(module: cst.Module, source: Optional[bytes] = None,
                   max_eps: float = 1.0, with_helpers: Optional[bool] = None) -> Optional[Float32Clamps]:
    """The module with every probability clamp (probability_clamps.py) of eps up to `max_eps`
    taking a float32 copy of what it clamps; None when it has none. A clamp that cannot be
    rewritten (the tensor passed by keyword) is listed in `left`, the module otherwise unchanged."""
    try:
        tree = ast.parse(source if source is not None else module.code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found = {line: text for line, text, eps in probability_clamps(tree, with_helpers) if eps <= max_eps}
    if not found:
        return None
    positions = Positions(module)
    finder = _ClampAssignments()
    module.visit(finder)
    replacements = {}
    rewritten = []
    for assign in finder.assignments:
        line = positions[assign].start.line
        if line not in found:
            continue
        call = assign.value
        new = _on_a_float32_copy(call)
        if new is None:
            continue
        replacements[id(call)] = new
        rewritten.append((line, found[line]))
    done = {line for line, _ in rewritten}
    left = sorted((line, text) for line, text in found.items() if line not in done)
    new_module = module.visit(_Replace(replacements)) if replacements else module
    return Float32Clamps(new_module, sorted(rewritten), left)


def _on_a_float32_copy(call: cst.Call) -> Optional[cst.Call]:
    """`torch.clamp(x.float(), ...)` for `torch.clamp(x, ...)`, `x.float().clamp(...)` for `x.clamp(...)`."""
    name = dotted_name(call.func) or ""
    method = isinstance(call.func, cst.Attribute) and name.split(".")[0] not in _FUNCTION_ROOTS
    if method:
        return call.with_changes(func=call.func.with_changes(value=_float_copy(call.func.value)))
    if not call.args or call.args[0].keyword is not None or call.args[0].star:
        return None
    first = call.args[0]
    return call.with_changes(args=[first.with_changes(value=_float_copy(first.value)), *call.args[1:]])


def _float_copy(node: cst.BaseExpression) -> cst.Call:
    if not isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not node.lpar:
        node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(value=node, attr=cst.Name("float")))


class _ClampAssignments(cst.CSTVisitor):
    """`name = <call>` statements; the caller keeps those on the clamps' lines."""

    def __init__(self) -> None:
        self.assignments: List[cst.Assign] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and isinstance(node.value, cst.Call):
            self.assignments.append(node)


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements) -> None:
        self.replacements = replacements

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return self.replacements.get(id(original_node), updated_node)


def plan_float32_clamps(project, here: str, code: str,
                        max_eps: float) -> Tuple[List[CompanionChange], List[str], Optional[str]]:
    """The training module `here` imports model code with probability clamps: each such module gets
    them rewritten to clamp float32 copies, as companions of this module's change (one change set).
    Returns (companions, one line per module for this module's report, None), or ([], [], the
    reason it cannot be done)."""
    def rewrite(key: str, display: str, source: bytes, module: cst.Module):
        clamps = float32_clamps(module, source, max_eps, with_helpers=True)
        if clamps is None:
            return None  # rewritten already, by the change set of another training file of this run
        if clamps.left:
            line, text = clamps.left[0]
            return (f"in {display}, the clamp at line {line} ({text}) passes the tensor by keyword, where "
                    "ampify does not write the float32 copy")
        return ModuleRewrite(clamps.module, clamps.rewritten[0][0], clamps.describe(), clamps.describe(display))

    return plan_companion_rewrites(
        project, here, project.probability_clamp_modules(max_eps), rewrite, code,
        "its probability clamps take float32 copies, so that the float16 loss of that training step stays finite")
