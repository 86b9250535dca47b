"""The rule catalogue (ampify/rules.py) is complete and is what the README, `ampify rules`,
`ampify rule CODE` and --select/--ignore use (issue #13)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ampify.findings import INCOMPLETE_CONVERSION_CODES
from ampify.rules import BY_CODE, RULES, Selection, UnknownRule, readme_table

ROOT = Path(__file__).resolve().parent.parent
#: codes no golden can show, each with the test that makes it appear
SHOWN_BY_OTHER_TESTS = {
    "AMP001": "tests/test_hostile_input.py",  # a write refused after the conversion (read-only folder)
    # a TF1 file whose optimizer a helper module builds, named without that module
    "AMP123": "tests/test_repository.py",
    # a driver named without the module whose function steps its optimizer (both backends)
    "AMP237": "tests/test_repository.py",
    "AMP327": "tests/test_repository.py",
    # internal errors of each target's transform (one policy, tests/test_rules.py forces each)
    "AMP100": "tests/test_rules.py",
    "AMP200": "tests/test_rules.py",
    "AMP300": "tests/test_rules.py",
    "AMP400": "tests/test_rules.py",
    "AMP500": "tests/test_rules.py",
    "AMP600": "tests/test_rules.py",
}


def emitted_codes():
    in_fixtures = set()
    repositories = ROOT / "fixtures" / "repositories"
    golden_repositories = [*repositories.glob("*/findings.txt"), *repositories.glob("*/variants/*/findings.txt")]
    for findings in [*(ROOT / "fixtures").glob("*/*.findings.txt"), *golden_repositories]:
        in_fixtures |= set(re.findall(r" (AMP\d{3})$", findings.read_text(), flags=re.M))
    in_source = set()
    for source in [*(ROOT / "transforms").rglob("*.py"), *(ROOT / "ampify").rglob("*.py")]:
        if source.name != "rules.py":
            in_source |= set(re.findall(r"\"(AMP\d{3})\"", source.read_text()))
    return in_fixtures, in_source


def test_every_code_emitted_is_catalogued_and_every_catalogued_code_is_emitted_by_a_fixture():
    in_fixtures, in_source = emitted_codes()
    assert (in_fixtures | in_source) - set(BY_CODE) == set(), "codes emitted but not in the catalogue"
    assert set(BY_CODE) - in_fixtures == set(SHOWN_BY_OTHER_TESTS), "catalogued codes no golden shows"
    for code, test in SHOWN_BY_OTHER_TESTS.items():
        assert code in (ROOT / test).read_text(), f"{test} must show {code}"


def test_each_rule_is_documented_whole():
    assert len({r.code for r in RULES}) == len(RULES), "a code appears twice"
    for rule in RULES:
        assert re.fullmatch(r"AMP[0-6]\d\d", rule.code)
        assert rule.summary and rule.why and rule.example and rule.fix in ("safe", "review", "manual")
        assert rule.severity in ("info", "warning", "error", "info or warning")
        if rule.incomplete:
            assert rule.severity == "warning" and rule.fix == "manual"
    assert INCOMPLETE_CONVERSION_CODES == {r.code for r in RULES if r.incomplete}


def test_the_readme_table_is_generated_from_the_catalogue():
    readme = (ROOT / "README.md").read_text()
    assert readme_table() in readme, "regenerate the README table from ampify/rules.py (readme_table())"


def run_ampify(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ampify", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


def test_ampify_rules_lists_every_rule_and_ampify_rule_explains_one(tmp_path):
    listing = run_ampify("rules", cwd=tmp_path)
    assert listing.returncode == 0
    assert [line.split()[0] for line in listing.stdout.splitlines()] == [r.code for r in RULES]
    explained = run_ampify("rule", "amp113", cwd=tmp_path)
    assert explained.returncode == 0
    text = explained.stdout
    assert text.startswith("AMP113 (tf1, warning)") and "Why: " in text and "Example:" in text
    assert "changed, incomplete" in text
    unknown = run_ampify("rule", "AMP999", cwd=tmp_path)
    assert unknown.returncode == 2 and "no rule 'AMP999'" in unknown.stderr


def test_a_folder_named_rules_is_still_a_path(tmp_path):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "x.py").write_text("x = 1\n")
    run = run_ampify("rules", "--check", cwd=tmp_path)
    assert run.returncode == 0 and "scanned 1 file" in run.stdout


def test_selection_prefixes_and_validation():
    selection = Selection.from_lists(["amp2"], ["AMP216"])
    assert selection.allows("AMP201") and not selection.allows("AMP216") and not selection.allows("AMP101")
    for bad in (["AMP9"], ["E501"], [""]):
        try:
            Selection.from_lists(bad, [])
        except UnknownRule as error:
            assert "no rule code or prefix" in str(error)
        else:
            raise AssertionError(f"{bad} accepted")


def test_ignore_hides_findings_and_an_accepted_warning_no_longer_makes_a_change_incomplete(tmp_path):
    target = tmp_path / "train.py"
    shutil.copy(ROOT / "fixtures" / "tf1" / "session_getter_before_optimizer.in.py", target)
    plain = run_ampify("--check", target)
    assert "AMP113" in plain.stdout and "changed, incomplete" in plain.stdout
    ignored = run_ampify("--check", "--ignore", "AMP113", target, "--report", tmp_path / "r.json")
    assert "AMP113" not in ignored.stdout and "incomplete" not in ignored.stdout
    entry = json.loads((tmp_path / "r.json").read_text())["files"][0]
    assert entry["status"] == "changed" and all(f["code"] != "AMP113" for f in entry["findings"])
    assert ignored.returncode == 1  # --check: the file would still change
    selected = run_ampify("--check", "--select", "AMP102,AMP113", target)
    codes = set(re.findall(r" (AMP\d{3}) ", selected.stdout))
    assert codes == {"AMP102", "AMP113"}


def test_select_and_ignore_from_pyproject_and_unknown_codes_are_usage_errors(tmp_path):
    target = tmp_path / "train.py"
    shutil.copy(ROOT / "fixtures" / "tf1" / "session_before_optimizer.in.py", target)
    (tmp_path / "pyproject.toml").write_text('[tool.ampify]\nignore = ["AMP113", "AMP102"]\n')
    run = run_ampify("--check", target)
    assert "AMP113" not in run.stdout and "AMP102" not in run.stdout and "AMP101" in run.stdout
    bad = run_ampify("--check", "--select", "AMP9", target)
    assert bad.returncode == 2 and "'AMP9' is no rule code or prefix of one" in bad.stderr


SOURCES_FOR_TARGET = {
    "tf1-graph-rewrite": ("import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n", "native"),
    "torch-native-amp": ("import torch\nfor x in data:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n", "native"),
    "torch-apex-amp": ("import torch\nfor x in data:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n", "apex"),
    "keras-mixed-precision": ("import keras\nmodel = keras.Sequential([keras.layers.Dense(1)])\nmodel.compile(loss='mse')\n", "native"),
    "torch-amp-migration": ("import torch\nwith torch.cuda.amp.autocast():\n    loss = model(x)\n", "native"),
    "gluon-amp": ("import mxnet as mx\nwith mx.autograd.record():\n    loss = net(x)\nloss.backward()\ntrainer.step(1)\n",
                  "native"),
}


def test_one_internal_error_policy_for_every_target(monkeypatch):
    """Whatever a transform raises: the file is left unchanged, "not converted" (exit 1), with the
    target's x00 error code from the catalogue; the run goes on."""
    from ampify.convert import convert_source
    from ampify.findings import FileStatus
    from ampify.options import Options
    from ampify.registry import ALL_TRANSFORMS

    assert {t.name for t in ALL_TRANSFORMS} == set(SOURCES_FOR_TARGET), "a new target needs a case here"
    for transform in ALL_TRANSFORMS:
        assert transform.internal_error_code in BY_CODE and transform.internal_error_code.endswith("00")
        source, backend = SOURCES_FOR_TARGET[transform.name]

        def broken(self, module, imports, options, context=None):
            raise RuntimeError("boom")

        with monkeypatch.context() as patch:
            patch.setattr(type(transform), "apply", broken)
            conversion = convert_source(source, Options(backend=backend))
        assert conversion.status is FileStatus.UNCONVERTED and conversion.converted is None, transform.name
        assert [(f.code, f.severity.value) for f in conversion.findings] == [(transform.internal_error_code, "error")]
        assert "internal error in the %s transform (RuntimeError: boom)" % transform.name in conversion.findings[0].message
