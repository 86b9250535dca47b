"""Unit tests of the parts of `ampify verify` that need no subprocess: parsing, detection, reports."""
import json

import pytest

from ampify.verify import detect
from ampify.verify.output_parsing import grappler_conversions, last_traceback_line
from ampify.verify.report import combined_exit_code, render_results
from ampify.verify.result import VerifyResult

OLD_TF_LINE = (
    "2019-05-14 12:51:58.209574: I tensorflow/core/grappler/optimizers/auto_mixed_precision.cc:1767] "
    "Converted 1240/9478 nodes to float16 precision using 307 cast(s) to float16 (excluding Const and "
    "Variable casts)"
)
TF_2_21_LINE = (
    "I0000 00:00:1796214958.248757    2103 auto_mixed_precision.cc:2259] Converted 22/192 nodes to float16 "
    "precision using 4 cast(s) to float16 (excluding Const and Variable casts)"
)


def test_grappler_line_with_old_path_prefix():
    [conversion] = grappler_conversions("noise\n" + OLD_TF_LINE + "\nstep 1\n")
    assert (conversion.converted, conversion.total, conversion.dtype, conversion.casts) == (1240, 9478, "float16", 307)


def test_grappler_line_of_tf_2_21():
    [conversion] = grappler_conversions(TF_2_21_LINE)
    assert (conversion.converted, conversion.total, conversion.casts) == (22, 192, 4)


def test_grappler_other_lines_are_not_conversions():
    output = (
        "I0000 00:00:1.1 4312 auto_mixed_precision.cc:2331] Running auto_mixed_precision_cpu graph optimizer\n"
        "I0000 00:00:1.2 4312 auto_mixed_precision.cc:1511] No allowlist ops found, nothing to do\n"
        "print: Converted 5/10 nodes to float16 precision using 1 cast(s)\n"
    )
    assert grappler_conversions(output) == []


def test_last_traceback_line_skips_frames_and_interleaved_logs():
    output = (
        "step 0\nTraceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    f()\n"
        "    ^^^\nE0000 00:00:1796215448.789409    5024 util.cc:131] oneDNN supports DT_HALF only\n"
        "ValueError: bad shape\nafter\n"
    )
    assert last_traceback_line(output) == "ValueError: bad shape"
    assert last_traceback_line("no traceback here") is None


def test_last_traceback_line_takes_the_last_of_chained_tracebacks():
    output = (
        "Traceback (most recent call last):\n  File \"a\", line 1\nKeyError: 'x'\n\nDuring handling of the "
        "above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"a\", "
        "line 2\nmypkg.errors.ConfigError: missing key x\n"
    )
    assert last_traceback_line(output) == "mypkg.errors.ConfigError: missing key x"


@pytest.mark.parametrize(
    "source, backend",
    [
        ("import tensorflow.compat.v1 as tf\n", detect.TF1),
        ("from tensorflow.python.training import optimizer\n", detect.TF1),
        ("import torch\nimport torch.nn as nn\n", detect.TORCH),
        ("from torch import nn\n", detect.TORCH),
        ("import torch\nfrom apex import amp\nmodel, opt = amp.initialize(model, opt)\n", detect.APEX),
        ("import torch\nimport apex\napex.amp.initialize(m, o)\n", detect.APEX),
        # apex's fused optimizers alone are not apex amp
        ("import torch\nfrom apex.optimizers import FusedAdam\n", detect.TORCH),
        ("import torch\nimport tensorflow as tf\nwriter = tf.summary\n", detect.TORCH),
        ("import torch\nimport tensorflow as tf\ntf.train.experimental.enable_mixed_precision_graph_rewrite(o)\n",
         detect.TF1),
        ("import numpy\n# import torch\n", detect.UNKNOWN),
        # TF2 / Keras code is not TF1: verify must not run it with TF_USE_LEGACY_KERAS=1
        ("import tensorflow as tf\nmodel = tf.keras.Sequential([])\nmodel.fit(x, y)\n", detect.KERAS),
        ("import tensorflow as tf\nimport keras\nmodel = keras.Sequential([])\n", detect.KERAS),
        ("import tensorflow as tf\nwith tf.GradientTape() as tape:\n    pass\n", detect.KERAS),
        ("import keras\nmodel = keras.Sequential([])\n", detect.KERAS),
        # Keras-backed TF1 code stays TF1
        ("import tensorflow as tf\nx = tf.placeholder(tf.float32)\ny = tf.keras.layers.Dense(3)(x)\n", detect.TF1),
    ],
)
def test_detect_backend(source, backend):
    assert detect.detect_backend(source) == backend


def _result(status, script="s.py"):
    return VerifyResult(script=script, status=status, framework="torch", backend="torch_native",
                        verdict="%s: because" % status, output="hello from the script\n")


def test_combined_exit_code_ranks_not_active_first():
    assert combined_exit_code([]) == 0
    assert combined_exit_code([_result("verified")]) == 0
    assert combined_exit_code([_result("verified"), _result("cannot_verify")]) == 3
    assert combined_exit_code([_result("cannot_verify"), _result("script_failed")]) == 2
    assert combined_exit_code([_result("script_failed"), _result("not_active"), _result("verified")]) == 1


def test_render_plain_single_and_table():
    single = render_results([_result("verified")], as_json=False, show_output=False)
    assert single == "s.py: verified: because"
    table = render_results([_result("verified", "a.py"), _result("not_active", "long/b.py")],
                           as_json=False, show_output=True)
    lines = table.splitlines()
    assert "hello from the script" in table
    header = next(line for line in lines if line.startswith("SCRIPT"))
    row = next(line for line in lines if line.startswith("long/b.py"))
    assert row.index("not active") == header.index("STATUS")
    assert lines[-1] == "1 verified, 1 not active"


def test_render_json():
    payload = json.loads(render_results([_result("not_active")], as_json=True, show_output=False))
    assert payload["exit_code"] == 1
    [entry] = payload["results"]
    assert entry["status"] == "not_active" and entry["exit_code"] == 1 and "output" not in entry
    with_output = json.loads(render_results([_result("verified")], as_json=True, show_output=True))
    assert with_output["results"][0]["output"] == "hello from the script\n"
