"""Run the original script and its conversion in turns (A, B, A, B, ...) and time their steps.

Each run goes through verify's probes in their bench mode: a timestamp after every optimizer
step (after the device finished), the loss of each measured step, peak memory; the script is
stopped after WARM-UP + STEPS steps. The user's files are never written: the converted script
is a temporary copy, run with the original's folder on its import path.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ampify.convert import ConversionError, convert_source
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.repository import project_view
from ampify.transforms.base import UnitContext
from ampify.verify import detect
from ampify.verify.judge import RunFacts
from ampify.verify.output_parsing import last_traceback_line
from ampify.verify.runner import EVIDENCE_PATH_ENV, FRAMEWORK_ENV, PROBE_MAIN, _run_child
from ampify.verify.targets import VERIFY_TARGETS

BENCH_ENV = "_AMPIFY_PROBE_BENCH"  # must match probes/_ampify_probe_common.py

ORIGINAL = "fp32 (original)"
CONVERTED = "mixed (ampify)"


class BenchError(Exception):
    """The script cannot be benchmarked; the message says why (exit code in `code`)."""

    def __init__(self, message: str, code: int = 3) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Run:
    variant: str
    index: int
    steps: int = 0
    seconds: float = 0.0
    losses: List[float] = field(default_factory=list)
    peak_device_memory: Optional[int] = None
    peak_host_rss_kb: Optional[int] = None
    #: samples a step, where the probe saw it (a DataLoader's batch_size, trainer.step(N), fit's
    #: batch_size, the leading dimension of a feed_dict)
    batch_size: Optional[int] = None
    failure: Optional[str] = None

    @property
    def steps_per_second(self) -> Optional[float]:
        return self.steps / self.seconds if self.steps and self.seconds > 0 else None


@dataclass
class BenchResult:
    script: str
    warmup: int
    steps: int
    runs: List[Run]
    notes: List[str] = field(default_factory=list)

    def of(self, variant: str) -> List[Run]:
        return [run for run in self.runs if run.variant == variant]

    @property
    def batch_size(self) -> Optional[int]:
        """The samples a step, when every run saw the same one (else None: no samples/s)."""
        sizes = {run.batch_size for run in self.runs}
        return sizes.pop() if len(sizes) == 1 else None

    def median_samples_rate(self, variant: str) -> Optional[float]:
        rate, batch = self.median_rate(variant), self.batch_size
        return rate * batch if rate and batch else None

    def median_rate(self, variant: str) -> Optional[float]:
        rates = [r.steps_per_second for r in self.of(variant) if r.steps_per_second]
        return statistics.median(rates) if rates else None

    def pair_ratios(self) -> List[float]:
        """converted / original steps/s for each pair of runs taken in turn."""
        ratios = []
        for original, converted in zip(self.of(ORIGINAL), self.of(CONVERTED)):
            if original.steps_per_second and converted.steps_per_second:
                ratios.append(converted.steps_per_second / original.steps_per_second)
        return ratios

    def loss_warning(self) -> Optional[str]:
        """A converted run whose loss became non-finite, or ended far above the original's."""
        converted = [loss for run in self.of(CONVERTED) for loss in run.losses]
        if any(not math.isfinite(loss) for loss in converted):
            return "the converted run's loss became non-finite (inf/nan): check the loss scaling and the hazards ampify reported"
        last_original = [run.losses[-1] for run in self.of(ORIGINAL) if run.losses]
        last_converted = [run.losses[-1] for run in self.of(CONVERTED) if run.losses]
        if last_original and last_converted:
            original, mixed = statistics.median(last_original), statistics.median(last_converted)
            if mixed > 1.5 * abs(original) + 1e-3:
                return (f"the converted run's last loss ({mixed:.4g}) is far above the original's ({original:.4g}): "
                        "it may diverge, or a dynamic loss scale may still be skipping its first steps; compare "
                        "longer runs")
        return None


def converted_copy(script: Path, options: Options, folder: Path) -> Path:
    """The converted script, written into `folder` under the script's own name."""
    source = script.read_bytes()
    try:
        conversion = convert_source(source, options, filename=str(script),
                                    context=UnitContext(str(script), project_view(script.resolve())))
    except ConversionError as error:
        raise BenchError(f"{script}: cannot be converted: {error}") from None
    if conversion.status is FileStatus.ALREADY_MIXED_PRECISION:
        raise BenchError(f"{script} already trains in mixed precision: bench compares an fp32 script with "
                         "the conversion ampify writes for it")
    if conversion.converted is None or conversion.status is not FileStatus.CHANGED:
        reason = conversion.reason or conversion.status.value
        raise BenchError(f"{script}: ampify does not convert it completely ({reason}): nothing to compare")
    if conversion.companions:
        raise BenchError(f"{script}: its conversion also changes "
                         + ", ".join(c.display for c in conversion.companions)
                         + "; bench runs single-file conversions only")
    copy = folder / script.name
    copy.write_bytes(conversion.converted)
    return copy


#: the frameworks bench times: detect's name -> (the probe's evidence section, the framework in words)
TIMED = {detect.TORCH: ("torch", "torch"), detect.UNKNOWN: ("torch", "torch"), detect.GLUON: ("gluon", "MXNet"),
         detect.KERAS: ("keras", "Keras"), detect.TF1: ("tf1", "TensorFlow")}


def _run_once(python: str, script: Path, as_given: str, script_args: Sequence[str], variant: str, index: int,
              warmup: int, steps: int, timeout: Optional[float], extra_path: Optional[Path],
              backend: str = detect.TORCH) -> Run:
    run = Run(variant, index)
    section, framework = TIMED[backend]
    env = dict(os.environ)
    env[BENCH_ENV] = f"{warmup},{steps}"
    env[FRAMEWORK_ENV] = backend
    for name, value, _ in VERIFY_TARGETS[backend].environment:  # as verify runs it (TF1: TF_USE_LEGACY_KERAS=1)
        env.setdefault(name, value)
    env["PYTHONUNBUFFERED"] = "1"
    if extra_path is not None:  # the converted copy imports the original's sibling modules
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory(prefix="ampify-bench-") as work:
        evidence_path = Path(work) / "evidence.json"
        output_path = Path(work) / "output.log"
        env[EVIDENCE_PATH_ENV] = str(evidence_path)
        command = [python, str(PROBE_MAIN), str(script), *script_args]
        try:
            returncode, timed_out = _run_child(command, env, timeout, output_path)
        except OSError as error:
            raise BenchError(f"cannot run {python}: {error.strerror or error}", 2) from None
        output = output_path.read_bytes().decode("utf-8", errors="replace")
        try:
            evidence = json.loads(evidence_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            evidence = {}
    probe = evidence.get(section, {})
    times = probe.get("step_times", [])
    if len(times) >= warmup + steps and warmup >= 1:
        run.steps = steps
        run.seconds = times[warmup + steps - 1] - times[warmup - 1]
        run.losses = [float(value) for value in probe.get("losses", [])]
        run.peak_device_memory = probe.get("peak_device_memory")
        run.peak_host_rss_kb = probe.get("peak_host_rss_kb")
        batch = probe.get("batch_size")
        run.batch_size = batch if isinstance(batch, int) and batch > 0 else None
        return run
    facts = RunFacts(output=output, probe=evidence, returncode=returncode, timed_out=timed_out, timeout=timeout)
    if timed_out:
        run.failure = f"timed out after {timeout:g} s with {len(times)} of {warmup + steps} steps"
    elif section not in evidence:
        run.failure = f"the script never imported {framework}"
    else:
        failure = last_traceback_line(output) if facts.failed else None
        run.failure = failure or f"the script ended after {len(times)} of {warmup + steps} optimizer steps"
    run.failure = f"{as_given} ({variant}): {run.failure}"
    return run


def bench_script(script: str, script_args: Sequence[str] = (), python: Optional[str] = None, steps: int = 20,
                 warmup: int = 5, repeats: int = 3, options: Optional[Options] = None,
                 timeout: Optional[float] = None) -> BenchResult:
    """Run the original and its conversion `repeats` times each, in turns."""
    path = Path(script)
    if not path.is_file():
        raise BenchError(f"no such script: {script}", 2)
    backend = detect.detect_backend(detect.read_script_text(path))
    if backend not in TIMED:
        raise BenchError(f"{script}: bench cannot time this script (it imports no framework it knows)")
    python = python or sys.executable
    options = options or Options()
    result = BenchResult(script, warmup, steps, [])
    with tempfile.TemporaryDirectory(prefix="ampify-bench-copy-") as folder:
        converted = converted_copy(path, options, Path(folder))
        variants: Dict[str, Path] = {ORIGINAL: path, CONVERTED: converted}
        for index in range(repeats):
            for variant, target in variants.items():
                extra = path.resolve().parent if target is converted else None
                run = _run_once(python, target, script, script_args, variant, index, warmup, steps, timeout, extra,
                                backend)
                result.runs.append(run)
                if run.failure:
                    raise BenchError(run.failure, 2)
    return result
