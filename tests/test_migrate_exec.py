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
    assert "AMP401 migrated deprecated torch.cuda.amp.GradScaler" in check.stdout
    assert "1 would be changed" in check.stdout
    kept = _ampify("--check", "--no-migrate", script)
    assert kept.returncode == 0 and "1 already mixed precision" in kept.stdout, kept.stdout + kept.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.ampify]\nmigrate = false\n")
    configured = _ampify("--check", script)
    assert configured.returncode == 0 and "1 already mixed precision" in configured.stdout, configured.stdout
    assert script.read_bytes() == before
