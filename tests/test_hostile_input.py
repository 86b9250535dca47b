"""Hostile input and signals: no hang, no lost report, bounded memory (issue #16).

Every test reproduces one way a real run went wrong: a worker that crashes or never finishes,
SIGTERM from `timeout` or CI, huge files, absurd -j, file names with escape sequences and
newlines, a report path that would overwrite a source, read-only folders and hard links as
root, CR-only files, two runs over one tree, a user file that looks like a temporary file, and
UTF-16 source. The stand-in transforms run the real runner, engine and file I/O.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import libcst as cst
import pytest

import ampify.convert
from ampify.cli import worker_count
from ampify.discover import discover
from ampify.engine import FileTask, Mode, unified_diff
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.runner import default_jobs, run_tasks
from ampify.source_io import SourceIOError, read_source, replace_atomically
from ampify.transforms.base import Transform, TransformResult, Verdict

TESTS_DIR = Path(__file__).resolve().parent

TORCH_STEP = textwrap.dedent(
    """\
    import torch
    model = torch.nn.Linear(4, 2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in [(torch.randn(3, 4), torch.randn(3, 2))]:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    """
)


class Misbehave(Transform):
    """Stand-in rewrite: `# crash-me` segfaults the process, `# hang-me` never returns, `# convert-me`
    gets a marker comment (the real transforms have no such bugs, which is the point)."""

    name = "misbehave"

    def may_apply(self, source, options):
        return b"-me" in source

    def concerns(self, imports, options):
        return True

    def apply(self, module, imports, options, context=None):
        if "# crash-me" in module.code:
            ctypes.string_at(0)  # SIGSEGV, as LibCST's native parser on 5,000 nested parentheses
        if "# hang-me" in module.code:
            time.sleep(3600)
        if "# converted" in module.code:
            return TransformResult(module, Verdict.ALREADY_MIXED_PRECISION)
        footer = [*module.footer, cst.EmptyLine(comment=cst.Comment("# converted"))]
        return TransformResult(module.with_changes(footer=footer), Verdict.CONVERTED)


@pytest.fixture
def misbehaving(monkeypatch):
    monkeypatch.setattr(ampify.convert, "transforms_for", lambda options: [Misbehave()])


def tasks_for(root: Path, mode=Mode.WRITE, **limits):
    return [FileTask(c, Options(), mode, **limits) for c in discover([root]).candidates]


def make_files(root: Path, specials: dict, good: int = 12) -> dict:
    files = {}
    for index in range(good):
        files[f"good_{index:02d}.py"] = f"# convert-me\nSTEP = {index}\n"
    files.update(specials)
    for name, text in files.items():
        (root / name).write_text(text)
    return files


# --- 1. a crashing worker ------------------------------------------------------------------

@pytest.mark.parametrize("jobs", [1, 2])
def test_a_worker_that_crashes_fails_its_file_and_the_run_goes_on(tmp_path, misbehaving, jobs):
    make_files(tmp_path, {"bomb.py": "# crash-me\n", "bomb2.py": "# crash-me\nx = 2\n"})
    started = time.monotonic()
    results = {Path(r.path).name: r for r in run_tasks(tasks_for(tmp_path), jobs)}
    assert time.monotonic() - started < 60
    assert len(results) == 14, "every file comes back with a result, the ones after the crash too"
    for name in ("bomb.py", "bomb2.py"):
        assert results[name].status is FileStatus.FAILED
        assert "the parser crashed (SIGSEGV)" in results[name].reason
        assert (tmp_path / name).read_text().startswith("# crash-me")
    for index in range(12):
        assert results[f"good_{index:02d}.py"].status is FileStatus.CHANGED
        assert (tmp_path / f"good_{index:02d}.py").read_text().endswith("# converted\n")


def test_real_deeply_nested_file_is_reported_not_hung(tmp_path):
    """5,000 nested parentheses crashed LibCST's parser and hung `-j 2` forever."""
    (tmp_path / "nested.py").write_text(TORCH_STEP + "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    (tmp_path / "lists.py").write_text(TORCH_STEP + "y = " + "[" * 3000 + "]" * 3000 + "\n")
    (tmp_path / "train.py").write_text(TORCH_STEP)
    for jobs in ("1", "2"):
        run = run_ampify("--check", "-j", jobs, tmp_path)
        assert run.returncode == 1, run
        assert "nested.py: failed: not valid Python 3." in run.stderr and "too many nested parentheses" in run.stderr
        assert "lists.py: failed:" in run.stderr
        assert "1 would be changed" in run.stdout and "2 failed" in run.stdout


def test_cli_reports_a_crash_with_one_worker_and_still_prints_the_summary(tmp_path):
    (tmp_path / "bomb.py").write_text("# crash-me\n")
    (tmp_path / "train.py").write_text("# convert-me\n")
    run = run_stand_in(tmp_path, "-j", "1", "--report", tmp_path / "r.json")
    assert run.returncode == 1, run  # not 139
    assert "bomb.py: failed: the parser crashed (SIGSEGV)" in run.stderr
    assert "1 changed" in run.stdout and "1 failed" in run.stdout
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["failed"] == 1


# --- 2. a per-file time limit ---------------------------------------------------------------

def test_a_file_over_the_time_limit_is_abandoned_and_the_rest_converted(tmp_path, misbehaving):
    make_files(tmp_path, {"slow.py": "# hang-me\n"}, good=4)
    started = time.monotonic()
    results = {Path(r.path).name: r for r in run_tasks(tasks_for(tmp_path), 2, file_timeout=0.5)}
    assert time.monotonic() - started < 30
    assert results["slow.py"].status is FileStatus.FAILED
    assert "longer than the 0.5 s per-file limit" in results["slow.py"].reason
    assert (tmp_path / "slow.py").read_text() == "# hang-me\n"
    assert all(results[f"good_{i:02d}.py"].status is FileStatus.CHANGED for i in range(4))


def test_real_long_sum_hits_the_cli_time_limit(tmp_path):
    """A 2,500-term sum takes LibCST seconds (10,000 terms took minutes)."""
    terms = " + ".join(f"x{i}" for i in range(2500))
    (tmp_path / "long_sum.py").write_text(TORCH_STEP + f"z = {terms}\n")
    run = run_ampify("--check", "--file-timeout", "0.2", tmp_path / "long_sum.py")
    assert run.returncode == 1
    assert "long_sum.py: failed: took longer than the 0.2 s per-file limit to convert (--file-timeout)" in run.stderr


# --- 3. SIGTERM and SIGHUP ------------------------------------------------------------------

@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_cleanly_with_summary_and_report(tmp_path, signum, code):
    tree = tmp_path / "tree"
    tree.mkdir()
    originals = {}
    for index in range(200):
        path = tree / f"train_{index:03d}.py"
        path.write_text(f"# convert-me\nSTEP = {index}\n" + "def f(a):\n    return [a * i for i in range(9)]\n" * 40)
        originals[path] = path.read_bytes()
    report = tmp_path / "report.json"
    process = subprocess.Popen(
        stand_in_command(tree, "-j", "2", "--report", report), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=dict(os.environ, PYTHONIOENCODING="utf-8"),
    )
    deadline = time.monotonic() + 60
    while sum(p.read_bytes() != data for p, data in originals.items()) < 3:
        assert time.monotonic() < deadline and process.poll() is None, "never got going"
        time.sleep(0.005)
    process.send_signal(signum)  # the main process only, as `timeout` and CI runners do
    stdout, stderr = process.communicate(timeout=60)

    assert process.returncode == code, (stdout, stderr)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    changed_on_disk = sum(p.read_bytes() != data for p, data in originals.items())
    assert 0 < changed_on_disk < len(originals)
    for path, data in originals.items():
        assert path.read_bytes() in (data, data + b"# converted\n")
    assert f"interrupted after" in stdout and f": {changed_on_disk} changed" in stdout
    document = json.loads(report.read_text())
    assert document["interrupted"] is True and document["summary"]["changed"] == changed_on_disk


# --- 4. memory: a size limit ----------------------------------------------------------------

def test_files_over_the_size_limit_are_skipped_with_the_reason(tmp_path):
    (tmp_path / "generated.py").write_text(TORCH_STEP + "# padding\n" * 2000)
    (tmp_path / "train.py").write_text(TORCH_STEP)
    run = run_ampify("--check", "--max-file-size", "0.01", tmp_path)
    assert re.search(r"generated\.py: skipped: 2\d\.\d kB, over the 10\.0 kB size limit \(--max-file-size", run.stdout), run
    assert "1 would be changed" in run.stdout and "1 skipped" in run.stdout
    assert "2 would be changed" in run_ampify("--check", "--max-file-size", "0", tmp_path).stdout


def test_the_default_size_limit_skips_a_huge_generated_file_without_reading_it(tmp_path):
    huge = tmp_path / "huge.py"
    with open(huge, "wb") as handle:
        handle.write(TORCH_STEP.encode())
        handle.write(b"# " + b"x" * 99 + b"\n" * 1)
        handle.truncate(5_000_000)  # sparse: 5 MB of NUL bytes that are never read
    run = run_ampify("--check", huge)
    assert "huge.py: skipped: 5.0 MB, over the 4.0 MB size limit (--max-file-size" in run.stdout


def test_size_and_time_limits_come_from_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ampify]\nmax-file-size = 0.0001\nfile-timeout = 30\n")
    (tmp_path / "train.py").write_text(TORCH_STEP)
    run = run_ampify("--check", tmp_path)
    assert "train.py: skipped:" in run.stdout, run
    (tmp_path / "pyproject.toml").write_text("[tool.ampify]\nfile-timeout = -1\n")
    bad = run_ampify("--check", tmp_path)
    assert bad.returncode == 2 and "file-timeout must be 0 (no limit) or more" in bad.stderr


# --- 5. bounded workers ---------------------------------------------------------------------

def test_jobs_are_capped_at_the_cpu_count_unless_forced(tmp_path):
    cores = default_jobs()
    assert worker_count(None, False) == (cores, False)
    assert worker_count(cores + 998, False) == (cores, True)
    assert worker_count(cores + 998, True) == (cores + 998, False)
    (tmp_path / "train.py").write_text(TORCH_STEP)
    run = run_ampify("--check", "-j", "1000", tmp_path)
    assert f"ampify: -j 1000 capped at {cores}, the CPU count (--force-jobs starts that many workers)" in run.stdout
    (tmp_path / "pyproject.toml").write_text("[tool.ampify]\njobs = 100000\n")
    assert f"-j 100000 capped at {cores}" in run_ampify("--check", tmp_path).stdout


# --- 6. file names ----------------------------------------------------------------------------

def test_escape_sequences_and_newlines_in_names_never_reach_the_terminal_raw(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    evil = "evil\x1b[2J\x1b]0;pwned\x07\nname.py"
    (repo / evil).write_text(TORCH_STEP)
    check = run_ampify("--check", repo)
    assert "\x1b" not in check.stdout + check.stderr
    assert '/evil\\033[2J\\033]0;pwned\\a\\nname.py":3:' in check.stdout
    for line in check.stdout.splitlines():
        assert not line.startswith("name.py"), "a newline in a name split a report line"

    diff = run_ampify("--diff", evil, cwd=repo)
    assert diff.stdout.startswith('--- "a/evil\\033[2J\\033]0;pwned\\a\\nname.py"\n')
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    applied = subprocess.run(["git", "apply", "-"], input=diff.stdout, text=True, cwd=repo, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert (repo / evil).read_bytes() == ampify.convert.convert_source(TORCH_STEP.encode()).converted


def test_non_utf8_names_round_trip_through_the_json_report(tmp_path):
    raw_name = b"caf\xe9_train.py"
    folder = os.fsencode(str(tmp_path))
    with open(os.path.join(folder, raw_name), "w") as handle:
        handle.write(TORCH_STEP)
    run = run_ampify("--check", tmp_path, "--report", tmp_path / "r.json")
    assert "caf\\351_train.py" in run.stdout
    raw_report = (tmp_path / "r.json").read_bytes()
    json.loads(raw_report.decode("utf-8"))  # strict UTF-8: no lone surrogates
    entry = json.loads(raw_report)["files"][0]
    assert base64.b64decode(entry["path_bytes"]) == os.path.join(folder, raw_name)


# --- 7. the --report path -----------------------------------------------------------------------

def test_a_bad_report_path_is_refused_before_anything_is_touched(tmp_path):
    (tmp_path / "src").mkdir()
    good = tmp_path / "src" / "good.py"
    good.write_text(TORCH_STEP)
    for report, message in [
        (tmp_path / "missing" / "r.json", "does not exist"),
        (tmp_path / "src", "is a folder"),
        (good, "is one of the files this run converts"),
    ]:
        run = run_ampify(tmp_path / "src", "--report", report)
        assert run.returncode == 2, run
        assert message in run.stderr and "Traceback" not in run.stderr
        assert good.read_text() == TORCH_STEP, "nothing may be rewritten when the report cannot be written"


# --- 9. read-only folders and hard links (also as root) --------------------------------------

def test_a_read_only_folder_is_honoured_also_as_root(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    (folder / "train.py").write_text(TORCH_STEP)
    os.chmod(folder, 0o555)
    try:
        run = run_ampify(folder)
        assert run.returncode == 1
        assert "train.py: failed: its folder is read-only, not overwritten" in run.stderr
        assert "AMP001 error: not written: its folder is read-only" in run.stdout + run.stderr
        assert (folder / "train.py").read_text() == TORCH_STEP
        assert sorted(os.listdir(folder)) == ["train.py"]
    finally:
        os.chmod(folder, 0o755)


def test_a_hard_linked_file_is_refused_or_written_through(tmp_path):
    (tmp_path / "train.py").write_text(TORCH_STEP)
    os.link(tmp_path / "train.py", tmp_path / "copy_elsewhere.txt")
    run = run_ampify(tmp_path / "train.py")
    assert run.returncode == 1
    assert "has 2 hard links: replacing it would split them" in run.stderr
    assert (tmp_path / "train.py").read_text() == TORCH_STEP

    inode = (tmp_path / "train.py").stat().st_ino
    through = run_ampify(tmp_path / "train.py", "--write-through-hardlinks")
    assert through.returncode == 0, through
    converted = ampify.convert.convert_source(TORCH_STEP.encode()).converted
    assert (tmp_path / "train.py").read_bytes() == converted
    assert (tmp_path / "copy_elsewhere.txt").read_bytes() == converted, "the link is kept"
    assert (tmp_path / "train.py").stat().st_ino == inode and (tmp_path / "train.py").stat().st_nlink == 2


# --- 10. CR-only line endings -------------------------------------------------------------------

def test_cr_only_files_keep_their_last_line_ending_and_diff_applies(tmp_path):
    source = TORCH_STEP.replace("\n", "\r").encode()
    converted = ampify.convert.convert_source(source).converted
    assert converted.endswith(b"opt)\r    scaler.update()\r")
    assert b"\n" not in converted
    path = tmp_path / "cr.py"
    path.write_bytes(source)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    patch = unified_diff("cr.py", source, converted)
    assert "\\ No newline at end of file" in patch and patch.count("\\ No newline") == 2
    applied = subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=tmp_path, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert path.read_bytes() == converted


def test_diff_lines_split_only_at_newlines_form_feeds_stay_inside(tmp_path):
    source = ("\x0c\n" + TORCH_STEP).encode()  # a form feed line, as old Python code has
    converted = ampify.convert.convert_source(source).converted
    path = tmp_path / "ff.py"
    path.write_bytes(source)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    applied = subprocess.run(["git", "apply", "-"], input=unified_diff("ff.py", source, converted), text=True,
                             cwd=tmp_path, capture_output=True)
    assert applied.returncode == 0, applied.stderr
    assert path.read_bytes() == converted


# --- 11. concurrent runs ------------------------------------------------------------------------

def test_the_last_check_and_the_rename_are_one_step_under_a_lock(tmp_path):
    """Run B read the file; run A is between its own last check and its rename (it holds the
    lock). B must wait, then see A's new file and refuse, never rename over it."""
    import fcntl

    path = tmp_path / "train.py"
    path.write_bytes(b"x = 1\n")
    run_b = read_source(path)
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    outcome = []

    def replace_b():
        try:
            replace_atomically(run_b, b"x = 1  # run B\n")
            outcome.append("written")
        except SourceIOError as error:
            outcome.append(str(error))

    thread = threading.Thread(target=replace_b)
    thread.start()
    time.sleep(0.3)
    assert outcome == [], "run B must wait for the lock"
    (tmp_path / ".a.tmp").write_bytes(b"x = 1  # run A\n")
    os.replace(tmp_path / ".a.tmp", path)  # run A's rename
    os.close(holder)
    thread.join(10)
    assert outcome == ["file changed on disk during the run, not overwritten"]
    assert path.read_bytes() == b"x = 1  # run A\n"


def test_two_concurrent_runs_convert_each_file_exactly_once(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for index in range(150):
        (tree / f"train_{index:03d}.py").write_text(f"# convert-me\nSTEP = {index}\n")
    reports = [tmp_path / "a.json", tmp_path / "b.json"]
    processes = [
        subprocess.Popen(stand_in_command(tree, "-j", "2", "-q", "--report", report),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for report in reports
    ]
    for process in processes:
        process.communicate(timeout=120)
    changed_by = {}
    for report in reports:
        for entry in json.loads(report.read_text())["files"]:
            if entry["status"] == "changed":
                changed_by.setdefault(entry["path"], []).append(report.name)
            else:
                assert entry["status"] in ("already mixed precision", "failed"), entry
                if entry["status"] == "failed":
                    assert "changed on disk" in entry["reason"]
    for path in tree.iterdir():
        assert path.read_text().count("# converted") == 1
        assert len(changed_by.get(str(path), [])) == 1, (path, changed_by.get(str(path)))


# --- 13. UTF-16 and NUL bytes -------------------------------------------------------------------

def test_utf16_and_nul_bytes_are_named_as_the_input_problem(tmp_path):
    (tmp_path / "utf16.py").write_bytes(TORCH_STEP.encode("utf-16"))
    (tmp_path / "utf16_no_bom.py").write_bytes(TORCH_STEP.encode("utf-16-le"))
    (tmp_path / "nul.py").write_bytes(TORCH_STEP.encode() + b"x = 1\x00\n")
    run = run_ampify("--check", tmp_path)
    assert "utf16.py: failed: encoded as UTF-16 (byte order mark): Python reads source files as UTF-8" in run.stderr
    assert "utf16_no_bom.py: failed: looks UTF-16 or UTF-32 encoded" in run.stderr
    assert "nul.py: failed: the file contains a NUL byte (line 9), which Python refuses to compile" in run.stderr
    assert "does not compile" not in run.stderr


# --- helpers --------------------------------------------------------------------------------------

STAND_IN_BOOTSTRAP = textwrap.dedent(
    f"""\
    import sys
    sys.path.insert(0, {str(TESTS_DIR)!r})
    import ampify.convert
    from test_hostile_input import Misbehave
    ampify.convert.transforms_for = lambda options: [Misbehave()]
    from ampify.cli import main
    sys.argv[0] = "ampify"
    main()
    """
)


def stand_in_command(*args):
    return [sys.executable, "-c", STAND_IN_BOOTSTRAP, *map(str, args)]


def run_stand_in(*args):
    return subprocess.run(stand_in_command(*args), capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONIOENCODING="utf-8"))


def run_ampify(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ampify", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


def test_a_worker_killed_while_idle_is_replaced_and_nothing_is_lost(tmp_path, misbehaving, monkeypatch):
    """Between two batches a worker waits for the next; killed there (OOM killer, a stray kill),
    it must not take the run down when it is handed more files."""
    import ampify.runner as runner

    make_files(tmp_path, {}, good=40)
    original_hand_out = runner._Pool.hand_out
    killed = []

    def hand_out_after_killing_an_idle_worker(self, stopping):
        idle = [w for w in self.workers if not w.busy and w.process.is_alive()]
        if idle and not killed and self.pending:
            idle[0].process.kill()
            idle[0].process.join()
            killed.append(idle[0].process.pid)
        return original_hand_out(self, stopping)

    monkeypatch.setattr(runner._Pool, "hand_out", hand_out_after_killing_an_idle_worker)
    monkeypatch.setattr(runner, "BATCH_MAX_FILES", 2)
    results = {Path(r.path).name: r for r in run_tasks(tasks_for(tmp_path), 2)}
    assert killed, "the test never found an idle worker to kill"
    assert len(results) == 40 and {r.status for r in results.values()} == {FileStatus.CHANGED}
