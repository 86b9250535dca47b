"""Migrated scripts run on CPU without a FutureWarning and train exactly as before (issue #17)."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from ampify.convert import convert_source
from ampify.findings import FileStatus

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "migrate" / "exec_cpu_training.py"


def _run(path: Path, *warning_flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *warning_flags, str(path)], capture_output=True, text=True, timeout=300)


def test_migrated_script_trains_the_same_without_future_warnings(tmp_path):
    original = _run(SCRIPT)
    assert original.returncode == 0, original.stderr[-2000:]
    # the deprecated APIs really warn: the check below could fail
    strict_original = _run(SCRIPT, "-W", "error::FutureWarning")
    assert strict_original.returncode != 0 and "FutureWarning" in strict_original.stderr

    conversion = convert_source(SCRIPT.read_bytes(), filename=str(SCRIPT))
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    migrated_text = conversion.converted.decode()
    assert "torch.cuda.amp" not in migrated_text and "torch.cpu.amp" not in migrated_text
    assert 'autocast("cpu", enabled=True, dtype=torch.bfloat16)' in migrated_text
    migrated = tmp_path / "exec_cpu_training.py"
    migrated.write_bytes(conversion.converted)

    strict = _run(migrated, "-W", "error::FutureWarning")
    assert strict.returncode == 0, strict.stderr[-2000:]
    assert strict.stdout.endswith("ok\n")
    # autocast still on (asserted inside), and the same losses to the last printed digit
    assert strict.stdout == original.stdout


def _ampify(*args, cwd=None):
    import os

    return subprocess.run([sys.executable, "-m", "ampify", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


def test_check_fails_on_deprecated_use_unless_migration_is_off(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n\nscaler = torch.cuda.amp.GradScaler()\nwith torch.cuda.amp.autocast():\n"
        "    loss = model(x)\nscaler.scale(loss).backward()\nscaler.step(opt)\nscaler.update()\n"
    )
    before = script.read_bytes()
    check = _ampify("--check", script)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "AMP401 would migrate deprecated torch.cuda.amp.GradScaler" in check.stdout
    assert "1 would be changed" in check.stdout
    kept = _ampify("--check", "--no-migrate", script)
    assert kept.returncode == 0 and "1 already mixed precision" in kept.stdout, kept.stdout + kept.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.ampify]\nmigrate = false\n")
    configured = _ampify("--check", script)
    assert configured.returncode == 0 and "1 already mixed precision" in configured.stdout, configured.stdout
    assert script.read_bytes() == before


def _losses(stdout: str):
    return [float(line.split()[1]) for line in stdout.splitlines() if line.startswith("loss ")]


def test_migrated_apex_script_trains_like_the_original_on_cpu(tmp_path):
    """apex amp -> torch.amp: the original runs against a CPU stand-in of apex.amp (real apex is
    not installable and refuses CPU models); the migrated script needs no apex at all."""
    import os

    script = SCRIPT.with_name("exec_apex_training.py")
    standin = SCRIPT.parent.parent / "verify" / "apex_standin"
    original = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(standin)))
    assert original.returncode == 0, original.stderr[-2000:]

    conversion = convert_source(script.read_bytes(), filename=str(script))
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    text = conversion.converted.decode()
    code = text.split('"""', 2)[2]  # after the docstring
    assert "apex" not in code and "amp.scale_loss" not in code and "amp.initialize" not in code
    assert "scaler = torch.amp.GradScaler(device.type)" in text and "scaler.unscale_(optimizer)" in text
    migrated = tmp_path / "migrated.py"
    migrated.write_bytes(conversion.converted)
    run = subprocess.run([sys.executable, "-W", "error::FutureWarning", str(migrated)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=""))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "dtype torch.float16" in run.stdout  # the forward pass runs under float16 autocast
    before, after = _losses(original.stdout), _losses(run.stdout)
    assert len(before) == len(after) == 20
    assert after[-1] < after[0] / 2  # it trains
    for old, new in zip(before, after):
        assert abs(old - new) <= 0.02 * max(abs(old), 1e-3), (before, after)
    checkpoint = __import__("torch").load(tmp_path / "checkpoint.pt")
    assert set(checkpoint) == {"model", "optimizer", "scaler"}


def test_a_static_apex_loss_scale_stays_static_after_migration(tmp_path):
    """`loss_scale=128.0` -> GradScaler(init_scale=128.0, growth_interval=2**30): after 20 finite
    steps the scale is still 128 (a dynamic GradScaler would keep its 65536 or grow), and it trains."""
    import os

    source = SCRIPT.with_name("exec_apex_training.py").read_text()
    assert source.count('opt_level="O1"') == 1
    source = source.replace('opt_level="O1"', 'opt_level="O1", loss_scale=128.0')
    conversion = convert_source(source, filename="static.py")
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    text = conversion.converted
    assert "GradScaler(device.type, init_scale=128.0, growth_interval=2**30)" in text
    migrated = tmp_path / "migrated.py"
    migrated.write_text(text + '\nprint("scale", scaler.get_scale())\n')
    run = subprocess.run([sys.executable, str(migrated)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=""))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "scale 128.0" in run.stdout.splitlines()
    losses = _losses(run.stdout)
    assert len(losses) == 20 and losses[-1] < losses[0] / 2


@pytest.mark.parametrize("flag", [["--fp16"], []], ids=["fp16", "fp32"])
def test_apex_behind_a_flag_migrates_to_torch_amp_switched_by_that_flag(tmp_path, flag):
    """`if args.fp16: amp.initialize(...)` -> autocast and GradScaler(enabled=args.fp16): with the flag
    the migrated script trains in float16 like the apex original (CPU stand-in); without it, both
    train in float32 and give the same losses exactly."""
    import os

    script = SCRIPT.with_name("exec_apex_flag.py")
    standin = SCRIPT.parent.parent / "verify" / "apex_standin"
    original = subprocess.run([sys.executable, str(script), *flag], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(standin)))
    assert original.returncode == 0, original.stderr[-2000:]
    conversion = convert_source(script.read_bytes(), filename=str(script))
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    text = conversion.converted.decode()
    assert "enabled=args.fp16" in text and "amp.initialize" not in text and "if args.fp16" not in text
    migrated = tmp_path / "migrated.py"
    migrated.write_bytes(conversion.converted)
    run = subprocess.run([sys.executable, "-W", "error::FutureWarning", str(migrated), *flag], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=""))
    assert run.returncode == 0, run.stderr[-2000:]
    dtype = "torch.float16" if flag else "torch.float32"
    assert all(line.endswith(dtype) for line in run.stdout.splitlines() if line.startswith("loss "))
    before, after = _losses(original.stdout), _losses(run.stdout)
    assert len(before) == len(after) == 20 and after[-1] < after[0] / 2
    for old, new in zip(before, after):
        assert abs(old - new) <= (0.02 * max(abs(old), 1e-3) if flag else 0.0), (before, after)


def test_a_disable_casts_region_runs_without_autocast_after_migration(tmp_path):
    """`with amp.disable_casts():` -> `with torch.autocast(device_type=device.type, enabled=False):` inside
    the converted autocast region: the model's matmul runs in float16, the matmul inside in float32."""
    import os

    source = SCRIPT.with_name("exec_apex_training.py").read_text()
    old = "    loss = torch.nn.functional.mse_loss(output.float(), target.to(device))\n"
    assert old in source
    source = source.replace(old, "    with amp.disable_casts():\n        product = output.float() @ torch.eye(1)\n"
                                 "        loss = torch.nn.functional.mse_loss(product, target.to(device))\n")
    conversion = convert_source(source, filename="disable_casts.py")
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    text = conversion.converted
    assert "with torch.autocast(device_type=device.type, enabled=False):" in text and "disable_casts" not in text
    migrated = tmp_path / "migrated.py"
    migrated.write_text(text.replace('print("loss %.6f dtype %s" % (loss.item(), output.dtype))',
                                     'print("loss %.6f dtype %s inside %s" % (loss.item(), output.dtype, product.dtype))'))
    run = subprocess.run([sys.executable, str(migrated)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=""))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("loss ")]
    # a matmul under autocast would give float16: inside the region it stays float32
    assert len(lines) == 20 and all(line.endswith("dtype torch.float16 inside torch.float32") for line in lines)


_TRAINING = SCRIPT.with_name("exec_apex_training.py").read_text()


def _variant(edits):
    source = _TRAINING
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return source


@pytest.mark.parametrize("name,edits,dtype", [
    ("O0", [('opt_level="O1"', 'opt_level="O0"')], "torch.float32"),
    ("O2 with .half()", [('opt_level="O1"', 'opt_level="O2"'),
                         (".to(device)\noptimizer", ".to(device).half()\noptimizer"),
                         ("model(data.to(device))", "model(data.to(device).half())")], "torch.float16"),
    ("delay_unscale", [("with amp.scale_loss(loss, optimizer) as scaled_loss:",
                        "with amp.scale_loss(loss, optimizer, delay_unscale=step % 2 == 0) as scaled_loss:"),
                       ("    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 5.0)\n    optimizer.step()\n",
                        "    if step % 2 == 1:\n        optimizer.step()\n")], "torch.float16"),
])
def test_each_apex_mapping_runs_migrated_on_cpu(tmp_path, name, edits, dtype):
    """The migrations goldens show, run: O0 stays float32 without apex, O2's `.half()` goes and the
    model trains in autocast's float16 with float32 weights, delay_unscale accumulates scaled
    gradients until the boundary step."""
    import os

    conversion = convert_source(_variant(edits), filename=f"{name}.py")
    assert conversion.status in (FileStatus.CHANGED, FileStatus.CHANGED_INCOMPLETE), (conversion.reason, conversion.findings)
    text = conversion.converted
    assert "apex" not in text.split('"""', 2)[2] and ".half()" not in text
    migrated = tmp_path / "migrated.py"
    migrated.write_text(text)
    run = subprocess.run([sys.executable, "-W", "error::FutureWarning", str(migrated)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=""))
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("loss ")]
    assert len(lines) == 20 and all(line.endswith("dtype " + dtype) for line in lines)
    losses = _losses(run.stdout)
    assert losses[-1] < losses[0] / 2


def test_autocast_bound_as_a_value_migrates_and_still_casts(tmp_path):
    """LeeDoYup's FixMatch shape on CPU: `amp_cm = autocast if amp else nullcontext` of the deprecated
    torch.cpu.amp, called with keywords only. Migrated, the script runs with FutureWarning as an
    error, its forward pass still runs in bfloat16 under amp_cm, and its losses are the original's."""
    source = (
        "import contextlib\nimport torch\nfrom torch.cpu.amp import autocast\n\n"
        "torch.manual_seed(0)\nmodel = torch.nn.Linear(8, 4)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "amp_cm = autocast if True else contextlib.nullcontext\n"
        "for step in range(3):\n    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))\n"
        "    with amp_cm(dtype=torch.bfloat16):\n        out = model(x)\n        assert out.dtype == torch.bfloat16\n"
        "        loss = torch.nn.functional.cross_entropy(out, y)\n"
        "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()\n    print(f'loss {loss.item():.6f}')\n")
    script = tmp_path / "fixmatch_shape.py"
    script.write_text(source)
    original = _run(script)
    assert original.returncode == 0, original.stderr[-2000:]
    assert _run(script, "-W", "error::FutureWarning").returncode != 0
    conversion = convert_source(source, filename=str(script))
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    assert 'amp_cm = (lambda **kwargs: autocast("cpu", **kwargs)) if True' in conversion.converted
    migrated = tmp_path / "migrated.py"
    migrated.write_text(conversion.converted)
    strict = _run(migrated, "-W", "error::FutureWarning")
    assert strict.returncode == 0, strict.stderr[-2000:]
    assert strict.stdout == original.stdout and strict.stdout.count("loss ") == 3
