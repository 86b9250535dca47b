"""Gram matrices of flattened feature maps (AMP238 / apex AMP330) in the forms real style-transfer code
writes them: the transpose inline or bound to a name first (pytorch/examples' `features_t =
features.transpose(1, 2); features.bmm(features_t)`), either way round, in the training file or in a
function of another project module it calls (found by the repository outline's ast detector).
Attention's `q @ k.transpose(-2, -1)` and products of unflattened tensors are not Gram matrices.
The premise (a Gram matrix overflows float16) is shown in test_torch_native_exec.py."""

from __future__ import annotations

import ast
import textwrap

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.transforms.torch.gram_matrix_functions import gram_matrix_line

FUNCTION = '''
def gram_matrix(y, q, k):
    (b, ch, h, w) = y.size()
    features = y.view(b, ch, w * h)
    features_t = features.transpose(1, 2)
    other = y.view(b, ch, -1)
    value = {expression}
    return value
'''

CASES = [
    ("features.bmm(features_t)", True),
    ("torch.bmm(features_t, features)", True),
    ("features.bmm(features.transpose(1, 2)) / (ch * h * w)", True),
    ("torch.matmul(features, features.mT)", True),
    ("features @ features_t", True),
    ("torch.matmul(q, k.transpose(-2, -1))", False),  # attention scores
    ("other.bmm(other.transpose(1, 2))", False),  # not flattened by a product of sizes
    ("features.bmm(features)", False),
]


@pytest.mark.parametrize("expression,gram", CASES)
def test_the_outline_detector(expression, gram):
    tree = ast.parse("import torch\n" + textwrap.dedent(FUNCTION.format(expression=expression)))
    function = tree.body[1]
    assert bool(gram_matrix_line(function)) is gram


TRAINING = '''
import torch

model = torch.nn.Conv2d(3, 8, 3).to("cuda")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(10):
    y = model(torch.randn(2, 3, 32, 32, device="cuda"))
    optimizer.zero_grad()
    loss = gram_matrix(y, y, y).mean()
    loss.backward()
    optimizer.step()
'''


@pytest.mark.parametrize("expression,gram", [case for case in CASES if "@" not in case[0]])
def test_in_the_training_file(expression, gram):
    source = "import torch\n" + textwrap.dedent(FUNCTION.format(expression=expression)) + TRAINING
    conversion = convert_source(source, Options())
    codes = [f.code for f in conversion.findings]
    if gram:
        assert conversion.status is FileStatus.UNCONVERTED and "AMP238" in codes, conversion
    else:
        assert conversion.status is FileStatus.CHANGED and "AMP238" not in codes, conversion
