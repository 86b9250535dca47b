"""Findings and per-file results: the data every other part of ampify passes along.

A transform never prints; it returns findings. The reporter renders them.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import List, Optional

from ampify.names import json_fields
from ampify.rules import INCOMPLETE_CONVERSION_CODES


class Severity(str, enum.Enum):
    """How much a finding matters to the user."""

    INFO = "info"  # a change that was made
    WARNING = "warning"  # something left alone or unsafe: the user must look
    ERROR = "error"  # the file could not be handled


@dataclass(frozen=True)
class Finding:
    """One change made, or one pattern that could not be converted, at a place in a file."""

    code: str
    message: str
    line: int = 0
    column: int = 0
    severity: Severity = Severity.INFO
    #: in a notebook, the 1-based number of the cell the line counts in (None in a .py file)
    cell: Optional[int] = None

    @property
    def shown_line(self) -> int:
        """The line as people and tools read it: 1-based; a finding about the whole file is on line 1."""
        return max(self.line, 1)

    @property
    def shown_column(self) -> int:
        """The column as ruff, flake8 and TorchFix print it: 1-based (stored 0-based, as LibCST gives it)."""
        return self.column + 1

    def place(self, path: str) -> str:
        """`path:line:col` (1-based), `path:cell N:line:col` in a notebook, as ruff shows cells."""
        where = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{path}:{where}{self.shown_line}:{self.shown_column}"

    def render(self, path: str) -> str:
        """`path:line:col: CODE message`, the form editors and CI logs understand (1-based)."""
        return f"{self.place(path)}: {self.code} {self.message}"

    def to_json(self) -> dict:
        data = asdict(self)
        data["severity"] = self.severity.value
        data["line"], data["column"] = self.shown_line, self.shown_column  # 1-based, as printed
        return data


class FileStatus(str, enum.Enum):
    """What happened to one file, as counted in the closing summary."""

    CHANGED = "changed"
    #: changed, but a warning says part of the training stays float32 or unscaled (exit 1)
    CHANGED_INCOMPLETE = "changed, incomplete"
    ALREADY_MIXED_PRECISION = "already mixed precision"
    NOT_APPLICABLE = "not applicable"
    UNCONVERTED = "not converted"  # training code found, but it could not be converted safely (the summary's word)
    SKIPPED = "skipped"
    FAILED = "failed"


def incomplete_codes(findings) -> List[str]:
    """The codes among `findings` that leave a conversion incomplete, in order, once each."""
    codes: List[str] = []
    for finding in findings:
        if finding.severity is Severity.WARNING and finding.code in INCOMPLETE_CONVERSION_CODES:
            if finding.code not in codes:
                codes.append(finding.code)
    return codes


@dataclass
class FileResult:
    """The outcome for one file: status, reason, findings, and (when changed) both versions."""

    path: str
    status: FileStatus
    reason: str = ""
    findings: List[Finding] = field(default_factory=list)
    written: bool = False
    #: unified diff of the change, filled in --diff mode only
    diff: str = ""
    #: other files changed together with this one (one change set), with their own results
    companions: List["FileResult"] = field(default_factory=list)
    #: not written yet: its change set spans several files (held back while other workers
    #: write), or another file of it changed during the run (another change set of this run
    #: sharing it); the runner converts it again, alone, after the others
    run_again_alone: bool = False

    @property
    def warnings(self) -> List[Finding]:
        return [f for f in self.findings if f.severity is not Severity.INFO]

    def to_json(self) -> dict:
        return {
            **json_fields(self.path),
            "status": self.status.value,
            "reason": self.reason,
            "written": self.written,
            "findings": [f.to_json() for f in self.findings],
        }
