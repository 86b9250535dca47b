"""AMP120 tells the truth: with eager execution on, only graphs get the mixed precision rewrite.

The same TF1-style script, converted by ampify, runs under real TensorFlow (CPU) twice: once with
the optimizer stepped eagerly, once inside tf.function. A small runner turns on grappler's CPU
auto mixed precision pass wherever TensorFlow would turn the GPU pass on (once the rewrite is
enabled), so "Converted N/M nodes to float16" appears exactly where the rewrite happens on a GPU.
The eager variant must convert nothing, and ampify must say so (AMP120); the tf.function variant
must convert nodes, and ampify must not warn.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"
)

RUNNER = '''
import runpy
import sys

from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context
from tensorflow.python.training.experimental import mixed_precision_global_state

_config = context.Context.config


def _config_with_cpu_pass(self):
    # Functions take their grappler options from this config: once the rewrite is enabled,
    # turn on the CPU variant of the pass TensorFlow turns on for a GPU.
    config = _config.fget(self)
    if mixed_precision_global_state.is_mixed_precision_graph_rewrite_enabled():
        config.graph_options.rewrite_options.auto_mixed_precision_cpu = rewriter_config_pb2.RewriterConfig.ON
    return config


context.Context.config = property(_config_with_cpu_pass)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
'''

SCRIPT = '''import tensorflow as tf

tf.compat.v1.enable_eager_execution()

model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(1)])
optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
x = tf.random.normal([64, 8])
y = tf.reduce_sum(x, axis=1, keepdims=True)
model(x)


def loss():
    return tf.reduce_mean(tf.square(model(x) - y))


{decorator}def train_step():
    optimizer.minimize(loss, var_list=model.trainable_variables)


for step in range(3):
    train_step()
print("final loss", float(loss()))
'''

CONVERTED_NODES = re.compile(r"Converted (\d+)/(\d+) nodes to float16")


def _convert_and_run(tmp_path, decorator: str):
    conversion = convert_source(SCRIPT.format(decorator=decorator), filename="train.py")
    # Eager with nothing that builds a graph (AMP120): the change cannot take effect.
    expected = FileStatus.CHANGED if decorator else FileStatus.CHANGED_INCOMPLETE
    assert conversion.status is expected, conversion.reason
    script = tmp_path / "train.py"
    script.write_text(conversion.converted)
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16="0",
               TF_CPP_MIN_LOG_LEVEL="0", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, str(runner), str(script)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "final loss" in result.stdout
    converted = sum(int(n) for n, _ in CONVERTED_NODES.findall(result.stderr))
    return conversion, converted


def test_eager_training_step_gets_no_float16_and_ampify_says_so(tmp_path):
    conversion, converted_nodes = _convert_and_run(tmp_path, decorator="")
    assert converted_nodes == 0
    codes = [f.code for f in conversion.findings]
    assert "AMP101" in codes and "AMP120" in codes
    warning = next(f for f in conversion.findings if f.code == "AMP120")
    assert warning.line == 3 and "still runs in float32" in warning.message


def test_training_step_in_tf_function_gets_float16_without_a_warning(tmp_path):
    conversion, converted_nodes = _convert_and_run(tmp_path, decorator="@tf.function\n")
    assert converted_nodes > 0
    codes = [f.code for f in conversion.findings]
    assert "AMP101" in codes and "AMP120" not in codes
