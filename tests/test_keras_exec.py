"""Converted Keras compile/fit scripts train on CPU in mixed precision, Keras 3 and Keras 2 (#18)."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from ampify.convert import convert_source
from ampify.findings import FileStatus

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "keras"


def _run(path: Path, **env) -> dict:
    completed = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, **env))
    assert completed.returncode == 0, completed.stderr[-3000:]
    return {line.split()[0]: line.split()[1:] for line in completed.stdout.splitlines() if line.strip()}


@pytest.mark.parametrize("script,env,dtype,policy,output", [
    ("exec_fit_keras3.py", {}, "float16", "mixed_float16", "float32"),
    ("exec_fit_keras3.py", {}, "bfloat16", "mixed_bfloat16", "float32"),
    ("exec_fit_tf_keras_legacy.py", {"TF_USE_LEGACY_KERAS": "1"}, "float16", "mixed_float16", "float32"),
])
def test_converted_script_trains_in_mixed_precision(tmp_path, script, env, dtype, policy, output):
    from ampify.options import Options

    source = (FIXTURES / script).read_bytes()
    original = _run(FIXTURES / script, **env)
    assert original["policy"] == ["float32"] and original["hidden"][0] == "float32"

    conversion = convert_source(source, Options(dtype=dtype), filename=script)
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    converted = tmp_path / script
    converted.write_bytes(conversion.converted)
    seen = _run(converted, **env)
    assert seen["policy"] == [policy]
    assert seen["hidden"][0] == dtype  # the hidden layer computes in reduced precision
    assert seen["hidden"][2] == output  # the model's output is float32
    if dtype == "float16":
        assert seen["optimizer"][0].startswith("LossScaleOptimizer")  # compile wrapped it by itself (V3 in Keras 2)
    assert math.isfinite(float(seen["loss"][0]))


@pytest.mark.parametrize("env", [{}, {"TF_USE_LEGACY_KERAS": "1"}], ids=["keras3", "keras2"])
def test_converted_custom_loop_scales_the_loss_and_trains(tmp_path, env):
    """One converted file for both Keras: the optimizer's own methods pick the API at run time."""
    script = "exec_custom_loop.py"
    conversion = convert_source((FIXTURES / script).read_bytes(), filename=script)
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    text = conversion.converted.decode()
    assert "LossScaleOptimizer(tf.keras.optimizers.Adam(1e-2))" in text
    converted = tmp_path / script
    converted.write_bytes(conversion.converted)
    original = _run(FIXTURES / script, **env)
    seen = _run(converted, **env)
    assert original["optimizer"][0] == "Adam" and seen["optimizer"][0].startswith("LossScaleOptimizer")
    assert seen["policy"] == ["mixed_float16"] and seen["hidden"] == ["float16"]
    first, last = float(seen["first"][0]), float(seen["last"][0])
    assert math.isfinite(last) and last < first / 2, (first, last)  # it trains, the scale taken back out
    # within float16 tolerance of what the float32 loop reached
    assert abs(last - float(original["last"][0])) < 0.25 * float(original["first"][0])


@pytest.mark.parametrize("env", [{}, {"TF_USE_LEGACY_KERAS": "1"}], ids=["keras3", "keras2"])
def test_experimental_api_script_runs_once_migrated(tmp_path, env):
    script = FIXTURES / "exec_experimental_api.py"
    before = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, **env))
    assert before.returncode != 0  # the experimental API is gone from TensorFlow 2.21
    conversion = convert_source(script.read_bytes(), filename=script.name)
    assert conversion.status is FileStatus.CHANGED, (conversion.reason, conversion.findings)
    migrated = tmp_path / script.name
    migrated.write_bytes(conversion.converted)
    seen = _run(migrated, **env)
    assert seen["policy"] == ["mixed_float16"]
    assert seen["optimizer"][0].startswith("LossScaleOptimizer")
    assert math.isfinite(float(seen["loss"][0]))
