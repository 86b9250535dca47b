"""`ampify bench` on TensorFlow scripts (#20): Keras compile/fit (a callback added to fit stamps the
training batches) and TF1 Sessions (each Session.run of a training op); structure, counted steps
and losses, never speed."""
import json
import subprocess
import sys

from pathlib import Path

import pytest

pytest.importorskip("keras")

ROOT = Path(__file__).resolve().parent.parent

FIT_SCRIPT = """\
import sys
import numpy as np
import keras

keras.utils.set_random_seed(0)
x = np.random.normal(size=(256, 16)).astype("float32")
y = (x[:, :4] > 0).astype("float32")
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(4, activation="sigmoid")])
model.compile(optimizer="adam", loss="binary_crossentropy")
model.fit(x, y, batch_size=16, epochs=int(sys.argv[1]), verbose=0)
print("fit finished")
"""


def test_keras_fit_versions_run_in_turns_for_the_counted_batches(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FIT_SCRIPT)
    run = subprocess.run([sys.executable, "-m", "ampify", "bench", str(script), "--steps", "3", "--warmup", "2",
                          "--repeats", "1", "--json", "--", "5"], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["order"] == ["fp32 (original)", "mixed (ampify)"] and report["measured_steps"] == 3
    losses = {}
    for name, variant in report["variants"].items():
        assert len(variant["steps_per_second"]) == 1 and variant["steps_per_second"][0] > 0
        losses[name] = variant["losses_of_last_run"]
        assert len(losses[name]) == 3 and variant["peak_host_rss_kb"] > 0
    original, mixed = losses["fp32 (original)"], losses["mixed (ampify)"]
    assert report["batch_size"] == 16  # fit(..., batch_size=16)
    assert original != mixed  # the converted run really computes in float16...
    assert all(abs(a - b) <= 0.01 * abs(a) for a, b in zip(original, mixed))  # ...and trains like fp32
    assert script.read_text() == FIT_SCRIPT and [p.name for p in tmp_path.iterdir()] == ["train.py"]


def test_tf1_session_versions_run_in_turns_for_the_counted_steps(tmp_path):
    script = tmp_path / "train.py"
    source = (ROOT / "fixtures" / "verify" / "tf1_fp32.py").read_text()
    script.write_text(source)
    run = subprocess.run([sys.executable, "-m", "ampify", "bench", str(script), "--steps", "3", "--warmup", "1",
                          "--repeats", "1", "--json", "--", "50"], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["order"] == ["fp32 (original)", "mixed (ampify)"] and report["measured_steps"] == 3
    for variant in report["variants"].values():
        assert variant["steps_per_second"][0] > 0
        # the loss is the one scalar float each training run fetches (`_, value = sess.run([train_op, loss])`)
        assert len(variant["losses_of_last_run"]) == 3
    assert "done" not in run.stdout  # stopped after warm-up + timed steps, not run to the end
    assert report["batch_size"] == 32  # every array the training runs feed has 32 rows
    assert script.read_text() == source
