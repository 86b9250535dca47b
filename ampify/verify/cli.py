"""`ampify verify SCRIPT... [-- SCRIPT_ARGS...]`: run scripts under the probes and report the evidence."""
import sys
from typing import List, Optional

import typer

from ampify.subcommand import run_with_script_args
from ampify.verify.report import combined_exit_code, render_outputs, render_results, render_rich_table
from ampify.verify.runner import verify_script

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def verify(
    ctx: typer.Context,
    scripts: List[str] = typer.Argument(..., metavar="SCRIPT...", help="Training scripts to run (arguments for them go after --)."),
    python: Optional[str] = typer.Option(None, "--python", help="Interpreter of the training environment."),
    full: bool = typer.Option(False, "--full", help="Let the script finish instead of stopping after one step."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0.1, help="Seconds before the script is killed."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    show_output: bool = typer.Option(False, "--show-output", help="Also print each script's own output."),
) -> None:
    """Run each SCRIPT as `python SCRIPT ARGS` and report whether mixed precision really ran.

    Exit codes: 0 verified, 1 ran but mixed precision not active, 2 the script failed or timed out before any evidence, 3 cannot be verified on this machine.
    """
    script_args = (ctx.obj or {}).get("script_args", [])
    if python is not None and not python.strip():
        typer.echo("ampify verify: error: --python is empty: name the interpreter of the training environment", err=True)
        raise typer.Exit(2)
    results = [
        verify_script(script, script_args, python=python, full=full, timeout=timeout) for script in scripts
    ]
    if len(results) > 1 and not as_json and sys.stdout.isatty():
        from rich.console import Console

        if show_output:
            typer.echo(render_outputs(results))
        Console().print(render_rich_table(results))
    else:
        typer.echo(render_results(results, as_json=as_json, show_output=show_output))
    raise typer.Exit(combined_exit_code(results))


def main(argv: Optional[List[str]] = None) -> int:
    """Run `ampify verify` with `argv` (everything after `--` goes to the scripts); return the exit code."""
    return run_with_script_args(app, argv, "ampify verify")
