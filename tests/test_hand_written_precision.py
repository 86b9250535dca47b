"""Hand-written mixed precision is "already mixed precision", never stacked (issue #12, item 3);
names that only look like it are not (the goldens cover whole scripts of each shape)."""

from __future__ import annotations

import textwrap

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.transforms.kit.hand_written_precision import (
    fp16_switch_evidence,
    fp16_utils_evidence,
    loss_scaling_evidence,
)


@pytest.mark.parametrize("name", ["loss_scale", "static_loss_scale", "LossScaler", "dynamic_loss_scaling", "loss_scale_factor"])
def test_loss_scale_names(name):
    assert loss_scaling_evidence(name) == f"manual loss scaling: {name}"


@pytest.mark.parametrize("name", ["LossScaleOptimizer", "loss_scales", "scale", "glossary_scale"])
def test_names_that_are_no_loss_scale(name):
    assert loss_scaling_evidence(name) is None


def test_an_fp16_switch_needs_a_prefix():
    assert fp16_switch_evidence("use_fp16") and fp16_switch_evidence("enable_mixed_precision")
    for name in ("fp16", "amp", "half", "use_cuda"):  # horovod's Compression.fp16, an amplitude ...
        assert fp16_switch_evidence(name) is None
    assert fp16_utils_evidence("FP16_Optimizer") and fp16_utils_evidence("Optimizer") is None


TF1_TRAINING = """
x = tf.placeholder(tf.float32, [None, 4])
w = tf.get_variable("w", [4, 1])
loss = tf.reduce_mean(tf.matmul(x, w))
train_op = tf.train.AdamOptimizer(0.01).minimize(loss)
"""


def tf1(body: str, training: bool = True) -> str:
    return "import tensorflow as tf\n" + textwrap.dedent(body) + (TF1_TRAINING if training else "")


@pytest.mark.parametrize("evidence,shown", [
    ("h = tf.cast(tf.ones([2]), tf.float16)\n", "float16 computation by hand: tf.float16"),
    ("h = tf.cast(tf.ones([2]), 'float16')\n", "float16 computation by hand: 'float16'"),
    ("def f(x, use_fp16):\n    return x if use_fp16 else x\n", "a half precision switch of its own: use_fp16"),
    ("def f(loss, loss_scale):\n    return loss * loss_scale\n", "manual loss scaling: loss_scale"),
])
def test_tf1_hand_written_evidence_keeps_the_optimizer_unwrapped(evidence, shown):
    conversion = convert_source(tf1(evidence))
    assert conversion.status is FileStatus.ALREADY_MIXED_PRECISION
    assert shown in conversion.reason
    assert not [f for f in conversion.findings if f.code == "AMP114"], "never advise stacking a second loss scale"


def test_tf1_names_that_are_not_used_prove_nothing():
    conversion = convert_source(tf1("def f(features, loss_scale=1, use_fp16=False):\n    return features\n"))
    assert conversion.status is FileStatus.CHANGED


def test_a_tf1_library_file_using_float16_is_not_applicable():
    conversion = convert_source(tf1("def cast(x):\n    return tf.cast(x, tf.float16)\n", training=False))
    assert conversion.status is FileStatus.NOT_APPLICABLE


TORCH_TRAINING = """
import torch
model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in [(torch.randn(3, 4), torch.randn(3, 2))]:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
{between}    optimizer.step()
"""


@pytest.mark.parametrize("backend", ["native", "apex"])
def test_torch_loss_scale_divided_out_of_gradients_is_already_mixed_precision(backend):
    source = "loss_scale = 128.0\n" + TORCH_TRAINING.format(
        between="    for p in model.parameters():\n        p.grad.data.div_(loss_scale)\n"
    )
    conversion = convert_source(source, Options(backend=backend))
    assert conversion.status is FileStatus.ALREADY_MIXED_PRECISION
    assert "manual loss scaling: loss_scale divided out of the gradients" in conversion.reason


def test_torch_fp16_utils_imported_but_unused_proves_nothing():
    source = "from fp16util import network_to_half\n" + TORCH_TRAINING.format(between="")
    assert convert_source(source).status is FileStatus.CHANGED
