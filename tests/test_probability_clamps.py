"""Probability clamps that reduced precision rounds away (AMP244 / apex AMP337): `p = clamp(p, lo, 1 - eps)`
before `log(1 - p)`, in the training file or the model code it imports (repository goldens
probability_clamp_*). The premise is shown with torch on CPU: in float16 the clamp's bound 1 - 1e-4 is
1.0, `log(1 - p)` is -inf and the focal loss NaN, while a float32 copy keeps the bound and the loss
finite."""

from __future__ import annotations

import ast
import textwrap

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.transforms.torch.probability_clamps import ROUNDS_TO_ONE, probability_clamps

LOSS = '''
def focal(p, t):
    p = {clamp}
    return -(t * torch.log(p) + (1.0 - t) * torch.log({complement}))
'''


@pytest.mark.parametrize("clamp,complement,eps", [
    ("torch.clamp(p, 1e-4, 1.0 - 1e-4)", "1.0 - p", 1e-4),
    ("p.clamp(1e-7, 1 - 1e-7)", "1 - p", 1e-7),
    ("torch.clamp(p, min=1e-6, max=1 - 1e-6)", "1 - p", 1e-6),
    ("p.clamp(min=1e-4, max=0.9999)", "1.0 - p", 1e-4),
    ("torch.clamp(p, 1e-4, 1.0 - 1e-4)", "p", None),  # no log of the complement
    ("torch.clamp(p, 0.0, 1.0)", "1.0 - p", None),  # no gap below 1
    ("np.clip(p, 1e-7, 1 - 1e-7)", "1 - p", None),  # numpy: not a tensor under autocast
    ("torch.clamp(p.float(), 1e-4, 1.0 - 1e-4)", "1.0 - p", None),  # a float32 copy: the bound holds
    ("p.float().clamp(1e-4, 1.0 - 1e-4)", "1.0 - p", None),
])
def test_which_clamps_count(clamp, complement, eps):
    found = probability_clamps(ast.parse(textwrap.dedent(LOSS.format(clamp=clamp, complement=complement))))
    if eps is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0][2] == pytest.approx(eps)


@pytest.mark.parametrize("eps,dtype,rounds", [
    (1e-4, "float16", True), (1e-3, "float16", False), (1e-3, "bfloat16", True), (1e-2, "bfloat16", False)])
def test_the_premise_the_bound_rounds_to_one(eps, dtype, rounds):
    import torch
    reduced = getattr(torch, dtype)
    p = torch.tensor([0.99999, 0.5], dtype=reduced)
    clamped = torch.clamp(p, eps, 1.0 - eps)
    assert (clamped[0].item() == 1.0) is rounds
    assert (eps <= ROUNDS_TO_ONE[dtype]) is rounds
    if rounds:
        target = torch.tensor([1.0, 0.0])
        loss = -(target * torch.log(clamped.float()) + (1.0 - target) * torch.log(1.0 - clamped.float()))
        assert torch.isnan(loss[0])  # 0 * -inf
        fixed = torch.clamp(p.float(), eps, 1.0 - eps)
        assert torch.isfinite(-(target * torch.log(fixed) + (1.0 - target) * torch.log(1.0 - fixed))).all()


def test_in_the_training_file_itself_without_a_project():
    source = textwrap.dedent('''
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(8, 1), torch.nn.Sigmoid()).to("cuda")
        optimizer = torch.optim.Adam(model.parameters())

        def focal(p, t):
            p = torch.clamp(p, 1e-7, 1 - 1e-7)
            return (-(t * torch.log(p) + (1 - t) * torch.log(1 - p))).mean()

        for step in range(10):
            x = torch.randn(4, 8, device="cuda")
            loss = focal(model(x), torch.ones(4, 1, device="cuda"))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        ''')
    conversion = convert_source(source, Options())
    assert conversion.status is FileStatus.UNCONVERTED, conversion
    assert any(f.code == "AMP244" and "line 8 torch.clamp(p, 1e-07, 1 - 1e-07)" in f.message
               for f in conversion.findings), conversion.findings
