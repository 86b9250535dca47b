"""Render results for people: terminal lines and the closing summary (other formats: output_formats.py)."""

from __future__ import annotations

import dataclasses

from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List

from ampify.findings import FileResult, FileStatus, Finding, Severity, incomplete_codes
from ampify.names import for_terminal
from ampify.rules import Selection

#: statuses that get a line of their own even without --verbose
_STATUS_LINES = {
    FileStatus.FAILED: "failed",
    FileStatus.SKIPPED: "skipped",
    FileStatus.UNCONVERTED: "not converted",
    FileStatus.CHANGED_INCOMPLETE: "changed, incomplete",
    FileStatus.ALREADY_MIXED_PRECISION: "already mixed precision",
}


def apply_selection(result: FileResult, selection: Selection) -> FileResult:
    """`result` with only the findings `selection` reports. A file that was "changed, incomplete"
    only because of ignored warnings is plainly "changed": the user accepted them."""
    kept = [f for f in result.findings if selection.allows(f.code)]
    status, reason = result.status, result.reason
    if status is FileStatus.CHANGED_INCOMPLETE and not incomplete_codes(kept):
        status, reason = FileStatus.CHANGED, ""
    return FileResult(result.path, status, reason, kept, result.written, result.diff, result.companions)


def render_finding(path: str, finding: Finding) -> str:
    """`path:line:col: CODE message`, with `warning:` before the message of a warning."""
    if finding.severity is Severity.INFO:
        return finding.render(path)
    return f"{finding.place(path)}: {finding.code} {finding.severity.value}: {finding.message}"


#: statuses that are problems: shown with --quiet, and they make the run exit 1
PROBLEM_STATUSES = (FileStatus.FAILED, FileStatus.SKIPPED, FileStatus.UNCONVERTED, FileStatus.CHANGED_INCOMPLETE)


#: the past tense a change is reported in, and its conditional under --check / --diff
_CONDITIONAL_VERBS = {
    "wrapped": "would wrap", "created": "would create", "set": "would set", "migrated": "would migrate",
    "rewrote": "would rewrite", "added": "would add", "moved": "would move", "removed": "would remove",
    "replaced": "would replace", "dropped": "would drop", "scaled": "would scale", "fused": "would fuse",
}


def in_conditional(result: FileResult) -> FileResult:
    """The result as --check and --diff report it: nothing was written, so each change is what
    ampify *would* do ("would wrap tf.train.AdamOptimizer", not "wrapped ...")."""
    findings = []
    for finding in result.findings:
        if finding.severity is Severity.INFO:
            first, _, rest = finding.message.partition(" ")
            verb = _CONDITIONAL_VERBS.get(first)
            message = f"{verb} {rest}" if verb else f"would write: {finding.message}"
            finding = dataclasses.replace(finding, message=message)
        findings.append(finding)
    return dataclasses.replace(result, findings=findings)


def render_file(result: FileResult, verbose: bool = False, problems_only: bool = False,
                conditional: bool = False) -> List[str]:
    """The lines one file contributes to the terminal report (the name escaped: see names.py).
    `problems_only` (--quiet): problem statuses and findings that are not plain information;
    `conditional` (--check, --diff): nothing was written, changes are said as what ampify would do."""
    lines = []
    path = for_terminal(result.path)
    label = _STATUS_LINES.get(result.status)
    if conditional:
        result = in_conditional(result)
        if result.status is FileStatus.CHANGED_INCOMPLETE:
            label = "would be changed, incomplete"
    if label is None and verbose and result.status is FileStatus.NOT_APPLICABLE:
        label = "not applicable"
    if problems_only and result.status not in PROBLEM_STATUSES:
        label = None
    if label is not None:
        lines.append(f"{path}: {label}" + (f": {result.reason}" if result.reason else ""))
    findings = [f for f in result.findings if not problems_only or f.severity is not Severity.INFO]
    lines.extend(render_finding(path, f) for f in findings)
    return lines


def merge_change_sets(results: List[FileResult]) -> List[FileResult]:
    """A file changed as part of another file's change set (main.py, where the GradScaler of
    engine.py's step is created) is reported as changed, with its own findings, instead of the
    "not applicable" its own conversion found."""
    companions = {}
    for companion in (c for result in results for c in result.companions):
        earlier = companions.get(companion.path)
        if earlier is None or companion.written or not earlier.written:
            # the latest set that wrote it (or, in --diff, planned it: it holds the earlier sets'
            # edits, and its findings' lines are those of the version shown)
            companions[companion.path] = companion
    if not companions:
        return results
    merged = []
    for result in results:
        companion = companions.pop(result.path, None)
        if companion is None or result.status is FileStatus.FAILED:
            merged.append(result)
        else:
            findings = companion.findings + [f for f in result.findings if f not in companion.findings]
            merged.append(FileResult(result.path, companion.status, companion.reason, findings,
                                     companion.written or result.written, result.diff))
    # changed, though not themselves in the run's file list (their diff is printed with the set)
    merged.extend(FileResult(c.path, c.status, c.reason, c.findings, c.written) for c in companions.values())
    return merged


def keep_latest_diffs(results: List[FileResult]) -> None:
    """`results` in the order the run made them: where several change sets show one file (main.py
    gets the GradScaler for engine_a.py, then passes it to engine_b.py too), each diff starts from
    the file on disk and holds the earlier changes (engine.py plans them), so only the latest is
    kept: the one a write run's result matches."""
    latest = {}
    for result in results:
        for holder in [result] + list(result.companions):
            if holder.diff:
                latest[holder.path] = holder
    for result in results:
        for holder in [result] + list(result.companions):
            if holder.diff and latest[holder.path] is not holder:
                holder.diff = ""


def diffs_to_print(results: Iterable[FileResult]) -> Iterator[str]:
    """Every file's diff once, a change set's files together: a module that two training files
    both change the same way (the attention code whose masked_fill both need fixed) is shown once."""
    printed = set()
    for result in results:
        for path, diff in [(result.path, result.diff)] + [(c.path, c.diff) for c in result.companions]:
            if diff and (path, diff) not in printed:
                printed.add((path, diff))
                yield diff


def exit_code(results: Iterable[FileResult], would_change_fails: bool) -> int:
    """0 all done or nothing to do; 1 a file failed, was not converted or was converted
    incompletely, or (with --check) would change. Skipped files are reported, not failed."""
    results = list(results)
    if any(r.status in (FileStatus.FAILED, FileStatus.UNCONVERTED, FileStatus.CHANGED_INCOMPLETE) for r in results):
        return 1
    if would_change_fails and any(r.status is FileStatus.CHANGED for r in results):
        return 1
    return 0


@dataclass
class Summary:
    scanned: int
    by_status: Dict[str, int]
    changes: int
    warnings: int

    @property
    def changed(self) -> int:
        """Every file changed, the incomplete ones too."""
        return self.count(FileStatus.CHANGED) + self.count(FileStatus.CHANGED_INCOMPLETE)

    def count(self, status: FileStatus) -> int:
        return self.by_status.get(status.value, 0)


def summarize(results: Iterable[FileResult]) -> Summary:
    results = list(results)
    counts = Counter(r.status.value for r in results)
    changes = sum(1 for r in results for f in r.findings if f.severity is Severity.INFO)
    warnings = sum(1 for r in results for f in r.findings if f.severity is not Severity.INFO)
    return Summary(len(results), {s.value: counts.get(s.value, 0) for s in FileStatus}, changes, warnings)


def render_summary(summary: Summary, wrote: bool, interrupted: bool = False) -> str:
    """The closing line(s): what was scanned and what happened to it."""
    changed_word = "changed" if wrote else "would be changed"
    incomplete = summary.count(FileStatus.CHANGED_INCOMPLETE)
    parts = [
        f"{summary.changed} {changed_word}" + (f" ({incomplete} incomplete)" if incomplete else ""),
        f"{summary.count(FileStatus.ALREADY_MIXED_PRECISION)} already mixed precision",
        f"{summary.count(FileStatus.NOT_APPLICABLE)} not applicable",
        f"{summary.count(FileStatus.UNCONVERTED)} not converted",
        f"{summary.count(FileStatus.SKIPPED)} skipped",
        f"{summary.count(FileStatus.FAILED)} failed",
    ]
    files = "file" if summary.scanned == 1 else "files"
    head = "interrupted after" if interrupted else "scanned"
    text = f"ampify: {head} {summary.scanned} {files}: " + ", ".join(parts)
    text += f"; {summary.changes} change{'s' if summary.changes != 1 else ''}"
    text += f", {summary.warnings} warning{'s' if summary.warnings != 1 else ''}"
    return text
