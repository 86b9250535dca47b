"""`ampify bench` (#20): the timing machinery and its report on tiny CPU scripts (structure and
counted steps, never speed), and the hardware messages with the device query replaced."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from ampify.bench.hardware import Device, expectations

FP32_SCRIPT = """\
import sys
import torch

torch.manual_seed(0)
device = torch.device("cpu")
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(64, 16)
target = data[:, :1]
for step in range(int(sys.argv[1])):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(data.to(device)), target.to(device))
    loss.backward()
    optimizer.step()
"""


def _bench(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ampify", "bench", *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


def test_both_versions_run_in_turns_for_the_counted_steps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FP32_SCRIPT)
    run = _bench(script, "--steps", "3", "--warmup", "1", "--repeats", "2", "--json", "--plot", tmp_path / "chart.svg",
                 "--", "1000", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["order"] == ["fp32 (original)", "mixed (ampify)", "fp32 (original)", "mixed (ampify)"]
    assert report["measured_steps"] == 3 and report["warmup_steps"] == 1 and report["repeats"] == 2
    for variant in report["variants"].values():
        assert len(variant["steps_per_second"]) == 2 and all(rate > 0 for rate in variant["steps_per_second"])
        assert len(variant["losses_of_last_run"]) == 3  # one loss per timed step
        assert variant["peak_host_rss_kb"] > 0
    assert report["ratio"] > 0 and len(report["ratio_spread"]) == 2
    assert report["hardware"][0].startswith("CPU only (no CUDA GPU): a CPU run is a correctness check")
    assert report["loss_warning"] is None
    assert report["batch_size"] is None  # no DataLoader: samples/s is not claimed
    assert script.read_text() == FP32_SCRIPT and sorted(p.name for p in tmp_path.iterdir()) == ["chart.svg", "train.py"]
    assert (tmp_path / "chart.svg").read_text().count("<rect ") == 4

    text = _bench(script, "--steps", "2", "--warmup", "1", "--repeats", "1", "--", "1000", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].endswith("1 run of each, taken in turns; 2 optimizer steps timed after 1 warm-up step")
    assert lines[1].startswith("hardware: CPU only")
    assert lines[3].startswith("fp32 (original)") and lines[4].startswith("mixed (ampify)")
    assert lines[5].startswith("mixed / fp32 steps/s: ")


def test_a_script_that_stops_too_early_is_a_failed_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(FP32_SCRIPT)
    run = _bench(script, "--steps", "5", "--warmup", "2", "--repeats", "1", "--", "3")
    assert run.returncode == 2
    assert "(fp32 (original)): the script ended after 3 of 7 optimizer steps" in run.stderr


def test_scripts_that_cannot_be_compared_say_why(tmp_path):
    already = tmp_path / "amp.py"
    already.write_text(FP32_SCRIPT.replace("optimizer = torch.optim.SGD(model.parameters(), lr=0.01)",
                                           "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
                                           "scaler = torch.amp.GradScaler('cpu')"))
    run = _bench(already)
    assert run.returncode == 3 and "already trains in mixed precision" in run.stderr
    missing = _bench(tmp_path / "nope.py")
    assert missing.returncode == 2 and "no such script" in missing.stderr


@pytest.mark.parametrize("device,dtype,expected", [
    (Device(True, "Tesla P100", (6, 0)), "float16", "has no tensor cores: float16 will not be faster"),
    (Device(True, "Tesla V100", (7, 0)), "float16", "has tensor cores"),
    (Device(True, "Tesla T4", (7, 5)), "bfloat16", "bfloat16 needs compute capability 8.0"),
    (Device(True, "NVIDIA H200", (9, 0)), "bfloat16", "has tensor cores"),
    (Device(False, cpu_bf16_flags=[]), "bfloat16", "no AVX512-BF16 or AMX: bfloat16 is emulated"),
    (Device(False, cpu_bf16_flags=["amx_bf16", "avx512_bf16"]), "bfloat16", "amx_bf16, avx512_bf16: bfloat16"),
    (None, "float16", "could not be queried"),
])
def test_hardware_messages(device, dtype, expected):
    told = " | ".join(expectations(device, dtype))
    assert expected in told
    if device is not None and not device.cuda:
        assert told.startswith("CPU only (no CUDA GPU): a CPU run is a correctness check")


LOADER_SCRIPT = FP32_SCRIPT.replace(
    "for step in range(int(sys.argv[1])):\n    optimizer.zero_grad()\n    loss = torch.nn.functional.mse_loss(model(data.to(device)), target.to(device))",
    "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, target), batch_size=8)\n"
    "for step in range(int(sys.argv[1])):\n    batch, wanted = next(iter(loader))\n    optimizer.zero_grad()\n"
    "    loss = torch.nn.functional.mse_loss(model(batch.to(device)), wanted.to(device))")


def test_samples_per_second_come_from_the_loader_the_steps_draw_from(tmp_path):
    assert "DataLoader" in LOADER_SCRIPT
    script = tmp_path / "train.py"
    script.write_text(LOADER_SCRIPT)
    run = _bench(script, "--steps", "2", "--warmup", "1", "--repeats", "1", "--", "1000", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "samples/s: steps/s x 8 samples a step" in run.stdout.splitlines()
