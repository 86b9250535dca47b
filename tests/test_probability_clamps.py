"""Probability clamps that reduced precision rounds away (AMP244 / apex AMP337): `p = clamp(p, lo, 1 - eps)`
before `log(1 - p)`, in the training file or the model code it imports (repository goldens
probability_clamp_*). The premise is shown with torch on CPU: in float16 the clamp's bound 1 - 1e-4 is
1.0, `log(1 - p)` is -inf and the focal loss NaN, while a float32 copy keeps the bound and the loss
finite."""

from __future__ import annotations

import ast
import math
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


IN_FILE = textwrap.dedent('''
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(8, 1), torch.nn.Sigmoid()).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def focal(p, t):
        p = torch.clamp(p, 1e-7, 1 - 1e-7)
        return (-(t * torch.log(p) + (1 - t) * torch.log(1 - p))).mean()

    losses = []
    for step in range(2):
        x = torch.ones(4, 8, device=device)
        loss = focal(model(x), torch.tensor([[1.0], [0.0], [1.0], [0.0]], device=device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    ''')


def test_in_the_training_file_itself_the_clamp_takes_a_float32_copy():
    conversion = convert_source(IN_FILE, Options())
    assert conversion.status is FileStatus.CHANGED, conversion
    assert "p = torch.clamp(p.float(), 1e-7, 1 - 1e-7)" in conversion.converted
    assert "scaler.scale(loss).backward()" in conversion.converted
    assert any(f.code == "AMP246" and f.line == 9 and "torch.clamp(p, 1e-07, 1 - 1e-07)" in f.message
               for f in conversion.findings), conversion.findings
    again = convert_source(conversion.converted, Options())
    assert again.status is FileStatus.ALREADY_MIXED_PRECISION, again


def test_apex_clamps_a_float32_copy_too():
    conversion = convert_source(IN_FILE.replace('"cuda" if torch.cuda.is_available() else "cpu"', '"cuda"'),
                                Options(backend="apex"))
    assert conversion.status is FileStatus.CHANGED, conversion
    assert "p = torch.clamp(p.float(), 1e-7, 1 - 1e-7)" in conversion.converted
    assert any(f.code == "AMP339" for f in conversion.findings), conversion.findings


@pytest.mark.parametrize("clamp, rewritten", [
    ("p = torch.clamp(p, 1e-4, 1.0 - 1e-4)", "p = torch.clamp(p.float(), 1e-4, 1.0 - 1e-4)"),
    ("p = p.clamp(1e-7, 1 - 1e-7)", "p = p.float().clamp(1e-7, 1 - 1e-7)"),
    ("p = torch.clamp(p[:, 0], min=1e-6, max=1 - 1e-6)", "p = torch.clamp(p[:, 0].float(), min=1e-6, max=1 - 1e-6)"),
    ("p = torch.clamp(p * m, 1e-5, 0.99999)", "p = torch.clamp((p * m).float(), 1e-5, 0.99999)"),
])
def test_the_rewrite_of_each_form(clamp, rewritten):
    import libcst as cst

    from ampify.transforms.torch.probability_clamps_float32 import float32_clamps

    source = f"import torch\n\n\ndef focal(p, t, m):\n    {clamp}\n    return torch.log(1 - p)\n"
    clamps = float32_clamps(cst.parse_module(source))
    assert clamps.module.code == source.replace(clamp, rewritten)
    assert clamps.rewritten == [(5, clamp.split(" = ", 1)[1].replace("1e-4", "0.0001").replace("1e-7", "1e-07")
                                 .replace("1e-6", "1e-06").replace("1e-5", "1e-05"))]
    assert float32_clamps(clamps.module) is None


def test_a_clamp_float16_keeps_is_left_alone_with_float16():
    import libcst as cst

    from ampify.transforms.torch.probability_clamps_float32 import float32_clamps

    source = "import torch\n\n\ndef focal(p):\n    p = torch.clamp(p, 1e-3, 1 - 1e-3)\n    return torch.log(1 - p)\n"
    assert float32_clamps(cst.parse_module(source), max_eps=ROUNDS_TO_ONE["float16"]) is None
    assert float32_clamps(cst.parse_module(source), max_eps=ROUNDS_TO_ONE["bfloat16"]) is not None


@pytest.mark.parametrize("bias, close", [(2.0, True), (12.0, False)])
def test_the_converted_focal_loss_runs_on_cpu_and_stays_finite(bias, close):
    """The converted script, run with float16 autocast on CPU: with a moderate logit its loss is the
    fp32 loss; with a confident one (sigmoid(12) is 1.0 in float16) it stays finite, where the same
    script with the clamp left alone is NaN."""
    pytest.importorskip("torch")
    conversion = convert_source(IN_FILE, Options())
    start = "import torch\ntorch.manual_seed(0)\n"
    setup = f"\nwith torch.no_grad():\n    model[0].weight.zero_()\n    model[0].bias.fill_({bias})\n"

    def run(code):
        code = code.replace("optimizer = torch.optim.SGD", setup.strip("\n") + "\noptimizer = torch.optim.SGD", 1)
        namespace = {}
        exec(compile(start + code, "<script>", "exec"), namespace)
        return namespace["losses"]

    fp32 = run(IN_FILE)
    mixed = run(conversion.converted)
    assert all(math.isfinite(loss) for loss in mixed)
    if close:
        assert mixed == pytest.approx(fp32, rel=1e-2)
    unfixed = run(conversion.converted.replace("torch.clamp(p.float(),", "torch.clamp(p,"))
    assert all(math.isfinite(loss) for loss in unfixed) is close
