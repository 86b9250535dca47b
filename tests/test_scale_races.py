"""Files that change under a real multi-worker run: reported, never clobbered, never recreated.

These runs use the real worker pool (forked, 2 workers) and the real engine and file I/O. The
rewrite itself is a tiny stand-in transform (appends a marker comment) patched into the
registry before the pool forks, so the tests exercise the write path whatever the real
transforms convert; the real transforms get the same treatment in test_interrupt_runs.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import libcst as cst
import pytest

import ampify.convert
import ampify.engine
from ampify.discover import discover
from ampify.engine import FileTask, Mode
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.runner import run_tasks
from ampify.transforms.base import Transform, TransformResult, Verdict

MARKER = "# converted by the stand-in transform"
FILES = 40


class AppendMarker(Transform):
    """Stand-in rewrite: files that say `# convert-me` get a marker comment at the end."""

    name = "append-marker"

    def may_apply(self, source, options):
        return b"# convert-me" in source

    def concerns(self, imports, options):
        return True

    def apply(self, module, imports, options, context=None):
        if MARKER in module.code:
            return TransformResult(module, Verdict.ALREADY_MIXED_PRECISION)
        footer = [*module.footer, cst.EmptyLine(comment=cst.Comment(MARKER))]
        return TransformResult(module.with_changes(footer=footer), Verdict.CONVERTED)


@pytest.fixture
def stand_in_transform(monkeypatch):
    monkeypatch.setattr(ampify.convert, "transforms_for", lambda options: [AppendMarker()])


def make_tree(root: Path, count: int = FILES) -> dict:
    originals = {}
    for index in range(count):
        path = root / f"pkg{index % 4}" / f"train_{index:03d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = f"# convert-me\nimport os\n\nSTEP = {index}\nprint(os.getcwd(), STEP)\n".encode()
        path.write_bytes(data)
        originals[path.name] = (path, data)
    return originals


def converted(data: bytes) -> bytes:
    return data + MARKER.encode() + b"\n"


def run_tree(root: Path, jobs: int = 2):
    tasks = [FileTask(c, Options(), Mode.WRITE) for c in discover([root]).candidates]
    results = {Path(r.path).name: r for r in run_tasks(tasks, jobs)}
    assert len(results) == len(tasks), "every task must come back with a result"
    return results


def leftover_temp_files(root: Path):
    return [p for p in root.rglob("*") if p.name.endswith(".ampify-tmp")]


def test_files_vanishing_between_discovery_and_processing(tmp_path, stand_in_transform):
    originals = make_tree(tmp_path)
    tasks = [FileTask(c, Options(), Mode.WRITE) for c in discover([tmp_path]).candidates]
    gone = sorted(originals)[::7]
    for name in gone:
        originals[name][0].unlink()

    results = {Path(r.path).name: r for r in run_tasks(tasks, 2)}

    assert len(results) == len(originals)
    for name, (path, data) in originals.items():
        if name in gone:
            assert results[name].status is FileStatus.FAILED
            assert "vanished" in results[name].reason
            assert not path.exists(), "a vanished file must not be recreated"
        else:
            assert results[name].status is FileStatus.CHANGED, results[name]
            assert path.read_bytes() == converted(data)
    assert leftover_temp_files(tmp_path) == []


def _interfere_after_read(monkeypatch, victims: dict) -> None:
    """Run `victims[name](path)` inside the worker, after the file was read, before the write."""
    real_convert = ampify.engine.convert_source

    def convert_then_interfere(source, options, filename, context=None):
        conversion = real_convert(source, options, filename=filename, context=context)
        action = victims.get(Path(filename).name)
        if action is not None:
            action(Path(filename))
        return conversion

    monkeypatch.setattr(ampify.engine, "convert_source", convert_then_interfere)


def test_files_changed_or_removed_by_someone_else_during_the_run(tmp_path, stand_in_transform, monkeypatch):
    originals = make_tree(tmp_path)
    names = sorted(originals)
    other_writer = b"# someone else's version\n"

    def append(path):  # size and mtime change
        with open(path, "ab") as handle:
            handle.write(b"# edited meanwhile\n")

    def same_size_new_mtime(path):  # only the content and mtime change, the size does not
        data = path.read_bytes()
        path.write_bytes(data.replace(b"import os", b"import re"))
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))

    def replaced_by_other_tool(path):  # another tool's atomic replace: new inode
        tmp = path.with_suffix(".other")
        tmp.write_bytes(other_writer)
        os.replace(tmp, path)

    victims = {
        names[1]: append,
        names[2]: same_size_new_mtime,
        names[3]: replaced_by_other_tool,
        names[4]: lambda path: path.unlink(),
    }
    _interfere_after_read(monkeypatch, victims)

    results = run_tree(tmp_path)

    assert results[names[1]].status is FileStatus.FAILED
    assert "changed on disk" in results[names[1]].reason
    assert originals[names[1]][0].read_bytes() == originals[names[1]][1] + b"# edited meanwhile\n"

    assert results[names[2]].status is FileStatus.FAILED
    assert "changed on disk" in results[names[2]].reason
    assert b"import re" in originals[names[2]][0].read_bytes()

    assert results[names[3]].status is FileStatus.FAILED
    assert originals[names[3]][0].read_bytes() == other_writer

    assert results[names[4]].status is FileStatus.FAILED
    assert "vanished" in results[names[4]].reason
    assert not originals[names[4]][0].exists()

    for name in names[5:] + names[:1]:
        path, data = originals[name]
        assert results[name].status is FileStatus.CHANGED, results[name]
        assert results[name].written
        assert path.read_bytes() == converted(data)
    for result in results.values():
        if result.status is FileStatus.FAILED:
            assert not result.written and result.reason
    assert leftover_temp_files(tmp_path) == []


def test_read_only_files_in_a_multi_worker_run(tmp_path, stand_in_transform):
    originals = make_tree(tmp_path)
    names = sorted(originals)
    read_only = set(names[::5])
    for name in read_only:
        os.chmod(originals[name][0], 0o444)

    results = run_tree(tmp_path)

    for name, (path, data) in originals.items():
        if name in read_only:
            assert results[name].status is FileStatus.FAILED
            assert "read-only" in results[name].reason
            assert path.read_bytes() == data
            assert stat.S_IMODE(path.stat().st_mode) == 0o444
        else:
            assert path.read_bytes() == converted(data)
    assert leftover_temp_files(tmp_path) == []


def test_second_run_over_the_converted_tree_changes_nothing(tmp_path, stand_in_transform):
    originals = make_tree(tmp_path)
    first = run_tree(tmp_path)
    assert {r.status for r in first.values()} == {FileStatus.CHANGED}
    after_first = {name: path.read_bytes() for name, (path, _) in originals.items()}

    second = run_tree(tmp_path)

    assert {r.status for r in second.values()} == {FileStatus.ALREADY_MIXED_PRECISION}
    assert {name: path.read_bytes() for name, (path, _) in originals.items()} == after_first
