"""In-place matrix products in model code, given matrices of their receiver's dtype.

The hard-mining triplet loss of re-identification code (KaiyangZhou/deep-person-reid, Cysu/open-reid):

    dist = torch.pow(inputs, 2).sum(dim=1, keepdim=True).expand(n, n)
    dist = dist + dist.t()
    dist.addmm_(inputs, inputs.t(), beta=1, alpha=-2)

Under CUDA autocast `inputs` (the model's features) is float16, `torch.pow` runs in float32 (its
float32 list), so `dist` is float32; autocast casts out-of-place products only, and the in-place
`addmm_` raises "self and mat2 must have the same dtype" on the first batch. Given
`inputs.to(dist.dtype)`, the product runs in float32, as in the fp32 script, where the cast is a
no-op: nothing changes outside autocast, and the converted step runs.

Rewritten: `addmm_`, `addbmm_`, `baddbmm_`, `addmv_`, `addr_` called in a `forward()` method of a
module-level class (the model and loss code a training step runs), on a receiver spelled as a name
or attribute, each tensor argument (positional, or `mat1=`/`mat2=`/`batch1=`/...) cast; numbers
(the old `addmm_(1, -2, a, b)` form) and `beta=`/`alpha=` stay. Used for the training file itself
(normalize.py) and for the model code it imports (a companion change, one change set).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.fast_walk import iter_tree
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.companion_modules import ModuleRewrite, plan_companion_rewrites

#: in-place products autocast does not cast (it casts their out-of-place forms)
INPLACE_PRODUCTS = frozenset({"addmm_", "addbmm_", "baddbmm_", "addmv_", "addr_"})
_SCALARS = frozenset({"beta", "alpha"})
#: the byte test of a module that may hold one
MARKERS = tuple(f".{name}(".encode() for name in sorted(INPLACE_PRODUCTS))


@dataclass
class InplaceProducts:
    """The module with its in-place products' matrices cast, and what changed."""

    module: cst.Module
    #: (line, the call as it was)
    rewritten: List[Tuple[int, str]] = field(default_factory=list)

    def describe(self, display: str = "") -> str:
        where = f"{display}:" if display else "line "
        shown = "; ".join(f"{where}{line} {text}" for line, text in self.rewritten[:3])
        more = f"; and {len(self.rewritten) - 3} more" if len(self.rewritten) > 3 else ""
        return (f"in-place matrix product in model code given matrices of its receiver's dtype ({shown}{more}): "
                "under autocast the matrices are float16 and the receiver may be float32 (a torch.pow or sum before "
                "it), where the in-place product raises; in float32 the cast is a no-op")


def inplace_product_lines(tree: ast.Module) -> List[int]:
    """Lines of the in-place products in forward() methods of the module's classes (stdlib ast,
    for the repository outline)."""
    found = []
    for statement in tree.body:
        if not isinstance(statement, ast.ClassDef):
            continue
        for method in statement.body:
            if not (isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and method.name == "forward"):
                continue
            for node in ast.walk(method):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in INPLACE_PRODUCTS and _plain_receiver_ast(node.func.value)
                        and _needs_a_cast_ast(node)):
                    found.append(node.lineno)
    return sorted(found)


def products_in_their_receivers_dtype(module: cst.Module) -> Optional[InplaceProducts]:
    """The module rewritten as above; None when it has no product to rewrite."""
    if not names_an_inplace_product(module):
        return None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    finder = _Finder()
    wrapper.module.visit(finder)
    if not finder.calls:
        return None
    rewritten = [(positions[call].start.line, module.code_for_node(call)) for call in finder.calls]
    new = wrapper.module.visit(_Cast({id(call) for call in finder.calls}))
    return InplaceProducts(new, rewritten)


def names_an_inplace_product(module: cst.Module) -> bool:
    """Does the module spell `.addmm_` (or another in-place product) anywhere? A read-only walk,
    for a module whose bytes are not at hand (the byte test MARKERS is cheaper)."""
    return any(isinstance(node, cst.Attribute) and node.attr.value in INPLACE_PRODUCTS for node in iter_tree(module))


class _Finder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: List[cst.Call] = []
        self._depth = 0  # inside a forward() of a module-level class
        self._classes = 0

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes -= 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "forward" and self._classes == 1:
            self._depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        if original_node.name.value == "forward" and self._classes == 1:
            self._depth -= 1

    def visit_Call(self, node: cst.Call) -> None:
        if (self._depth and isinstance(node.func, cst.Attribute) and node.func.attr.value in INPLACE_PRODUCTS
                and dotted_name(node.func.value) is not None and any(_cast_needed(arg, node) for arg in node.args)):
            self.calls.append(node)


class _Cast(cst.CSTTransformer):
    def __init__(self, wanted) -> None:
        self.wanted = wanted

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if id(original_node) not in self.wanted:
            return updated_node
        receiver = dotted_name(original_node.func.value)
        args = [arg.with_changes(value=cst.parse_expression(f"({cst.Module(body=[]).code_for_node(arg.value)})"
                                                           f".to({receiver}.dtype)")
                                 if not isinstance(arg.value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
                                 else cst.Call(func=cst.Attribute(value=arg.value, attr=cst.Name("to")),
                                               args=[cst.Arg(cst.parse_expression(f"{receiver}.dtype"))]))
                if _cast_needed(arg, original_node) else arg
                for arg in updated_node.args]
        return updated_node.with_changes(args=args)


def _cast_needed(arg: cst.Arg, call: cst.Call) -> bool:
    """A tensor argument not cast to the receiver's dtype yet (not a number, not beta=/alpha=)."""
    if arg.keyword is not None and arg.keyword.value in _SCALARS:
        return False
    if arg.star:
        return False
    value = arg.value
    if isinstance(value, (cst.Integer, cst.Float)) or (
            isinstance(value, cst.UnaryOperation) and isinstance(value.expression, (cst.Integer, cst.Float))):
        return False
    receiver = dotted_name(call.func.value)
    return not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "to"
                and len(value.args) == 1 and dotted_name(value.args[0].value) == f"{receiver}.dtype")


def _plain_receiver_ast(node: ast.AST) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _needs_a_cast_ast(call: ast.Call) -> bool:
    receiver = ast.unparse(call.func.value)
    for arg in list(call.args) + [k.value for k in call.keywords if k.arg not in _SCALARS]:
        if isinstance(arg, ast.Constant) or (isinstance(arg, ast.UnaryOp) and isinstance(arg.operand, ast.Constant)):
            continue
        if isinstance(arg, ast.Starred):
            continue
        cast = (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "to"
                and len(arg.args) == 1 and ast.unparse(arg.args[0]) == f"{receiver}.dtype")
        if not cast:
            return True
    return False


def plan_imported_inplace_products(project, here: str,
                                   code: str = "AMP249") -> Tuple[List[CompanionChange], List[str], Optional[str]]:
    """The training module `here` imports model code with in-place matrix products: each such module
    gets their matrices cast, as a companion of this module's change (one change set). Returns
    (companions, one line per module for this module's report, None), or ([], [], the reason it
    cannot be done)."""

    def rewrite(key: str, display: str, source: bytes, module: cst.Module):
        products = products_in_their_receivers_dtype(module)
        if products is None:
            return None  # rewritten already, by the change set of another training file of this run
        return ModuleRewrite(products.module, products.rewritten[0][0], products.describe(), products.describe(display))

    return plan_companion_rewrites(
        project, here, project.inplace_product_modules(), rewrite, code,
        "its in-place matrix products take matrices of their receiver's dtype, so that the float16 forward pass of "
        "that training step runs")
