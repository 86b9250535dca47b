"""Old training scripts (Python 2, PyTorch 0.3 on Python <= 3.6) fail with the reason and the fix,
never with a bare "invalid syntax", and are never converted, also when LibCST reads them."""

from __future__ import annotations

import subprocess
import sys
import os
from pathlib import Path

import pytest

from ampify.convert import ConversionError, convert_source
from ampify.legacy_syntax import legacy_syntax_hint

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
    ("    targets = targets.cuda(async=True)\n", "PyTorch 0.3's spelling of `non_blocking=True`"),
    ("    inputs = inputs.to(device, async = True)\n", "PyTorch 0.3's spelling of `non_blocking=True`"),
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
    old.write_text(TRAINING.format(line="    inputs, targets = inputs.cuda(), targets.cuda(async=True)\n"))
    before = old.read_bytes()
    run = subprocess.run([sys.executable, "-m", "ampify", str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONIOENCODING="utf-8"))
    assert run.returncode == 1
    assert f"{old}: failed: not valid Python 3." in run.stderr + run.stdout
    assert "non_blocking=True" in run.stderr + run.stdout
    assert old.read_bytes() == before
