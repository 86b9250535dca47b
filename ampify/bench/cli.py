"""`ampify bench SCRIPT [-- ARGS]`: the fp32 script and its ampify conversion, side by side."""
import sys
from pathlib import Path
from typing import List, Optional

import typer

from ampify.subcommand import run_with_script_args
from ampify.bench.hardware import expectations, query_device
from ampify.bench.report import render_json, render_svg, render_text
from ampify.bench.runner import BenchError, bench_script
from ampify.options import DTYPES, Options
from ampify.verify import detect

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def bench(
    ctx: typer.Context,
    script: str = typer.Argument(..., metavar="SCRIPT", help="An fp32 training script (its arguments go after --)."),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps timed per run."),
    warmup: int = typer.Option(5, "--warmup", min=1, help="Optimizer steps run before the timing starts."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Runs of each version, taken in turns (A, B, A, B...)."),
    dtype: str = typer.Option("float16", "--dtype", help="Reduced precision of the conversion: float16 or bfloat16."),
    python: Optional[str] = typer.Option(None, "--python", help="Interpreter of the training environment."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.1, help="Seconds before a run is killed."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE.svg", help="Also write a small SVG chart."),
) -> None:
    """Convert SCRIPT in memory, run both versions (never writing your files) and report steps/s,
    peak memory, the mixed/fp32 ratio with its spread, and the last losses of both.

    Exit codes: 0 measured; 2 a run failed (its error shown) or a usage error; 3 the script cannot be
    benchmarked (not converted by ampify, already mixed precision, no framework bench knows).
    """
    if dtype not in DTYPES:
        typer.echo(f"ampify bench: error: --dtype must be one of {', '.join(DTYPES)}", err=True)
        raise typer.Exit(2)
    script_args = (ctx.obj or {}).get("script_args", [])
    interpreter = python or sys.executable
    backend = detect.detect_backend(detect.read_script_text(Path(script))) if Path(script).is_file() else ""
    framework = {detect.GLUON: "mxnet", detect.KERAS: "tensorflow", detect.TF1: "tensorflow"}.get(backend, "torch")
    told = expectations(query_device(interpreter, framework), dtype)
    try:
        result = bench_script(script, script_args, python=interpreter, steps=steps, warmup=warmup,
                              repeats=repeats, options=Options(dtype=dtype), timeout=timeout)
    except BenchError as error:
        typer.echo(f"ampify bench: {error}", err=True)
        raise typer.Exit(error.code)
    typer.echo(render_json(result, told) if as_json else render_text(result, told))
    if plot is not None:
        plot.write_text(render_svg(result, told), encoding="utf-8")
    raise typer.Exit(0)


def main(argv: Optional[List[str]] = None) -> int:
    """Run `ampify bench` with `argv` (everything after `--` goes to the script); return the exit code."""
    return run_with_script_args(app, argv, "ampify bench")
