"""The `ampify` command: a thin layer over discover -> run -> report.

`ampify PATH...` rewrites in place, `--diff` prints a diff, `--check` exits 1 when a file would
change. `ampify verify SCRIPT` is handed to `ampify.verify`; `ampify rules` / `ampify rule CODE` show
the rule catalogue (ampify/rules.py).
Exit codes (as ruff and black): 0 nothing to do or all done; 1 changes needed (with --check),
a file failed, or training code could not be converted; 2 usage error; 128 + the signal when
stopped by SIGINT (130), SIGTERM (143) or SIGHUP (129), after the summary and report.
"""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import typer

from ampify import __version__
from ampify.config import ConfigError, load_config
from ampify.discover import discover
from ampify.engine import DEFAULT_MAX_FILE_BYTES, FileTask, Mode
from ampify.findings import FileResult, FileStatus
from ampify.names import for_terminal
from ampify.registry import declared_options, options_from
from ampify.change_set import recover_change_sets
from ampify.output_formats import FORMATS, render_github, render_json, render_markdown, render_sarif, write_json_report
from ampify.report import (
    apply_selection, diffs_to_print, exit_code, in_conditional, keep_latest_diffs, merge_change_sets, render_file,
    render_summary, summarize,
)
from ampify.rules import Selection, UnknownRule, render_list, render_rule, rule
from ampify.runner import DEFAULT_FILE_TIMEOUT, Interrupted, default_jobs, run_tasks
from ampify.source_io import remove_abandoned_temp_files

#: a progress bar only pays off from this many files on
PROGRESS_THRESHOLD = 50

app = typer.Typer(add_completion=True, no_args_is_help=True, rich_markup_mode=None)

# Choices as enums, so that --help shows them and typer rejects anything else.
#: the targets' own options (transforms/<target>/target.py): their choices and help texts are the
#: declarations', the flags below must name every one (tests/test_rules.py checks it)
_DECLARED = {option.field: option for option in declared_options()}


def _choices(field: str) -> type:
    return enum.Enum(f"_{field}", {name: name for name in _DECLARED[field].choices}, type=str)


_Backend = _choices("backend")
_Dtype = _choices("dtype")
_OptLevel = _choices("apex_opt_level")
_OutputFormat = enum.Enum("_OutputFormat", {name: name for name in FORMATS}, type=str)


def _value(choice) -> Optional[str]:
    return None if choice is None else choice.value


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ampify {__version__}")
        raise typer.Exit()


@app.command(
    help="Rewrite TensorFlow 1.x, TF2/Keras, PyTorch and MXNet Gluon training scripts under PATH to train in automatic mixed "
    "precision.\n\n"
    "Other commands: `ampify verify SCRIPT [-- ARGS]` runs a rewritten script and proves that mixed precision "
    "engaged (`ampify verify --help`); `ampify bench SCRIPT [-- ARGS]` times an fp32 script against its "
    "conversion (`ampify bench --help`); `ampify rules` lists the rule codes, `ampify rule CODE` explains one.\n\n"
    "Exit codes: 0 nothing to do or all done; 1 changes needed (--check), a file failed, was not converted or "
    "was converted incompletely; 2 usage error; 130/143/129 stopped by SIGINT/SIGTERM/SIGHUP."
)
def rewrite(
    paths: List[Path] = typer.Argument(
        ..., metavar="PATH...",
        help="Files or folders to convert; `-` reads one file from standard input and writes the result to standard output.",
    ),
    diff: bool = typer.Option(False, "--diff", help="Print a unified diff; write nothing."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when any file would change."),
    exclude: List[str] = typer.Option([], "--exclude", metavar="GLOB", help="Skip paths matching GLOB (.gitignore syntax); repeatable."),
    no_gitignore: bool = typer.Option(False, "--no-gitignore", help="Also convert files .gitignore excludes."),
    jobs: Optional[int] = typer.Option(None, "-j", "--jobs", min=1, help="Worker processes (default: all cores; more than the cores only with --force-jobs)."),
    force_jobs: bool = typer.Option(False, "--force-jobs", help="Start as many workers as -j says, even more than the cores."),
    file_timeout: Optional[float] = typer.Option(
        None, "--file-timeout", metavar="SECONDS", min=0,
        help=f"Give up on a file still converting after SECONDS (default {DEFAULT_FILE_TIMEOUT:g}; 0: no limit).",
    ),
    max_file_size: Optional[float] = typer.Option(
        None, "--max-file-size", metavar="MB", min=0,
        help=f"Skip files larger than MB megabytes (default {DEFAULT_MAX_FILE_BYTES / 1e6:g}; 0: no limit).",
    ),
    write_through_hardlinks: bool = typer.Option(
        False, "--write-through-hardlinks",
        help="Rewrite a file that has other hard links in place (keeps the links; not atomic). Default: refuse it.",
    ),
    report: Optional[Path] = typer.Option(None, "--report", metavar="FILE.json", help="Write every result and finding as JSON."),
    output_format: _OutputFormat = typer.Option(
        "text", "--output-format",
        help="How findings and statuses are printed: text (default), json (the --report document), github "
        "(GitHub Actions annotations), markdown (a review summary for a pull request), sarif (SARIF 2.1.0 for code "
        "scanning).",
    ),
    stdin_filename: Optional[Path] = typer.Option(
        None, "--stdin-filename", metavar="PATH",
        help="With `-`: the file's name for messages, and where to look for [tool.ampify] and the repository.",
    ),
    backend: Optional[_Backend] = typer.Option(None, _DECLARED["backend"].flag, help=_DECLARED["backend"].help),
    dtype: Optional[_Dtype] = typer.Option(None, _DECLARED["dtype"].flag, help=_DECLARED["dtype"].help),
    opt_level: Optional[_OptLevel] = typer.Option(None, _DECLARED["apex_opt_level"].flag, help=_DECLARED["apex_opt_level"].help),
    no_tf_ignore_performance: bool = typer.Option(
        False, _DECLARED["tf_ignore_performance"].flag, help=_DECLARED["tf_ignore_performance"].help
    ),
    no_migrate: bool = typer.Option(False, _DECLARED["migrate"].flag, help=_DECLARED["migrate"].help),
    select: List[str] = typer.Option([], "--select", metavar="CODES", help="Report only these rule codes or prefixes (AMP1, AMP213); comma-separated or repeated."),
    ignore: List[str] = typer.Option([], "--ignore", metavar="CODES", help="Do not report these rule codes or prefixes; an ignored warning no longer makes a conversion incomplete."),
    verify: List[Path] = typer.Option([], "--verify", metavar="SCRIPT", help="After rewriting, run `ampify verify` on SCRIPT; repeatable."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also list files that were not applicable."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print only problems and the summary."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    reading_stdin = [str(p) for p in paths] == ["-"]
    if not reading_stdin:
        for path in paths:
            if str(path) == "-":
                _usage_error("`-` (standard input) cannot be combined with other paths")
            if not path.exists() and not path.is_symlink():
                _usage_error(f"Invalid value for 'PATH...': Path {for_terminal(str(path))!r} does not exist.")
    elif stdin_filename is None:
        stdin_filename = Path("<stdin>")
    try:
        config = load_config([stdin_filename.parent if stdin_filename.parent.exists() else Path(".")]
                             if reading_stdin else paths)
    except ConfigError as error:
        _usage_error(str(error))
    try:
        options = options_from(
            {
                "backend": _value(backend),
                "dtype": _value(dtype),
                "apex_opt_level": _value(opt_level),
                "tf_ignore_performance": no_tf_ignore_performance,
                "migrate": no_migrate,
            },
            config.target_options,
        )
    except ValueError as error:
        _usage_error(str(error))
    try:
        selection = Selection.from_lists(
            _split_codes([*config.select, *select]), _split_codes([*config.ignore, *ignore])
        )
    except UnknownRule as error:
        _usage_error(f"--select/--ignore: {error}")
    if verify and (diff or check):
        _usage_error("--verify runs the rewritten script, so it cannot be combined with --diff or --check")
    output_format = output_format.value
    if diff and output_format in ("json", "markdown", "sarif"):
        _usage_error(f"--diff prints a patch on standard output, so it cannot be combined with --output-format {output_format}")
    if reading_stdin:
        from ampify.stdin_mode import convert_stdin

        mode = Mode.DIFF if diff else Mode.CHECK if check else Mode.WRITE
        raise typer.Exit(convert_stdin(stdin_filename, options, mode, selection))
    if report is not None:
        _check_report_folder(report)

    mode = Mode.DIFF if diff else Mode.CHECK if check else Mode.WRITE
    respect_gitignore = not no_gitignore and config.respect_gitignore is not False
    found = discover(paths, [*config.exclude, *exclude], respect_gitignore)
    if report is not None:
        _check_report_not_converted(report, found.candidates)
    size_limit = _first_set(max_file_size, config.max_file_size, DEFAULT_MAX_FILE_BYTES / 1e6)
    time_limit = _first_set(file_timeout, config.file_timeout, DEFAULT_FILE_TIMEOUT)
    tasks = [
        FileTask(candidate, options, mode, max_file_bytes=int(size_limit * 1e6) or None,
                 write_through_hardlinks=write_through_hardlinks, named=tuple(paths))
        for candidate in found.candidates
    ]
    results: List[FileResult] = [FileResult(path, FileStatus.SKIPPED, reason) for path, reason in found.skipped]

    # In --diff mode stdout carries nothing but the patch; everything else goes to stderr.
    out = sys.stderr if diff or output_format in ("json", "markdown", "sarif") else sys.stdout
    workers, capped = worker_count(jobs or config.jobs, force_jobs)
    if capped and not quiet:
        print(f"ampify: -j {jobs or config.jobs} capped at {workers}, the CPU count "
              "(--force-jobs starts that many workers)", file=out)

    # A change set a killed run left half-written is finished before anything is read.
    for line in recover_change_sets({candidate.path.parent for candidate in found.candidates}):
        print(line, file=out)
    stopped_by = None
    try:
        _run_with_progress(tasks, workers, results, time_limit or None)
    except Interrupted as stop:
        stopped_by = stop
    keep_latest_diffs(results)
    results = merge_change_sets(results)
    results.sort(key=lambda r: r.path)
    interrupted = stopped_by is not None
    if not selection.everything:
        results = [apply_selection(result, selection) for result in results]
    for diff in diffs_to_print(results):
        sys.stdout.write(diff)
    for result in results:
        if output_format != "text":
            continue
        lines = render_file(result, verbose, problems_only=quiet, conditional=mode is not Mode.WRITE)
        for line in lines:
            print(line, file=sys.stderr if result.status is FileStatus.FAILED else out)
    summary = summarize(results)
    if found.ignored_by_gitignore:
        count = found.ignored_by_gitignore
        print(
            f"ampify: {count} Python file{'s' if count != 1 else ''} left out by .gitignore "
            "(--no-gitignore includes them)",
            file=out,
        )
    _report_abandoned_temp_files(found.abandoned_temp_files, mode, out)
    wrote = mode is Mode.WRITE
    if output_format == "text":
        print(render_summary(summary, wrote=wrote, interrupted=interrupted), file=out)
    elif output_format == "github":
        print(render_github(results if wrote else [in_conditional(r) for r in results], summary, wrote, interrupted))
    else:
        # standard output carries the document alone; the summary line goes to standard error
        print(render_summary(summary, wrote=wrote, interrupted=interrupted), file=sys.stderr)
        if output_format == "json":
            print(render_json(results, summary, options, mode.value, interrupted))
        elif output_format == "sarif":
            print(render_sarif(results, interrupted))
        else:
            sys.stdout.write(render_markdown(results if wrote else [in_conditional(r) for r in results], summary, wrote,
                                             interrupted))
    report_failed = False
    if report is not None:
        try:
            write_json_report(report, results, summary, options, mode.value, interrupted)
        except OSError as error:
            print(f"ampify: error: cannot write the report {for_terminal(str(report))}: {error.strerror or error}",
                  file=sys.stderr)
            report_failed = True

    if stopped_by is not None:
        raise typer.Exit(stopped_by.exit_code)
    code = max(exit_code(results, would_change_fails=mode is Mode.CHECK), 1 if report_failed else 0)
    if verify:
        code = max(code, _verify_after_rewrite(verify))
    raise typer.Exit(code)


def _report_abandoned_temp_files(paths: List[Path], mode: Mode, out) -> None:
    """Temporary files of a killed ampify run: a rewrite run removes them, the others list them."""
    if not paths:
        return
    if mode is Mode.WRITE:
        removed = remove_abandoned_temp_files(paths)
        if removed:
            print(f"ampify: removed {removed} temporary file{'s' if removed != 1 else ''} left by a killed ampify run "
                  "(every source file was already either untouched or fully replaced)", file=out)
        return
    listed = ", ".join(for_terminal(str(p)) for p in paths[:5]) + (", ..." if len(paths) > 5 else "")
    print(f"ampify: {len(paths)} temporary file{'s' if len(paths) != 1 else ''} left by a killed ampify run "
          f"(safe to delete; a rewrite run removes them): {listed}", file=out)


def _split_codes(entries: List[str]) -> List[str]:
    return [part for entry in entries for part in entry.split(",") if part.strip()]


def worker_count(asked: Optional[int], force: bool) -> Tuple[int, bool]:
    """(workers to start, whether the number asked for was capped at the CPU count)."""
    cores = default_jobs()
    if asked is None:
        return cores, False
    if asked > cores and not force:
        return cores, True
    return asked, False


def _first_set(*values):
    return next(value for value in values if value is not None)


def _check_report_folder(report: Path) -> None:
    """Before anything is touched: the report can be written where it was asked for."""
    shown = for_terminal(str(report))
    if report.is_dir():
        _usage_error(f"--report {shown}: is a folder; name a file")
    folder = report.parent if str(report.parent) else Path(".")
    if not folder.is_dir():
        _usage_error(f"--report {shown}: the folder {for_terminal(str(folder))} does not exist")
    if not os.access(folder, os.W_OK) or (report.exists() and not os.access(report, os.W_OK)):
        _usage_error(f"--report {shown}: no permission to write it")


def _check_report_not_converted(report: Path, candidates) -> None:
    """The report must never overwrite a file this run converts."""
    target = report.resolve()
    for candidate in candidates:
        if candidate.path.resolve() == target:
            _usage_error(f"--report {for_terminal(str(report))}: is one of the files this run converts; "
                         "choose another path")


def _run_with_progress(tasks: List[FileTask], jobs: int, results: List[FileResult], file_timeout) -> None:
    """Append each result to `results` as it comes, so that after a stop signal the summary still
    counts every file that was done (`Interrupted` propagates once the workers stopped)."""
    if not sys.stderr.isatty() or len(tasks) < PROGRESS_THRESHOLD:
        for result in run_tasks(tasks, jobs, file_timeout=file_timeout):
            results.append(result)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
    ) as progress:
        bar = progress.add_task("ampify", total=len(tasks))
        for result in run_tasks(tasks, jobs, file_timeout=file_timeout):
            results.append(result)
            progress.advance(bar)


def _verify_after_rewrite(scripts: List[Path]) -> int:
    from ampify.verify.report import combined_exit_code, render_results
    from ampify.verify.runner import verify_script

    results = [verify_script(script) for script in scripts]
    print(render_results(results, as_json=False, show_output=False))
    return combined_exit_code(results)


def _rules_command(command: str, args: List[str]) -> int:
    """`ampify rules` lists the catalogue; `ampify rule CODE` explains one rule."""
    try:
        return _print_rules(command, args)
    except BrokenPipeError:  # `ampify rules | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _print_rules(command: str, args: List[str]) -> int:
    if command == "rules":
        if args:
            print("ampify rules: error: takes no arguments (`ampify rule CODE` explains one rule)", file=sys.stderr)
            return 2
        print(render_list())
        return 0
    if len(args) != 1:
        print("ampify rule: error: name one rule code, e.g. `ampify rule AMP213`", file=sys.stderr)
        return 2
    found = rule(args[0])
    if found is None:
        print(f"ampify rule: error: no rule {args[0]!r} (`ampify rules` lists them)", file=sys.stderr)
        return 2
    print(render_rule(found))
    return 0


def _usage_error(message: str) -> None:
    print(f"ampify: error: {message}", file=sys.stderr)
    raise typer.Exit(2)


def main(argv: Optional[List[str]] = None) -> None:
    """Entry point: `ampify verify ...` goes to the verifier, anything else rewrites."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] == "verify":
        from ampify.verify.cli import main as verify_main

        sys.exit(verify_main(args[1:]))
    if args and args[0] == "bench":  # a folder named bench is converted as `ampify ./bench`
        from ampify.bench.cli import main as bench_main

        sys.exit(bench_main(args[1:]))
    if args and args[0] in ("rules", "rule") and not Path(args[0]).exists():
        sys.exit(_rules_command(args[0], args[1:]))
    command = typer.main.get_command(app)
    command.main(args=args, prog_name="ampify")
