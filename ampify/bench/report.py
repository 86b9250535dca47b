"""`ampify bench` results as text, JSON and a small SVG chart for a pull request or a notebook."""

from __future__ import annotations

import json
import statistics
from html import escape
from typing import List, Optional

from ampify.bench.runner import CONVERTED, ORIGINAL, BenchResult


def _memory(result: BenchResult, variant: str) -> str:
    runs = result.of(variant)
    device = [r.peak_device_memory for r in runs if r.peak_device_memory]
    if device:
        return f"{max(device) / 2**20:.0f} MiB on the GPU"
    host = [r.peak_host_rss_kb for r in runs if r.peak_host_rss_kb]
    return f"{max(host) / 1024:.0f} MiB host RSS" if host else "-"


def _last_loss(result: BenchResult, variant: str) -> Optional[float]:
    last = [run.losses[-1] for run in result.of(variant) if run.losses]
    return statistics.median(last) if last else None


def as_dict(result: BenchResult, expectations: List[str]) -> dict:
    ratios = result.pair_ratios()
    return {
        "script": result.script,
        "warmup_steps": result.warmup,
        "measured_steps": result.steps,
        "repeats": len(result.of(ORIGINAL)),
        "batch_size": result.batch_size,
        "hardware": expectations,
        "variants": {
            variant: {
                "steps_per_second": [run.steps_per_second for run in result.of(variant)],
                "median_steps_per_second": result.median_rate(variant),
                "median_samples_per_second": result.median_samples_rate(variant),
                "peak_device_memory_bytes": max((r.peak_device_memory or 0 for r in result.of(variant)), default=0) or None,
                "peak_host_rss_kb": max((r.peak_host_rss_kb or 0 for r in result.of(variant)), default=0) or None,
                "losses_of_last_run": result.of(variant)[-1].losses if result.of(variant) else [],
            }
            for variant in (ORIGINAL, CONVERTED)
        },
        "ratio": statistics.median(ratios) if ratios else None,
        "ratio_spread": [min(ratios), max(ratios)] if ratios else None,
        "order": [run.variant for run in result.runs],
        "loss_warning": result.loss_warning(),
    }


def render_json(result: BenchResult, expectations: List[str]) -> str:
    return json.dumps(as_dict(result, expectations), indent=2)


def render_text(result: BenchResult, expectations: List[str]) -> str:
    repeats = len(result.of(ORIGINAL))
    lines = [f"ampify bench {result.script}: {repeats} run{'s' if repeats != 1 else ''} of each, taken in turns; "
             f"{result.steps} optimizer steps timed after {result.warmup} warm-up step{'s' if result.warmup != 1 else ''}"]
    lines += [f"hardware: {line}" for line in expectations]
    samples = result.batch_size is not None
    lines.append(f"{'':18}{'steps/s':>10}" + (f"{'samples/s':>12}" if samples else "")
                 + f"  {'peak memory':<22}{'last loss':>12}")
    for variant in (ORIGINAL, CONVERTED):
        rate = result.median_rate(variant)
        loss = _last_loss(result, variant)
        per_sample = result.median_samples_rate(variant)
        lines.append(f"{variant:18}{(f'{rate:.2f}' if rate else '-'):>10}"
                     + (f"{(f'{per_sample:.1f}' if per_sample else '-'):>12}" if samples else "")
                     + f"  {_memory(result, variant):<22}{(f'{loss:.5g}' if loss is not None else '-'):>12}")
    if samples:
        lines.append(f"samples/s: steps/s x {result.batch_size} samples a step")
    ratios = result.pair_ratios()
    if ratios:
        spread = f" ({min(ratios):.2f}x - {max(ratios):.2f}x over {len(ratios)} pairs)" if len(ratios) > 1 else ""
        lines.append(f"mixed / fp32 steps/s: {statistics.median(ratios):.2f}x{spread}")
    warning = result.loss_warning()
    if warning:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def render_svg(result: BenchResult, expectations: List[str]) -> str:
    """A bar per run (steps/s), fp32 and mixed side by side, with the median ratio as the title."""
    runs = [run for run in result.runs if run.steps_per_second]
    top = max((run.steps_per_second for run in runs), default=1.0)
    width, height, bar, gap = 60 + 34 * len(runs), 220, 24, 10
    ratios = result.pair_ratios()
    title = (f"{result.script}: mixed / fp32 = {statistics.median(ratios):.2f}x" if ratios else result.script)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(width, 360)}" height="{height}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="10" y="16" font-size="13">{escape(title)}</text>',
             f'<text x="10" y="{height - 8}">{escape(expectations[0] if expectations else "")[:90]}</text>']
    for index, run in enumerate(runs):
        scaled = 140 * run.steps_per_second / top
        x = 40 + index * (bar + gap)
        color = "#888888" if run.variant == ORIGINAL else "#2b7bb9"
        parts.append(f'<rect x="{x}" y="{180 - scaled:.1f}" width="{bar}" height="{scaled:.1f}" fill="{color}">'
                     f'<title>{escape(run.variant)} run {run.index + 1}: {run.steps_per_second:.2f} steps/s</title></rect>')
        parts.append(f'<text x="{x}" y="195">{"fp32" if run.variant == ORIGINAL else "mixed"}</text>')
    parts.append('<text x="10" y="40">steps/s</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
