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


def test_policy_set_after_the_model_is_built_is_caught():
    result = verify_script(FIXTURES / "keras_late_policy.py")
    assert result.status == "not_active"
    assert "the policy was set after the model was built" in result.reason
