"""`ampify verify` on real TF1 graph-mode scripts (TensorFlow CPU: grappler's CPU variant of the pass)."""
import pytest

pytest.importorskip("tensorflow")

from verify_helpers import FIXTURES, tf1_env  # noqa: F401  (pytest fixture)

from ampify.verify.runner import verify_script


def test_converted_tf1_script_verifies_with_converted_node_count(tf1_env):
    result = verify_script(FIXTURES / "tf1_converted.py")
    assert result.status == "verified" and result.exit_code == 0, result.output[-2000:]
    [conversion, *_] = sorted(result.evidence["grappler_conversions"], key=lambda c: -c["converted"])
    assert conversion["converted"] > 0 and conversion["total"] > conversion["converted"]
    assert result.evidence["cpu_emulation"] is True
    assert result.evidence["training_steps_with_rewrite"] == 1
    assert result.evidence["training_steps_loss_scaled"] == 1  # minimize() went through compute_gradients
    assert result.verdict.startswith("verified: %d/%d nodes converted to float16 (CPU emulation)" % (
        conversion["converted"], conversion["total"]))
    assert result.framework == "tensorflow" and result.backend == "tf1_graph_rewrite"
    # stopped inside the first training step's Session.run: the print after it never ran
    assert result.stopped_early and "step 0" not in result.output and "done" not in result.output


def test_unconverted_tf1_script_is_not_active_and_cpu_pass_stays_off(tf1_env):
    result = verify_script(FIXTURES / "tf1_fp32.py")
    assert result.status == "not_active" and result.exit_code == 1, result.output[-2000:]
    assert "graph rewrite was not enabled when the training Session was created" in result.reason
    assert result.evidence["grappler_conversions"] == []
    assert result.evidence["cpu_emulation"] is False and result.evidence["training_steps"] == 1


def test_tf1_script_that_raises_reports_its_error(tf1_env):
    result = verify_script(FIXTURES / "tf1_raises.py")
    assert result.status == "script_failed" and result.exit_code == 2
    assert result.reason.startswith("ValueError: Dimensions must be equal, but are 4 and 5")
    assert result.returncode == 1


def test_monitored_training_session_with_silenced_tf_log_verifies(tf1_env):
    """MonitoredTrainingSession builds its Session itself; the script sets TF_CPP_MIN_LOG_LEVEL=3."""
    result = verify_script(FIXTURES / "tf1_monitored.py")
    assert result.status == "verified", result.output[-2000:]
    assert max(c["converted"] for c in result.evidence["grappler_conversions"]) > 0
    assert result.evidence["training_steps_with_rewrite"] == 1 and "done" not in result.output


def test_session_created_before_the_rewrite_is_not_rewritten(tf1_env):
    """TensorFlow applies the rewrite only to Sessions created after it was enabled; so must verify."""
    result = verify_script(FIXTURES / "tf1_session_before_rewrite.py")
    assert result.status == "not_active" and result.exit_code == 1, result.output[-2000:]
    assert result.evidence["sessions_with_rewrite"] == 0 and result.evidence["training_steps"] == 1
    assert result.evidence["cpu_emulation"] is False and result.evidence["grappler_conversions"] == []


def test_float16_rewrite_without_loss_scaling_is_not_active(tf1_env, tmp_path):
    """tf.gradients fed to the wrapped optimizer's apply_gradients: float16 nodes, unscaled loss
    (issue #12, item 13). Verify must not call that mixed precision training."""
    source = (FIXTURES / "tf1_converted.py").read_text()
    unscaled = source.replace(
        "train_op = opt.minimize(loss)",
        "tvars = tf.trainable_variables()\ntrain_op = opt.apply_gradients(zip(tf.gradients(loss, tvars), tvars))",
    )
    assert unscaled != source
    script = tmp_path / "tf1_unscaled.py"
    script.write_text(unscaled)
    result = verify_script(script)
    assert result.status == "not_active" and result.exit_code == 1, result.output[-2000:]
    assert max(c["converted"] for c in result.evidence["grappler_conversions"]) > 0, "float16 nodes did run"
    assert result.evidence["training_steps_loss_scaled"] == 0
    assert "never went through the wrapped optimizer's compute_gradients" in result.reason
