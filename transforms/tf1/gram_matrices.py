"""Gram matrices in a TF1 graph: style transfer's style loss (lengstrom/fast-style-transfer,
anishathalye/neural-style).

    feats = tf.reshape(layer, (bs, height * width, filters))
    feats_T = tf.transpose(feats, perm=[0, 2, 1])
    grams = tf.matmul(feats_T, feats) / size

A Gram matrix sums height*width products of feature maps. The graph rewrite runs MatMul and
BatchMatMul in float16 (its allow list): the sum passes 65504 before the division by the size, the
style loss is inf, and the loss-scale optimizer skips every step, silently. Taking the matrix
products off the allow list keeps them in float32; the convolutions, most of the work, still
convert. A Gram matrix is a product of a feature map flattened by `tf.reshape` (bound to a name in the
same function) and its own transpose: `tf.matmul(tf.transpose(f), f)`, a name bound to
`tf.transpose(f, ...)` in the same function, `transpose_a=True` / `adjoint_b=True` on
`tf.matmul(f, f, ...)`, or `tf.einsum(..., f, f)`. Products of other tensors with their transposes
(EBGAN's pull-away term over normalized embeddings, cosine similarities within [-1, 1]) are not.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampify.transforms.kit.imports import ImportMap, dotted_name

_PREFIXES = ("tensorflow.compat.v1.", "tensorflow.compat.v2.", "tensorflow.")
_MATMULS = frozenset({"matmul", "linalg.matmul", "batch_matmul", "linalg.einsum", "einsum"})
_TRANSPOSES = frozenset({"transpose", "linalg.transpose", "matrix_transpose", "linalg.matrix_transpose"})
_TRANSPOSE_FLAGS = {"transpose_a": 0, "adjoint_a": 0, "transpose_b": 1, "adjoint_b": 1}


def gram_matrix_calls(module: cst.Module, imports: ImportMap) -> List[cst.Call]:
    """Every matrix product of `module` that multiplies a tensor by its own transpose."""
    finder = _Finder(imports)
    module.visit(finder)
    return finder.found


def _tensorflow_name(imports: ImportMap, node: cst.BaseExpression) -> Optional[str]:
    """`matmul` for tf.matmul / tf.compat.v1.matmul / tf.linalg.matmul(...)'s `linalg.matmul`."""
    qualified = imports.resolve(node)
    if qualified is None:
        return None
    for prefix in _PREFIXES:
        if qualified.startswith(prefix):
            return qualified[len(prefix):]
    return None


class _Finder(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.found: List[cst.Call] = []
        #: per function (module level first): name -> the tensor a `name = tf.transpose(x)` transposes
        self.transposed: List[Dict[str, Optional[str]]] = [{}]
        #: per function: the names bound to `tf.reshape(...)` (flattened feature maps)
        self.reshaped: List[set] = [set()]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.transposed.append({})
        self.reshaped.append(set())

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.transposed.pop()
        self.reshaped.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                name = target.target.value
                base = self._transpose_of(node.value)
                known = self.transposed[-1]
                # bound twice to different things: not followed
                known[name] = base if name not in known or known[name] == base else None
                if isinstance(node.value, cst.Call) and _tensorflow_name(self.imports, node.value.func) in (
                        "reshape", "compat.v1.reshape"):
                    self.reshaped[-1].add(name)

    def visit_Call(self, node: cst.Call) -> None:
        name = _tensorflow_name(self.imports, node.func)
        if name not in _MATMULS:
            return
        positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value: arg.value for arg in node.args if arg.keyword is not None}
        if name.endswith("einsum"):
            operands = positional[1:]
            if len(operands) == 2 and dotted_name(operands[0]) is not None \
                    and dotted_name(operands[0]) == dotted_name(operands[1]) \
                    and dotted_name(operands[0]) in self.reshaped[-1]:
                self.found.append(node)
            return
        operands = positional[:2]
        for keyword, index in (("a", 0), ("b", 1)):
            if keyword in keywords and len(operands) == index:
                operands.append(keywords[keyword])
        if len(operands) != 2:
            return
        sides: List[Tuple[Optional[str], bool]] = []
        for index, operand in enumerate(operands):
            base = self._transpose_of(operand)
            transposed = base is not None
            if not transposed:
                base = dotted_name(operand)
            flagged = any(_is_true(value) for key, value in keywords.items() if _TRANSPOSE_FLAGS.get(key) == index)
            sides.append((base, transposed != flagged))
        (left, left_transposed), (right, right_transposed) = sides
        if left is not None and left == right and left_transposed != right_transposed and left in self.reshaped[-1]:
            self.found.append(node)

    def _transpose_of(self, node: cst.BaseExpression) -> Optional[str]:
        """The dotted name `x` when `node` is `tf.transpose(x, ...)` or a name bound to it here."""
        if isinstance(node, cst.Name):
            return self.transposed[-1].get(node.value)
        if isinstance(node, cst.Call) and _tensorflow_name(self.imports, node.func) in _TRANSPOSES and node.args:
            first = node.args[0]
            if first.keyword is None and not first.star:
                return dotted_name(first.value)
            keyword = next((arg for arg in node.args if arg.keyword is not None and arg.keyword.value in ("a", "x")),
                           None)  # tf.transpose(a=feats, perm=...), tf.linalg.matrix_transpose(x=...)
            return dotted_name(keyword.value) if keyword is not None else None
        return None


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"
