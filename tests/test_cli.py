"""The `ampify` command end to end, in a subprocess, on real folder trees."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ampify.convert import convert_source

TF1_SCRIPT = textwrap.dedent(
    '''\
    """Train a tiny regression model."""
    import numpy as np
    import tensorflow.compat.v1 as tf

    tf.disable_v2_behavior()
    x = tf.placeholder(tf.float32, [None, 4])
    y = tf.placeholder(tf.float32, [None, 1])
    w = tf.get_variable("w", [4, 1])
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    train_op = tf.train.AdamOptimizer(0.01).minimize(loss)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(train_op, {x: np.ones((2, 4)), y: np.ones((2, 1))})
    '''
)

TORCH_SCRIPT = textwrap.dedent(
    '''\
    import torch
    import torch.nn as nn

    device = torch.device("cuda")
    model = nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = ((model(x.to(device)) - y.to(device)) ** 2).mean()
        loss.backward()
        optimizer.step()
    '''
)

NOT_TRAINING = "import os\n\nprint(os.getcwd())\n"


def run_ampify(*args, cwd=None):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "ampify", *map(str, args)],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=300,
    )


def expected_conversion(source: bytes) -> bytes:
    conversion = convert_source(source)
    assert conversion.converted is not None, conversion
    return conversion.converted


def make_tree(root: Path, files: dict) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def test_rewrites_a_tree_in_place_and_says_what_it_did(tmp_path):
    make_tree(tmp_path, {"train.py": TF1_SCRIPT, "pkg/util.py": NOT_TRAINING, "pkg/model/train2.py": TF1_SCRIPT})
    result = run_ampify(tmp_path)
    assert result.returncode == 0, result.stderr
    expected = expected_conversion(TF1_SCRIPT.encode())
    assert (tmp_path / "train.py").read_bytes() == expected
    assert (tmp_path / "pkg/model/train2.py").read_bytes() == expected
    assert (tmp_path / "pkg/util.py").read_text() == NOT_TRAINING
    assert b"enable_mixed_precision_graph_rewrite" in expected
    train = os.path.join(str(tmp_path), "train.py")
    assert f"{train}:10:" in result.stdout and "AMP101" in result.stdout
    assert "scanned 3 files: 2 changed, 0 already mixed precision, 1 not applicable" in result.stdout

    again = run_ampify(tmp_path)
    assert again.returncode == 0
    assert "0 changed, 2 already mixed precision" in again.stdout
    assert (tmp_path / "train.py").read_bytes() == expected


def test_diff_writes_nothing_and_the_diff_applies(tmp_path):
    make_tree(tmp_path, {"train.py": TF1_SCRIPT})
    result = run_ampify("--diff", "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "train.py").read_text() == TF1_SCRIPT
    assert result.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "AMP101" in result.stderr and "AMP101" not in result.stdout
    patch = subprocess.run(["patch", "-p1"], input=result.stdout, text=True, cwd=tmp_path, capture_output=True)
    assert patch.returncode == 0, patch.stdout + patch.stderr
    assert (tmp_path / "train.py").read_bytes() == expected_conversion(TF1_SCRIPT.encode())


def test_check_exits_1_when_a_file_would_change_and_writes_nothing(tmp_path):
    make_tree(tmp_path, {"train.py": TF1_SCRIPT, "other.py": NOT_TRAINING})
    result = run_ampify("--check", tmp_path)
    assert result.returncode == 1
    assert "1 would be changed" in result.stdout
    assert (tmp_path / "train.py").read_text() == TF1_SCRIPT
    assert run_ampify(tmp_path).returncode == 0
    assert run_ampify("--check", tmp_path).returncode == 0


def test_usage_errors_exit_2(tmp_path):
    assert run_ampify(tmp_path / "missing.py").returncode == 2
    (tmp_path / "a.py").write_text(TF1_SCRIPT)
    bad_backend = run_ampify("--backend", "mxnet", tmp_path)
    assert bad_backend.returncode == 2 and "'mxnet' is not one of 'native', 'apex'" in bad_backend.stderr
    bad_level = run_ampify("--opt-level", "O3", tmp_path)
    assert bad_level.returncode == 2 and "'O3' is not one of 'O1', 'O2'" in bad_level.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.ampify]\nopt-level = "O0"\n')
    bad_config = run_ampify(tmp_path)
    assert bad_config.returncode == 2 and "opt-level must be one of O1, O2" in bad_config.stderr
    assert (tmp_path / "a.py").read_text() == TF1_SCRIPT


def test_gitignore_excludes_junk_folders_and_symlinks(tmp_path):
    outside = tmp_path / "outside"
    repo = tmp_path / "repo"
    make_tree(outside, {"elsewhere.py": TF1_SCRIPT})
    make_tree(
        repo,
        {
            ".gitignore": "generated/\n*_ignored.py\n",
            "train.py": TF1_SCRIPT,
            "generated/train.py": TF1_SCRIPT,
            "also_ignored.py": TF1_SCRIPT,
            "legacy/old_train.py": TF1_SCRIPT,
            "venv/lib/train.py": TF1_SCRIPT,
            ".venv/train.py": TF1_SCRIPT,
            "build/train.py": TF1_SCRIPT,
            "__pycache__/train.py": TF1_SCRIPT,
        },
    )
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "link_out.py").symlink_to(outside / "elsewhere.py")
    (repo / "loop.py").symlink_to(repo / "loop.py")
    (repo / "dir_link").symlink_to(outside, target_is_directory=True)
    before = snapshot(repo)

    result = run_ampify("--exclude", "legacy/", "--report", tmp_path / "r.json", repo)
    assert result.returncode == 0, result.stdout + result.stderr
    after = snapshot(repo)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {"train.py"}
    assert (outside / "elsewhere.py").read_text() == TF1_SCRIPT
    report = json.loads((tmp_path / "r.json").read_text())
    by_path = {os.path.relpath(f["path"], repo): f for f in report["files"]}
    assert by_path["link_out.py"]["status"] == "skipped"
    assert "outside the tree" in by_path["link_out.py"]["reason"]
    assert by_path["loop.py"]["status"] == "skipped"
    assert set(by_path) == {"train.py", "link_out.py", "loop.py"}

    assert "2 Python files left out by .gitignore" in result.stdout

    # A folder that git ignores as a whole, named explicitly, is converted (an explicit request).
    ignored_whole = run_ampify("--check", repo / "generated")
    assert "1 would be changed" in ignored_whole.stdout, ignored_whole.stdout

    # --no-gitignore brings the ignored files back, but never the junk folders.
    result = run_ampify("--no-gitignore", "--check", repo)
    assert "3 would be changed" in result.stdout



def test_a_symlink_loop_in_the_repository_costs_no_torch_file_its_conversion(tmp_path):
    """The repository model reads every module of the project around a torch file; a link that
    loops (`loop.py -> loop.py`, where Path.resolve() raises) is skipped there too: the training
    file beside it converts, with no internal error."""
    repo = tmp_path / "repo"
    make_tree(repo, {"train.py": "import loop\nimport models\n" + TORCH_SCRIPT,
                     "models.py": "import torch.nn as nn\n\nNet = nn.Linear\n"})
    (repo / "loop.py").symlink_to(repo / "loop.py")
    result = run_ampify("--check", repo / "train.py")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 would be changed" in result.stdout, result.stdout
    assert "internal error" not in result.stdout + result.stderr

def test_json_report_lists_every_file_and_finding(tmp_path):
    make_tree(tmp_path, {"train.py": TF1_SCRIPT, "other.py": NOT_TRAINING, "broken.py": "import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\ndef f(:\n"})
    report_path = tmp_path / "report.json"
    result = run_ampify("--report", report_path, tmp_path)
    assert result.returncode == 1  # broken.py failed
    report = json.loads(report_path.read_text())
    files = {Path(f["path"]).name: f for f in report["files"]}
    assert files["train.py"]["status"] == "changed" and files["train.py"]["written"] is True
    assert files["other.py"]["status"] == "not applicable"
    assert files["broken.py"]["status"] == "failed" and "not valid Python 3" in files["broken.py"]["reason"]
    codes = [f["code"] for f in files["train.py"]["findings"]]
    assert "AMP101" in codes
    assert all(f["line"] > 0 for f in files["train.py"]["findings"])
    assert report["summary"]["scanned"] == 3 and report["summary"]["changed"] == 1
    assert report["summary"]["failed"] == 1


def test_bad_inputs_fail_alone_with_one_line_each_and_stay_byte_for_byte(tmp_path):
    latin1_crlf = TF1_SCRIPT.replace('"""Train a tiny regression model."""', '# -*- coding: latin-1 -*-\n# caf\xe9 model')
    latin1_crlf = latin1_crlf.replace("\n", "\r\n").encode("latin-1")
    bad = {
        "py2.py": "import tensorflow as tf\nprint 'training'\nopt = tf.train.AdamOptimizer(0.1)\n",
        "syntax.py": "import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1\n",
        "binary.py": b"\x00\x01tensorflow\xff\xfe\x00Optimizer\x89PNG",
        "unreadable.py": TF1_SCRIPT,
        "bad_encoding.py": b"# -*- coding: no-such-codec -*-\nimport tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n",
    }
    make_tree(tmp_path, {**bad, "good.py": TF1_SCRIPT, "latin1_crlf.py": latin1_crlf})
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    os.chmod(tmp_path / "unreadable.py", 0)
    (tmp_path / "exec_train.py").write_text("#!/usr/bin/env python\n" + TF1_SCRIPT)
    os.chmod(tmp_path / "exec_train.py", 0o755)
    before = {name: (tmp_path / name).read_bytes() for name in bad}

    # ampify honours permission bits also when run as root (as CI does here).
    result = run_ampify(tmp_path)
    assert result.returncode == 1
    os.chmod(tmp_path / "unreadable.py", 0o644)
    for name, content in before.items():
        assert (tmp_path / name).read_bytes() == content, name
    lines = (result.stdout + result.stderr).splitlines()
    for name, reason in [
        ("py2.py", "not valid Python 3"),
        ("syntax.py", "not valid Python 3"),
        ("binary.py", ""),
        ("unreadable.py", "no permission"),
        ("bad_encoding.py", "cannot decode"),
        ("loop.py", "symlink loop"),
    ]:
        hits = [line for line in lines if line.startswith(os.path.join(str(tmp_path), name) + ": ")]
        assert len(hits) == 1, (name, lines)
        assert reason in hits[0], hits[0]
    assert (tmp_path / "good.py").read_bytes() == expected_conversion(TF1_SCRIPT.encode())
    converted = (tmp_path / "latin1_crlf.py").read_bytes()
    assert converted == expected_conversion(latin1_crlf)
    assert b"caf\xe9" in converted and converted.count(b"\r\n") == converted.count(b"\n")
    compile(converted, "latin1_crlf.py", "exec")
    mode = stat.S_IMODE((tmp_path / "exec_train.py").stat().st_mode)
    assert mode & stat.S_IXUSR
    assert b"enable_mixed_precision_graph_rewrite" in (tmp_path / "exec_train.py").read_bytes()


def test_read_only_file_is_reported_not_clobbered(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TF1_SCRIPT)
    os.chmod(path, 0o444)
    result = run_ampify(path)
    assert result.returncode == 1
    assert path.read_text() == TF1_SCRIPT
    assert f"{path}: failed: file is read-only" in result.stderr


def test_pyproject_defaults_and_bad_config(tmp_path):
    make_tree(
        tmp_path,
        {
            "pyproject.toml": '[tool.ampify]\nexclude = ["experiments/"]\njobs = 1\n',
            "train.py": TF1_SCRIPT,
            "experiments/train.py": TF1_SCRIPT,
        },
    )
    result = run_ampify("--check", tmp_path)
    assert "1 would be changed" in result.stdout, result.stdout
    (tmp_path / "pyproject.toml").write_text("[tool.ampify]\nexlcude = []\n")
    bad = run_ampify("--check", tmp_path)
    assert bad.returncode == 2
    assert "unknown key 'exlcude'" in bad.stderr and "pyproject.toml" in bad.stderr


def test_workers_give_the_same_results_as_one_process(tmp_path):
    files = {f"pkg{i % 3}/train_{i}.py": TF1_SCRIPT for i in range(12)}
    files.update({f"pkg{i % 3}/util_{i}.py": NOT_TRAINING for i in range(12)})
    for copy in ("one", "many"):
        make_tree(tmp_path / copy, files)
    one = run_ampify("-j", "1", "--report", tmp_path / "one.json", tmp_path / "one")
    many = run_ampify("-j", "2", "--report", tmp_path / "many.json", tmp_path / "many")
    assert one.returncode == many.returncode == 0
    assert snapshot(tmp_path / "one") == snapshot(tmp_path / "many")

    def statuses(report):
        data = json.loads(report.read_text())
        return sorted((Path(f["path"]).name, f["status"], len(f["findings"])) for f in data["files"])

    assert statuses(tmp_path / "one.json") == statuses(tmp_path / "many.json")


def test_check_over_the_whole_installed_stdlib_changes_nothing_and_fails_only_on_non_python3(tmp_path):
    import ast
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    result = run_ampify("--check", "--report", tmp_path / "stdlib.json", stdlib)
    report = json.loads((tmp_path / "stdlib.json").read_text())
    assert report["summary"]["scanned"] > 500, "the stdlib was not walked"
    assert report["summary"]["changed"] == 0
    for entry in report["files"]:
        if entry["status"] == "failed":
            # only files that really are not Python 3 may fail, and they must say so
            assert "not valid Python 3" in entry["reason"] or "cannot decode" in entry["reason"], entry
            with pytest.raises((SyntaxError, ValueError, UnicodeDecodeError)):
                ast.parse(Path(entry["path"]).read_bytes())
    assert result.returncode == (1 if report["summary"]["failed"] else 0)


def test_temporary_files_of_a_killed_run_are_listed_then_removed(tmp_path):
    make_tree(tmp_path, {"train.py": TF1_SCRIPT, "pkg/model.py": NOT_TRAINING, "notes.txt": "my notes"})
    abandoned = tmp_path / "pkg" / ".model.py.k2j4x9_q.ampify-tmp"
    live = tmp_path / ".train.py.q8w1zz0a.ampify-tmp"  # a run in progress right now: never touched
    not_ours = [
        tmp_path / "notes.ampify-tmp",  # no leading dot: not a name ampify makes
        tmp_path / ".notes.txt.x.ampify-tmp",  # not tempfile's 8 random characters
        tmp_path / ".gone.py.abcd1234.ampify-tmp",  # the file it would replace is not there
    ]
    for path in (abandoned, live, *not_ours):
        path.write_text("import os\nprint(os.getcwd())\n")  # what ampify writes: a source that compiles
    old = time.time() - 600
    for path in (abandoned, *not_ours):
        os.utime(path, (old, old))

    check = run_ampify("--check", tmp_path)
    assert f"1 temporary file left by a killed ampify run (safe to delete; a rewrite run removes them): {abandoned}" in check.stdout
    assert abandoned.exists() and live.exists() and all(p.exists() for p in not_ours)

    rewrite = run_ampify(tmp_path)
    assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
    assert "removed 1 temporary file left by a killed ampify run" in rewrite.stdout
    assert not abandoned.exists()
    assert live.exists() and all(p.exists() for p in not_ours)
    assert "temporary file" not in run_ampify("--check", tmp_path).stdout


def test_a_temporary_file_that_is_not_a_complete_python_source_is_never_deleted(tmp_path):
    make_tree(tmp_path, {"notes.txt": "my notes"})
    user_file = tmp_path / ".notes.txt.abcd1234.ampify-tmp"  # ampify's name form, but not its content
    user_file.write_text("remember: buy milk, (unbalanced")
    old = time.time() - 600
    os.utime(user_file, (old, old))
    rewrite = run_ampify(tmp_path)
    assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
    assert user_file.read_text() == "remember: buy milk, (unbalanced"
    assert "removed" not in rewrite.stdout


def test_opt_level_reaches_amp_initialize_from_the_cli_and_the_config(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nmodel = torch.nn.Linear(4, 2).cuda()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in data:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
    )
    assert 'opt_level="O2"' in run_ampify("--diff", "--backend", "apex", "--opt-level", "O2", script).stdout
    (tmp_path / "pyproject.toml").write_text('[tool.ampify]\nbackend = "apex"\nopt-level = "O2"\n')
    assert 'opt_level="O2"' in run_ampify("--diff", script).stdout


def test_help_lists_the_other_commands_the_exit_codes_and_the_choices():
    text = run_ampify("--help").stdout
    assert "ampify verify SCRIPT" in text and "ampify rules" in text and "Exit codes:" in text
    assert "<native|apex>" in text and "<float16|bfloat16>" in text and "<O1|O2>" in text


def test_quiet_shows_problems_by_severity_not_by_text(tmp_path):
    """A change whose message happens to contain " warning: " is still information."""
    script = tmp_path / "train.py"
    script.write_text(TF1_SCRIPT)
    quiet = run_ampify("-q", "--check", script)
    assert "AMP101" not in quiet.stdout and "would be changed" in quiet.stdout
    session_first = tmp_path / "session_first.py"
    session_first.write_text(
        (Path(__file__).resolve().parent.parent / "fixtures" / "tf1" / "session_getter_before_optimizer.in.py").read_text()
    )
    quiet = run_ampify("-q", "--check", session_first)
    assert "AMP113 warning" in quiet.stdout and "changed, incomplete" in quiet.stdout and "AMP101 " not in quiet.stdout


def test_shell_completion_as_typer_gives_it(tmp_path):
    """`ampify --show-completion bash` prints the script; the shell then asks ampify itself."""
    shown = subprocess.run([sys.executable, "-m", "ampify", "--show-completion", "bash"], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1"))
    assert "_AMPIFY_COMPLETE=complete_bash" in shown.stdout, shown.stderr

    def complete(words: str, index: int) -> list:
        env = dict(os.environ, COMP_WORDS=words, COMP_CWORD=str(index), _AMPIFY_COMPLETE="complete_bash")
        done = subprocess.run([sys.executable, "-c", "from ampify.cli import main; main()"], capture_output=True,
                              text=True, timeout=60, env=env)
        return done.stdout.split()

    assert complete("ampify --back", 1) == ["--backend"]
    assert complete("ampify --backend ", 2) == ["native", "apex"]
    assert complete("ampify --output-format ", 2) == ["text", "json", "github", "markdown", "sarif"]


def test_check_and_diff_say_what_ampify_would_do(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n")
    for flag in ("--check", "--diff"):
        run = subprocess.run([sys.executable, "-m", "ampify", flag, str(script)], capture_output=True, text=True,
                             timeout=120)
        assert ": AMP101 would wrap tf.train.AdamOptimizer with the mixed precision graph rewrite" in run.stdout + run.stderr
        assert "AMP102 would set TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE=1" in run.stdout + run.stderr
    written = subprocess.run([sys.executable, "-m", "ampify", str(script)], capture_output=True, text=True, timeout=120)
    assert ": AMP101 wrapped tf.train.AdamOptimizer" in written.stdout
