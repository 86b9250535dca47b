"""One file, start to end: read bytes, convert, check, then write atomically or render a diff.

This is the unit of work a worker process runs; it never raises, whatever the file holds.
"""

from __future__ import annotations

import difflib
import os
import enum
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from ampify.change_set import Change, write_change_set
from ampify.convert import ConversionError, convert_source
from ampify.discover import Candidate
from ampify.names import for_diff_header
from ampify.notebooks import cell_diff, convert_notebook, is_notebook
from ampify.findings import FileResult, FileStatus, Finding, Severity
from ampify.options import Options
from ampify.repository import project_view
from ampify.source_io import FileTooLarge, SourceIOError, plan_content, read_source, replace_atomically
from ampify.transforms.base import UnitContext


class Mode(str, enum.Enum):
    WRITE = "write"  # replace changed files in place
    DIFF = "diff"  # write nothing, return a unified diff
    CHECK = "check"  # write nothing


#: files larger than this are skipped: LibCST needs about 300 bytes of memory per byte of
#: source (a 20 MB generated file took 5.9 GB), and no training script comes near it
DEFAULT_MAX_FILE_BYTES = 4_000_000


@dataclass(frozen=True)
class FileTask:
    candidate: Candidate
    options: Options
    mode: Mode
    #: skip files larger than this (bytes); None: no limit
    max_file_bytes: Optional[int] = DEFAULT_MAX_FILE_BYTES
    #: a file with other hard links is rewritten in place (same inode) instead of refused
    write_through_hardlinks: bool = False
    #: the paths the user named: another file of a change set is written only when inside them
    named: Tuple[Path, ...] = ()
    #: a change set spanning several files is not written (nor shown) but handed back
    #: (`run_again_alone`): two workers writing change sets that share a file (one driver, two
    #: engine modules) would each plan against a version the other replaces
    hold_change_sets: bool = False


def process_file(task: FileTask, before_write: Optional[Callable[[], None]] = None) -> FileResult:
    """Convert one file according to `task.mode`; every outcome is a FileResult.

    `before_write` is called right before a changed file is written (the runner stops timing
    the file there: a write is never cut short)."""
    display = task.candidate.display
    try:
        source = read_source(task.candidate.path, task.max_file_bytes)
    except FileTooLarge as error:
        return FileResult(display, FileStatus.SKIPPED, str(error))
    except SourceIOError as error:
        return FileResult(display, FileStatus.FAILED, str(error))
    cells = None
    try:
        if is_notebook(task.candidate.path.name):
            converted_notebook = convert_notebook(source.data, task.options, display)
            conversion, cells = converted_notebook.conversion, converted_notebook.cells
        else:
            context = UnitContext(display, project_view(task.candidate.path, task.named))
            conversion = convert_source(source.data, task.options, filename=display, context=context)
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
    if conversion.converted is None:
        return result
    if conversion.companions:
        if task.hold_change_sets:
            held = FileResult(display, FileStatus.FAILED, "held back: its change set spans several files")
            held.run_again_alone = True
            return held
        return _process_change_set(task, source, conversion, result, before_write)
    new_data = conversion.converted
    if task.mode is Mode.DIFF:
        result.diff = cell_diff(display, cells) if cells is not None else unified_diff(display, _on_disk(source), new_data)
    elif task.mode is Mode.WRITE:
        if before_write is not None:
            before_write()
        try:
            written = replace_atomically(source, new_data, write_through_hardlinks=task.write_through_hardlinks)
        except SourceIOError as error:
            result.status = FileStatus.FAILED
            result.reason = str(error)
            result.findings.append(Finding("AMP001", f"not written: {error}", 0, 0, Severity.ERROR))
            return result
        if not written:
            return _written_meanwhile(result)
        result.written = True
    return result


def _process_change_set(task: FileTask, source, conversion, result: FileResult, before_write) -> FileResult:
    """This file's change needs edits of other files (the GradScaler created where the optimizer
    is): all are shown, or written as one change set, or none is."""
    others = []
    for companion in conversion.companions:
        shown = _display_beside(task.candidate.display, task.candidate.path, Path(companion.key))
        try:
            other = read_source(Path(companion.key))
        except SourceIOError as error:
            return _change_set_failed(result, f"{shown} ({error})")
        if other.data != companion.old and other.data != companion.new:
            # (holding the new version already: another change set of this run wrote the same edit)
            return _change_set_failed(result, f"{shown} changed during the run", run_again_alone=True)
        others.append((shown, other, companion))
    result.companions = [
        FileResult(shown, FileStatus.CHANGED, companion.reason, list(companion.findings)) for shown, _, companion in others
    ]
    if task.mode is not Mode.WRITE:
        # shown, not written: the files of the run that come later see these versions (as a
        # write run finds them on disk), and each diff starts from what is on disk
        plan_content(source.path, conversion.converted)
        for _, other, companion in others:
            plan_content(other.path, companion.new)
    if task.mode is Mode.DIFF:
        result.diff = unified_diff(result.path, _on_disk(source), conversion.converted)
        for companion_result, (shown, other, companion) in zip(result.companions, others):
            companion_result.diff = unified_diff(shown, _on_disk(other), companion.new)
    elif task.mode is Mode.WRITE:
        if before_write is not None:
            before_write()
        changes = [Change(source, conversion.converted)] + [Change(other, companion.new) for _, other, companion in others]
        try:
            held = set(write_change_set(changes))
        except SourceIOError as error:
            return _change_set_failed(result, str(error))
        for companion_result, (_, other, _) in zip(result.companions, others):
            companion_result.written = other.path not in held
        if source.path in held:
            return _written_meanwhile(result)
        result.written = True
    return result


def _on_disk(source) -> bytes:
    return source.on_disk if source.on_disk is not None else source.data


def _written_meanwhile(result: FileResult) -> FileResult:
    """The file changed during the run and now holds exactly the version this run would write:
    another run, or another change set of this run, wrote it. Not reported as this run's change."""
    result.status = FileStatus.ALREADY_MIXED_PRECISION
    result.reason = "converted meanwhile: the file already holds this version (written by another change of this run or by another run)"
    result.findings = [f for f in result.findings if f.severity is not Severity.INFO]
    return result


def _change_set_failed(result: FileResult, why: str, run_again_alone: bool = False) -> FileResult:
    result.status = FileStatus.FAILED
    result.run_again_alone = run_again_alone
    result.reason = f"not written: the change set with {why}; no file of it was written"
    result.findings.append(Finding("AMP001", result.reason, 0, 0, Severity.ERROR))
    result.companions = []
    return result


def _display_beside(display: str, path: Path, other: Path) -> str:
    """`other` as the user would name it: relative to where `display` (as given) points."""
    try:
        relative = os.path.relpath(other.resolve(), path.resolve().parent)
    except ValueError:
        return str(other)
    return os.path.normpath(os.path.join(os.path.dirname(display), relative))


def unified_diff(display: str, old: bytes, new: bytes) -> str:
    """A `git apply`-able unified diff of two versions of one file, decoded for display.

    Lines are split on "\\n" only, as git and patch split them: `str.splitlines` would also
    split on "\\r" (a CR-only file became hundreds of "no newline" lines), form feeds and other
    separators that Python source may hold. Names are quoted as git quotes them."""
    old_text = _decode_for_diff(old)
    new_text = _decode_for_diff(new)
    lines = difflib.unified_diff(
        _lines_as_git_splits_them(old_text),
        _lines_as_git_splits_them(new_text),
        fromfile=for_diff_header("a/", display),
        tofile=for_diff_header("b/", display),
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _lines_as_git_splits_them(text: str) -> List[str]:
    lines = text.split("\n")
    last = lines.pop()
    return [line + "\n" for line in lines] + ([last] if last else [])


def _decode_for_diff(data: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return data.decode("utf-8", errors="replace")
