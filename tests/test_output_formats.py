"""`--output-format` (text, json, github, markdown) and `ampify -` on standard input (#21 items 3-5)."""
import json
import os
import subprocess
import sys

import pytest

from ampify.findings import FileResult, FileStatus, Finding, Severity
from ampify.output_formats import github_annotation, render_markdown
from ampify.report import summarize

TORCH_FP32 = (
    "import torch\n\nmodel = torch.nn.Linear(4, 2).to('cuda')\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x, y in loader:\n    optimizer.zero_grad()\n    loss = torch.nn.functional.mse_loss(model(x), y)\n"
    "    loss.backward()\n    optimizer.step()\n"
)
DEPRECATED_AS_VALUE = "import torch\nac = torch.cuda.amp.autocast if fp16 else None\n"


def _ampify(*args, stdin=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "ampify", *map(str, args)], input=stdin, capture_output=True,
                          timeout=120, cwd=cwd, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "train.py").write_text(TORCH_FP32)
    (tmp_path / "value.py").write_text(DEPRECATED_AS_VALUE)
    (tmp_path / "notes.py").write_text("print('no training here')\n")
    return tmp_path


def test_github_annotations_one_per_finding_and_per_refused_file(tree):
    run = _ampify("--check", "--output-format", "github", tree, cwd=tree)
    assert run.returncode == 1
    lines = run.stdout.decode().splitlines()
    train = [line for line in lines if "file=" in line and "train.py" in line]
    assert train and all(line.startswith("::notice file=") for line in train)
    assert any(",line=8,col=5,title=AMP202::AMP202 " in line for line in train)  # 1-based, as editors count
    refused = [line for line in lines if "value.py" in line]
    assert refused[0].startswith("::warning file=") and ",title=AMP410::AMP410 " in refused[0]
    assert refused[1].startswith("::error file=") and "title=ampify::not converted: " in refused[1]
    assert lines[-1].startswith("ampify: scanned 3 files: 1 would be changed")


def test_github_escapes_what_would_end_a_property_or_a_line():
    finding = Finding("AMP215", "50% of it:\nleft", 3, 0, Severity.WARNING)
    line = github_annotation("dir,with:odd/train.py", finding)
    assert line == "::warning file=dir%2Cwith%3Aodd/train.py,line=3,col=1,title=AMP215::AMP215 50%25 of it:%0Aleft"


def test_json_on_standard_output_is_the_report_document(tree):
    run = _ampify("--check", "--output-format", "json", "--report", tree / "report.json", tree, cwd=tree)
    document = json.loads(run.stdout)
    assert document == json.loads((tree / "report.json").read_text())
    statuses = {f["path"].rsplit("/", 1)[-1]: f["status"] for f in document["files"]}
    assert statuses == {"train.py": "changed", "value.py": "not converted", "notes.py": "not applicable"}
    # the summary's words, in the console and in the JSON alike
    assert document["summary"]["not converted"] == 1 and "1 not converted" in run.stderr.decode()
    finding = next(f for f in document["files"] if f["path"].endswith("value.py"))["findings"][0]
    assert (finding["line"], finding["column"]) == (2, 6)


def test_markdown_review_summary_names_changes_warnings_and_refusals(tree):
    run = _ampify("--check", "--output-format", "markdown", tree, cwd=tree)
    text = run.stdout.decode()
    assert text.startswith("## ampify: 1 file would change\n")
    assert "| `" in text and "| changed | 4 | 0 |" in text and "| not converted | 0 | 1 |" in text
    assert "What changed and why:" in text and "- line 8: **AMP202**" in text
    assert "Left for a human:" in text and "**AMP410** warning: torch.cuda.amp.autocast is used as a value" in text
    assert "notes.py" not in text  # not applicable files are not listed
    assert "ampify:" not in text.split("\n", 1)[1]  # the summary line went to standard error
    assert "ampify: scanned 3 files" in run.stderr.decode()


def test_markdown_keeps_table_cells_intact():
    result = FileResult("a|b.py", FileStatus.UNCONVERTED, "x | y", [Finding("AMP410", "p | q", 1, 0, Severity.WARNING)])
    text = render_markdown([result], summarize([result]), wrote=False, interrupted=False)
    assert "| `a\\|b.py` | not converted | 0 | 1 |" in text and "x \\| y" in text and "p \\| q" in text


def test_diff_cannot_share_standard_output_with_a_document(tree):
    run = _ampify("--diff", "--output-format", "json", tree)
    assert run.returncode == 2 and b"cannot be combined with --output-format json" in run.stderr


def test_stdin_to_stdout_as_black_and_ruff_do(tree):
    source = (tree / "train.py").read_bytes()
    run = _ampify("-", "--stdin-filename", tree / "train.py", stdin=source, cwd=tree)
    assert run.returncode == 0, run.stderr
    from ampify.convert import convert_source

    assert run.stdout == convert_source(source).converted
    assert b"train.py:8:5: AMP202" in run.stderr and b"1 changed" in run.stderr
    assert (tree / "train.py").read_bytes() == source  # the named file is never written
    check = _ampify("--check", "-", stdin=source)
    assert check.returncode == 1 and check.stdout == b"" and b"<stdin>:8:5: AMP202" in check.stderr
    diff = _ampify("--diff", "-", stdin=source)
    assert diff.stdout.startswith(b"--- a/<stdin>") and b"+    scaler.scale(loss).backward()" in diff.stdout
    untouched = _ampify("-", stdin=b"print('hi')\n")
    assert untouched.returncode == 0 and untouched.stdout == b"print('hi')\n"


def test_stdin_reads_the_configuration_beside_the_named_file(tree):
    (tree / "pyproject.toml").write_text('[tool.ampify]\ndtype = "bfloat16"\n')
    run = _ampify("-", "--stdin-filename", tree / "train.py", stdin=(tree / "train.py").read_bytes())
    assert b"torch.bfloat16" in run.stdout and b"GradScaler" not in run.stdout


def test_stdin_cannot_mix_with_paths(tree):
    run = _ampify("-", tree / "train.py")
    assert run.returncode == 2 and b"cannot be combined with other paths" in run.stderr
    missing = _ampify(tree / "missing.py")
    assert missing.returncode == 2 and b"does not exist" in missing.stderr


def test_sarif_is_valid_sarif_2_1_0_and_carries_every_finding(tree):
    """Validated with a pydantic model generated from the SARIF 2.1.0 schema (extra keys forbidden);
    the test first shows that the validator rejects what the schema rejects."""
    from pydantic import ValidationError
    from pydantic_sarif.model import StaticAnalysisResultsFormatSarifVersion210JsonSchema as SarifLog

    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                           "source": TORCH_FP32}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tree / "train nb.ipynb").write_text(json.dumps(notebook, indent=1) + "\n")
    (tree / "broken.py").write_text("import torch\nloss.backward(\n")
    run = _ampify("--check", "--output-format", "sarif", ".", cwd=tree)
    assert run.returncode == 1
    document = json.loads(run.stdout)
    SarifLog.model_validate(document)
    with pytest.raises(ValidationError):
        SarifLog.model_validate({**document, "runs": [{**document["runs"][0], "unknown": 1}]})

    [sarif_run] = document["runs"]
    rules = {rule["id"] for rule in sarif_run["tool"]["driver"]["rules"]}
    from ampify.rules import BY_CODE

    assert rules == set(BY_CODE)
    results = sarif_run["results"]
    by_file = {}
    for result in results:
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        by_file.setdefault(uri, []).append(result)
        assert "ruleId" not in result or result["ruleId"] in rules  # a status result has no rule
    train = {r["ruleId"] for r in by_file["train.py"]}
    assert {"AMP201", "AMP202", "AMP203", "AMP204"} <= train
    region = next(r for r in by_file["train.py"] if r["ruleId"] == "AMP203")["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 9, "startColumn": 5}  # 1-based, as the text output prints it
    notebook_results = by_file["train%20nb.ipynb"]
    assert all(r["properties"]["cell"] == 1 and "region" not in r["locations"][0]["physicalLocation"]
               for r in notebook_results)
    [failure] = by_file["broken.py"]
    assert failure["level"] == "error" and failure["message"]["text"].startswith("failed: ")
    assert any(r["level"] == "warning" for r in by_file["value.py"])
