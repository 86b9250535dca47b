"""Bytes in, bytes out: read a source file and replace it atomically, never half-written.

Encoding, BOM, newlines and the trailing newline are whatever the bytes say (LibCST keeps
them); permission bits are copied to the new file; a file that changed on disk since it was
read, or that is read-only, is never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None


#: the new version of a file is written to `.<name>.<random><TEMP_SUFFIX>` next to it, then renamed
TEMP_SUFFIX = ".ampify-tmp"

#: a temporary file this old was left by a run that was killed (a live one exists for the
#: milliseconds between write and rename)
ABANDONED_AFTER_SECONDS = 60


#: `.train.py.k3x_9q2z.ampify-tmp`: a dot, the file's name, tempfile's 8 random characters, the suffix
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX) + r"$", re.DOTALL)


def is_abandoned_temp_file(path: Path, mtime: float, now: float) -> bool:
    """Is this a temporary file of a killed ampify run? Its name has exactly the form ampify
    writes, the file it was meant to replace is beside it, and it is older than a live one can be."""
    match = _TEMP_NAME.match(path.name)
    if match is None or now - mtime <= ABANDONED_AFTER_SECONDS:
        return False
    return os.path.isfile(os.path.join(os.path.dirname(path), match.group("target")))


class SourceIOError(Exception):
    """A file could not be read or written; the message is the reason shown to the user."""


class FileTooLarge(SourceIOError):
    """The file is over the size limit: it is skipped, not read."""


@dataclass(frozen=True)
class Snapshot:
    """What the file looked like when it was read: used to refuse clobbering a changed file."""

    size: int
    mtime_ns: int
    inode: int
    mode: int


@dataclass(frozen=True)
class SourceFile:
    path: Path
    data: bytes
    snapshot: Snapshot
    #: what the file holds on disk when `data` is a version planned by this run (see
    #: `plan_content`), else None
    on_disk: Optional[bytes] = None


#: The versions an earlier change set of this --diff / --check run planned for files it did not
#: write (resolved path -> bytes). Later files of the run read them as a write run would find
#: them on disk, so a second engine module sees the GradScaler the first one's change set puts
#: in main.py, and the shown diffs add up to what a write run writes.
_PLANNED: Dict[Path, bytes] = {}


def plan_content(path: Path, data: bytes) -> None:
    _PLANNED[Path(path).resolve()] = data


def planned_content(path: Path) -> Optional[bytes]:
    return _PLANNED.get(Path(path).resolve()) if _PLANNED else None


def current_bytes(path: Path) -> bytes:
    """The file's bytes as this run sees them: planned by an earlier change set, else on disk."""
    planned = planned_content(path)
    return planned if planned is not None else Path(path).read_bytes()


def _snapshot(st: os.stat_result) -> Snapshot:
    return Snapshot(st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)


def read_source(path: Path, max_bytes: Optional[int] = None) -> SourceFile:
    """Read a regular file as bytes, with the stat needed to replace it safely later.
    A file over `max_bytes` raises FileTooLarge without being read."""
    try:
        # stat before open: opening a FIFO named `x.py` would block forever.
        first = os.stat(path)
        mode = first.st_mode
        if not stat.S_ISREG(mode):
            raise SourceIOError("not a regular file")
        if max_bytes is not None and first.st_size > max_bytes:
            raise FileTooLarge(
                f"{_megabytes(first.st_size)}, over the {_megabytes(max_bytes)} size limit "
                "(--max-file-size; LibCST needs about 300 times a file's size in memory)"
            )
        if not mode & (stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH):
            # Permission bits rule, also for root (who could read it anyway), as for writes.
            raise SourceIOError("no permission to read the file")
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            if max_bytes is not None and st.st_size > max_bytes:
                raise FileTooLarge(f"{_megabytes(st.st_size)}, over the {_megabytes(max_bytes)} size limit (--max-file-size)")
            data = handle.read()
    except FileNotFoundError:
        raise SourceIOError("file vanished before it could be read") from None
    except PermissionError:
        raise SourceIOError("no permission to read the file") from None
    except IsADirectoryError:
        raise SourceIOError("is a directory") from None
    except OSError as error:
        raise SourceIOError(f"cannot read the file: {error.strerror or error}") from None
    planned = planned_content(path)
    if planned is not None:
        return SourceFile(path, planned, _snapshot(st), on_disk=data)
    return SourceFile(path, data, _snapshot(st))


def _megabytes(size: int) -> str:
    """4.0 MB, 12.5 kB: as the limit is given (decimal megabytes)."""
    return f"{size / 1_000_000:.1f} MB" if size >= 100_000 else f"{size / 1000:.1f} kB"


def is_writable(path: Path, mode: int) -> bool:
    """False for read-only files, also when running as root (who could write them anyway)."""
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return False
    return os.access(path, os.W_OK)


def replace_atomically(source: SourceFile, new_data: bytes, write_through_hardlinks: bool = False) -> bool:
    """Replace `source.path` by `new_data`: temp file in the same folder, fsync, rename.

    At every instant the path holds either the old bytes or the new bytes, even if the
    process is killed. Refuses when the file or its folder is read-only, when the file changed
    since it was read, and when it has other hard links (a rename would split them; with
    `write_through_hardlinks` the file is rewritten in place instead, which keeps the link
    but is not atomic).

    The last check and the rename happen under an exclusive lock on the file, so two ampify
    runs over the same tree never both replace one file: the second sees the first's new
    inode and refuses.

    Returns False, writing nothing, when the file changed since it was read but now holds exactly
    `new_data` (another change of this run, or another run, wrote the same version): the caller
    must not report it as its own change.
    """
    path = source.path
    try:
        current = _stat_for_write(path, source)
    except SourceIOError:
        if holds_already(path, new_data):
            return False
        raise
    directory = path.parent
    if current.st_nlink > 1:
        if not write_through_hardlinks:
            raise SourceIOError(
                f"has {current.st_nlink} hard links: replacing it would split them, not overwritten "
                "(--write-through-hardlinks rewrites it in place, keeping the links)"
            )
        _write_through(source, new_data)
        return True
    if not _folder_writable(directory):
        raise SourceIOError("its folder is read-only, not overwritten")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=directory)
    except OSError as error:
        raise SourceIOError(f"cannot create a temporary file next to it: {error.strerror or error}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(new_data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, stat.S_IMODE(current.st_mode))
        if hasattr(os, "chown"):
            try:
                os.chown(tmp_name, current.st_uid, current.st_gid)
            except PermissionError:
                pass  # only root can give a file away; an unprivileged user keeps their own
        with _exclusive_lock(path):
            # Last check right before the rename: someone may have written the file meanwhile.
            try:
                _stat_for_write(path, source)
            except SourceIOError:
                if not holds_already(path, new_data):
                    raise
                _remove_quietly(tmp_name)
                return False
            os.replace(tmp_name, path)
    except SourceIOError:
        _remove_quietly(tmp_name)
        raise
    except OSError as error:
        _remove_quietly(tmp_name)
        raise SourceIOError(f"cannot write the file: {error.strerror or error}") from None
    _fsync_directory(directory)
    return True


def holds_already(path: Path, new_data: bytes) -> bool:
    """Does the file hold exactly `new_data` now? Then a write that found it changed since it
    was read has nothing left to do: the same edit was written by another change of this run (two
    training files that both need the attention module's masked_fill fixed)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(new_data) + 1) == new_data
    except OSError:
        return False


def _stat_for_write(path: Path, source: SourceFile) -> os.stat_result:
    """The file's stat, if it may still be overwritten: unchanged since read, not read-only."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        raise SourceIOError("file vanished during the run, nothing written") from None
    except OSError as error:
        raise SourceIOError(f"cannot stat the file: {error.strerror or error}") from None
    if _snapshot(current) != source.snapshot:
        raise SourceIOError("file changed on disk during the run, not overwritten")
    if not is_writable(path, current.st_mode):
        raise SourceIOError("file is read-only, not overwritten")
    return current


def _folder_writable(directory: Path) -> bool:
    """The folder's write bits rule, also for root, as the file's do: a rename changes the folder."""
    try:
        mode = os.stat(directory).st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(directory, os.W_OK)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """flock the file as it is now; another ampify run waits here for its own last check."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SourceIOError("file vanished during the run, nothing written") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_through(source: SourceFile, new_data: bytes) -> None:
    """Rewrite a hard-linked file in place (same inode), under the lock, after the last check."""
    try:
        with _exclusive_lock(source.path):
            _stat_for_write(source.path, source)
            with open(source.path, "r+b") as handle:
                handle.write(new_data)
                handle.truncate()
                handle.flush()
                os.fsync(handle.fileno())
    except OSError as error:
        raise SourceIOError(f"cannot write the file: {error.strerror or error}") from None


def remove_abandoned_temp_files(paths) -> int:
    """Delete temporary files of killed runs (see `is_abandoned_temp_file`) that hold what ampify
    writes there, a Python source that compiles; how many went. Anything else stays."""
    removed = 0
    for path in paths:
        try:
            with open(path, "rb") as handle:
                data = handle.read(64 * 1024 * 1024)
            compile(data, str(path), "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            continue  # not ours, or unreadable: reported as still there by the next run
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass  # another run removed it first
        except OSError:
            pass  # reported as still there by the next run
    return removed


def _remove_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); harmless where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
