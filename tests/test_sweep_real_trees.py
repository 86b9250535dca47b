"""ampify over real installed code nobody here wrote: the stdlib, torch and tensorflow.

What it covers (bounded for CI: about a minute on 2 quiet cores with all transforms; files over 60 kB are
left out of the samples): per tree, a deterministic sample
(SAMPLE_SIZE files chosen by a hash of the relative path), plus up to TRAINING_LIKE files
that look like training code (the ones the transforms really parse and rewrite), plus for the
stdlib every file of `lib2to3/tests/data` and the stdlib's own bad-syntax/bad-coding test
files, plus a hand-made set of hostile inputs that look like training scripts (Python 2,
BOM + CRLF, latin-1, bad UTF-8, NUL bytes, deep nesting).

For each tree: `--check` on the installed originals (never written), then a write run on a
copy, then `--check` on the copy. Zero crashes: every file ends changed, unchanged (already
mixed precision / not applicable / not converted), skipped, or failed with a reason that is
not an internal error. Check and write agree file by file, every changed file compiles,
unchanged files are byte-identical, and the second run changes nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zlib
from pathlib import Path
from typing import Dict, List, Optional

import pytest

SAMPLE_SIZE = 120
TRAINING_LIKE = 20
#: files above this size are left out of the sample (CI time budget: LibCST parses ~0.2 MB/s)
MAX_SAMPLED_BYTES = 60_000
TRAINING_MARKERS = (b".backward(", b".minimize(", b"apply_gradients", b"GradScaler", b"autocast(", b".step(")
ALLOWED = {"changed", "changed, incomplete", "already mixed precision", "not applicable", "not converted", "skipped", "failed"}
#: reasons a file may legitimately fail: the input itself is not Python 3 or not readable
INPUT_FAULTS = (
    "not valid Python 3", "cannot decode", "too deeply nested", "not a regular file", "cannot read",
    "the file contains a NUL byte", "encoded as UTF-", "looks UTF-16", "valid Python, but LibCST",
    "Python 3.",  # "Python 3.11 cannot compile it: ..."
)

HOSTILE_INPUTS = {
    "py2_training.py": b"import torch\nprint 'epoch'\nloss.backward()\noptimizer.step()\n",
    "bom_crlf_training.py": (
        b"\xef\xbb\xbfimport torch\r\n\r\nmodel = torch.nn.Linear(2, 2)\r\n"
        b"optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\r\n"
        b"for _ in range(2):\r\n    optimizer.zero_grad()\r\n"
        b"    loss = model(torch.ones(1, 2)).sum()\r\n    loss.backward()\r\n    optimizer.step()\r\n"
    ),
    "latin1_training.py": (
        b"# -*- coding: latin-1 -*-\nimport tensorflow.compat.v1 as tf\n# caf\xe9\n"
        b"loss = tf.reduce_sum(tf.get_variable('w', [1]))\n"
        b"train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)\n"
    ),
    "bad_utf8_training.py": b"import torch\nname = '\xff\xfe'\nloss.backward()\noptimizer.step()\n",
    "nul_byte_training.py": b"import torch\nloss.backward()\x00\noptimizer.step()\n",
    "deep_nesting_training.py": b"import torch\nloss = " + b"(" * 400 + b"1" + b")" * 400 + b"\nloss.backward()\n",
    "empty.py": b"",
    "only_comment_no_newline.py": b"# torch .backward( .step(",
    "tabs_and_spaces.py": b"import torch\nif True:\n\tloss.backward()\n        optimizer.step()\n",
}


def package_folder(name: str) -> Optional[Path]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def python_files(root: Path) -> List[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(folder, name), root))
    return found


def sample(root: Path, extra: List[str] = ()) -> List[str]:
    """Deterministic: among files up to MAX_SAMPLED_BYTES, the SAMPLE_SIZE paths with the
    smallest hash and the first TRAINING_LIKE (in hash order) that contain a training-step
    marker; plus `extra`, whatever its size."""
    everything = [rel for rel in python_files(root) if (root / rel).stat().st_size <= MAX_SAMPLED_BYTES]
    by_hash = sorted(everything, key=lambda rel: zlib.crc32(rel.encode()))[:SAMPLE_SIZE]
    training = []
    for rel in sorted(everything, key=lambda rel: zlib.crc32(rel.encode())):
        if len(training) >= TRAINING_LIKE:
            break
        data = (root / rel).read_bytes()
        if any(marker in data for marker in TRAINING_MARKERS):
            training.append(rel)
    return sorted(set(by_hash) | set(training) | set(extra))


def stdlib_bad_inputs(root: Path) -> List[str]:
    """lib2to3's test data (Python 2, BOM, CRLF, odd encodings) and the stdlib's bad-syntax tests."""
    picked = []
    for rel in python_files(root):
        name = os.path.basename(rel)
        if rel.startswith(os.path.join("lib2to3", "tests", "data")):
            picked.append(rel)
        elif rel.startswith("test" + os.sep) and name.startswith(("badsyntax_", "bad_coding", "badcoding")):
            picked.append(rel)
    return picked


def run_ampify(paths: List[Path], *args, report: Path) -> dict:
    command = [sys.executable, "-m", "ampify", *map(str, paths), "-q", "-j", "2", "--report", str(report), *args]
    process = subprocess.run(command, capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, PYTHONIOENCODING="utf-8"))
    assert process.returncode in (0, 1), process.stderr[-3000:]
    assert "Traceback" not in process.stderr, process.stderr[-3000:]
    return {Path(entry["path"]).resolve(): entry for entry in json.loads(report.read_text())["files"]}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_no_crash(entries: Dict[Path, dict]) -> None:
    for path, entry in entries.items():
        assert entry["status"] in ALLOWED, (path, entry)
        internal = [f for f in entry["findings"] if f["severity"] == "error" and f["code"].endswith("00")]
        assert not internal, (path, internal)  # a transform raised (AMP100/AMP200/AMP300)
        if entry["status"] == "failed":
            assert entry["reason"], (path, entry)
            assert "internal error" not in entry["reason"], (path, entry["reason"])
            assert "does not compile" not in entry["reason"], (path, entry["reason"])
            assert entry["reason"].startswith(INPUT_FAULTS), (path, entry["reason"])


def sweep(tmp_path: Path, root: Path, relatives: List[str], hostile: Dict[str, bytes] = None) -> dict:
    originals = [root / rel for rel in relatives]
    before = {p: digest(p) for p in originals}
    copy_root = tmp_path / "copy"
    for rel in relatives:
        target = copy_root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, target)  # copyfile: no read-only bits from the install
    for name, data in (hostile or {}).items():
        (copy_root / "hostile").mkdir(exist_ok=True)
        (copy_root / "hostile" / name).write_bytes(data)
    copies = sorted(p for p in copy_root.rglob("*.py"))
    copy_bytes = {p: p.read_bytes() for p in copies}

    # 1. --check on the installed originals: reported, never written.
    checked = run_ampify(originals, "--check", report=tmp_path / "check.json")
    assert len(checked) == len(originals)
    assert_no_crash(checked)
    assert {p: digest(p) for p in originals} == before, "--check modified an installed file"

    # 2. write mode on the copy: the same verdicts, and only compiling output is written.
    written = run_ampify(copies, report=tmp_path / "write.json")
    assert len(written) == len(copies)
    assert_no_crash(written)
    for rel in relatives:
        status_checked = checked[(root / rel).resolve()]["status"]
        status_written = written[(copy_root / rel).resolve()]["status"]
        assert status_checked == status_written, (rel, status_checked, status_written)
    for path, entry in written.items():
        data = path.read_bytes()
        if entry["status"].startswith("changed"):  # "changed, incomplete" files are written too
            assert entry["written"], entry
            compile(data, str(path), "exec", dont_inherit=True)
        else:
            assert data == copy_bytes[path], f"{path} is {entry['status']} but its bytes changed"

    # 3. a second run over what was rewritten changes nothing (the other files are the same
    #    bytes as in step 2, and conversion is deterministic).
    rewritten = [p for p, e in written.items() if e["status"] == "changed"]
    if rewritten:
        again = run_ampify(rewritten, "--check", report=tmp_path / "again.json")
        assert len(again) == len(rewritten)
        assert [p for p, e in again.items() if e["status"] != "already mixed precision"] == []

    counts: Dict[str, int] = {}
    for entry in written.values():
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    print(f"\nsweep of {root}: {len(copies)} files: {counts}")
    return written


def test_sweep_stdlib_with_bad_inputs(tmp_path):
    root = Path(sysconfig.get_paths()["stdlib"])
    bad = stdlib_bad_inputs(root)
    written = sweep(tmp_path, root, sample(root, bad), HOSTILE_INPUTS)
    hostile = {p.name: e for p, e in written.items() if p.parent.name == "hostile"}
    assert len(hostile) == len(HOSTILE_INPUTS)
    if (root / "lib2to3" / "tests" / "data" / "py2_test_grammar.py").exists():
        assert len([p for p in written if "lib2to3" in p.parts]) >= 6
    bom = tmp_path / "copy" / "hostile" / "bom_crlf_training.py"
    if hostile["bom_crlf_training.py"]["status"].startswith("changed"):
        data = bom.read_bytes()
        assert data.startswith(b"\xef\xbb\xbf") and data.count(b"\n") == data.count(b"\r\n")
    latin1 = tmp_path / "copy" / "hostile" / "latin1_training.py"
    assert b"caf\xe9" in latin1.read_bytes(), "the latin-1 byte must survive, whatever the verdict"


@pytest.mark.parametrize("package", ["torch", "tensorflow"])
def test_sweep_installed_package(tmp_path, package):
    root = package_folder(package)
    if root is None:
        pytest.fail(f"{package} is not installed for {sys.executable}: the sweep needs it (pip install -e .[test])")
    written = sweep(tmp_path, root, sample(root))
    assert len(written) >= SAMPLE_SIZE
