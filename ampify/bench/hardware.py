"""What the machine can gain from mixed precision, said before any figure is shown.

The device is asked through the training interpreter (`--python`), never this one, which may
not have torch; `query_device` is the one place that talks to it (tests replace it).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

_QUERY = (
    "import json, torch\n"
    "cuda = torch.cuda.is_available()\n"
    "print(json.dumps({'cuda': cuda, 'name': torch.cuda.get_device_name() if cuda else None,\n"
    "    'capability': list(torch.cuda.get_device_capability()) if cuda else None}))\n"
)


@dataclass
class Device:
    cuda: bool
    name: Optional[str] = None
    capability: Optional[Tuple[int, int]] = None
    #: CPU flags that matter for bfloat16 (avx512_bf16, amx_bf16)
    cpu_bf16_flags: List[str] = field(default_factory=list)


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> List[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return sorted(flags & {"avx512_bf16", "amx_bf16"})


#: MXNet reports how many GPUs it sees, not their compute capability
_MXNET_QUERY = (
    "import json, mxnet\n"
    "print(json.dumps({'cuda': mxnet.context.num_gpus() > 0, 'name': None, 'capability': None}))\n"
)


_TENSORFLOW_QUERY = (
    "import json, os\n"
    "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')\n"
    "import tensorflow as tf\n"
    "gpus = tf.config.list_physical_devices('GPU')\n"
    "details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}\n"
    "print(json.dumps({'cuda': bool(gpus), 'name': details.get('device_name'),\n"
    "    'capability': list(details['compute_capability']) if details.get('compute_capability') else None}))\n"
)
_QUERIES = {"torch": _QUERY, "mxnet": _MXNET_QUERY, "tensorflow": _TENSORFLOW_QUERY}


def query_device(python: str, framework: str = "torch") -> Optional[Device]:
    """The GPU the training interpreter sees (asked through `framework`: "torch", "mxnet" or
    "tensorflow"), or None when the framework cannot be asked."""
    try:
        completed = subprocess.run([python, "-c", _QUERIES[framework]],
                                   capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        data = json.loads(completed.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    capability = tuple(data["capability"]) if data.get("capability") else None
    return Device(bool(data.get("cuda")), data.get("name"), capability, cpu_bf16_flags())


def expectations(device: Optional[Device], dtype: str) -> List[str]:
    """What to expect, in plain words, before the figures."""
    if device is None:
        return ["the device could not be queried (the framework did not import in the training interpreter)"]
    if not device.cuda:
        lines = ["CPU only (no CUDA GPU): a CPU run is a correctness check of the converted script, not a speed "
                 "claim (reduced precision on a CPU is often slower than float32)"]
        if dtype == "bfloat16":
            lines.append("this CPU has " + ", ".join(device.cpu_bf16_flags) + ": bfloat16 matmuls run natively"
                         if device.cpu_bf16_flags else
                         "this CPU has no AVX512-BF16 or AMX: bfloat16 is emulated and slower")
        return lines
    if device.capability is None:
        return [f"a CUDA GPU, whose compute capability the framework does not report: {dtype} pays off with tensor "
                "cores (compute capability 7.0, and 8.0 for bfloat16)"]
    major, minor = device.capability
    where = f"{device.name} (compute capability {major}.{minor})"
    if dtype == "bfloat16" and major < 8:
        return [f"{where}: bfloat16 needs compute capability 8.0 (Ampere) or newer; expect no speed-up"]
    if major < 7:
        return [f"{where} has no tensor cores: float16 will not be faster, and memory may not shrink either "
                "(the field report's case)"]
    return [f"{where} has tensor cores: matmuls and convolutions can run several times faster in {dtype}"]
