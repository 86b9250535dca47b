"""The PyTorch targets: native torch.amp, or NVIDIA apex amp (`--backend` picks one)."""

from ampify.options import APEX_OPT_LEVELS, BACKENDS, DTYPES
from ampify.transforms.base import Target, TargetOption
from ampify.transforms.torch.apex_amp import TorchApexAmp
from ampify.transforms.torch.native_amp import TorchNativeAmp

BACKEND_OPTION = TargetOption(
    field="backend",
    flag="--backend",
    config_key="backend",
    help="PyTorch target (default native: torch.autocast + torch.amp.GradScaler).",
    choices=BACKENDS,
)

NATIVE_TARGET = Target(
    name="torch-native",
    description="PyTorch training steps: torch.autocast + torch.amp.GradScaler",
    transform=TorchNativeAmp(),
    runs_when=lambda options: options.backend == "native",
    options=(
        BACKEND_OPTION,
        TargetOption(
            field="dtype",
            flag="--dtype",
            config_key="dtype",
            help="PyTorch reduced precision (default float16; bfloat16 needs no GradScaler).",
            choices=DTYPES,
        ),
    ),
    rule_prefix="AMP2",
    verify="torch",
    fixtures="torch_native",
)

APEX_TARGET = Target(
    name="torch-apex",
    description="PyTorch training steps: NVIDIA apex amp.initialize + amp.scale_loss",
    transform=TorchApexAmp(),
    runs_when=lambda options: options.backend == "apex",
    options=(
        BACKEND_OPTION,
        TargetOption(
            field="apex_opt_level",
            flag="--opt-level",
            config_key="opt-level",
            help="apex opt_level passed to amp.initialize (default O1).",
            choices=APEX_OPT_LEVELS,
        ),
    ),
    rule_prefix="AMP3",
    verify="apex",
    fixtures="torch_apex",
)
