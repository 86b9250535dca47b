"""Framework-owned training loops (#15 item 6): the framework's own switch is set, an existing
setting is kept, `**kwargs` is reported; and with the real packages on CPU the converted script is
accepted and its training step runs in bfloat16 (fp16 autocast is a GPU feature in Accelerate and
Lightning: on CPU they run fp32 or switch to bf16 themselves, so bf16 is what CPU can prove)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "fixtures" / "torch_native" / "frameworks"
CASES = {
    "accelerate_loop.py": ("accelerate", 'mixed_precision="bf16"', "precision bf16 dtypes ['torch.bfloat16']"),
    "lightning_trainer.py": ("lightning", 'precision="bf16-mixed"', "precision bf16-mixed dtypes ['torch.bfloat16']"),
    "hf_trainer.py": ("transformers", "bf16=True", "precision bf16 dtypes ['torch.bfloat16']"),
}


def _run(script: Path, tmp_path: Path) -> str:
    completed = subprocess.run([sys.executable, str(script), str(tmp_path / "hf_output")], capture_output=True,
                               text=True, timeout=600, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_framework_switch_makes_the_real_framework_train_in_bfloat16(name, tmp_path):
    package, switch, after = CASES[name]
    pytest.importorskip(package)
    source = (SCRIPTS / name).read_text()
    assert "float32" in _run(SCRIPTS / name, tmp_path)  # the original trains in float32
    conversion = convert_source(source, Options(dtype="bfloat16"), filename=name)
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert switch in conversion.converted
    assert [f.code for f in conversion.findings] == ["AMP209"]
    converted = tmp_path / name
    converted.write_text(conversion.converted)
    assert after in _run(converted, tmp_path)
    again = convert_source(conversion.converted, Options(dtype="bfloat16"), filename=name)
    assert again.status is FileStatus.ALREADY_MIXED_PRECISION and again.converted is None


def test_float16_values_and_kept_settings():
    converted = convert_source("import lightning as L\ntrainer = L.Trainer(max_epochs=1)\n", Options())
    assert converted.converted == 'import lightning as L\ntrainer = L.Trainer(max_epochs=1, precision="16-mixed")\n'
    hf = convert_source("from transformers import TrainingArguments\na = TrainingArguments('out')\n", Options())
    assert hf.converted == "from transformers import TrainingArguments\na = TrainingArguments('out', fp16=True)\n"
    kept = convert_source("from accelerate import Accelerator\na = Accelerator(mixed_precision='no')\n", Options())
    assert kept.status is FileStatus.NOT_APPLICABLE and "by the script's choice" in kept.reason
    chosen = convert_source("from transformers import TrainingArguments\na = TrainingArguments('o', bf16=True)\n", Options())
    assert chosen.status is FileStatus.ALREADY_MIXED_PRECISION and chosen.converted is None
    unknown = convert_source("import pytorch_lightning as pl\nt = pl.Trainer(**cfg)\n", Options())
    assert unknown.status is FileStatus.UNCONVERTED and [f.code for f in unknown.findings] == ["AMP225"]
    apex = convert_source("import lightning as L\ntrainer = L.Trainer(max_epochs=1)\n", Options(backend="apex"))
    assert apex.converted is None  # the apex backend leaves framework-owned loops alone
