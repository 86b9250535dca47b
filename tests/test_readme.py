"""The README's promises: its two commands are the ones CI and users run, and they work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_opens_with_the_install_and_the_test_command():
    commands = readme_commands()
    assert len(commands) >= 2
    install, test = commands[0], commands[1]
    assert "pip install ." in install and "ampify --diff examples/" in install
    assert "'.[test]'" in test and "--no-deps tf-keras==2.21.0" in test and "pytest" in test
    assert ".venv-mxnet/bin/pip install -q mxnet==1.9.1 numpy==1.23.5" in test  # the Gluon tests' own environment


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines


def test_the_example_command_prints_a_diff_for_every_example_and_writes_nothing(tmp_path):
    examples = sorted([*(ROOT / "examples").glob("*.py"), *(ROOT / "examples").glob("*.ipynb")])
    assert {p.suffix for p in examples} == {".py", ".ipynb"}
    before = {p: p.read_bytes() for p in examples}
    result = subprocess.run(
        [sys.executable, "-m", "ampify", "--diff", "examples/"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for path in examples:
        assert f"+++ b/examples/{path.name}" in result.stdout, path.name  # a notebook's diff is per cell
        assert path.read_bytes() == before[path]


def test_every_rule_code_ampify_can_emit_is_documented():
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| (AMP\d{3}) \|", readme, flags=re.M))
    emitted = set()
    for source in list((ROOT / "transforms").rglob("*.py")) + list((ROOT / "ampify").glob("*.py")):
        emitted |= set(re.findall(r"\"(AMP\d{3})\"", source.read_text()))
    for findings in (ROOT / "fixtures").glob("*/*.findings.txt"):
        emitted |= set(re.findall(r" (AMP\d{3})$", findings.read_text(), flags=re.M))
    assert emitted, "no rule codes found at all"
    assert emitted - documented == set()


def test_the_readme_verify_example_runs_as_written(tmp_path):
    """The README shows `ampify verify tf1_classifier.py` after `ampify tf1_classifier.py`: run
    both exactly so, in a folder holding the bundled example, and get the lines it shows."""
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"\$ (ampify verify (\S+))\s+# after `(ampify \S+)`\n((?:.+\n)+?)```", readme)
    assert example, "the README's verify example is gone"
    verify_command, script, rewrite_command, shown = example.groups()
    (tmp_path / script).write_bytes((ROOT / "examples" / script).read_bytes())

    def run(command):
        program, *args = command.split()
        assert program == "ampify"
        return subprocess.run([sys.executable, "-m", "ampify", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)

    assert run(rewrite_command).returncode == 0
    verified = run(verify_command)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    number = re.compile(r"\d+(\.\d+)?")
    shown_lines = [number.sub("N", line) for line in shown.strip().splitlines()]
    assert [number.sub("N", line) for line in verified.stdout.strip().splitlines()] == shown_lines


def test_the_bundled_keras_and_gluon_examples_train_once_converted(tmp_path):
    """The examples the README's first command shows diffs for are real scripts: converted, they
    train (Keras in mixed_float16 here; Gluon in bfloat16 in the MXNet environment, where it exists)."""
    import pytest

    from ampify.convert import convert_source
    from ampify.options import Options

    pytest.importorskip("keras")
    keras_example = tmp_path / "keras_classifier.py"
    keras_example.write_bytes(convert_source((ROOT / "examples" / "keras_classifier.py").read_bytes()).converted)
    run = subprocess.run([sys.executable, str(keras_example)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    from mxnet_environment import MXNET_PYTHON, mxnet_bfloat16_python

    mxnet_bfloat16_python()  # skips where MXNet is missing or cannot compute in bfloat16 on this CPU
    gluon_example = tmp_path / "gluon_classifier.py"
    converted = convert_source((ROOT / "examples" / "gluon_classifier.py").read_bytes(), Options(dtype="bfloat16"))
    gluon_example.write_bytes(converted.converted)
    run = subprocess.run([str(MXNET_PYTHON), str(gluon_example)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("loss") == 5
