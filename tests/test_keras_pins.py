"""Which Keras a custom loop is written for, where the imports cannot tell (#18): the repository's
version pins decide (requirements, setup.py, pyproject), and the choice runs under that Keras."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ampify.dependency_pins import allowed_range, dependency_pins
from ampify.transforms.keras.keras_version import EITHER, KERAS_2, KERAS_3, keras_api

ROOT = Path(__file__).resolve().parent.parent
LOOP = (ROOT / "fixtures" / "keras" / "exec_custom_loop.py").read_text()


def _project(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "train.py").write_text(LOOP)
    return tmp_path / "train.py"


def test_version_ranges_of_requirement_specifiers():
    assert allowed_range("==2.12.0") == ((2, 12, 0), (2, 12, 1))
    assert allowed_range(">=2.4,<2.16") == ((2, 4), (2, 16))
    assert allowed_range("~=2.15.0") == ((2, 15, 0), (2, 16))
    assert allowed_range("==2.15.*") == ((2, 15), (2, 16))
    assert allowed_range(">=2.16") == ((2, 16), (999,))


def test_pins_are_read_from_every_requirement_file(tmp_path):
    (tmp_path / "requirements.txt").write_text("numpy\n# tensorflow==1.15\ntensorflow-gpu==2.12.0  # the GPU build\n")
    (tmp_path / "setup.py").write_text("setup(install_requires=['keras>=3.0', \"tf-keras~=2.15\"])\n")
    (tmp_path / "pyproject.toml").write_text('[project]\ndependencies = ["tensorflow>=2.4,<2.16"]\n')
    dependency_pins.cache_clear()
    pins = dependency_pins(tmp_path)
    assert pins["tensorflow-gpu"] == ("==2.12.0", "requirements.txt:3")
    assert pins["keras"] == (">=3.0", "setup.py:1") and pins["tf-keras"] == ("~=2.15", "setup.py:1")
    assert pins["tensorflow"] == (">=2.4,<2.16", "pyproject.toml:2")
    assert "numpy" not in pins  # unpinned: nothing to decide with


@pytest.mark.parametrize("roots,pins,api", [
    (["tensorflow.keras"], {"tensorflow": ("==2.12.0", "requirements.txt:1")}, KERAS_2),
    (["tensorflow.keras"], {"tensorflow": (">=2.16", "requirements.txt:1")}, KERAS_3),
    (["tensorflow.keras"], {"tensorflow": (">=2.4", "requirements.txt:1")}, EITHER),  # both sides of 2.16
    (["tensorflow.keras"], {}, EITHER),
    (["tensorflow.keras"], {"tensorflow": (">=2.16", "r:1"), "tf-keras": (">=2.16", "r:2")}, EITHER),
    (["keras"], {"keras": ("==2.13.1", "r:1")}, KERAS_2),
    (["keras"], {"keras": (">=3", "r:1")}, KERAS_3),
    (["keras"], {"tensorflow": ("==2.17.0", "r:1")}, KERAS_3),
    (["tf_keras"], {}, KERAS_2),
    (["keras", "tensorflow.keras"], {"keras": (">=3", "r:1"), "tensorflow": ("==2.12.0", "r:2")}, EITHER),
])
def test_the_pins_decide_which_keras(roots, pins, api):
    assert keras_api(roots, pins)[0] == api


def _convert(script: Path) -> str:
    run = subprocess.run([sys.executable, "-m", "ampify", str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return script.read_text(), run.stdout


def test_a_repository_pinned_to_tensorflow_before_2_16_gets_the_keras_2_api(tmp_path):
    script = _project(tmp_path, {"requirements.txt": "tensorflow==2.12.0\n"})
    text, report = _convert(script)
    assert "optimizer.get_scaled_loss(loss)" in text and "get_unscaled_gradients(grads)" in text
    assert "hasattr" not in text and ".scale_loss(" not in text
    assert "Keras 2 API: requirements.txt:1 pins tensorflow==2.12.0, whose tf.keras is Keras 2" in report
    pytest.importorskip("tf_keras")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_USE_LEGACY_KERAS="1"))  # tf.keras is Keras 2 here, as pinned
    assert run.returncode == 0, run.stderr[-2000:]
    seen = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert seen["policy"] == "mixed_float16" and seen["optimizer"].startswith("LossScaleOptimizer")
    assert float(seen["last"]) < float(seen["first"])


def test_a_repository_pinned_to_tensorflow_2_16_or_later_gets_the_keras_3_api_and_it_trains(tmp_path):
    pytest.importorskip("tensorflow")
    script = _project(tmp_path, {"setup.py": "setup(install_requires=['tensorflow>=2.16'])\n"})
    text, report = _convert(script)
    assert "scaled_loss = optimizer.scale_loss(loss)" in text
    assert "hasattr" not in text and "get_scaled_loss" not in text and "get_unscaled_gradients" not in text
    assert "Keras 3 API: setup.py:1 pins tensorflow>=2.16, whose tf.keras is Keras 3" in report
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"})
    assert run.returncode == 0, run.stderr[-2000:]
    seen = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert seen["policy"] == "mixed_float16" and seen["optimizer"].startswith("LossScaleOptimizer")
    assert float(seen["last"]) < float(seen["first"])
