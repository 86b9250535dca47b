"""apex backend, where amp.initialize goes when the script's layout is not the plain one, run on
CPU against the apex stand-in (fixtures/verify/apex_standin) and compared with the float32 run:

- the DataParallel/DDP wrap comes before the optimizer (#15 item 5): the optimizer is built from
  the model above the wrap, so amp.initialize sees the unwrapped model (the stand-in rejects
  wrapped models as apex's check_models does, proved here on the naive order);
- the optimizer is handed to a trainer class (#14): amp.initialize goes in its __init__."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampify.engine import convert_source
from ampify.findings import FileStatus
from ampify.options import Options

STANDIN = Path(__file__).resolve().parent.parent / "fixtures" / "verify" / "apex_standin"

SCRIPT = '''\
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
dp_model = nn.DataParallel(model)
criterion = nn.MSELoss()
optimizer = torch.optim.SGD(dp_model.parameters(), lr=0.05)
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(20):
    optimizer.zero_grad()
    loss = criterion(dp_model(x), y)
    loss.backward()
    optimizer.step()
    print("loss", loss.item())
'''


def _run(path: Path, with_standin: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(STANDIN) if with_standin else "")
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=path.parent,
                          env=env)


def _losses(stdout: str):
    return [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("loss ")]


def test_the_converted_script_initializes_the_unwrapped_model_and_trains(tmp_path):
    original = tmp_path / "original.py"
    original.write_text(SCRIPT)
    fp32 = _run(original, with_standin=False)
    assert fp32.returncode == 0, fp32.stderr[-2000:]

    conversion = convert_source(SCRIPT, filename="train.py", options=Options(backend="apex"))
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    text = conversion.converted
    assert [f.code for f in conversion.findings if f.code == "AMP308"] == ["AMP308"]
    lines = text.splitlines()
    optimizer = lines.index("optimizer = torch.optim.SGD(model.parameters(), lr=0.05)")
    initialize = lines.index('model, optimizer = amp.initialize(model, optimizer, opt_level="O1")')
    wrap = lines.index("dp_model = nn.DataParallel(model)")
    assert optimizer < initialize < wrap
    converted = tmp_path / "converted.py"
    converted.write_text(text)
    amp_run = _run(converted, with_standin=True)
    assert amp_run.returncode == 0, amp_run.stderr[-2000:]
    before, after = _losses(fp32.stdout), _losses(amp_run.stdout)
    assert len(before) == len(after) == 20
    assert after[-1] < after[0] / 2  # it trains
    # apex's dynamic scaler starts at 2**16 and skips the first steps that overflow, halving the
    # scale (the loss stays put); after them the run follows the float32 one step for step
    skipped = next(k for k in range(len(after)) if after[k + 1] != after[0])
    assert skipped <= 3, after
    for old, new in zip(before, after[skipped:]):
        assert abs(old - new) <= 0.02 * max(abs(old), 1e-3), (before, after)


def test_the_standin_rejects_a_wrapped_model_as_apex_does(tmp_path):
    """The naive conversion (amp.initialize where the optimizer was, after the wrap) fails the way
    real apex fails: the reason the optimizer has to move."""
    naive = SCRIPT.replace("import torch\n", "import torch\nfrom apex import amp\n", 1).replace(
        "optimizer = torch.optim.SGD(dp_model.parameters(), lr=0.05)\n",
        "optimizer = torch.optim.SGD(dp_model.parameters(), lr=0.05)\n"
        'dp_model, optimizer = amp.initialize(dp_model, optimizer, opt_level="O1")\n',
    )
    path = tmp_path / "naive.py"
    path.write_text(naive)
    run = _run(path, with_standin=True)
    assert run.returncode != 0
    assert "Incoming model is an instance of torch.nn.parallel.DataParallel" in run.stderr


TRAINER = '''\
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, optimizer, device):
        self.device = device
        self.model = model.to(device)
        self.optimizer = optimizer

    def run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source.to(self.device)), targets.to(self.device))
        loss.backward()
        self.optimizer.step()
        print("loss", loss.item())


def load_train_objs():
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return model, optimizer


torch.manual_seed(0)
model, optimizer = load_train_objs()
trainer = Trainer(model, optimizer, torch.device("cpu"))
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(20):
    trainer.run_batch(x, y)
'''


def test_an_optimizer_handed_to_a_trainer_class_is_initialized_in_its_init(tmp_path):
    original = tmp_path / "original.py"
    original.write_text(TRAINER)
    fp32 = _run(original, with_standin=False)
    assert fp32.returncode == 0, fp32.stderr[-2000:]
    conversion = convert_source(TRAINER, filename="train.py", options=Options(backend="apex"))
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    lines = conversion.converted.splitlines()
    initialize = lines.index('        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")')
    assert lines[initialize - 1] == "        self.optimizer = optimizer"
    converted = tmp_path / "converted.py"
    converted.write_text(conversion.converted)
    amp_run = _run(converted, with_standin=True)
    assert amp_run.returncode == 0, amp_run.stderr[-2000:]
    before, after = _losses(fp32.stdout), _losses(amp_run.stdout)
    assert len(before) == len(after) == 20 and after[-1] < after[0] / 2
    skipped = next(k for k in range(len(after)) if after[k + 1] != after[0])
    assert skipped <= 3, after
    for old, new in zip(before, after[skipped:]):
        assert abs(old - new) <= 0.02 * max(abs(old), 1e-3), (before, after)


def test_a_gradient_penalty_scaled_with_apex_loss_scale_equals_the_fp32_penalty(tmp_path):
    """The WGAN-GP executable fixture converted for apex (AMP328): the penalty differentiates the
    critic's scores times apex's loss scale of the critic's loss and divides the gradients by it.
    Run against the stand-in (float16 forward, dynamic scaling as apex does it), the penalty equals
    the float32 one within float16's tolerance; the first iteration overflows at the initial scale
    (2**16), which skips that step and halves the scale, as the native recipe does."""
    source = (Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / "exec" / "wgan_gp.py").read_text()
    conversion = convert_source(source, filename="wgan_gp.py", options=Options(backend="apex"))
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    assert "AMP328" in {f.code for f in conversion.findings} and "AMP312" not in {f.code for f in conversion.findings}
    probe = "\nprint('penalties', *PENALTIES)\n"  # the fixture ends by calling run()
    original = tmp_path / "original.py"
    original.write_text(source + probe)
    converted = tmp_path / "converted.py"
    converted.write_text(conversion.converted + probe)

    def penalties(run: subprocess.CompletedProcess):
        assert run.returncode == 0, run.stderr[-2000:]
        line = next(line for line in run.stdout.splitlines() if line.startswith("penalties "))
        return [float(value) for value in line.split()[1:]]

    fp32 = penalties(_run(original, with_standin=False))
    mixed = penalties(_run(converted, with_standin=True))
    assert len(fp32) == len(mixed) == 3
    assert not math.isfinite(mixed[0]), mixed  # 2**16 times the scores' gradients overflows float16
    for new, old in zip(mixed[1:], fp32[1:]):
        assert new == pytest.approx(old, rel=5e-2, abs=1e-3), (mixed, fp32)
