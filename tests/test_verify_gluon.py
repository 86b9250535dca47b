"""`ampify verify` on MXNet Gluon scripts (#19): amp.init and its dtype, the network's outputs
while autograd records, the hybridized graph's amp_cast nodes and the trainer's loss scaler, from
real MXNet runs on CPU in the MXNet environment; the float16 rules on recorded evidence."""
import pytest

from mxnet_environment import mxnet_bfloat16_python, mxnet_python
from verify_helpers import FIXTURES

from ampify.convert import convert_source
from ampify.options import Options
from ampify.verify import detect
from ampify.verify.judge import RunFacts
from ampify.verify.runner import verify_script
from ampify.verify.targets import judge


@pytest.fixture(scope="module")
def python():
    return mxnet_python()


def _converted(tmp_path, dtype):
    path = tmp_path / "train.py"
    text = convert_source((FIXTURES / "gluon_fp32.py").read_bytes(), Options(dtype=dtype)).converted.decode()
    if dtype == "float16":  # float16 operators need CuDNN: the same scaling, run in bfloat16 on CPU
        text = text.replace("amp.init()\n", 'amp.init(target_dtype="bfloat16")\n')
    path.write_text(text)
    return path


def test_fp32_gluon_script_is_not_active_with_the_reason(python):
    result = verify_script(FIXTURES / "gluon_fp32.py", python=python)
    assert result.backend == "gluon_amp" and result.framework == "mxnet"
    assert result.status == "not_active" and result.exit_code == 1
    assert result.reason == "amp.init() was never called: the network trains in float32"
    assert "step 1" not in result.output  # stopped at the first trainer step


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_converted_gluon_script_verifies(tmp_path, python, dtype):
    mxnet_bfloat16_python()  # the converted script computes in bfloat16 (float16 too, on CPU)
    result = verify_script(_converted(tmp_path, dtype), python=python)
    assert result.status == "verified", result.output[-2000:]
    assert result.verdict.startswith("verified: amp.init(target_dtype=bfloat16), network output in bfloat16, "
                                     "6 amp_cast nodes in the hybridized graph")
    assert result.evidence["network_outputs"][0][:2] == ["HybridSequential", "bfloat16"]
    assert result.evidence["loss_scaler"] is (dtype == "float16")
    assert result.evidence["scale_loss_calls"] == (1 if dtype == "float16" else 0)


def test_amp_init_after_the_graph_was_cached_is_caught(python):
    result = verify_script(FIXTURES / "gluon_late_amp_init.py", python=python)
    assert result.status == "not_active"
    assert result.reason.startswith("amp.init(target_dtype='bfloat16') ran but the network's outputs are float32 "
                                    "and its graphs hold no amp_cast node: the network was built or hybridized "
                                    "before amp.init()")


def _facts(**gluon):
    probe = {"gluon": {"version": "1.9.1", "steps": 1, "scale_loss_calls": 0,
                       "outputs": [["Net", "float16", 4]], **gluon}}
    return RunFacts(output="", probe=probe, returncode=0, timed_out=False, timeout=5.0)


def test_float16_without_loss_scaling_is_not_active():
    _, judgement = judge(detect.GLUON, _facts(amp_init={"target_dtype": "float16"}, loss_scaler=False))
    assert judgement.status == "not_active"
    assert judgement.reason == ("float16 training without loss scaling (no amp.init_trainer): float16 gradients "
                                "can underflow silently")
    _, judgement = judge(detect.GLUON, _facts(amp_init={"target_dtype": "float16"}, loss_scaler=True))
    assert "(no amp.scale_loss)" in judgement.reason
    _, judgement = judge(detect.GLUON, _facts(amp_init={"target_dtype": "float16"}, loss_scaler=True,
                                              scale_loss_calls=1, loss_scale=65536.0))
    assert judgement.status == "verified" and judgement.verdict.endswith("loss scale 65536")


def test_a_run_that_never_stepped_a_trainer_is_not_verified():
    _, judgement = judge(detect.GLUON, _facts(steps=0, amp_init={"target_dtype": "bfloat16"}))
    assert judgement.status != "verified" and "no trainer step ran" in judgement.reason


def test_detect_reads_gluon_scripts_from_their_imports():
    assert detect.detect_backend("import mxnet as mx\nfrom mxnet import gluon\n") == detect.GLUON
    assert detect.detect_backend("from mxnet.gluon import nn\nimport torch\n") == detect.TORCH
