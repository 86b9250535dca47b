"""Which matrix products are Gram matrices (tf1/gram_matrices.py): a tensor times its own transpose,
spelled inline, through a name bound to tf.transpose in the same function, with transpose/adjoint
flags, or as an einsum of one tensor with itself; attention's `q @ k^T` and `f @ f` are not."""

from __future__ import annotations

import libcst as cst
import pytest

from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.tf1.gram_matrices import gram_matrix_calls

SOURCE = '''
import tensorflow as tf
import tensorflow.compat.v1 as tf1


def style(layer, q, k, embeddings):
    feats = tf.reshape(layer, (1, -1, 16))
    feats_T = tf.transpose(feats, perm=[0, 2, 1])
    normalized = embeddings / tf.norm(embeddings, axis=1, keepdims=True)
    value = {expression}
    return value
'''


@pytest.mark.parametrize("expression,gram", [
    ("tf.matmul(feats_T, feats)", True),
    ("tf.matmul(feats, feats_T)", True),
    ("tf.matmul(tf.transpose(feats), feats) / 4096", True),
    ("tf.matmul(tf.transpose(a=feats, perm=[0, 2, 1]), feats)", True),  # fast-style-transfer
    ("tf1.matmul(feats, feats, transpose_a=True)", True),
    ("tf.linalg.matmul(a=feats, b=feats, adjoint_b=True)", True),
    ("tf.einsum('bij,bik->bjk', feats, feats)", True),
    ("tf.matmul(q, k, transpose_b=True)", False),  # attention scores
    ("tf.matmul(feats, feats)", False),
    ("tf.matmul(feats_T, feats, transpose_a=True)", False),  # feats @ feats
    ("tf.einsum('bij,bjk->bik', q, k)", False),
    ("numpy_matmul(feats_T, feats)", False),
    ("tf.matmul(normalized, normalized, transpose_b=True)", False),  # EBGAN's pull-away term: cosines
])
def test_gram_matrices(expression, gram):
    module = cst.parse_module(SOURCE.format(expression=expression))
    found = gram_matrix_calls(module, ImportMap.from_module(module))
    assert bool(found) is gram, [module.code_for_node(call) for call in found]


def test_a_name_bound_to_a_transpose_in_another_function_is_not_followed():
    module = cst.parse_module(
        "import tensorflow as tf\n"
        "def a(feats):\n    feats_T = tf.transpose(feats)\n    return feats_T\n"
        "def b(layer, feats_T):\n    feats = tf.reshape(layer, (-1, 16))\n    return tf.matmul(feats_T, feats)\n")
    assert gram_matrix_calls(module, ImportMap.from_module(module)) == []
