"""Honest reporting (issue #12, items 7, 9 and 12): the status, the exit code and the messages
say what really happened.

- A file whose conversion cannot take full effect (a Session created before the rewrite, an
  optimizer left unwrapped, gradients that bypass loss scaling, a training step left in
  float32) is "changed, incomplete" and the run exits 1, in every mode.
- A warning never stands beside a "not applicable" status.
- A file Python cannot compile is reported with Python's own message and line; valid Python
  that LibCST cannot read is never called invalid.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ampify.convert
import ampify.findings
from ampify.convert import ConversionError, convert_source
from ampify.findings import INCOMPLETE_CONVERSION_CODES, FileStatus, Finding, Severity
from ampify.transforms.base import Transform, TransformResult, Verdict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PYTHON = "Python %d.%d" % sys.version_info[:2]


def run_ampify(*args):
    return subprocess.run([sys.executable, "-m", "ampify", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


@pytest.mark.parametrize("case,code", [
    ("tf1/session_getter_before_optimizer", "AMP113"),
    ("tf1/exec_a2c_optimizer_after_gradients", "AMP110"),
    ("tf1/delegating_optimizer_class", "AMP116"),
    ("tf1/optimizer_for_tpu_and_gpu", "AMP128"),
    ("torch_native/convertible_and_manual_loops", "AMP226"),
])
def test_a_conversion_that_cannot_take_full_effect_is_changed_incomplete_and_exits_1(tmp_path, case, code):
    source = FIXTURES / f"{case}.in.py"
    target = tmp_path / "train.py"
    shutil.copy(source, target)

    check = run_ampify("--check", target)
    assert check.returncode == 1
    rewrite = run_ampify(target, "--report", tmp_path / "report.json")
    assert rewrite.returncode == 1, "CI must not pass a conversion that does not take effect"
    assert target.read_bytes() != source.read_bytes(), "the partial conversion is still written"
    assert f"train.py: changed, incomplete: part of the training stays float32 or unscaled (" in rewrite.stdout
    assert code in rewrite.stdout.split("changed, incomplete")[1].splitlines()[0]
    assert "1 changed (1 incomplete)" in rewrite.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["files"][0]["status"] == "changed, incomplete"
    assert report["summary"]["changed, incomplete"] == 1 and report["summary"]["changed"] == 0


def test_a_complete_conversion_stays_plain_changed_and_exits_0(tmp_path):
    target = tmp_path / "train.py"
    shutil.copy(FIXTURES / "tf1" / "exec_train_adam.in.py", target)
    rewrite = run_ampify(target)
    assert rewrite.returncode == 0, rewrite.stdout
    assert "incomplete" not in rewrite.stdout


def test_only_warnings_make_a_change_incomplete():
    info = Finding("AMP113", "an info finding with a listed code", 1, 0, Severity.INFO)
    assert ampify.findings.incomplete_codes([info]) == []
    warning = Finding("AMP113", "a Session before the rewrite", 1, 0, Severity.WARNING)
    assert ampify.findings.incomplete_codes([info, warning, warning]) == ["AMP113"]
    assert "AMP111" not in INCOMPLETE_CONVERSION_CODES, "one loss scale per optimizer still trains in AMP"


class WarnsButNothingToDo(Transform):
    name = "warns-but-nothing-to-do"

    def may_apply(self, source, options):
        return b"warn-me" in source

    def concerns(self, imports, options):
        return True

    def apply(self, module, imports, options, context=None):
        warning = Finding("AMP210", "the training steps of this file were left unconverted", 3, 0, Severity.WARNING)
        return TransformResult(module, Verdict.NOTHING_TO_DO, [warning], "nothing here")


def test_a_warning_and_a_not_applicable_status_never_go_together(monkeypatch):
    monkeypatch.setattr(ampify.convert, "transforms_for", lambda options: [WarnsButNothingToDo()])
    conversion = convert_source("# warn-me\nx = 1\n")
    assert conversion.status is FileStatus.UNCONVERTED
    assert "AMP210" in conversion.reason


# --- item 12: parse errors --------------------------------------------------------------------

TRAINING_TAIL = "loss.backward()\noptimizer.step()\n"


def conversion_error(source: str) -> str:
    with pytest.raises(ConversionError) as raised:
        convert_source("import torch\n" + source + TRAINING_TAIL)
    return str(raised.value)


def test_syntax_errors_carry_pythons_own_message_and_line():
    assert conversion_error("x = 1\n\ndef f()\n    pass\n") == f"not valid {PYTHON} (line 4: expected ':')"
    message = conversion_error("print 'epoch'\n")
    assert message.startswith(f"not valid {PYTHON} (line 2: Missing parentheses in call to 'print'")


def test_valid_python_that_libcst_cannot_read_is_not_called_invalid():
    message = conversion_error("(x): int = 1\n")
    assert "not valid" not in message
    assert message.startswith("valid Python, but LibCST (the parser ampify rewrites with")
    assert "cannot read it at line " in message and message.endswith("; file left untouched")


def test_nesting_cpython_refuses_is_reported_without_reaching_libcst(monkeypatch):
    def libcst_must_not_run(*args, **kwargs):
        raise AssertionError("LibCST's parser may crash on this input")

    monkeypatch.setattr(ampify.convert.cst, "parse_module", libcst_must_not_run)
    message = conversion_error("x = " + "(" * 500 + "1" + ")" * 500 + "\n")
    assert message == f"not valid {PYTHON} (line 2: too many nested parentheses)"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="needs syntax newer than the running Python")
def test_newer_syntax_than_this_python_falls_back_to_libcst():
    conversion = convert_source("import torch\ntype Batch = list[int]\n" + TRAINING_TAIL)
    assert conversion.status is not FileStatus.FAILED and conversion.converted is None


# --- item 8: refusal reasons name the real obstacle ---------------------------------------------

BASE_CLASS_OPTIMIZER = '''\
import torch


class BaseTrainer:
    def __init__(self, model):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


class Trainer(BaseTrainer):
    def train(self, loader):
        for x, y in loader:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
'''


@pytest.mark.parametrize("backend", ["native", "apex"])
def test_an_optimizer_of_a_base_class_is_named_where_it_is_created(backend):
    from ampify.options import Options

    conversion = convert_source(BASE_CLASS_OPTIMIZER, Options(backend=backend))
    messages = [f.message for f in conversion.findings if f.severity is Severity.WARNING]
    assert any(
        "self.optimizer is created in class BaseTrainer (line 7), not in the class of Trainer.train()" in m
        for m in messages
    ), messages
    assert not any("cannot find where" in m for m in messages)


MODULE_TRAIN_FUNCTION = '''\
import torch
import torch.nn as nn


def train(model, loader, criterion):
    for x, y in loader:
        criterion(model(x), y).backward()


model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
criterion = nn.MSELoss()
for epoch in range(2):
    model.train()
    optimizer.zero_grad()
    loss = criterion(model(torch.randn(3, 4)), torch.randn(3, 2))
    loss.backward()
    optimizer.step()
'''


def test_model_train_is_not_taken_for_a_function_of_the_file_named_train():
    """`model.train()` switches nn.Module to training mode; it never runs this file's train()."""
    conversion = convert_source(MODULE_TRAIN_FUNCTION)
    assert conversion.converted is not None and "scaler.step(optimizer)" in conversion.converted
    assert not any("calls train()" in f.message for f in conversion.findings)
    # the train() function's own backward, with no step anywhere, is still reported
    assert any(f.code == "AMP220" and f.line == 7 for f in conversion.findings)


def test_a_refusal_a_reshape_answers_also_says_what_still_refuses_the_step():
    """The loss inside the backward() call is bound by ampify itself; when the step is refused all
    the same (its optimizer built in the caller only when none is handed in), the warning says so."""
    source = (FIXTURES / "torch_native" / "loss_in_the_backward_call_of_a_step_refused_otherwise.in.py").read_bytes()
    conversion = convert_source(source, filename="finetune.py")
    assert conversion.status is FileStatus.UNCONVERTED
    [warning] = [f for f in conversion.findings if f.code == "AMP215"]
    assert "the loss is computed inside the backward() call itself" in warning.message
    assert "ampify binds it itself, but the step would still be refused: the caller at line 20" in warning.message
