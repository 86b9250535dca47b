"""Render verify results for people (one verdict line per script, a table for several) and for machines."""
import json
from typing import Iterable, List, Sequence

from ampify.verify.result import CANNOT_VERIFY, NOT_ACTIVE, SCRIPT_FAILED, VERIFIED, VerifyResult

# The combined exit code reports the most important finding: a script that is provably not in
# mixed precision outranks one that crashed, which outranks one that cannot be checked here.
_EXIT_CODE_SEVERITY = {0: 0, 3: 1, 2: 2, 1: 3}
_STATUS_LABELS = {
    VERIFIED: "verified",
    NOT_ACTIVE: "not active",
    SCRIPT_FAILED: "script failed",
    CANNOT_VERIFY: "cannot verify",
}


def combined_exit_code(results: Iterable[VerifyResult]) -> int:
    """One exit code for several scripts: 1 (not active) > 2 (failed) > 3 (cannot verify) > 0."""
    codes = [result.exit_code for result in results]
    return max(codes, key=_EXIT_CODE_SEVERITY.__getitem__, default=0)


def _summary(results: Sequence[VerifyResult]) -> str:
    counts = {}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    return ", ".join("%d %s" % (counts[status], label) for status, label in _STATUS_LABELS.items() if status in counts)


def _plain_table(results: Sequence[VerifyResult]) -> List[str]:
    rows = [("SCRIPT", "STATUS", "VERDICT")] + [
        (result.script, _STATUS_LABELS[result.status], result.verdict) for result in results
    ]
    script_width = max(len(row[0]) for row in rows)
    status_width = max(len(row[1]) for row in rows)
    return ["%-*s  %-*s  %s" % (script_width, row[0], status_width, row[1], row[2]) for row in rows]


def render_outputs(results: Sequence[VerifyResult]) -> str:
    """Each script's own captured output (stdout and stderr, in order), framed by its name."""
    lines: List[str] = []
    for result in results:
        lines += ["----- output of %s -----" % result.script, result.output.rstrip("\n"), "----- end of output -----", ""]
    return "\n".join(lines)


def render_results(results: Sequence[VerifyResult], as_json: bool, show_output: bool) -> str:
    """Text for the terminal (or JSON with `as_json`); the scripts' own output with `show_output`."""
    results = list(results)
    if as_json:
        payload = {
            "exit_code": combined_exit_code(results),
            "results": [result.to_dict(include_output=show_output) for result in results],
        }
        return json.dumps(payload, indent=2, default=str)
    lines: List[str] = [render_outputs(results)] if show_output else []
    if len(results) == 1:
        lines.append("%s: %s" % (results[0].script, results[0].verdict))
    else:
        lines.extend(_plain_table(results))
        lines.append(_summary(results))
    for result in results:
        lines.extend("%s: note: %s" % (result.script, note) for note in result.notes)
    return "\n".join(lines)


def render_rich_table(results: Sequence[VerifyResult]):
    """A rich Table of several results, for an interactive terminal."""
    from rich.table import Table

    styles = {VERIFIED: "green", NOT_ACTIVE: "red", SCRIPT_FAILED: "yellow", CANNOT_VERIFY: "magenta"}
    table = Table(title="ampify verify")
    table.add_column("script", overflow="fold")
    table.add_column("status")
    table.add_column("verdict", overflow="fold")
    for result in results:
        style = styles[result.status]
        table.add_row(result.script, "[%s]%s[/]" % (style, _STATUS_LABELS[result.status]), result.verdict)
    table.caption = _summary(results)
    return table
