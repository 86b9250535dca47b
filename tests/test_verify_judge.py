"""The verdict rules, on recorded probe evidence and output (no subprocess)."""
from ampify.verify import detect
from ampify.verify.judge import RunFacts
from ampify.verify.targets import judge

TF_LINE = ("I0000 00:00:1796214958.248757    2103 auto_mixed_precision.cc:2259] Converted 22/192 nodes to float16 "
           "precision using 4 cast(s) to float16 (excluding Const and Variable casts)\n")
TRACEBACK = "Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\nRuntimeError: out of memory\n"


def _facts(probe, output="", returncode=0, timed_out=False):
    return RunFacts(output=output, probe=probe, returncode=returncode, timed_out=timed_out, timeout=5.0)


def _tf1_probe(**session):
    record = {"rewrite_enabled": True, "cpu_emulation": True}
    record.update(session)
    return {"tf1": {"version": "2.21.0", "sessions": [record], "train_steps": 1, "train_steps_with_rewrite": 1},
            "stopped_early": True}


def test_tf1_conversion_line_verifies_and_names_cpu_emulation():
    _, judgement = judge(detect.TF1, _facts(_tf1_probe(), TF_LINE))
    assert judgement.status == "verified"
    assert judgement.verdict == "verified: 22/192 nodes converted to float16 (CPU emulation), 1 training step"


def test_tf1_zero_converted_nodes_is_not_active():
    zero = TF_LINE.replace("22/192", "0/192")
    _, judgement = judge(detect.TF1, _facts(_tf1_probe(), zero))
    assert judgement.status == "not_active" and "converted 0 nodes" in judgement.reason


def test_tf1_without_cpu_pass_cannot_be_verified():
    probe = _tf1_probe(cpu_emulation=False, cpu_emulation_error="ValueError('no field')")
    probe["tf1"]["version"] = "1.15.5"
    _, judgement = judge(detect.TF1, _facts(probe))
    assert judgement.status == "cannot_verify" and "TensorFlow 1.15.5 has no CPU mode" in judgement.reason


def test_tf1_gpu_too_old_for_the_pass_is_not_active():
    probe = _tf1_probe(cpu_emulation=False)
    output = "W auto_mixed_precision.cc:1] No (suitable) GPUs detected, skipping auto_mixed_precision graph optimizer\n"
    _, judgement = judge(detect.TF1, _facts(probe, output))
    assert judgement.status == "not_active" and "compute capability 7.0+" in judgement.reason


def _torch_probe(forward, backward, steps=1, **extra):
    probe = {"torch": {"ops": {"forward": forward, "backward": backward}, "optimizer_steps": steps,
                       "autocast": [], "grad_scaler": [], "op_counter": "active"}, "stopped_early": steps > 0}
    probe["torch"].update(extra)
    return probe


def test_torch_reduced_ops_verify_with_counts():
    probe = _torch_probe({"float16": 60, "float32": 2}, {"float16": 58, "float32": 4})
    _, judgement = judge(detect.TORCH, _facts(probe))
    assert judgement.verdict == "verified: 118/124 matmul/conv ops ran in float16 (fwd 60, bwd 58), 1 optimizer step"


def test_torch_disabled_autocast_warning_in_output_fails_even_with_filtered_records():
    output = "UserWarning: CUDA is not available or torch_xla is imported. Disabling autocast.\n"
    _, judgement = judge(detect.TORCH, _facts(_torch_probe({"float32": 3}, {"float32": 5}), output))
    assert judgement.status == "not_active" and "silently ran in float32" in judgement.reason


def test_torch_crash_before_any_optimizer_step_is_a_script_failure():
    probe = _torch_probe({"bfloat16": 3}, {}, steps=0)
    probe["stopped_early"] = False
    _, judgement = judge(detect.TORCH, _facts(probe, TRACEBACK, returncode=1))
    assert judgement.status == "script_failed" and judgement.reason == "RuntimeError: out of memory"


def test_unknown_backend_is_judged_by_what_the_script_imported():
    backend, judgement = judge(detect.UNKNOWN, _facts(_torch_probe({"bfloat16": 3}, {"bfloat16": 5})))
    assert backend == detect.TORCH and judgement.status == "verified"
    backend, judgement = judge(detect.UNKNOWN, _facts({}, "hello\n"))
    assert judgement.status == "not_active" and "neither TensorFlow, PyTorch nor MXNet" in judgement.reason


def test_apex_needs_initialize_to_have_returned():
    probe = _torch_probe({"float16": 3}, {"float16": 5})
    _, judgement = judge(detect.APEX, _facts(probe, "Selected optimization level O1\n"))
    assert judgement.status == "not_active" and "amp.initialize" in judgement.reason
    probe["apex"] = {"initialized": True, "opt_level": "O1"}
    _, judgement = judge(detect.APEX, _facts(probe))
    assert judgement.status == "verified" and judgement.verdict.endswith("apex amp O1")


def test_timeout_after_evidence_still_verifies_and_says_so():
    probe = _torch_probe({"bfloat16": 30}, {"bfloat16": 50}, steps=10)
    probe["stopped_early"] = True  # the probe's SIGTERM handler saved the evidence
    _, judgement = judge(detect.TORCH, _facts(probe, returncode=0, timed_out=True))
    assert judgement.status == "verified" and judgement.verdict.endswith("10 optimizer steps, stopped by the 5 s timeout")
    _, judgement = judge(detect.TORCH, _facts({"stopped_early": True}, returncode=0, timed_out=True))
    assert judgement.status == "script_failed" and judgement.reason == "timed out after 5 s before any evidence"


def test_torch_without_a_working_op_counter_cannot_be_verified():
    probe = _torch_probe({}, {}, steps=1)
    del probe["torch"]["op_counter"]
    probe["torch"]["version"] = "1.8.1"
    probe["torch"]["probe_errors"] = ["_install_op_counter: ImportError('TorchDispatchMode')"]
    _, judgement = judge(detect.TORCH, _facts(probe))
    assert judgement.status == "cannot_verify" and "torch 1.8.1" in judgement.reason


def test_tf1_training_in_a_session_without_rewrite_is_not_verified_by_another_sessions_conversion():
    probe = _tf1_probe()
    probe["tf1"]["sessions"].insert(0, {"rewrite_enabled": False, "cpu_emulation": False})
    probe["tf1"]["train_steps_with_rewrite"] = 0  # the one training step ran in the early Session
    _, judgement = judge(detect.TF1, _facts(probe, TF_LINE))
    assert judgement.status == "not_active" and "training Session" in judgement.reason


def test_torch_autocast_only_in_evaluation_is_not_amp_training():
    probe = _torch_probe({"bfloat16": 3, "float32": 3}, {"float32": 5})
    _, judgement = judge(detect.TORCH, _facts(probe))
    assert judgement.status == "not_active" and "backward pass ran all 5 ops in float32" in judgement.reason


def test_apex_float16_backward_outside_scale_loss_is_not_active():
    probe = _torch_probe({"float16": 3}, {"float16": 5})
    probe["apex"] = {"initialized": True, "opt_level": "O1", "scale_loss_calls": 0}
    _, judgement = judge(detect.APEX, _facts(probe))
    assert judgement.status == "not_active" and "no backward pass went through amp.scale_loss" in judgement.reason
    probe["apex"].update(scale_loss_calls=2, loss_scale=65536.0)
    _, judgement = judge(detect.APEX, _facts(probe))
    assert judgement.status == "verified" and judgement.verdict.endswith("amp.scale_loss scaled 2 losses")
    assert judgement.evidence["apex_loss_scale"] == 65536.0
    # bfloat16 needs no loss scale: apex's bf16 levels run without scale_loss
    probe = _torch_probe({"bfloat16": 3}, {"bfloat16": 5})
    probe["apex"] = {"initialized": True, "opt_level": "O4", "scale_loss_calls": 0}
    _, judgement = judge(detect.APEX, _facts(probe))
    assert judgement.status == "verified"
