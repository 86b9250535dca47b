"""The run's results in the forms CI systems and reviewers read (`--output-format`).

- `text`: one line per finding and status, then the summary (report.py; the default);
- `json`: the document `--report` writes, on standard output;
- `github`: GitHub Actions workflow commands, one annotation per finding and per file that failed or
  was not converted (`::warning file=train.py,line=12,col=5,title=AMP215::...`), then the summary;
- `markdown`: a review summary for a pull request: what changed in each file and why, every warning
  with its line, the files left unconverted with the reason;
- `sarif`: SARIF 2.1.0, the static analysis format code scanning dashboards read: the rule catalogue as
  the tool's rules, one result per finding, one per file that failed or was not converted.

Lines and columns are 1-based everywhere (Finding.shown_line / shown_column).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from urllib.parse import quote
from pathlib import Path
from typing import Dict, List

from ampify import __version__
from ampify.findings import FileResult, FileStatus, Finding, Severity
from ampify.options import Options
from ampify.report import Summary, render_summary

FORMATS = ("text", "json", "github", "markdown", "sarif")

#: how each status is named, the same words in every format (the text summary's)
STATUS_WORDS: Dict[FileStatus, str] = {
    FileStatus.CHANGED: "changed",
    FileStatus.CHANGED_INCOMPLETE: "changed, incomplete",
    FileStatus.ALREADY_MIXED_PRECISION: "already mixed precision",
    FileStatus.NOT_APPLICABLE: "not applicable",
    FileStatus.UNCONVERTED: "not converted",
    FileStatus.SKIPPED: "skipped",
    FileStatus.FAILED: "failed",
}


def json_document(results: List[FileResult], summary: Summary, options: Options, mode: str,
                  interrupted: bool) -> dict:
    """Every file's result and every finding, for CI dashboards and scripts."""
    return {
        "ampify_version": __version__,
        "mode": mode,
        "interrupted": interrupted,
        "options": asdict(options),
        "summary": {
            "scanned": summary.scanned,
            **summary.by_status,
            "changes": summary.changes,
            "warnings": summary.warnings,
        },
        "files": [r.to_json() for r in sorted(results, key=lambda r: r.path)],
    }


def render_json(results, summary, options, mode, interrupted) -> str:
    return json.dumps(json_document(results, summary, options, mode, interrupted), indent=2)


def write_json_report(path: Path, results, summary, options, mode: str, interrupted: bool) -> None:
    """`--report FILE.json`: the same document as `--output-format json`."""
    path.write_text(render_json(results, summary, options, mode, interrupted) + "\n", encoding="utf-8")


# -- GitHub Actions -----------------------------------------------------------------------

_GITHUB_LEVELS = {Severity.INFO: "notice", Severity.WARNING: "warning", Severity.ERROR: "error"}


def _escape_data(text: str) -> str:
    """A workflow command's message: %, CR and LF escaped (GitHub's toolkit does the same)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property value: also `:` and `,`, which end a property."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(path: str, finding: Finding) -> str:
    level = _GITHUB_LEVELS[finding.severity]
    if finding.cell is not None:
        # a notebook's lines count in cells, which GitHub cannot place: the cell goes in the message
        properties = ",".join([f"file={_escape_property(path)}", f"title={_escape_property(finding.code)}"])
        where = f"cell {finding.cell}, line {finding.shown_line}: "
        return f"::{level} {properties}::{_escape_data(where + finding.code + ' ' + finding.message)}"
    properties = ",".join([
        f"file={_escape_property(path)}",
        f"line={finding.shown_line}",
        f"col={finding.shown_column}",
        f"title={_escape_property(finding.code)}",
    ])
    return f"::{level} {properties}::{_escape_data(finding.code + ' ' + finding.message)}"


def render_github(results: List[FileResult], summary: Summary, wrote: bool, interrupted: bool) -> str:
    lines = []
    for result in sorted(results, key=lambda r: r.path):
        for finding in result.findings:
            lines.append(github_annotation(result.path, finding))
        if result.status in (FileStatus.FAILED, FileStatus.UNCONVERTED, FileStatus.SKIPPED) and result.reason:
            level = "warning" if result.status is FileStatus.SKIPPED else "error"
            lines.append(f"::{level} file={_escape_property(result.path)},title=ampify::"
                         f"{_escape_data(STATUS_WORDS[result.status] + ': ' + result.reason)}")
    lines.append(render_summary(summary, wrote=wrote, interrupted=interrupted))
    return "\n".join(lines)


# -- Markdown review summary ----------------------------------------------------------------

def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell or list item."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}" if fence == "`" else f"{fence} {text} {fence}"


def _where(finding: Finding) -> str:
    return (f"cell {finding.cell}, " if finding.cell is not None else "") + f"line {finding.shown_line}"


def render_markdown(results: List[FileResult], summary: Summary, wrote: bool, interrupted: bool) -> str:
    changed_word = "changed" if wrote else "would change"
    head = [
        f"## ampify: {summary.changed} file{'s' if summary.changed != 1 else ''} {changed_word}"
        + (" (interrupted)" if interrupted else ""),
        "",
        render_summary(summary, wrote=wrote, interrupted=interrupted).replace("ampify: ", "", 1),
        "",
    ]
    shown = [r for r in sorted(results, key=lambda r: r.path) if r.status is not FileStatus.NOT_APPLICABLE]
    if shown:
        head += ["| file | status | changes | warnings |", "| --- | --- | --- | --- |"]
        for result in shown:
            changes = sum(1 for f in result.findings if f.severity is Severity.INFO)
            warnings = len(result.findings) - changes
            head.append(f"| {_cell(_code(result.path))} | {STATUS_WORDS[result.status]} | {changes} | {warnings} |")
        head.append("")
    sections: List[str] = []
    for result in shown:
        if not result.findings and not result.reason:
            continue
        sections.append(f"### {_code(result.path)}: {STATUS_WORDS[result.status]}")
        if result.reason:
            sections.append("")
            sections.append(_cell(result.reason))
        changes = [f for f in result.findings if f.severity is Severity.INFO]
        problems = [f for f in result.findings if f.severity is not Severity.INFO]
        if changes:
            sections += ["", "What changed and why:", ""]
            sections += [f"- {_where(f)}: **{f.code}** {_cell(f.message)}" for f in changes]
        if problems:
            sections += ["", "Left for a human:", ""]
            sections += [f"- {_where(f)}: **{f.code}** {f.severity.value}: {_cell(f.message)}" for f in problems]
        sections.append("")
    return "\n".join(head + sections).rstrip() + "\n"


_SARIF_LEVELS = {Severity.INFO: "note", Severity.WARNING: "warning", Severity.ERROR: "error"}
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _sarif_rule(rule) -> dict:
    level = "warning" if "warning" in rule.severity else "error" if rule.severity == "error" else "note"
    return {
        "id": rule.code,
        "shortDescription": {"text": rule.summary.replace("`", "")},
        "fullDescription": {"text": rule.why},
        "help": {"text": rule.example},
        "defaultConfiguration": {"level": level},
        "properties": {"target": rule.target, "fix": rule.fix},
    }


def _sarif_result(path: str, finding: Finding) -> dict:
    location: dict = {"artifactLocation": {"uri": quote(path)}}
    message = f"{finding.code} {finding.message}"
    result = {"ruleId": finding.code, "level": _SARIF_LEVELS[finding.severity], "message": {"text": message}}
    if finding.cell is not None:
        # a notebook's lines count in its cells, which SARIF regions cannot name
        result["message"] = {"text": f"cell {finding.cell}, line {finding.shown_line}: {message}"}
        result["properties"] = {"cell": finding.cell, "cellLine": finding.shown_line}
    else:
        location["region"] = {"startLine": finding.shown_line, "startColumn": finding.shown_column}
    result["locations"] = [{"physicalLocation": location}]
    return result


def sarif_document(results: List[FileResult], interrupted: bool) -> dict:
    """A SARIF 2.1.0 log of the run (validated in the tests with a model generated from the schema)."""
    from ampify.rules import RULES

    sarif_results = []
    for result in sorted(results, key=lambda r: r.path):
        sarif_results += [_sarif_result(result.path, finding) for finding in result.findings]
        if result.status in (FileStatus.FAILED, FileStatus.UNCONVERTED) and result.reason and not any(
                f.severity is not Severity.INFO for f in result.findings):
            sarif_results.append({
                "level": "error" if result.status is FileStatus.FAILED else "warning",
                "message": {"text": f"{STATUS_WORDS[result.status]}: {result.reason}"},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": quote(result.path)}}}],
            })
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "ampify", "version": __version__, "rules": [_sarif_rule(r) for r in RULES]}},
            "invocations": [{"executionSuccessful": not interrupted}],
            "results": sarif_results,
        }],
    }


def render_sarif(results: List[FileResult], interrupted: bool) -> str:
    return json.dumps(sarif_document(results, interrupted), indent=2)
