"""A training step split over two files converts as one change set: both files or neither.

The step (engine.py) takes the GradScaler as a new parameter; the module that calls it (main.py)
creates the scaler after the optimizer and passes it in. These tests prove the guarantees:
a run killed at any instant leaves, after the next run's recovery, both files old or both new;
a file changed by someone else aborts the whole set; a caller outside the run is never written;
and the converted project trains on CPU.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampify.change_set import JOURNAL_PREFIX, Change, recover_change_sets, write_change_set
from ampify.source_io import SourceIOError, read_source

ROOT = Path(__file__).resolve().parent.parent
CASE = ROOT / "fixtures" / "repositories" / "engine_split"


def _ampify(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "ampify", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env)


def _tree(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.py"))}


def _copy(tmp_path: Path, name: str = "repo") -> Path:
    tree = tmp_path / name
    shutil.copytree(CASE / "input", tree)
    return tree


def test_a_caller_outside_the_run_is_never_written_and_the_refusal_names_it(tmp_path):
    tree = _copy(tmp_path)
    completed = _ampify(tree / "engine.py", cwd=tmp_path)
    assert completed.returncode == 1
    assert _tree(tree) == _tree(CASE / "input")
    assert "needs the GradScaler from main.py:14, which this run does not cover" in completed.stdout
    assert "run ampify on both files or on the repository" in completed.stdout


def test_naming_both_files_converts_both(tmp_path):
    tree = _copy(tmp_path)
    completed = _ampify(tree / "engine.py", tree / "main.py", cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert _tree(tree) == _tree(CASE / "expected")


def test_diff_prints_the_change_set_together_and_writes_nothing(tmp_path):
    tree = _copy(tmp_path)
    completed = _ampify("--diff", "repo", cwd=tmp_path)
    assert _tree(tree) == _tree(CASE / "input")
    assert "--- a/repo/engine.py" in completed.stdout and "--- a/repo/main.py" in completed.stdout
    patch = tmp_path / "change.patch"
    patch.write_text(completed.stdout)
    subprocess.run(["git", "apply", "--unsafe-paths", str(patch)], cwd=tmp_path, check=True)
    assert _tree(tree) == _tree(CASE / "expected")


def test_a_file_changed_by_someone_else_aborts_the_whole_set(tmp_path):
    tree = _copy(tmp_path)
    engine, main = read_source(tree / "engine.py"), read_source(tree / "main.py")
    (tree / "main.py").write_text((tree / "main.py").read_text() + "# edited meanwhile\n")
    edited = (tree / "main.py").read_bytes()
    with pytest.raises(SourceIOError, match="main.py: file changed on disk.*no file of the change set was written"):
        write_change_set([Change(engine, b"new engine\n"), Change(main, b"new main\n")])
    assert (tree / "engine.py").read_bytes() == engine.data and (tree / "main.py").read_bytes() == edited
    assert not [p for p in tree.iterdir() if p.name.startswith(".")], "temporary files or a journal left behind"


def test_recovery_rolls_back_when_a_temporary_file_is_gone(tmp_path):
    """A journal whose set cannot be completed (a temporary file deleted by hand) is rolled back:
    every file of the set gets its old bytes again."""
    tree = _copy(tmp_path)
    engine, main = read_source(tree / "engine.py"), read_source(tree / "main.py")
    os.environ["_AMPIFY_CHANGE_SET_PAUSE"] = "2"
    child = os.fork()
    if child == 0:  # pragma: no cover - the child is killed mid-set
        try:
            write_change_set([Change(engine, b"x = 1\n"), Change(main, b"y = 2\n")])
        finally:
            os._exit(0)
    del os.environ["_AMPIFY_CHANGE_SET_PAUSE"]
    deadline = time.time() + 20
    while (tree / "engine.py").read_bytes() == engine.data and time.time() < deadline:
        time.sleep(0.02)  # engine.py (first in path order) replaced; main.py still waits
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    assert (tree / "engine.py").read_bytes() == b"x = 1\n" and (tree / "main.py").read_bytes() == main.data
    for temp in [p for p in tree.iterdir() if p.name.endswith(".ampify-tmp")]:
        temp.unlink()
    lines = recover_change_sets([tree])
    assert lines and "rolled back" in lines[0]
    assert _tree(tree) == _tree(CASE / "input")
    assert not [p for p in tree.iterdir() if p.name.startswith(JOURNAL_PREFIX)]


def test_kill_9_at_random_moments_never_leaves_half_a_change_set(tmp_path):
    """SIGKILL the CLI at random instants of its write (slowed down inside the set so that the
    kills land in every step of it); after the next run's recovery both files are old or both
    new, every time, and a final run always ends at the expected tree."""
    rng = random.Random(20261203)
    # 0.8 s after the journal and after each rename: the journal lives 2.4 s, so that a kill aimed
    # inside it lands there also on a loaded machine (CI runs this beside other tests)
    env = {**os.environ, "_AMPIFY_CHANGE_SET_PAUSE": "0.8"}
    calibration = _copy(tmp_path, "calibration")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "ampify", str(calibration), "-j", "1"], cwd=tmp_path, env=env,
                   capture_output=True, check=True)
    whole_run = time.monotonic() - started  # about 2.4 s of it is inside the change set
    seen = set()
    for attempt in range(10):
        tree = _copy(tmp_path, f"repo{attempt}")
        child = subprocess.Popen([sys.executable, "-m", "ampify", str(tree), "-j", "1"], cwd=tmp_path, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if attempt % 2:
            # anywhere in the run
            time.sleep(rng.uniform(0.1, 1.0) * whole_run)
        else:
            # inside the change set: once its journal exists, at a random instant of the
            # (slowed-down) renames, whatever the machine's speed before it
            deadline = time.monotonic() + 3 * whole_run
            while not [p for p in tree.iterdir() if p.name.startswith(JOURNAL_PREFIX)] and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 1.6))
        child.kill()
        child.wait()
        recovery = _ampify("--check", tree, cwd=tmp_path)  # recovers first, in any mode
        state = _tree(tree)
        assert state in (_tree(CASE / "input"), _tree(CASE / "expected")), (attempt, recovery.stdout)
        seen.add("new" if state == _tree(CASE / "expected") else "old")
        seen.add("recovered" if "left unfinished" in recovery.stdout else "clean")
        assert not [p for p in tree.iterdir() if p.name.startswith(JOURNAL_PREFIX)]
        final = _ampify(tree, cwd=tmp_path)
        assert final.returncode == 0, final.stdout + final.stderr
        assert _tree(tree) == _tree(CASE / "expected")
    assert "recovered" in seen, seen  # some kills landed inside the change set


def test_the_converted_two_module_project_trains_on_cpu(tmp_path):
    pytest.importorskip("torch")
    tree = tmp_path / "project"
    tree.mkdir()
    (tree / "engine.py").write_text(
        "import torch\n\n\n"
        "def train_one_epoch(model, criterion, loader, optimizer, device):\n"
        "    for x, y in loader:\n"
        "        x, y = x.to(device), y.to(device)\n"
        "        loss = criterion(model(x), y)\n"
        "        optimizer.zero_grad()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    return loss.item()\n"
    )
    (tree / "main.py").write_text(
        "import math\nimport torch\nimport torch.nn as nn\n\nfrom engine import train_one_epoch\n\n"
        "device = torch.device('cpu')\n"
        "model = nn.Linear(8, 2).to(device)\n"
        "dtypes = []\nmodel.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))\n"
        "criterion = nn.CrossEntropyLoss()\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(3)]\n"
        "for epoch in range(2):\n"
        "    last = train_one_epoch(model, criterion, loader, optimizer, device)\n"
        "assert math.isfinite(last)\n"
        "assert dtypes == [torch.float16] * 6, dtypes\n"
        "print('trained', last)\n"
    )
    completed = _ampify(tree, cwd=tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "scaler=scaler" in (tree / "main.py").read_text()
    run = subprocess.run([sys.executable, "main.py"], cwd=tree, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "trained" in run.stdout


def test_apex_places_amp_initialize_in_the_calling_module_or_refuses_naming_it(tmp_path):
    tree = _copy(tmp_path)
    alone = _ampify("--backend", "apex", tree / "engine.py", cwd=tmp_path)
    assert alone.returncode == 1 and _tree(tree) == _tree(CASE / "input")
    assert "needs amp.initialize in main.py:14, which this run does not cover" in alone.stdout
    both = _ampify("--backend", "apex", tree, cwd=tmp_path)
    assert both.returncode == 0, both.stdout + both.stderr
    expected = ROOT / "fixtures" / "repositories" / "engine_split" / "variants" / "apex" / "expected"
    assert _tree(tree) == _tree(expected)
    main = (tree / "main.py").read_text()
    # amp.initialize after the optimizer and before the loop that calls the step
    assert main.index("optimizer = torch.optim.SGD") < main.index("amp.initialize(") < main.index("for epoch in")


def test_workers_do_not_outlive_a_run_killed_with_sigkill(tmp_path):
    """The parent killed mid-run: its worker finishes the file in hand (a change set is never cut
    by the parent's death) and then exits, instead of waiting on the pipe forever."""
    tree = _copy(tmp_path, "orphans")
    env = {**os.environ, "_AMPIFY_CHANGE_SET_PAUSE": "0.5"}
    child = subprocess.Popen([sys.executable, "-m", "ampify", str(tree), "-j", "1"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.8)
    child.kill()
    child.wait()
    deadline = time.time() + 15
    while time.time() < deadline:
        alive = subprocess.run(["pgrep", "-f", str(tree)], capture_output=True, text=True).stdout.split()
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, f"worker processes left running: {alive}"
    recovery = _ampify("--check", tree, cwd=tmp_path)
    assert _tree(tree) in (_tree(CASE / "input"), _tree(CASE / "expected")), recovery.stdout


# ---- one edit of a module that several change sets share ----------------------------------------

SHARED = ROOT / "fixtures" / "repositories" / "imported_float16_overflow"


def _rel_tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.py"))}


def test_an_imported_module_outside_the_run_is_not_written_and_the_refusal_says_so(tmp_path):
    tree = tmp_path / "repo"
    shutil.copytree(SHARED / "input", tree)
    completed = _ampify(tree / "train.py", cwd=tmp_path)
    assert completed.returncode == 1
    assert _rel_tree(tree) == _rel_tree(SHARED / "input")
    assert "model/attention.py is not in this run: run ampify on both files or on the repository" in completed.stdout


@pytest.mark.parametrize("workers", ["1", "2"])
def test_two_trainers_sharing_the_attention_fix_both_convert(tmp_path, workers):
    """train.py and finetune.py both need model/attention.py's masked_fill rewritten: each change
    set holds the same edit, the module's own conversion makes it too, and whichever comes later
    finds it made (no "changed during the run" failure, also with two workers racing)."""
    for attempt in range(3 if workers == "2" else 1):
        tree = tmp_path / f"repo{attempt}"
        shutil.copytree(SHARED / "input", tree)
        completed = _ampify(tree, "-j", workers, cwd=tmp_path)
        assert completed.returncode == 0, completed.stdout + completed.stderr
        assert "failed" not in completed.stdout.split("scanned")[0]
        assert _rel_tree(tree) == _rel_tree(SHARED / "expected")


def test_diff_shows_a_shared_edit_once(tmp_path):
    tree = tmp_path / "repo"
    shutil.copytree(SHARED / "input", tree)
    completed = _ampify(tree, "--diff", "-j", "1", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count("+++ b/") == 4  # attention.py, finetune.py, prepare.py, train.py
    assert completed.stdout.count("torch.finfo(attn.dtype).min") == 1
    assert _rel_tree(tree) == _rel_tree(SHARED / "input")


def test_a_change_set_skips_a_file_that_already_holds_its_new_version(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_bytes(b"a = 1\n")
    second.write_bytes(b"b = 1\n")
    old_first, old_second = read_source(first), read_source(second)
    first.write_bytes(b"a = 2\n")  # another change set of the run wrote the same edit
    held = write_change_set([Change(old_first, b"a = 2\n"), Change(old_second, b"b = 2\n")])
    assert held == [first]  # not this set's change: the caller does not report it as written
    assert first.read_bytes() == b"a = 2\n" and second.read_bytes() == b"b = 2\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    first.write_bytes(b"a = 3\n")  # someone else's edit still aborts the set
    with pytest.raises(SourceIOError):
        write_change_set([Change(read_source(second), b"b = 3\n"), Change(old_first, b"a = 2\n")])
    assert first.read_bytes() == b"a = 3\n" and second.read_bytes() == b"b = 2\n"


TWO_ENGINES = ROOT / "fixtures" / "repositories" / "two_engines_one_driver"


@pytest.mark.parametrize("case", ["two_engines_one_driver", "apex_two_engines_one_driver"])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_two_engine_modules_called_from_one_driver_share_its_setup_whatever_the_workers(tmp_path, workers, case):
    """engine_plain.py and engine_distill.py each need train.py to create a GradScaler and pass it
    (apex: to call amp.initialize): the change set written second finds what the first created and
    uses it (no second scaler for the same optimizer, no second amp.initialize, no "already mixed
    precision" for a file still in float32). With two workers, change sets spanning files are
    held back and written one at a time after the others, so the tree is the one a single worker
    writes, every time."""
    folder = ROOT / "fixtures" / "repositories" / case
    options = ["--backend", "apex"] if case.startswith("apex") else []
    for attempt in range(3 if workers == "2" else 1):
        tree = tmp_path / f"repo{attempt}"
        shutil.copytree(folder / "input", tree)
        (tree / ".git").mkdir()
        completed = _ampify(tree, "-j", workers, *options, cwd=tmp_path)
        assert completed.returncode == 0, completed.stdout + completed.stderr
        summary = completed.stdout.split("ampify: scanned")[-1]
        assert "3 changed, 0 already mixed precision" in summary and " 0 failed" in summary, completed.stdout
        assert _tree(tree) == _tree(folder / "expected")
        setups = (tree / "train.py").read_text().count("GradScaler(") + (tree / "train.py").read_text().count(
            "amp.initialize(")
        assert setups == (1 if options else 2)  # one per optimizer, not one per engine module


def test_two_engine_modules_sharing_one_scaler_train_on_cpu(tmp_path):
    """The converted project runs: 3 + 3 + 1 stage steps and 1 fine-tuning step, all finite, with
    the forward passes in float16 under CPU autocast; the original runs in float32."""
    probe = (
        "import json, runpy, sys, torch\n"
        "dtypes = set()\n"
        "linear = torch.nn.functional.linear\n"
        "def recording(*a, **k):\n"
        "    out = linear(*a, **k); dtypes.add(str(out.dtype)); return out\n"
        "torch.nn.functional.linear = recording\n"
        "sys.path.insert(0, '.')\n"
        "found = runpy.run_path('train.py', run_name='__main__')\n"
        "print(json.dumps({'losses': found['LOSSES'], 'dtypes': sorted(dtypes)}))\n"
    )
    import json
    import math

    for folder, dtype in (("input", "torch.float32"), ("expected", "torch.float16")):
        tree = tmp_path / folder
        shutil.copytree(TWO_ENGINES / folder, tree)
        completed = subprocess.run([sys.executable, "-c", probe], cwd=tree, capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        found = json.loads(completed.stdout.strip().splitlines()[-1])
        assert dtype in found["dtypes"], found["dtypes"]
        assert len(found["losses"]) == 8 and all(math.isfinite(loss) for loss in found["losses"]), found["losses"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_diff_of_two_change_sets_sharing_a_driver_shows_what_a_write_run_writes(tmp_path, workers):
    """--diff plans the change sets in the order a write run writes them: the second engine's
    set sees the scaler the first one's set planned for train.py, and train.py's diff is shown
    once, whole. Applied with `git apply`, the diff gives exactly the tree a write run writes."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tree = tmp_path / "repo"
    shutil.copytree(TWO_ENGINES / "input", tree)
    (tree / ".git").mkdir()
    completed = _ampify(".", "--diff", "-j", workers, cwd=tree)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count("+++ b/train.py") == 1
    assert _tree(tree) == _tree(TWO_ENGINES / "input")  # nothing written
    patch = tmp_path / "change.diff"
    patch.write_text(completed.stdout)
    applied = subprocess.run(["git", "apply", str(patch)], cwd=tree, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert _tree(tree) == _tree(TWO_ENGINES / "expected")
