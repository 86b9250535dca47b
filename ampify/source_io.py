"""Bytes in, bytes out: read a source file and replace it atomically, never half-written.

Encoding, BOM, newlines and the trailing newline are whatever the bytes say (LibCST keeps
them); permission bits are copied to the new file; a file that changed on disk since it was
read, or that is read-only, is never overwritten.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path


#: the new version of a file is written to `.<name>.<random><TEMP_SUFFIX>` next to it, then renamed
TEMP_SUFFIX = ".ampify-tmp"

#: a temporary file this old was left by a run that was killed (a live one exists for the
#: milliseconds between write and rename)
ABANDONED_AFTER_SECONDS = 60


def is_abandoned_temp_file(name: str, mtime: float, now: float) -> bool:
    """Is this directory entry a temporary file of a killed ampify run?"""
    return name.startswith(".") and name.endswith(TEMP_SUFFIX) and now - mtime > ABANDONED_AFTER_SECONDS


class SourceIOError(Exception):
    """A file could not be read or written; the message is the reason shown to the user."""


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


def _snapshot(st: os.stat_result) -> Snapshot:
    return Snapshot(st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)


def read_source(path: Path) -> SourceFile:
    """Read a regular file as bytes, with the stat needed to replace it safely later."""
    try:
        # stat before open: opening a FIFO named `x.py` would block forever.
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise SourceIOError("not a regular file")
        if not mode & (stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH):
            # Permission bits rule, also for root (who could read it anyway), as for writes.
            raise SourceIOError("no permission to read the file")
        with open(path, "rb") as handle:
            st = os.fstat(handle.fileno())
            data = handle.read()
    except FileNotFoundError:
        raise SourceIOError("file vanished before it could be read") from None
    except PermissionError:
        raise SourceIOError("no permission to read the file") from None
    except IsADirectoryError:
        raise SourceIOError("is a directory") from None
    except OSError as error:
        raise SourceIOError(f"cannot read the file: {error.strerror or error}") from None
    return SourceFile(path, data, _snapshot(st))


def is_writable(path: Path, mode: int) -> bool:
    """False for read-only files, also when running as root (who could write them anyway)."""
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return False
    return os.access(path, os.W_OK)


def replace_atomically(source: SourceFile, new_data: bytes) -> None:
    """Replace `source.path` by `new_data`: temp file in the same folder, fsync, rename.

    At every instant the path holds either the old bytes or the new bytes, even if the
    process is killed. Refuses when the file is read-only or changed since it was read.
    """
    path = source.path
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

    directory = path.parent
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
        # Last check right before the rename: someone may have written the file meanwhile.
        if _snapshot(os.stat(path)) != source.snapshot:
            raise SourceIOError("file changed on disk during the run, not overwritten")
        os.replace(tmp_name, path)
    except SourceIOError:
        _remove_quietly(tmp_name)
        raise
    except OSError as error:
        _remove_quietly(tmp_name)
        raise SourceIOError(f"cannot write the file: {error.strerror or error}") from None
    _fsync_directory(directory)


def remove_abandoned_temp_files(paths) -> int:
    """Delete temporary files of killed runs (see `is_abandoned_temp_file`); how many went."""
    removed = 0
    for path in paths:
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
