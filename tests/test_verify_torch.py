"""`ampify verify` on real PyTorch scripts (CPU autocast), plus apex which needs CUDA."""
import time

import pytest

torch = pytest.importorskip("torch")

from verify_helpers import FIXTURES

from ampify.verify.runner import verify_script


def test_converted_torch_script_for_10000_steps_verifies_in_seconds():
    """10 000 steps take over 100 s (each sleeps 10 ms); verify stops inside the first optimizer step."""
    started = time.monotonic()
    result = verify_script(FIXTURES / "torch_converted.py", ["10000"])
    elapsed = time.monotonic() - started
    assert result.status == "verified" and result.exit_code == 0, result.output[-2000:]
    evidence = result.evidence
    assert evidence["reduced_precision_ops"] > 0
    # autocast's default dtype: bfloat16 on the CPU, float16 on CUDA (the script trains on CUDA when it can)
    device, dtype = ("cuda", "float16") if torch.cuda.is_available() else ("cpu", "bfloat16")
    assert evidence["forward"].get(dtype, 0) > 0 and evidence["backward"].get(dtype, 0) > 0
    assert evidence["autocast"] == [{"device_type": device, "requested": True, "enabled": True, "dtype": dtype}]
    assert f"matmul/conv ops ran in {dtype} (fwd " in result.verdict and "1 optimizer step" in result.verdict
    # stopped, not finished: far below the 100 s the loop needs, one step, no later print
    assert elapsed < 30 and result.elapsed < 30
    assert result.stopped_early and evidence["optimizer_steps"] == 1 and result.returncode == 0
    assert "step 0" not in result.output and "done" not in result.output


def test_fp32_torch_script_is_not_active():
    result = verify_script(FIXTURES / "torch_fp32.py")
    assert result.status == "not_active" and result.exit_code == 1
    assert result.evidence["reduced_precision_ops"] == 0 and result.evidence["counted_ops"] > 0
    assert result.reason.startswith("0/%d matmul/conv ops ran in float16/bfloat16" % result.evidence["counted_ops"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback of CUDA autocast")
def test_cuda_autocast_on_cpu_machine_is_silently_fp32():
    result = verify_script(FIXTURES / "torch_cuda_autocast.py")
    assert result.status == "not_active" and result.exit_code == 1
    assert "torch.autocast('cuda') disabled itself" in result.reason
    assert "GradScaler disabled itself" in result.reason
    assert result.reason.endswith("the script silently ran in float32")
    # torch's own warnings are in the captured output too
    assert "Disabling autocast" in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="apex cannot be verified only without CUDA")
def test_apex_script_cannot_be_verified_without_cuda():
    result = verify_script(FIXTURES / "apex_amp.py")
    assert result.status == "cannot_verify" and result.exit_code == 3
    assert result.reason == "apex amp needs a CUDA GPU"
    assert result.verdict == "cannot verify here: apex amp needs a CUDA GPU"
    assert result.backend == "apex" and result.returncode is None  # the script itself never ran


def test_full_run_lets_the_script_finish():
    result = verify_script(FIXTURES / "torch_converted.py", ["2"], full=True)
    assert result.status == "verified" and not result.stopped_early
    assert result.evidence["optimizer_steps"] == 2 and "done in" in result.output and result.returncode == 0


def test_script_ending_with_os_exit_keeps_its_evidence_in_a_full_run():
    result = verify_script(FIXTURES / "torch_os_exit.py", full=True)
    assert result.status == "verified", result.output[-2000:]
    assert result.evidence["optimizer_steps"] == 2 and "trained" in result.output
    assert "swallowed SystemExit" not in result.output


def test_default_run_stops_even_when_the_script_swallows_system_exit():
    result = verify_script(FIXTURES / "torch_os_exit.py")
    assert result.status == "verified" and result.stopped_early
    assert result.evidence["optimizer_steps"] == 1
    assert "swallowed SystemExit" not in result.output and "trained" not in result.output


def _float16_variant(tmp_path, name, step_code, keep_scaler=True):
    source = (FIXTURES / "torch_converted.py").read_text()
    variant = source.replace("torch.autocast(device_type=device.type)", "torch.autocast(device_type=device.type, dtype=torch.float16)")
    variant = variant.replace(
        "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n", step_code
    )
    if not keep_scaler:
        variant = variant.replace("scaler = torch.amp.GradScaler(device.type)\n", "")
    assert variant.count("float16") == 1 and step_code in variant
    assert ("scaler = torch.amp.GradScaler" in variant) is keep_scaler
    script = tmp_path / name
    script.write_text(variant)
    return verify_script(script)


SCALED_STEP = "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n"
UNSCALED_STEP = "    loss.backward()\n    optimizer.step()\n"


def test_float16_with_a_scaler_that_scales_verifies(tmp_path):
    result = _float16_variant(tmp_path, "scaled.py", SCALED_STEP)
    assert result.status == "verified", result.output[-2000:]
    assert result.evidence["backward"].get("float16", 0) > 0


def test_a_scaler_that_never_scales_the_backward_is_not_mixed_precision_training(tmp_path):
    """issue #12, item 13: float16 ops ran, the GradScaler exists, the loss was never scaled."""
    result = _float16_variant(tmp_path, "unscaled.py", UNSCALED_STEP)
    assert result.status == "not_active" and result.exit_code == 1, result.output[-2000:]
    assert result.reason.startswith("a GradScaler was created but never scaled a loss")
    assert result.evidence["reduced_precision_ops"] > 0 and result.evidence["scaler_scale_calls"] == 0


def test_float16_without_any_scaler_is_not_mixed_precision_training(tmp_path):
    result = _float16_variant(tmp_path, "no_scaler.py", UNSCALED_STEP, keep_scaler=False)
    assert result.status == "not_active", result.output[-2000:]
    assert result.reason.startswith("float16 backward passes ran without loss scaling (no torch.amp.GradScaler)")
