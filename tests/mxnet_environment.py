"""The MXNet environment of the Gluon tests: a second venv (`.venv-mxnet`, made by the README's test
command), since MXNet 1.9.1 needs numpy 1.23 and conflicts with TensorFlow and PyTorch here."""

import os
import subprocess
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the interpreter of the MXNet environment (AMPIFY_MXNET_PYTHON overrides the default place)
MXNET_PYTHON = Path(os.environ.get("AMPIFY_MXNET_PYTHON", ROOT / ".venv-mxnet" / "bin" / "python"))


def _mxnet_version() -> Optional[str]:
    if not MXNET_PYTHON.exists():
        return None
    completed = subprocess.run([str(MXNET_PYTHON), "-c", "import mxnet; print(mxnet.__version__)"],
                               capture_output=True, text=True, timeout=120)
    return completed.stdout.strip() if completed.returncode == 0 else None


def mxnet_python() -> str:
    """The MXNet interpreter, or skip with the reason (the README's test command installs it)."""
    version = _mxnet_version()
    if version is None:
        pytest.skip(f"no MXNet environment at {MXNET_PYTHON}: the README's test command creates it with "
                    "`python3 -m venv .venv-mxnet && .venv-mxnet/bin/pip install mxnet==1.9.1 numpy==1.23.5`; "
                    "it could not be installed here")
    return str(MXNET_PYTHON)


def run_mxnet(script: Path, python: str, timeout: int = 300) -> dict:
    """Run a script in the MXNet environment; its `key value...` lines as a dict (losses as a list)."""
    completed = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=timeout,
                               cwd=str(script.parent))
    assert completed.returncode == 0, completed.stderr[-3000:]
    seen: dict = {"loss": []}
    for line in completed.stdout.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "loss":
            seen["loss"].append([float(value) for value in parts[2:]])
        else:
            seen[parts[0]] = parts[1:]
    return seen
