"""One file, start to end: read bytes, convert, check, then write atomically or render a diff.

This is the unit of work a worker process runs; it never raises, whatever the file holds.
"""

from __future__ import annotations

import difflib
import enum
import io
import tokenize
from dataclasses import dataclass

from ampify.convert import ConversionError, convert_source
from ampify.discover import Candidate
from ampify.findings import FileResult, FileStatus, Finding, Severity
from ampify.options import Options
from ampify.source_io import SourceIOError, read_source, replace_atomically


class Mode(str, enum.Enum):
    WRITE = "write"  # replace changed files in place
    DIFF = "diff"  # write nothing, return a unified diff
    CHECK = "check"  # write nothing


@dataclass(frozen=True)
class FileTask:
    candidate: Candidate
    options: Options
    mode: Mode


def process_file(task: FileTask) -> FileResult:
    """Convert one file according to `task.mode`; every outcome is a FileResult."""
    display = task.candidate.display
    try:
        source = read_source(task.candidate.path)
    except SourceIOError as error:
        return FileResult(display, FileStatus.FAILED, str(error))
    try:
        conversion = convert_source(source.data, task.options, filename=display)
    except ConversionError as error:
        return FileResult(display, FileStatus.FAILED, str(error))
    except RecursionError:
        return FileResult(display, FileStatus.FAILED, "too deeply nested for the parser")
    except Exception as error:  # a bug in ampify must not stop the other files
        return FileResult(
            display,
            FileStatus.FAILED,
            f"internal error in ampify ({type(error).__name__}: {error}); file left untouched, please report it",
        )

    result = FileResult(display, conversion.status, conversion.reason, list(conversion.findings))
    if conversion.status is not FileStatus.CHANGED:
        return result
    new_data = conversion.converted
    if task.mode is Mode.DIFF:
        result.diff = unified_diff(display, source.data, new_data)
    elif task.mode is Mode.WRITE:
        try:
            replace_atomically(source, new_data)
        except SourceIOError as error:
            result.status = FileStatus.FAILED
            result.reason = str(error)
            result.findings.append(Finding("AMP001", f"not written: {error}", 0, 0, Severity.ERROR))
            return result
        result.written = True
    return result


def unified_diff(display: str, old: bytes, new: bytes) -> str:
    """A `git apply`-able unified diff of two versions of one file, decoded for display."""
    old_text = _decode_for_diff(old)
    new_text = _decode_for_diff(new)
    lines = difflib.unified_diff(
        old_text.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile=f"a/{display}",
        tofile=f"b/{display}",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _decode_for_diff(data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("utf-8", errors="replace")
