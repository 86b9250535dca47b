"""Add NVIDIA apex amp.initialize and amp.scale_loss to PyTorch training steps.

Work in progress: this transform does not convert anything yet.
"""

from __future__ import annotations

import libcst as cst

from ampify.options import Options
from ampify.transforms.base import Transform, TransformResult, Verdict
from ampify.transforms.imports import ImportMap


class TorchApexAmp(Transform):
    name = "torch-apex-amp"
    description = "Add NVIDIA apex amp.initialize and amp.scale_loss to PyTorch training steps."

    def may_apply(self, source: bytes, options: Options) -> bool:
        return False

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return False

    def apply(self, module: cst.Module, imports: ImportMap, options: Options) -> TransformResult:
        return TransformResult(module, Verdict.NOTHING_TO_DO)
