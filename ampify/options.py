"""User-facing options that change what the transforms write."""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("native", "apex")
DTYPES = ("float16", "bfloat16")
#: apex opt_levels that are mixed precision training: O0 is float32, O3 pure float16 (no master weights)
APEX_OPT_LEVELS = ("O1", "O2")


@dataclass(frozen=True)
class Options:
    """Options every transform receives; defaults are what `ampify PATH` does."""

    # PyTorch: "native" (torch.autocast + torch.amp.GradScaler) or "apex" (NVIDIA apex amp).
    backend: str = "native"
    # PyTorch native: reduced-precision dtype; bfloat16 needs no loss scaling, so no scaler.
    dtype: str = "float16"
    # TF1: set TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE=1 before TF is imported,
    # without which GPUs older than Volta silently skip the rewrite.
    tf_ignore_performance: bool = True
    # apex: the opt_level passed to amp.initialize.
    apex_opt_level: str = "O1"
    # Migrate deprecated mixed precision APIs (torch.cuda.amp / torch.cpu.amp) to torch.amp.
    migrate: bool = True

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.apex_opt_level not in APEX_OPT_LEVELS:
            raise ValueError(
                f"apex opt_level must be one of {', '.join(APEX_OPT_LEVELS)} (O0 is float32, O3 pure float16), "
                f"not {self.apex_opt_level!r}"
            )
