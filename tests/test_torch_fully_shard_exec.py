"""FSDP2 (torch.distributed.fsdp.fully_shard) converted with a plain GradScaler, run on two ranks.

The claim behind converting it: fully_shard's gradients are DTensors, and DTensor reduces the
inf/NaN check of GradScaler.unscale_ over the mesh, so an overflow on one rank makes every rank
skip the step. The script poisons one element of rank 1's own gradient shard at one step; the
converted script must skip that step on both ranks, where the unconverted one steps on rank 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.fsdp")
if not torch.distributed.is_available():  # pragma: no cover - CPU wheels ship gloo
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from ampify.convert import convert_source  # noqa: E402
from ampify.findings import FileStatus  # noqa: E402
from ampify.options import Options  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / "exec_distributed" / "fully_shard_two_ranks.py"
POISON_STEP = 2


def _run_two_ranks(script: Path, results: Path) -> dict:
    results.mkdir()
    env = dict(os.environ, RESULTS_DIR=str(results), OMP_NUM_THREADS="1")
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    written = all((results / f"rank{rank}.json").exists() for rank in (0, 1))
    # gloo may abort a process while it tears down after the results are written (seen under a
    # loaded machine); anything else is a failure
    teardown_abort = written and "terminate called without an active exception" in completed.stderr
    assert completed.returncode == 0 or teardown_abort, completed.stderr[-3000:]
    return {rank: json.loads((results / f"rank{rank}.json").read_text()) for rank in (0, 1)}


def test_fully_shard_converts_with_a_plain_grad_scaler_and_apex_refuses_it():
    source = SCRIPT.read_text()
    native = convert_source(source, Options(), filename=SCRIPT.name)
    assert native.status is FileStatus.CHANGED, native.reason
    assert "scaler = torch.amp.GradScaler(device.type)" in native.converted
    assert "scaler.step(optimizer)" in native.converted
    assert not any(f.code == "AMP222" for f in native.findings)
    apex = convert_source(source, Options(backend="apex"), filename=SCRIPT.name)
    assert apex.status is FileStatus.UNCONVERTED and {f.code for f in apex.findings} == {"AMP320"}


def test_private_fully_shard_spelling_stays_refused():
    source = SCRIPT.read_text().replace("from torch.distributed.fsdp import fully_shard",
                                        "from torch.distributed._composable.fsdp import fully_shard")
    result = convert_source(source, Options(), filename=SCRIPT.name)
    assert result.status is FileStatus.UNCONVERTED
    assert {f.code for f in result.findings} == {"AMP222"}
    assert convert_source(source, Options(dtype="bfloat16"), filename=SCRIPT.name).status is FileStatus.CHANGED


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    converted = tmp_path / "converted.py"
    converted.write_text(convert_source(SCRIPT.read_text(), Options(), filename=SCRIPT.name).converted)
    original = _run_two_ranks(SCRIPT, tmp_path / "fp32")
    # without loss scaling the poisoned gradient is stepped: rank 0 had no inf and stepped too,
    # and the inf reaches every rank's shard through the next all-gather
    assert original[0]["changed"][POISON_STEP] and original[1]["changed"][POISON_STEP]
    assert not original[0]["finite"]
    mixed = _run_two_ranks(converted, tmp_path / "mixed")
    assert mixed[0]["changed"] == mixed[1]["changed"], mixed
    assert mixed[0]["changed"][POISON_STEP] is False, mixed
    assert mixed[0]["changed"][-1] is True, mixed  # training goes on after the skipped step
    assert mixed[0]["finite"] and mixed[1]["finite"]
