"""How the runner splits a tree into batches for the worker pool."""

from __future__ import annotations

from pathlib import Path

from ampify.discover import Candidate
from ampify.engine import FileTask, Mode
from ampify.options import Options
from ampify.runner import BATCH_MAX_BYTES, BATCH_MAX_FILES, _batches


def make_tasks(tmp_path: Path, sizes):
    tasks = []
    for index, size in enumerate(sizes):
        path = tmp_path / f"f{index:04d}.py"
        path.write_bytes(b"#" * size)
        tasks.append(FileTask(Candidate(path, path.name), Options(), Mode.CHECK))
    return tasks


def test_every_file_once_big_files_alone_and_first(tmp_path):
    # Tree order keeps the big files together, as TensorFlow's gen_*_ops.py are.
    sizes = [2_000] * 300 + [600_000] * 6 + [40_000] * 50 + [100] * 300
    tasks = make_tasks(tmp_path, sizes)
    missing = FileTask(Candidate(tmp_path / "gone.py", "gone.py"), Options(), Mode.CHECK)

    batches = _batches(tasks + [missing], jobs=2)

    flat = [task for batch in batches for task in batch]
    assert sorted(t.candidate.display for t in flat) == sorted(t.candidate.display for t in tasks + [missing])
    for batch in batches:
        assert len(batch) <= BATCH_MAX_FILES
        total = sum(t.candidate.path.stat().st_size for t in batch if t.candidate.path.exists())
        assert len(batch) == 1 or total <= BATCH_MAX_BYTES
    assert [len(b) for b in batches[:6]] == [1] * 6, "each 600 kB file is a batch of its own"
    biggest_per_batch = [max((t.candidate.path.stat().st_size for t in b if t.candidate.path.exists()), default=0) for b in batches]
    assert biggest_per_batch == sorted(biggest_per_batch, reverse=True), "largest files go first"


def test_small_trees_still_use_several_batches(tmp_path):
    tasks = make_tasks(tmp_path, [500] * 20)
    batches = _batches(tasks, jobs=2)
    assert len(batches) >= 2 and sum(map(len, batches)) == 20
