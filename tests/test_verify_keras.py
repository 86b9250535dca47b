"""`ampify verify` on Keras scripts (#18): the policy, the layers' compute dtypes and the optimizer
at the first training step, from a real Keras 3 run on CPU."""
import pytest

pytest.importorskip("keras")

from verify_helpers import FIXTURES

from ampify.convert import convert_source
from ampify.verify.runner import verify_script


def test_fp32_keras_script_is_not_active_with_the_reason():
    result = verify_script(FIXTURES / "keras_fp32.py")
    assert result.backend == "keras_policy" and result.status == "not_active" and result.exit_code == 1
    assert result.reason.startswith("the dtype policy is float32 when training starts")
    assert "done" not in result.output  # stopped at the first training step


def test_converted_keras_script_verifies(tmp_path):
    converted = tmp_path / "train.py"
    converted.write_bytes(convert_source((FIXTURES / "keras_fp32.py").read_bytes()).converted)
    result = verify_script(converted)
    assert result.status == "verified", result.output[-2000:]
    assert result.verdict.startswith("verified: policy mixed_float16, 1/2 layers with weights compute in float16, "
                                     "optimizer LossScaleOptimizer")
    assert result.evidence["layers"] == [["dense", "float16"], ["dense_1", "float32"]]
    # the traced train step itself: the hidden layer's matmul and its gradients in float16
    traced = result.evidence["traced_step_ops"]
    assert traced.get("float16", 0) >= 2 and "2/5 matmul/conv ops of the traced step in float16" in result.verdict


def test_policy_set_after_the_model_is_built_is_caught():
    result = verify_script(FIXTURES / "keras_late_policy.py")
    assert result.status == "not_active"
    assert "the policy was set after the model was built" in result.reason


def test_a_traced_step_with_only_float32_matmuls_is_not_active():
    from ampify.verify import detect
    from ampify.verify.judge import RunFacts
    from ampify.verify.targets import judge

    probe = {"keras": {"policy": "mixed_float16", "optimizer": "LossScaleOptimizer", "steps": 1,
                       "layers": [["dense", "float16"]], "traced_ops": {"float32": 5}}}
    _, judgement = judge(detect.KERAS, RunFacts(output="", probe=probe, returncode=0, timed_out=False, timeout=5.0))
    assert judgement.status == "not_active"
    assert judgement.reason == ("the policy is mixed_float16 but all 5 matmul/conv ops of the traced training step "
                                "run in float32")
