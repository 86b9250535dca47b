"""Reading and replacing files: whole or not at all, never over someone else's change."""

from __future__ import annotations

import os
import stat

import pytest

from ampify.source_io import SourceIOError, read_source, replace_atomically


def test_replace_keeps_mode_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"x = 1\r\n")
    os.chmod(path, 0o750)
    source = read_source(path)
    replace_atomically(source, b"x = 2\r\n")
    assert path.read_bytes() == b"x = 2\r\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_file_changed_after_reading_is_not_overwritten(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"x = 1\n")
    source = read_source(path)
    path.write_bytes(b"x = 1  # edited by someone else meanwhile\n")
    with pytest.raises(SourceIOError, match="changed on disk"):
        replace_atomically(source, b"x = 2\n")
    assert path.read_bytes() == b"x = 1  # edited by someone else meanwhile\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_vanished_file_is_reported(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"x = 1\n")
    source = read_source(path)
    path.unlink()
    with pytest.raises(SourceIOError, match="vanished"):
        replace_atomically(source, b"x = 2\n")
    assert not path.exists()


def test_read_only_is_refused_even_for_root(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"x = 1\n")
    os.chmod(path, 0o444)
    with pytest.raises(SourceIOError, match="read-only"):
        replace_atomically(read_source(path), b"x = 2\n")
    assert path.read_bytes() == b"x = 1\n"


def test_reading_a_missing_or_odd_file_gives_a_reason(tmp_path):
    with pytest.raises(SourceIOError, match="vanished"):
        read_source(tmp_path / "nope.py")
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    with pytest.raises(SourceIOError, match="not a regular file"):
        read_source(fifo)  # must not block waiting for a writer
