"""Losses of compiled extensions that take float32 activations only.

Baidu's warp-ctc binding (`warpctc_pytorch.CTCLoss`, used by OCR and speech code from before
`torch.nn.CTCLoss`) hands the activations' data pointer to a float kernel: float16 activations
from autocast (or apex O1) make it raise. Such a loss gets its first argument cast to float32,
`criterion(preds.float(), text, preds_size, length)`: a no-op where the activations are float32
already (another branch builds `torch.nn.CTCLoss`, which autocast runs in float32 anyway).
"""

from __future__ import annotations

from typing import List, Tuple

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.statements import calls_within
from ampify.transforms.torch.training_loop import TrainingStructure

#: constructors of loss modules whose forward() takes float32 activations only
FLOAT32_ONLY_LOSSES = ("warpctc_pytorch.CTCLoss",)


def float32_only_loss_calls(s: TrainingStructure, node: cst.CSTNode) -> List[Tuple[cst.Call, str]]:
    """Calls within `node` of a name or `self.` attribute that the file binds (anywhere) to one
    of FLOAT32_ONLY_LOSSES, with a first positional argument to cast; (call, constructor)."""
    built = {}
    for binding in s.bindings:
        if binding.qualified_call in FLOAT32_ONLY_LOSSES and binding.statement is not None:
            built.setdefault(binding.name, f"{binding.qualified_call} at line {s.line(binding.statement)}")
    if not built:
        return []
    found = []
    for call in calls_within(node):
        called = dotted_name(call.func)
        if called not in built or not call.args:
            continue
        first = call.args[0]
        if first.keyword is not None or first.star:
            continue
        if _is_float_cast(first.value):
            continue
        found.append((call, built[called]))
    return found


def _is_float_cast(value: cst.BaseExpression) -> bool:
    """`x.float()` already."""
    return (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "float"
        and not value.args
    )
