"""The Keras target: a mixed precision policy for TF2/Keras compile/fit scripts."""

from ampify.transforms.base import Target
from ampify.transforms.keras.policy import KerasMixedPrecision
from ampify.transforms.torch.target import NATIVE_TARGET

KERAS_TARGET = Target(
    name="keras",
    description="TF2/Keras compile/fit scripts: set_global_policy before the model is built, float32 outputs",
    transform=KerasMixedPrecision(),
    runs_when=lambda options: True,
    # `--dtype bfloat16` picks mixed_bfloat16, as it picks bfloat16 autocast for PyTorch
    options=tuple(option for option in NATIVE_TARGET.options if option.field == "dtype"),
    rule_prefix="AMP5",
    verify="keras",
    fixtures="keras",
)
