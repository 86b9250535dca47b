"""verify's apex evidence: amp.initialize returned, float16 ran, and amp.scale_loss scaled the loss.

Real apex cannot run here (not on the package index; amp.initialize refuses CPU models), so these
runs use a CPU stand-in of `apex.amp` with apex's own signatures (fixtures/verify/apex_standin),
and the CUDA query is answered at its boundary. What is under test is the probe and the judge.
"""
import pytest

torch = pytest.importorskip("torch")

from verify_helpers import FIXTURES

from ampify.verify import runner
from ampify.verify.runner import verify_script


@pytest.fixture
def apex_standin(monkeypatch):
    monkeypatch.setattr(runner, "cuda_available", lambda python: True)
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES / "apex_standin"))


def test_apex_backward_through_scale_loss_verifies(apex_standin):
    result = verify_script(FIXTURES / "apex_cpu_scaled.py")
    assert result.backend == "apex"
    assert result.status == "verified", result.output[-2000:]
    assert result.evidence["apex_initialized"] and result.evidence["apex_scale_loss_calls"] == 1
    assert result.evidence["apex_loss_scale"] == 65536.0
    assert result.evidence["backward"].get("float16", 0) > 0
    assert "1 optimizer step, apex amp O1, amp.scale_loss scaled 1 loss" in result.verdict


def test_apex_backward_outside_scale_loss_is_not_active(apex_standin):
    result = verify_script(FIXTURES / "apex_cpu_unscaled.py")
    assert result.status == "not_active" and result.exit_code == 1, result.output[-2000:]
    assert result.evidence["apex_initialized"] and result.evidence["apex_scale_loss_calls"] == 0
    assert result.evidence["backward"].get("float16", 0) > 0
    assert result.reason.startswith("apex amp.initialize ran, but no backward pass went through amp.scale_loss")
