"""The TF1 target: the mixed precision graph rewrite of TensorFlow 1.x graph code."""

from ampify.transforms.base import Target, TargetOption
from ampify.transforms.tf1.graph_rewrite import TF1GraphRewrite

TF1_TARGET = Target(
    name="tf1",
    description="TensorFlow 1.x graph code: optimizers wrapped with enable_mixed_precision_graph_rewrite",
    transform=TF1GraphRewrite(),
    runs_when=lambda options: True,
    options=(
        TargetOption(
            field="tf_ignore_performance",
            flag="--no-tf-ignore-performance",
            config_key="tf-ignore-performance",
            help="TF1: do not set TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE=1 "
            "(pre-Volta GPUs then skip the rewrite).",
        ),
    ),
    rule_prefix="AMP1",
    verify="tf1",
    fixtures="tf1",
)
