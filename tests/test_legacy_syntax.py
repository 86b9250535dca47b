"""Old training scripts (Python 2, PyTorch 0.3 on Python <= 3.6) fail with the reason and the fix,
never with a bare "invalid syntax", and are never converted, also when LibCST reads them; the one
exception is PyTorch 0.3's `.cuda(async=True)`, renamed `non_blocking=True` in a file ampify converts."""

from __future__ import annotations

import subprocess
import sys
import os
from pathlib import Path

import pytest

from ampify.convert import ConversionError, convert_source
from ampify.legacy_syntax import legacy_syntax_hint, rename_async_arguments

TRAINING = (
    "import torch\n"
    "model = torch.nn.Linear(4, 2)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for inputs, targets in loader:\n"
    "{line}"
    "    loss = torch.nn.functional.mse_loss(model(inputs), targets)\n"
    "    optimizer.zero_grad()\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
)


@pytest.mark.parametrize("line,expected", [
    ("    targets = ReplayWrapper(replay, async=True)\n", "PyTorch 0.3's spelling of `non_blocking=True`"),
    ("    targets = targets.cuda(async=True)\n    print 'loss', loss\n", "Python 2 code (a print statement)"),
    ("    mode = loader.async\n", "`async` is a keyword since Python 3.7 and cannot name"),
    ("    print 'loss', loss\n", "Python 2 code (a print statement)"),
    ("    exec 'x = 1'\n", "Python 2 code (an exec statement)"),
    ("    raise ValueError, 'bad batch'\n", "Python 2 code (`raise E, message`)"),
    ("    if inputs.size(0) <> 4: continue\n", "Python 2 code (the `<>` operator)"),
    ("    mask = 0777\n", "Python 2 code (an octal literal written 0777)"),
    ("    steps = 10L\n", "Python 2 code (a long literal (123L))"),
    ("    name = `inputs`\n", "Python 2 code (backquotes for repr())"),
])
def test_the_reason_names_the_old_syntax_and_the_fix(line, expected):
    source = TRAINING.format(line=line)
    with pytest.raises(ConversionError) as raised:
        convert_source(source)
    message = str(raised.value)
    assert message.startswith("not valid Python 3.") and expected in message, message


def test_python2_code_libcst_reads_is_not_converted():
    """`except IOError, e:` parses in LibCST; the file must still fail, not be converted or refused
    for another reason."""
    source = TRAINING.format(line="    try:\n        pass\n    except IOError, e:\n        pass\n")
    with pytest.raises(ConversionError) as raised:
        convert_source(source)
    assert "Python 2 code (`except E, name:`)" in str(raised.value)


@pytest.mark.parametrize("line", [
    "    mode = args.async_mode\n",
    "    print('epoch', 1)\n",
    "    print ('epoch', 1)\n",
    "    label = 'print \"x\"'  # print 'y'\n",
    "    x = 0.0777 + 1e05 + 0\n",
    "    x = inputs.cuda(non_blocking=True)\n",
])
def test_valid_python3_lines_get_no_hint(line):
    assert legacy_syntax_hint(line) is None
    compile(TRAINING.format(line=line), "train.py", "exec")


def test_an_ordinary_syntax_error_gets_no_hint():
    with pytest.raises(ConversionError) as raised:
        convert_source(TRAINING.format(line="    x = torch.zeros(2\n"))
    assert "Python 2" not in str(raised.value) and "async" not in str(raised.value)


def test_cli_reports_the_old_file_as_failed_and_leaves_it(tmp_path: Path):
    old = tmp_path / "cifar.py"
    old.write_text(TRAINING.format(line="    inputs, targets = inputs.cuda(), targets.cuda(async=True)\n"
                                        "    print 'batch'\n"))
    before = old.read_bytes()
    run = subprocess.run([sys.executable, "-m", "ampify", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONIOENCODING="utf-8"))
    assert run.returncode == 1
    assert f"{old}: failed: not valid Python 3." in run.stderr + run.stdout
    assert "Python 2 code (a print statement)" in run.stderr + run.stdout
    assert old.read_bytes() == before


@pytest.mark.parametrize("line", ["    targets = targets.cuda(async=True)\n",
                                  "    inputs, targets = inputs.to(device, async = True), targets.cuda(async=True)\n"])
def test_pytorch03_async_transfers_are_renamed_in_a_file_ampify_converts(line):
    """bearpaw/pytorch-classification's `targets.cuda(async=True)`: the only reason the file is not
    Python 3.7+. Converted, with `non_blocking=` (AMP002 on that line) and the step in AMP."""
    conversion = convert_source(TRAINING.format(line=line).encode(), filename="cifar.py")
    converted = conversion.converted.decode()
    assert "async" not in converted and converted.count("non_blocking") == line.count("async")
    assert "scaler.scale(loss).backward()" in converted
    assert [(f.code, f.line) for f in conversion.findings if f.code == "AMP002"] == [("AMP002", 5)]
    compile(converted, "cifar.py", "exec")


def test_an_async_transfer_in_a_file_ampify_does_not_change_is_not_rewritten():
    """Nothing converted, nothing renamed: a file with no training code is not applicable, as it
    was; one whose step is refused reports that refusal, and the rename it would make with the
    conversion."""
    unrelated = convert_source("import torch\nx = torch.zeros(2).cuda(async=True)\nmodel = torch.nn.Linear(2, 2)\n"
                               "y = model(x)\n")
    assert unrelated.converted is None and unrelated.status.value == "not applicable"
    refused = convert_source("import torch\nx = torch.zeros(2).cuda(async=True)\nmodel = torch.nn.Linear(2, 2)\n"
                             "model(x).sum().backward()\n")
    assert refused.converted is None and refused.status.value == "not converted"
    assert "`async=` arguments (line 2) would be renamed `non_blocking=` with the conversion" in refused.reason


def test_an_evaluation_script_with_async_transfers_is_not_applicable_and_says_so():
    """DARTS' test.py: a PyTorch evaluation loop (no backward, no optimizer) with
    `.cuda(async=True)`: not a failure, nothing written; the reason names the old spelling."""
    source = ("import torch\nimport torch.nn as nn\nmodel = nn.Linear(2, 2).cuda()\ncriterion = nn.MSELoss()\n"
              "for step, (x, y) in enumerate(loader):\n    x = x.cuda()\n    y = y.cuda(async=True)\n"
              "    loss = criterion(model(x), y)\n    print(step, loss.item())\n")
    conversion = convert_source(source, filename="test.py")
    assert conversion.converted is None and conversion.status.value == "not applicable", conversion.reason
    assert "PyTorch 0.3 `async=` arguments (line 7) are not valid Python 3.7 or later" in conversion.reason


def test_the_rename_keeps_encoding_bom_and_newlines():
    source = "\ufeff# d\u00e9j\u00e0\r\nx = y.cuda(async=True)\r\nz = f(async=True)\r\n".encode("utf-8")
    new, lines = rename_async_arguments(source)
    assert new == "\ufeff# d\u00e9j\u00e0\r\nx = y.cuda(non_blocking=True)\r\nz = f(async=True)\r\n".encode("utf-8")
    assert lines == [2]
    assert rename_async_arguments(b"x = y.cuda(non_blocking=True)\n") is None
