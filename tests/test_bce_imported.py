"""BCE on probabilities in the code a training file imports (transforms/torch/bce_imported.py):
found through the module's own torch aliases, fused with the sigmoid it applies, or refused with
the reason."""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from ampify.transforms.torch.bce_imported import bce_lines, logits_bce


def _lines(source: str):
    return bce_lines(ast.parse(textwrap.dedent(source)))


def test_bce_is_found_through_every_alias_with_the_names_that_reach_it_unless_never_called():
    found = _lines("""
        import torch
        import torch.nn.functional as F
        from torch import nn
        from torch.nn import BCELoss as Plain

        def loss_a(p, y):
            return F.binary_cross_entropy(p, y)

        class Loss(nn.Module):
            def __init__(self):
                super().__init__()
                self.bce = nn.BCELoss()
                self.other = Plain()

            def forward(self, p, y):
                return self.bce(p, y) + torch.nn.functional.binary_cross_entropy(p, y)

        def fine(x, y):
            return F.binary_cross_entropy_with_logits(x, y) + nn.BCEWithLogitsLoss()(x, y)

        criterion = nn.BCELoss()  # module level: no function of the module runs it
    """)
    assert found == [
        (8, "F.binary_cross_entropy", ("loss_a",)),
        (13, "nn.BCELoss", ("Loss",)),
        (17, "torch.nn.functional.binary_cross_entropy", ("Loss",)),
    ]  # self.other is built and never called: no BCE runs


def test_a_name_that_is_not_torch_is_not_a_bce():
    assert _lines("""
        import mylosses as F

        def loss(p, y):
            return F.binary_cross_entropy(p, y)
    """) == []


@pytest.mark.parametrize("body, fused", [
    ("return F.binary_cross_entropy(torch.sigmoid(out), target)",
     "return F.binary_cross_entropy_with_logits(out, target)"),
    ("prob = torch.sigmoid(out)\n    return F.binary_cross_entropy(prob, torch.ones_like(prob))",
     "prob = out\n    return F.binary_cross_entropy_with_logits(prob, torch.ones_like(prob))"),
])
def test_a_bce_of_the_sigmoid_the_module_applies_is_fused(body, fused):
    source = f"import torch\nimport torch.nn.functional as F\n\n\ndef loss(out, target):\n    {body}\n"
    module, refused = logits_bce(cst.parse_module(source))
    assert refused is None and module.code == source.replace(body, fused)


def test_a_bce_of_probabilities_handed_in_is_refused_and_a_fused_module_is_left_alone():
    handed = "import torch.nn.functional as F\n\n\ndef loss(probs, target):\n    return F.binary_cross_entropy(probs, target)\n"
    module, refused = logits_bce(cst.parse_module(handed))
    assert module is None and "does not take a sigmoid it applies itself" in refused
    done = "import torch.nn.functional as F\n\n\ndef loss(x, t):\n    return F.binary_cross_entropy_with_logits(x, t)\n"
    assert logits_bce(cst.parse_module(done)) == (None, None)
