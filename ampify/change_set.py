"""Write several files as one change set: after a crash or a kill at any instant, the next run
finds every file of the set either all old or all new.

The protocol (roll forward):
1. every new version is written to a temporary file beside its target and fsynced;
2. under a lock on every target (taken in path order), each target is checked unchanged since
   it was read; one changed file aborts the whole set, and nothing is written;
3. a journal naming every target, its temporary file and the hashes of both versions (with the
   old bytes, to roll back when rolling forward is impossible) is written and fsynced;
4. the temporary files are renamed over their targets, the folders fsynced;
5. the journal is removed.

A run that finds a journal (`recover_change_sets`, before it reads anything) finishes it: a
target whose temporary file is still there gets it; a target already new stays; if neither
(the temporary file was deleted by hand), every target of the set goes back to its old bytes.
A kill before step 3 leaves only temporary files, which are swept like any other.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Sequence

from ampify.source_io import TEMP_SUFFIX, SourceFile, SourceIOError, _exclusive_lock, holds_already, _fsync_directory, _folder_writable, _stat_for_write

#: `.ampify-changeset.<16 hex>.json`, in the folder of the set's first target
JOURNAL_PREFIX = ".ampify-changeset."
JOURNAL_SUFFIX = ".json"

#: tests only: seconds to sleep after the journal is written and after each rename, so that a
#: kill lands inside the window the journal protects
_PAUSE_ENV = "_AMPIFY_CHANGE_SET_PAUSE"


@dataclass(frozen=True)
class Change:
    source: SourceFile
    new_data: bytes


def write_change_set(changes: Sequence[Change]) -> List[Path]:
    """Replace every `source.path` by its `new_data`, all or none (see the module docstring).
    Raises SourceIOError naming the file that stopped the set; then nothing was replaced.
    Returns the targets left alone because they already held their new version (written by
    another change set of this run, or by another run): not this set's changes."""
    changes = sorted(changes, key=lambda change: str(change.source.path))
    temps: List[str] = []
    try:
        to_write = []
        held: List[Path] = []
        for change in changes:
            try:
                temps.append(_write_temp(change))
                to_write.append(change)
            except SourceIOError as error:
                if holds_already(change.source.path, change.new_data):
                    held.append(change.source.path)  # another change set wrote the same version
                    continue
                raise SourceIOError(f"{change.source.path.name}: {error}; no file of the change set was written") from None
        changes = to_write
        with contextlib.ExitStack() as locks:
            pending = []
            for change, temp in zip(changes, temps):
                try:
                    locks.enter_context(_exclusive_lock(change.source.path))
                    _stat_for_write(change.source.path, change.source)
                    pending.append((change, temp))
                except SourceIOError as error:
                    if holds_already(change.source.path, change.new_data):
                        _remove_all([temp])  # another change set wrote the same version
                        held.append(change.source.path)
                        continue
                    raise SourceIOError(f"{change.source.path.name}: {error}; no file of the change set was written") from None
            if not pending:
                return held
            changes, temps = [c for c, _ in pending], [t for _, t in pending]
            journal = _write_journal(changes, temps)
            _pause()
            renamed = []
            try:
                for change, temp in zip(changes, temps):
                    os.replace(temp, change.source.path)
                    renamed.append(change)
                    _pause()
            except OSError:
                for change in renamed:  # one target could not be replaced: the others go back
                    _restore(change.source.path, change.source.data)
                os.unlink(journal)
                raise
            for folder in {change.source.path.parent for change in changes}:
                _fsync_directory(folder)
            with contextlib.suppress(FileNotFoundError):  # a concurrent run's recovery may finish it first
                os.unlink(journal)
            _fsync_directory(journal.parent)
    except SourceIOError:
        _remove_all(temps)
        raise
    except OSError as error:
        _remove_all(temps)
        raise SourceIOError(f"cannot write the change set: {error.strerror or error}") from None
    return held


def _write_temp(change: Change) -> str:
    path = change.source.path
    current = _stat_for_write(path, change.source)
    if current.st_nlink > 1:
        raise SourceIOError(f"has {current.st_nlink} hard links, which a change set never splits")
    if not _folder_writable(path.parent):
        raise SourceIOError("its folder is read-only")
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(change.new_data)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(name, stat.S_IMODE(current.st_mode))
    return name


def _write_journal(changes: Sequence[Change], temps: Sequence[str]) -> Path:
    folder = changes[0].source.path.parent
    journal = folder / f"{JOURNAL_PREFIX}{secrets.token_hex(8)}{JOURNAL_SUFFIX}"
    document = {
        "ampify_change_set": 1,
        "written": time.time(),
        "files": [
            {
                "target": os.fspath(change.source.path.resolve()),
                "temp": os.fspath(Path(temp).resolve()),
                "old_sha256": _sha(change.source.data),
                "new_sha256": _sha(change.new_data),
                "old": base64.b64encode(change.source.data).decode("ascii"),
            }
            for change, temp in zip(changes, temps)
        ],
    }
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_directory(folder)
    return journal


def journals_in(folders: Iterable[Path]) -> List[Path]:
    """Journals of unfinished change sets in these folders."""
    found = []
    for folder in sorted(set(folders)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        found += [folder / name for name in sorted(names) if name.startswith(JOURNAL_PREFIX) and name.endswith(JOURNAL_SUFFIX)]
    return found


def recover_change_sets(folders: Iterable[Path]) -> List[str]:
    """Finish every change set a killed run left in these folders; one line per set, saying what
    was done (for the run's output). A set another live run is writing is not touched: its
    targets are locked until its journal is gone."""
    lines = []
    for journal in journals_in(folders):
        try:
            document = json.loads(journal.read_text(encoding="utf-8"))
            entries = document["files"]
            targets = sorted(Path(entry["target"]) for entry in entries)
        except (OSError, ValueError, KeyError, TypeError):
            lines.append(f"ampify: {journal}: unreadable change set journal left in place: check its files by hand")
            continue
        try:
            with contextlib.ExitStack() as locks:
                for target in targets:
                    locks.enter_context(_exclusive_lock(target))
                if not journal.exists():
                    continue  # a live run finished it while we waited for its locks
                what = _finish(entries)
                os.unlink(journal)
                _fsync_directory(journal.parent)
        except (OSError, SourceIOError) as error:
            lines.append(f"ampify: {journal}: cannot finish this change set ({error}); journal left in place")
            continue
        names = ", ".join(target.name for target in targets)
        lines.append(f"ampify: {what} a change set a killed ampify run left unfinished ({names})")
    return lines


def _finish(entries: List[dict]) -> str:
    """Roll the set forward when every target has its new version or its temporary file, else back."""
    if all(_can_roll_forward(entry) for entry in entries):
        for entry in entries:
            if os.path.exists(entry["temp"]):
                os.replace(entry["temp"], entry["target"])
        what = "completed"
    else:
        for entry in entries:
            target = Path(entry["target"])
            if _file_sha(target) == entry["new_sha256"]:
                _restore(target, base64.b64decode(entry["old"]))
            with contextlib.suppress(OSError):
                os.unlink(entry["temp"])
        what = "rolled back"
    for folder in {Path(entry["target"]).parent for entry in entries}:
        _fsync_directory(folder)
    return what


def _can_roll_forward(entry: dict) -> bool:
    if os.path.exists(entry["temp"]):
        return _file_sha(Path(entry["temp"])) == entry["new_sha256"]
    return _file_sha(Path(entry["target"])) == entry["new_sha256"]


def _restore(target: Path, data: bytes) -> None:
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(name, stat.S_IMODE(os.stat(target).st_mode))
    os.replace(name, target)


def _file_sha(path: Path) -> str:
    try:
        return _sha(path.read_bytes())
    except OSError:
        return ""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pause() -> None:
    seconds = os.environ.get(_PAUSE_ENV)
    if seconds:
        time.sleep(float(seconds))


def _remove_all(names: Iterator[str]) -> None:
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name)
