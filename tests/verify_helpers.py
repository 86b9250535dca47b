"""Shared paths and settings for the `ampify verify` tests."""
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "fixtures" / "verify"


@pytest.fixture
def tf1_env(monkeypatch):
    """TF1 fixtures use tf.layers, which needs legacy Keras under TF 2.16+."""
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")


def process_is_gone(pid: int) -> bool:
    """True when `pid` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open("/proc/%d/status" % pid) as status:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in status)
    except OSError:
        return True
