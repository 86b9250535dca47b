"""Rewrite then verify, as a user would: `ampify SCRIPT --verify SCRIPT` on the bundled examples.

Real TensorFlow and real PyTorch run here on the CPU: TF1 through verify's CPU emulation of the
graph rewrite, PyTorch through CPU autocast (the examples pick their device at run time).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ampify(*args, cwd):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="0", PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "ampify", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=300,
    )


@pytest.mark.parametrize(
    "example, change_code, evidence",
    [
        ("tf1_classifier.py", "AMP101", "CPU emulation"),
        ("torch_classifier.py", "AMP201", "ran in float16"),
    ],
)
def test_example_is_rewritten_and_verified_on_cpu(tmp_path, example, change_code, evidence):
    script = tmp_path / example
    shutil.copy(ROOT / "examples" / example, script)

    before = ampify("verify", script, cwd=tmp_path)
    assert before.returncode == 1, before.stdout + before.stderr
    assert "not active" in before.stdout

    result = ampify(script, "--verify", script, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert change_code in result.stdout
    assert "verified" in result.stdout and evidence in result.stdout
