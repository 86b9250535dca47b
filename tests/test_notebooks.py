"""Jupyter notebooks (#21): code cells converted as one program, IPython lines kept, the notebook
written back in its own JSON layout with only the changed cells touched, cell-level diffs and
`cell N:line:col` findings, checked with the Jupyter project's own nbformat."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ampify.convert import ConversionError
from ampify.findings import FileStatus
from ampify.notebooks import build_program, convert_notebook, read_notebook, split_program
from ampify.options import Options

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "notebooks"
CASES = sorted(FIXTURES.glob("*.in.ipynb"))
UPDATE = os.environ.get("AMPIFY_UPDATE_GOLDEN") == "1"


def _rows(conversion) -> str:
    rows = [f"status: {conversion.status.value}"]
    rows += [f"cell {f.cell}:{f.line}:{f.column} {f.code}" for f in conversion.findings]
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("path", CASES, ids=[p.name for p in CASES])
def test_notebook_golden(path):
    expected = path.with_name(path.name.replace(".in.ipynb", ".out.ipynb"))
    findings = path.with_name(path.name.replace(".in.ipynb", ".findings.txt"))
    data = path.read_bytes()
    result = convert_notebook(data, Options(), path.name)
    output = result.conversion.converted if result.conversion.converted is not None else data
    if UPDATE:
        expected.write_bytes(output)
        findings.write_text(_rows(result.conversion))
    assert output == expected.read_bytes()
    assert _rows(result.conversion) == findings.read_text()
    nbformat.validate(nbformat.reads(output.decode(), as_version=nbformat.NO_CONVERT))
    again = convert_notebook(output, Options(), path.name)
    assert again.conversion.converted is None and again.conversion.status is FileStatus.ALREADY_MIXED_PRECISION


@pytest.mark.parametrize("path", CASES, ids=[p.name for p in CASES])
def test_only_the_changed_cells_change(path):
    """Outputs, execution counts, metadata, markdown, IPython lines and untouched cells stay byte for
    byte; in the file, only lines of the changed cells' sources differ."""
    data = path.read_bytes()
    result = convert_notebook(data, Options(), path.name)
    before, after = json.loads(data), json.loads(result.conversion.converted)
    changed = {change.index for change in result.cells}
    assert changed, "the fixture trains: some cell must change"
    assert [k for k in before] == [k for k in after] and before["metadata"] == after["metadata"]
    for index, (old, new) in enumerate(zip(before["cells"], after["cells"])):
        if index in changed:
            assert {k: v for k, v in old.items() if k != "source"} == {k: v for k, v in new.items() if k != "source"}
            old_lines = "".join(old["source"]).splitlines()
            new_lines = "".join(new["source"]).splitlines()
            assert [line for line in old_lines if line.lstrip().startswith(("%", "!"))] == \
                [line for line in new_lines if line.lstrip().startswith(("%", "!"))]
        else:
            assert old == new
    import difflib
    diff = [line for line in difflib.unified_diff(data.decode().splitlines(), result.conversion.converted.decode()
                                                   .splitlines(), n=0) if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    sources = {json.dumps(line, ensure_ascii=False).strip('"') for cell in after["cells"] + before["cells"]
               for line in cell["source"]}
    assert diff and all(any(text in line for text in sources if text) or line.strip() in "+-" for line in diff)


def test_the_layout_of_another_editor_is_kept():
    data = (FIXTURES / "vscode_layout.in.ipynb").read_bytes()
    assert b'\n  "cells"' not in data[:20] and b"caf\\u00e9" in data and not data.endswith(b"\n")
    out = convert_notebook(data, Options(), "nb.ipynb").conversion.converted
    assert out.startswith(b'{\n  "nbformat": 4') and b"caf\\u00e9" in out and not out.endswith(b"\n")


def test_a_notebook_whose_layout_cannot_be_reproduced_is_not_written():
    data = (FIXTURES / "train_cells.in.ipynb").read_bytes().replace(b'\n   "metadata": {},', b'\n     "metadata": {},', 1)
    with pytest.raises(ConversionError, match="JSON layout"):
        convert_notebook(data, Options(), "nb.ipynb")
    # nothing to write: no complaint about its layout
    plain = json.loads(data)
    plain["cells"] = [cell for cell in plain["cells"] if cell["cell_type"] == "markdown"]
    odd = json.dumps(plain, indent=1).replace('\n  "cell_type"', '\n     "cell_type"', 1).encode()
    assert convert_notebook(odd, Options(), "nb.ipynb").conversion.status is FileStatus.NOT_APPLICABLE


def test_ipython_lines_and_foreign_cell_magics_come_back_exactly():
    notebook = read_notebook((FIXTURES / "train_cells.in.ipynb").read_bytes())
    program, cells = build_program(notebook)
    assert "%matplotlib" not in program and "!nvidia-smi" not in program and "%%bash" not in program
    compile(program, "program", "exec")
    back = split_program(program, cells)
    for cell in cells:
        assert back[cell.index] == cell.source
    assert split_program(program.replace("# ampify-cell 5\n", ""), cells) is None  # a lost marker: nothing written


def test_cli_converts_notebooks_in_folders_and_shows_cells(tmp_path):
    folder = tmp_path / "work"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    source = (FIXTURES / "train_cells.in.ipynb").read_bytes()
    (folder / "train.ipynb").write_bytes(source)
    (folder / ".ipynb_checkpoints" / "train-checkpoint.ipynb").write_bytes(source)
    diff = subprocess.run([sys.executable, "-m", "ampify", "--diff", str(folder)], capture_output=True, text=True)
    assert diff.returncode == 0, diff.stderr
    assert f"--- a/{folder / 'train.ipynb'}:cell 4\n" in diff.stdout and ":cell 6\n" in diff.stdout
    assert "checkpoint" not in diff.stdout + diff.stderr
    assert ("train.ipynb:cell 6:4:5: AMP201 would write: forward pass and loss (lines 4-5) run under torch.autocast(device.type, "
            "float16)") in diff.stderr
    written = subprocess.run([sys.executable, "-m", "ampify", "-q", str(folder)], capture_output=True, text=True)
    assert written.returncode == 0, written.stderr
    assert (folder / "train.ipynb").read_bytes() == (FIXTURES / "train_cells.out.ipynb").read_bytes()
    assert (folder / ".ipynb_checkpoints" / "train-checkpoint.ipynb").read_bytes() == source


def test_converted_notebook_code_trains_in_mixed_precision_on_cpu(tmp_path):
    """The kernel's view: the converted code cells, run in order (IPython lines left out), train in
    bfloat16 autocast on CPU."""
    pytest.importorskip("torch")
    data = (FIXTURES / "train_cells.in.ipynb").read_bytes()
    converted = json.loads(convert_notebook(data, Options(dtype="bfloat16"), "nb.ipynb").conversion.converted)
    code = []
    for cell in converted["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or source.startswith("%%bash"):
            continue
        code += [line for line in source.splitlines()
                 if not line.lstrip().startswith(("%", "!")) and "= !" not in line and not line.endswith("?")]
    script = tmp_path / "cells.py"
    script.write_text("\n".join(code) + "\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.count("dtype torch.bfloat16") == 4


def _notebook(cells, metadata=None) -> bytes:
    code = [{"cell_type": "code", "metadata": {}, "source": source, "outputs": [], "execution_count": None}
            for source in cells]
    return json.dumps({"cells": code, "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 5}, indent=1).encode()


def test_a_cell_that_does_not_parse_is_named_with_its_line():
    data = _notebook([["import torch\n", "x = 1\n"], ["print \"hi\"\n", "loss.backward()\n", "opt.step()"]])
    with pytest.raises(ConversionError, match=r"cell 2 line 1: Missing parentheses"):
        convert_notebook(data, Options(), "py2.ipynb")


def test_a_notebook_of_another_language_is_not_applicable():
    data = _notebook([["library(torch)\n", "loss$backward()\n"]], {"kernelspec": {"name": "ir", "language": "R"}})
    conversion = convert_notebook(data, Options(), "r.ipynb").conversion
    assert conversion.status is FileStatus.NOT_APPLICABLE and conversion.reason == "a notebook whose kernel runs r, not Python"


def test_a_git_lfs_pointer_is_not_a_notebook_to_fail_on():
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 52311\n"
    conversion = convert_notebook(pointer, Options(), "big.ipynb").conversion
    assert conversion.status is FileStatus.NOT_APPLICABLE and "Git LFS pointer" in conversion.reason


def test_ipython_lines_with_windows_line_endings_come_back_exactly():
    data = _notebook([["import torch\r\n", "%matplotlib inline\r\n", "x = 1\r\n"]])
    notebook = read_notebook(data)
    program, cells = build_program(notebook)
    assert split_program(program, cells) == {0: "import torch\r\n%matplotlib inline\r\nx = 1\r\n"}


def test_a_shell_line_continued_with_backslashes_is_masked_whole_and_the_training_cell_converts():
    # gan-compression's notebooks: `!python get_test_opt.py --dataroot ... \` over several lines
    shell = ["!python get_test_opt.py --dataroot database/horse2zebra/valA \\\n", "--dataset_mode single \\\n",
             "    --ngf 64 --netG resnet_9blocks\n"]
    train = ["for x, y in loader:\n", "    optimizer.zero_grad()\n", "    loss = criterion(model(x), y)\n",
             "    loss.backward()\n", "    optimizer.step()\n"]
    data = _notebook([["import torch\n", "import torch.nn as nn\n"], shell + ["print('done')\n"],
                      ["device = torch.device('cuda')\n", "model = nn.Linear(4, 2).to(device)\n",
                       "criterion = nn.CrossEntropyLoss()\n",
                       "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n", "loader = []\n"], train])
    program, cells = build_program(read_notebook(data))
    assert "--dataset_mode" not in program and "resnet_9blocks" not in program
    compile(program, "program", "exec")
    assert split_program(program, cells)[1] == "".join(shell) + "print('done')\n"
    result = convert_notebook(data, Options(), "cycle_gan.ipynb")
    assert result.conversion.status is FileStatus.CHANGED, result.conversion.reason
    cells_after = json.loads(result.conversion.converted)["cells"]
    assert "".join(cells_after[1]["source"]) == "".join(shell) + "print('done')\n"
    assert "scaler.scale(loss).backward()" in "".join(cells_after[3]["source"])
