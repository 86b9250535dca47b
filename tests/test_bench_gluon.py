"""`ampify bench` on MXNet Gluon scripts (#20): both versions timed in turns through the Gluon probe's
bench mode, in the MXNet environment; the report's structure and counted steps, never speed."""
import json
import subprocess
import sys

import pytest

from ampify.bench.hardware import Device, expectations
from mxnet_environment import mxnet_bfloat16_python, mxnet_python

GLUON_SCRIPT = """\
import sys
import mxnet as mx
from mxnet import autograd, gluon, nd

mx.random.seed(0)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(4))
net.initialize(mx.init.Xavier())
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
x = nd.random.normal(shape=(32, 8))
y = nd.random.randint(0, 4, shape=(32,)).astype("float32")
for step in range(int(sys.argv[1])):
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(32)
"""


def _bench(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ampify", "bench", *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gluon_versions_run_in_turns_for_the_counted_steps(tmp_path, dtype):
    python = mxnet_bfloat16_python() if dtype == "bfloat16" else mxnet_python()
    script = tmp_path / "train.py"
    script.write_text(GLUON_SCRIPT)
    run = _bench(script, "--python", python, "--dtype", dtype, "--steps", "3", "--warmup", "1", "--repeats", "2",
                 "--json", "--", "1000", cwd=tmp_path)
    if dtype == "float16":  # float16 MXNet operators need CuDNN: the converted run fails, and bench says so
        assert run.returncode == 2 and "mixed (ampify)" in run.stderr and "CuDNN" in run.stderr
        return
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["order"] == ["fp32 (original)", "mixed (ampify)", "fp32 (original)", "mixed (ampify)"]
    for variant in report["variants"].values():
        assert len(variant["steps_per_second"]) == 2 and all(rate > 0 for rate in variant["steps_per_second"])
        assert len(variant["losses_of_last_run"]) == 3  # one loss a timed step, the scaled one not twice
        assert variant["peak_host_rss_kb"] > 0
    original, mixed = (report["variants"][name]["losses_of_last_run"] for name in ("fp32 (original)", "mixed (ampify)"))
    assert all(abs(a - b) <= 0.03 * abs(a) for a, b in zip(original, mixed))
    assert report["hardware"][0].startswith("CPU only (no CUDA GPU)")
    assert report["batch_size"] == 32  # trainer.step(32)
    for variant in report["variants"].values():
        assert variant["median_samples_per_second"] == pytest.approx(32 * variant["median_steps_per_second"])
    assert script.read_text() == GLUON_SCRIPT and [p.name for p in tmp_path.iterdir()] == ["train.py"]


def test_a_gpu_whose_capability_is_not_reported_is_described_as_such():
    told = expectations(Device(True), "float16")
    assert told == ["a CUDA GPU, whose compute capability the framework does not report: float16 pays off with "
                    "tensor cores (compute capability 7.0, and 8.0 for bfloat16)"]
