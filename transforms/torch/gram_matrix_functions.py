"""Functions of a project module that compute a Gram matrix of a flattened feature map, found in the
module's syntax tree (the repository outline's view of AMP238 / apex AMP330).

pytorch/examples' fast_neural_style keeps it in utils.py, which the training script calls under
autocast:

    def gram_matrix(y):
        (b, ch, h, w) = y.size()
        features = y.view(b, ch, w * h)
        features_t = features.transpose(1, 2)
        gram = features.bmm(features_t) / (ch * h * w)

The product sums h*w terms: in float16 it passes 65504 before the division, the style loss is inf,
and GradScaler skips every step. A Gram matrix here is a product (`torch.mm/bmm/matmul`, the same
methods, `@`) of a name bound to `x.view(...)` / `x.reshape(...)` with a product of sizes among its
arguments and that name's transpose (`.t()`, `.transpose(...)`, `.permute(...)`, `.T`, `.mT`,
`torch.transpose(f, ...)`, inline or bound to a name in the same function). One written inside
`with torch.autocast(..., enabled=False):` (or apex's `with amp.disable_casts():`) on a float32 copy
(`y = y.float()` first in that block: gram_matrix_float32.py's rewrite) runs in float32 and is not
counted.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, Optional, Set, Tuple

from ampify.transforms.kit.ast_names import ast_dotted as _dotted

_PRODUCT_FUNCTIONS = frozenset({"torch.mm", "torch.bmm", "torch.matmul"})
_PRODUCT_METHODS = frozenset({"mm", "bmm", "matmul"})
_TRANSPOSE_METHODS = frozenset({"t", "transpose", "permute"})


def torch_names(tree: ast.AST) -> Tuple[FrozenSet[str], FrozenSet[str]]:
    """(the names bound to the torch module: `torch`, `th` of `import torch as th`; the names bound
    to its product functions: `mm` of `from torch import mm`), for gram_matrix_line."""
    modules, products = {"torch"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.asname for alias in node.names if alias.name == "torch" and alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and node.level == 0:
            products.update(alias.asname or alias.name for alias in node.names if alias.name in _PRODUCT_METHODS)
    return frozenset(modules), frozenset(products)


_TORCH_ONLY = (frozenset({"torch"}), frozenset())


def gram_matrix_line(function: ast.AST, names: Tuple[FrozenSet[str], FrozenSet[str]] = _TORCH_ONLY) -> int:
    """The line of the first Gram matrix of a flattened feature map in `function`'s body; 0 if none.
    `names`: torch_names() of its module (`th.mm(f, f.t())` after `import torch as th`)."""
    flattened: Set[str] = set()
    transposed: Dict[str, Optional[str]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if _is_flattening(node.value):
                flattened.add(name)
            base = _transpose_of(node.value, {}, names[0])
            if base is not None:
                transposed[name] = base if transposed.get(name, base) == base else None
    in_float32 = _inside_float32_blocks(function)
    for node in ast.walk(function):
        if id(node) in in_float32:
            continue
        operands = _product_operands(node, names)
        if operands is None:
            continue
        sides = []
        for operand in operands:
            base = _transpose_of(operand, transposed, names[0])
            sides.append((base, True) if base is not None else (_dotted(operand), False))
        (left, left_transposed), (right, right_transposed) = sides
        if left is not None and left == right and left_transposed != right_transposed and left in flattened:
            return node.lineno
    return 0


def _product_operands(node: ast.AST, names: Tuple[FrozenSet[str], FrozenSet[str]] = _TORCH_ONLY
                      ) -> Optional[Tuple[ast.expr, ast.expr]]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    name = _dotted(node.func) or ""
    root, _, last = name.rpartition(".")
    function = (root in names[0] and last in _PRODUCT_METHODS) or (not root and name in names[1])
    if function and len(node.args) == 2:
        return node.args[0], node.args[1]
    if isinstance(node.func, ast.Attribute) and node.func.attr in _PRODUCT_METHODS and len(node.args) == 1 \
            and not function:
        return node.func.value, node.args[0]
    return None


def _transpose_of(node: ast.expr, transposed: Dict[str, Optional[str]],
                  modules: FrozenSet[str] = frozenset({"torch"})) -> Optional[str]:
    if isinstance(node, ast.Name):
        return transposed.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        return _dotted(node.value)
    if isinstance(node, ast.Call):
        root, _, last = (_dotted(node.func) or "").rpartition(".")
        function = root in modules and last == "transpose"
        if isinstance(node.func, ast.Attribute) and node.func.attr in _TRANSPOSE_METHODS and not function:
            return _dotted(node.func.value)
        if function and node.args:
            return _dotted(node.args[0])
    return None


def _is_flattening(node: ast.expr) -> bool:
    """`f.view(b, ch, w * h)` / `input.reshape(a * b, c * d)`: a product of sizes among the arguments."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("view", "reshape")
            and any(isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult) for arg in node.args))


def _inside_float32_blocks(function: ast.AST) -> Set[int]:
    """ids of the nodes inside `with torch.autocast(..., enabled=False):` / `with amp.disable_casts():`
    blocks that first copy a name to float32 (`y = y.float()`)."""
    inside: Set[int] = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.With) or not node.body or not any(
                _switches_casts_off(item.context_expr) for item in node.items):
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Assign) and len(first.targets) == 1 and isinstance(first.targets[0], ast.Name)
                and isinstance(first.value, ast.Call) and isinstance(first.value.func, ast.Attribute)
                and first.value.func.attr == "float" and not first.value.args
                and isinstance(first.value.func.value, ast.Name)
                and first.value.func.value.id == first.targets[0].id):
            continue
        for statement in node.body:
            inside.update(id(child) for child in ast.walk(statement))
    return inside


def _switches_casts_off(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = _dotted(node.func) or ""
    if name.rsplit(".", 1)[-1] == "disable_casts":
        return True
    return name.rsplit(".", 1)[-1] == "autocast" and any(
        k.arg == "enabled" and isinstance(k.value, ast.Constant) and k.value.value is False for k in node.keywords)
