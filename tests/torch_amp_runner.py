"""Test-only runner: run a training script with runpy and count matmul/conv outputs by dtype.

A TorchDispatchMode sits below autocast in the dispatcher, so it sees the ops after autocast
has cast their inputs: a float16/bfloat16 output of aten.mm/addmm/convolution proves that
reduced precision really ran. Used by tests/test_torch_native_exec.py; never by ampify itself.
"""

from __future__ import annotations

import collections
import runpy
from dataclasses import dataclass, field
from typing import Counter, Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: the compute-heavy ops autocast is meant to run in reduced precision
COUNTED_OPS = {"mm", "addmm", "bmm", "baddbmm", "convolution", "linear", "matmul"}


@dataclass
class RunEvidence:
    """What one script run did: counted op outputs by dtype, and the script's globals."""

    dtypes: Counter = field(default_factory=collections.Counter)
    #: GradScaler method calls: "scale", "step", "update", "unscale_", "load_state_dict", "state_dict"
    scaler_calls: Counter = field(default_factory=collections.Counter)
    #: total gradient norms seen by clip_grad_norm_ (scaled gradients would be ~65536x larger)
    clip_norms: List[float] = field(default_factory=list)
    script_globals: Dict[str, object] = field(default_factory=dict)

    def reduced(self, dtype: torch.dtype) -> int:
        return self.dtypes[dtype]


class _CountMatmuls(TorchDispatchMode):
    def __init__(self, evidence: RunEvidence) -> None:
        super().__init__()
        self.evidence = evidence

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in COUNTED_OPS and isinstance(result, torch.Tensor):
            self.evidence.dtypes[result.dtype] += 1
        return result


_SCALER_METHODS = ("scale", "step", "update", "unscale_", "load_state_dict", "state_dict")


def _counting(method, name, evidence):
    def counted(self, *args, **kwargs):
        evidence.scaler_calls[name] += 1
        return method(self, *args, **kwargs)

    return counted


def run_script(path: str) -> RunEvidence:
    """Run `path` as __main__ under the counting mode, counting GradScaler calls too."""
    evidence = RunEvidence()
    scaler_class = torch.amp.GradScaler
    originals = {name: getattr(scaler_class, name) for name in _SCALER_METHODS}
    original_clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(*args, **kwargs):
        norm = original_clip(*args, **kwargs)
        evidence.clip_norms.append(float(norm))
        return norm

    try:
        for name, method in originals.items():
            setattr(scaler_class, name, _counting(method, name, evidence))
        torch.nn.utils.clip_grad_norm_ = recording_clip
        with _CountMatmuls(evidence):
            evidence.script_globals = runpy.run_path(path, run_name="__main__")
    finally:
        for name, method in originals.items():
            setattr(scaler_class, name, method)
        torch.nn.utils.clip_grad_norm_ = original_clip
    return evidence
