"""Runs killed or interrupted while rewriting a tree: every file ends exactly old or exactly new.

`ampify TREE -j 2` runs in its own process group, as from a terminal. SIGKILL (no clean-up at
all) hits it while it writes; afterwards no file may be truncated, empty or half-written:
each is byte for byte the original or byte for byte the converted version. Ctrl-C (SIGINT to
the whole group) must stop the workers, exit 130 and print a summary that matches the disk.

Two converters are used: the real TF1 transform on a real TF1 training script (the expected
bytes come from `convert_source`), and a stand-in transform (tests/test_scale_races.py) that
exercises the same engine whatever the real transforms do.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ampify.convert import convert_source

TESTS_DIR = Path(__file__).resolve().parent
FILES = 120

TF1_SCRIPT = textwrap.dedent(
    '''\
    """Train a tiny regression model (copy {index})."""
    import numpy as np
    import tensorflow.compat.v1 as tf

    tf.disable_v2_behavior()
    {padding}
    x = tf.placeholder(tf.float32, [None, 4])
    y = tf.placeholder(tf.float32, [None, 1])
    w = tf.get_variable("w", [4, 1])
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    train_op = tf.train.AdamOptimizer({rate}).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train_op, {{x: np.ones((2, 4)), y: np.ones((2, 1))}})
    '''
)

STAND_IN_SCRIPT = "# convert-me\nimport os\n{padding}\nprint(os.getcwd(), {rate})\n"

#: runs ampify's CLI with the stand-in transform patched into the registry
STAND_IN_BOOTSTRAP = textwrap.dedent(
    f"""\
    import sys
    sys.path.insert(0, {str(TESTS_DIR)!r})
    import ampify.convert
    from test_scale_races import AppendMarker
    ampify.convert.transforms_for = lambda options: [AppendMarker()]
    from ampify.cli import main
    sys.argv[0] = "ampify"
    main()
    """
)


def padding(index: int) -> str:
    """Plain helper functions, so that each file takes a few milliseconds to parse."""
    return "\n".join(
        f"def helper_{index}_{n}(value, scale={n}):\n    return [value * scale + i for i in range({n})]\n"
        for n in range(8)
    )


def build_tree(root: Path, converter: str) -> dict:
    """{path: (original bytes, expected converted bytes)} for a tree of convertible files."""
    template = TF1_SCRIPT if converter == "tf1" else STAND_IN_SCRIPT
    # One script copied everywhere: a single expected conversion, and the check per file is
    # still exact (each path must hold exactly these old or exactly these new bytes).
    original = template.format(index=0, padding=padding(0), rate=0.01).encode()
    converted = expected_conversion(original, converter)
    files = {}
    for index in range(FILES):
        path = root / f"project{index % 6}" / f"train_{index:04d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(original)
        files[path] = (original, converted)
    return files


def expected_conversion(original: bytes, converter: str) -> bytes:
    if converter == "stand-in":
        return original + b"# converted by the stand-in transform\n"
    conversion = convert_source(original)
    if conversion.converted is None:
        pytest.fail(
            "the TF1 transform converts nothing on a plain TF1 script "
            f"(status {conversion.status.value!r}: {conversion.reason}); this test needs the real "
            "TF1 transform (merge main once it has landed)"
        )
    return conversion.converted


def ampify_command(converter: str, *args) -> list:
    if converter == "stand-in":
        return [sys.executable, "-c", STAND_IN_BOOTSTRAP, *map(str, args)]
    return [sys.executable, "-m", "ampify", *map(str, args)]


def start(converter: str, root: Path, jobs: int = 2) -> subprocess.Popen:
    return subprocess.Popen(
        ampify_command(converter, root, "-j", jobs, "-q"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, like a job started from a shell
        env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )


def count_states(files: dict):
    """(# exactly original, # exactly converted, [paths that are neither])."""
    old = new = 0
    broken = []
    for path, (original, converted) in files.items():
        data = path.read_bytes()
        if data == original:
            old += 1
        elif data == converted:
            new += 1
        else:
            broken.append((path, len(data)))
    return old, new, broken


def wait_for_converted(process: subprocess.Popen, files: dict, at_least: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"ampify finished before it could be interrupted: {process.communicate()}")
        if count_states(files)[1] >= at_least:
            return
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"fewer than {at_least} files converted after {timeout} s")


def assert_only_ampify_temp_files(root: Path, files: dict) -> None:
    """A SIGKILL can leave a temp file behind, never a stray `.py`: nothing ampify would read."""
    for path in root.rglob("*"):
        if path.is_file() and path not in files:
            assert path.name.startswith(".") and path.name.endswith(".ampify-tmp"), path


@pytest.mark.parametrize("converter", ["tf1", "stand-in"])
def test_sigkill_mid_rewrite_leaves_every_file_old_or_new(tmp_path, converter):
    files = build_tree(tmp_path, converter)
    for at_least in (1, FILES // 3):
        process = start(converter, tmp_path)
        wait_for_converted(process, files, at_least)
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
        old, new, broken = count_states(files)
        assert broken == [], f"files neither original nor converted after SIGKILL: {broken[:5]}"
        assert new >= at_least and old > 0, (old, new)  # it really was killed mid-run
        assert_only_ampify_temp_files(tmp_path, files)

    # A run after the crash finishes the job; converted files are not converted twice, and the
    # temporary files the kills left (aged past the minute a live one could have) are removed.
    leftovers = list(tmp_path.rglob("*.ampify-tmp"))
    for path in leftovers:
        os.utime(path, (time.time() - 120, time.time() - 120))
    finish = subprocess.run(ampify_command(converter, tmp_path, "-j", "2", "-q"), capture_output=True, text=True, timeout=300)
    assert finish.returncode == 0, finish.stderr
    assert count_states(files) == (0, FILES, [])
    assert list(tmp_path.rglob("*.ampify-tmp")) == []
    if leftovers:
        assert f"removed {len(leftovers)} temporary file" in finish.stdout


@pytest.mark.parametrize("converter,jobs", [("tf1", 2), ("stand-in", 2), ("stand-in", 1)])
def test_ctrl_c_stops_workers_and_reports_what_was_done(tmp_path, converter, jobs):
    files = build_tree(tmp_path, converter)
    process = start(converter, tmp_path, jobs)
    wait_for_converted(process, files, 1)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C: the whole group
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("ampify did not stop within 60 s of Ctrl-C")

    assert process.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stderr, stderr
    old, new, broken = count_states(files)
    assert broken == []
    assert old > 0, "the run was not interrupted: every file was converted"
    summary = re.search(r"interrupted after (\d+) files?: (\d+) changed", stdout)
    assert summary, stdout
    assert int(summary.group(2)) == new, "the summary must count exactly the files rewritten on disk"
    assert int(summary.group(1)) >= new
    assert_only_ampify_temp_files(tmp_path, files)
    # No worker outlives the interrupted run.
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)
