"""The one list of transforms, in the order they run."""

from __future__ import annotations

from typing import List

from ampify.options import Options
from ampify.transforms.base import Transform
from ampify.transforms.tf1.graph_rewrite import TF1GraphRewrite
from ampify.transforms.torch.apex_amp import TorchApexAmp
from ampify.transforms.torch.native_amp import TorchNativeAmp

#: every transform ampify has, whatever the options
ALL_TRANSFORMS: List[Transform] = [TF1GraphRewrite(), TorchNativeAmp(), TorchApexAmp()]


def transforms_for(options: Options) -> List[Transform]:
    """The transforms that run for these options (the PyTorch backend picks one of two)."""
    selected = []
    for transform in ALL_TRANSFORMS:
        if isinstance(transform, TorchNativeAmp) and options.backend != "native":
            continue
        if isinstance(transform, TorchApexAmp) and options.backend != "apex":
            continue
        selected.append(transform)
    return selected
