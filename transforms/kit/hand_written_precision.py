"""Mixed precision written by hand, recognised by the names such code uses in every framework.

Before AMP APIs existed, and in many research code bases since, mixed precision was written
by hand: an fp16 switch (`use_fp16`, `dtype == "mixed"`), float16 tensors, a loss multiplied by
a scale with the gradients divided back, a loss-scaler object or a loss-scaling optimizer
wrapper class of the repository's own, master weights in float32 (`FP16_Optimizer`,
`network_to_half`, `model_grads_to_master_grads`, often copied into the repository from apex's
`fp16_utils`). Adding an AMP wrapper on top stacks a second loss scale on the first and forces
float16 onto runs configured as float32: such a file is "already mixed precision", and the
finding names the evidence.

No framework knowledge here: the TF1 survey and the PyTorch analysis ask these questions of
the names they meet.
"""

from __future__ import annotations

import re
from typing import Optional

#: a loss scale, a loss scaler or loss scaling: `loss_scale`, `static_loss_scale`,
#: `LossScaler`, `dynamic_loss_scaling`, `self.loss_scaler`
_LOSS_SCALING = re.compile(r"loss_?scal(e|er|ing)(_|$)", re.IGNORECASE)

#: a switch for a half precision path of the code's own: `use_fp16`, `FLAGS.enable_float16`,
#: `args.with_mixed_precision` (a prefix is required: `fp16` alone also names horovod's fp16
#: gradient compression, `amp` alone an amplitude)
_FP16_SWITCH = re.compile(r"^(use|enable|with)_(fp16|float16|half|half_precision|mixed_precision|amp)$", re.IGNORECASE)

#: apex's `fp16_utils` (also found copied into repositories as `fp16util.py`): master weights
#: in float32, a model in float16, gradients copied between them
FP16_UTILS_NAMES = frozenset(
    {
        "FP16_Optimizer", "FP16_Module", "network_to_half", "convert_network", "BN_convert_float",
        "prep_param_lists", "model_grads_to_master_grads", "master_params_to_model_params",
        "tofp16", "DynamicLossScaler", "LossScaler",
    }
)

#: string values that select a half precision path (`dtype == "mixed"`, `precision="fp16"`)
HALF_PRECISION_STRINGS = frozenset({"float16", "fp16", "mixed", "half", "bfloat16", "bf16"})


def loss_scaling_evidence(identifier: str) -> Optional[str]:
    """A description when `identifier` names a hand-written loss scale or scaler."""
    if _LOSS_SCALING.search(identifier) and "LossScaleOptimizer" not in identifier:
        return f"manual loss scaling: {identifier}"
    return None


def fp16_switch_evidence(identifier: str) -> Optional[str]:
    """A description when `identifier` is a switch for a half precision path of the code's own."""
    if _FP16_SWITCH.match(identifier):
        return f"a half precision switch of its own: {identifier}"
    return None


def fp16_utils_evidence(identifier: str) -> Optional[str]:
    """A description when `identifier` is one of the fp16_utils master-weight helpers."""
    if identifier in FP16_UTILS_NAMES:
        return f"float32 master weights by hand: {identifier}"
    return None
