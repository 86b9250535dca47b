"""The MXNet environment of the Gluon tests: a second venv (`.venv-mxnet`, made by the README's test
command), since MXNet 1.9.1 needs numpy 1.23 and conflicts with TensorFlow and PyTorch here."""

import functools
import os
import platform
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


#: a bfloat16 forward pass under amp, as every converted Gluon script here runs one
_BFLOAT16_PROBE = """
from mxnet import autograd, gluon, nd
from mxnet.contrib import amp
amp.init(target_dtype="bfloat16")
net = gluon.nn.Dense(4)
net.initialize()
with autograd.record():
    out = net(nd.ones((2, 8)))
print(out.astype("float32").asnumpy().sum())
"""


@functools.lru_cache(maxsize=None)
def _bfloat16_failure(python: str) -> Optional[str]:
    completed = subprocess.run([python, "-c", _BFLOAT16_PROBE], capture_output=True, text=True, timeout=300)
    if completed.returncode == 0:
        return None
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {completed.returncode}"


def mxnet_bfloat16_python() -> str:
    """The MXNet interpreter where MXNet can compute in bfloat16 on this CPU, or skip with the
    reason. MXNet 1.9.1 runs bfloat16 through oneDNN only, whose kernels need AVX-512 (an AMD EPYC
    without it fails: "could not create a primitive descriptor iterator"); float16 needs CuDNN."""
    python = mxnet_python()
    failure = _bfloat16_failure(python)
    if failure is not None:
        cpu = _cpu_name()
        pytest.skip(f"MXNet cannot compute in bfloat16 on this CPU ({cpu}): its oneDNN kernels need AVX-512 "
                    f"({failure})")
    return python


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


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
