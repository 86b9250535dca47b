"""Probability clamps that float16 (or bfloat16) rounds away, found in a module's syntax tree.

yhenon/pytorch-retinanet's focal loss, in the model code its train.py runs under autocast:

    classification = torch.clamp(classification, 1e-4, 1.0 - 1e-4)
    bce = -(targets * torch.log(classification) + (1.0 - targets) * torch.log(1.0 - classification))

The sigmoid's output arrives in float16, and the clamp keeps its dtype: 1.0 - 1e-4 rounds to 1.0 in
float16 (its spacing below 1 is 2**-11), so a confident anchor's probability stays 1.0, `log(1.0 -
classification)` is -inf and `0 * -inf` NaN: the loss is NaN, GradScaler skips the step, and keeps
skipping as the detector grows confident. bfloat16 (spacing 2**-8) rounds 1 - 1e-3 to 1 too, and
with no scaler the NaN reaches the weights. A clamp counts when its upper bound is `1 - eps` (or a
literal just below 1) and the same function takes the log of one minus the clamped name.

A clamp helper counts too: princeton-vl/CornerNet's (and xingyizhou/CenterNet's)

    def _sigmoid(x):
        x = torch.clamp(x.sigmoid_(), min=1e-4, max=1-1e-4)
        return x

hands the clamped probability to a focal loss, `torch.log(1 - neg_pred)`, of another function or
module. A module-level function returning such a clamp is one when its module, or another module
of the training file's project, takes `log(1 - ...)` (`clamp_helpers`).
"""

from __future__ import annotations

import ast
import re
from typing import List, Optional, Tuple

from ampify.transforms.kit.ast_names import ast_dotted as _dotted

#: `log(1 - p)` / `log(1.0 - p)` in a source: a cheap byte test before any parse
LOG_OF_COMPLEMENT = re.compile(rb"log\(\s*1(?:\.0*)?\s*-")
#: the largest eps for which 1 - eps rounds to 1: half the spacing below 1 (ties go to the even 1.0)
ROUNDS_TO_ONE = {"float16": 2.0 ** -12, "bfloat16": 2.0 ** -9}


def probability_clamps(tree: ast.AST, with_helpers: Optional[bool] = None) -> List[Tuple[int, str, float]]:
    """(line, the clamp as written, eps) for each clamp `name = clamp(x, lo, 1 - eps)` in a function
    that also takes `log(1 - name)`; and the clamps of clamp helpers (`clamp_helpers`) when
    `with_helpers`, or, when it is None, when the module itself takes `log(1 - ...)` somewhere."""
    found = []
    if with_helpers or (with_helpers is None and _complements_logged(tree)):
        found += clamp_helpers(tree)
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        logged = _complements_logged(function)
        if not logged:
            continue
        for node in ast.walk(function):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in logged and isinstance(node.value, ast.Call)):
                continue
            eps = _upper_bound_gap(node.value)
            if eps is not None:
                found.append((node.lineno, ast.unparse(node.value), eps))
    return sorted(set(found))


def clamp_helpers(tree: ast.AST) -> List[Tuple[int, str, float]]:
    """(line, clamp, eps) of module-level functions that return a probability clamp:
    `x = torch.clamp(x.sigmoid_(), min=1e-4, max=1-1e-4)` then `return x`, or the clamp returned."""
    found = []
    for function in getattr(tree, "body", []):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        returned = {node.value.id for node in ast.walk(function)
                    if isinstance(node, ast.Return) and isinstance(node.value, ast.Name)}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id in returned and isinstance(node.value, ast.Call):
                eps = _upper_bound_gap(node.value)
                if eps is not None:
                    found.append((node.lineno, ast.unparse(node.value), eps))
    return found


def _complements_logged(function: ast.AST) -> set:
    """Names `p` of `log(1 - p)` / `log(1.0 - p)` (torch.log, math-free `.log()` forms) in the function."""
    names = set()
    for node in ast.walk(function):
        argument = None
        if isinstance(node, ast.Call):
            called = _dotted(node.func) or ""
            if called.rsplit(".", 1)[-1] == "log" and node.args and called != "log":
                argument = node.args[0]
            elif called == "log" and node.args:
                argument = node.args[0]
            elif isinstance(node.func, ast.Attribute) and node.func.attr == "log" and not node.args:
                argument = node.func.value
        if isinstance(argument, ast.BinOp) and isinstance(argument.op, ast.Sub) and _is_one(argument.left) \
                and isinstance(argument.right, ast.Name):
            names.add(argument.right.id)
    return names


def _upper_bound_gap(call: ast.Call) -> Optional[float]:
    """eps for `torch.clamp(x, lo, 1 - eps)`, `x.clamp(lo, 1 - eps)`, `clamp(x, min=..., max=1 - eps)`,
    `torch.clamp(x, lo, 0.9999)`; None when the call is no such clamp."""
    called = _dotted(call.func) or ""
    if called.rsplit(".", 1)[-1] not in ("clamp", "clip"):
        return None
    method = isinstance(call.func, ast.Attribute) and called.split(".")[0] not in ("torch", "np", "numpy")
    positional = call.args if method else call.args[1:]
    if called.split(".")[0] in ("np", "numpy"):
        return None
    clamped = call.func.value if method else (call.args[0] if call.args else None)
    if _is_float32_copy(clamped):
        return None  # `torch.clamp(p.float(), ...)`: the bound holds
    upper = positional[1] if len(positional) > 1 else next(
        (k.value for k in call.keywords if k.arg in ("max", "a_max")), None)
    if upper is None:
        return None
    if isinstance(upper, ast.BinOp) and isinstance(upper.op, ast.Sub) and _is_one(upper.left):
        eps = _number(upper.right)
    else:
        value = _number(upper)
        eps = 1.0 - value if value is not None and 0.0 < value < 1.0 else None
    return eps if eps is not None and 0.0 < eps < 0.01 else None


def _is_float32_copy(node: Optional[ast.AST]) -> bool:
    """`p.float()`, `p.double()`, `p.to(torch.float32)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr in ("float", "double"):
        return True
    return node.func.attr == "to" and any((_dotted(arg) or "").endswith(("float32", "float64", "float", "double"))
                                          for arg in node.args)


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 1


def _number(node: ast.AST) -> Optional[float]:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None
