"""The MXNet Gluon target: `mxnet.contrib.amp` for Gluon training loops (MXNet 1.6-1.9)."""

from ampify.transforms.base import Target
from ampify.transforms.gluon.conversion import GluonMixedPrecision
from ampify.transforms.torch.target import NATIVE_TARGET

GLUON_TARGET = Target(
    name="gluon",
    description="MXNet Gluon training loops: amp.init before the network is built, amp.init_trainer, amp.scale_loss",
    transform=GluonMixedPrecision(),
    runs_when=lambda options: True,
    # `--dtype bfloat16` picks amp.init(target_dtype="bfloat16"), as it picks bfloat16 autocast for PyTorch
    options=tuple(option for option in NATIVE_TARGET.options if option.field == "dtype"),
    rule_prefix="AMP6",
    verify="gluon",
    fixtures="gluon",
)
