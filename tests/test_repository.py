"""The repository as the unit: golden repositories (a folder tree in, a folder tree and every
file's status and findings out) and the repository index itself.

`fixtures/repositories/<case>/input/` is converted by the CLI in a scratch copy; the result must
equal `expected/` (when absent: the input, unchanged) file by file, and the statuses and
findings `findings.txt`. A second run changes nothing. AMPIFY_UPDATE_GOLDEN=1 rewrites both.
`<case>/variants/<name>/` holds another run of the same input (its `options.json`, `expected/`,
`findings.txt`): the apex backend on a project the native golden also converts, or a run naming
some files of the tree only (`"paths"` in options.json).
"""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampify.repository import ProjectView, RepositoryIndex, find_root

ROOT = Path(__file__).resolve().parent.parent
BASES = sorted(p for p in (ROOT / "fixtures" / "repositories").iterdir() if p.is_dir())
#: (the folder with input/, the folder with options.json, expected/ and findings.txt)
CASES = [(base, base) for base in BASES] + [
    (base, variant) for base in BASES for variant in sorted((base / "variants").glob("*")) if variant.is_dir()]
UPDATE = os.environ.get("AMPIFY_UPDATE_GOLDEN") == "1"


def _run(tree: Path, case: Path, report: Path) -> subprocess.CompletedProcess:
    """ampify on the tree, or on the paths of it that options.json names (`"paths": ["train.py"]`:
    the rest of the repository is read, not converted)."""
    options = json.loads((case / "options.json").read_text()) if (case / "options.json").exists() else {}
    named = [str(tree / path) for path in options.pop("paths", [])] or [str(tree)]
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]
    return subprocess.run(
        [sys.executable, "-m", "ampify", *named, "-j", "1", "--report", str(report), *flags],
        capture_output=True, text=True, cwd=tree.parent,
    )


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.py"))}


def _rows(report: Path) -> list:
    rows = []
    for entry in json.loads(report.read_text())["files"]:
        rows.append(f"{entry['path']}: {entry['status']}")
        rows += [f"  {f['line']}:{f['column']} {f['code']}" for f in entry["findings"]]
    return rows


@pytest.mark.parametrize("base, case", CASES,
                         ids=[b.name if b == c else f"{b.name}/{c.name}" for b, c in CASES])
def test_golden_repository(base, case, tmp_path):
    tree = tmp_path / "repo"
    shutil.copytree(base / "input", tree)
    completed = _run(tree, case, tmp_path / "report.json")
    assert completed.returncode in (0, 1), completed.stderr
    rows = [row.replace(str(tree) + "/", "") for row in _rows(tmp_path / "report.json")]
    expected_folder = case / "expected" if (case / "expected").exists() else base / "input"
    if UPDATE:
        if _tree(tree) != _tree(base / "input"):
            shutil.rmtree(case / "expected", ignore_errors=True)
            shutil.copytree(tree, case / "expected", ignore=shutil.ignore_patterns("__pycache__"))
        (case / "findings.txt").write_text("\n".join(rows) + "\n")
        expected_folder = case / "expected" if (case / "expected").exists() else base / "input"
    assert _tree(tree) == _tree(expected_folder)
    assert rows == (case / "findings.txt").read_text().splitlines()
    for path, data in _tree(tree).items():
        compile(data, path, "exec")
    again = _run(tree, case, tmp_path / "again.json")
    assert again.returncode in (0, 1), again.stderr
    assert _tree(tree) == _tree(expected_folder), "a second run changed the tree"


def test_root_and_module_resolution(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "src" / "pkg" / "engine.py").write_text("def train_one_epoch(model, optimizer):\n    pass\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "helpers.py").write_text("import torch\n")
    script = tmp_path / "tools" / "train.py"
    script.write_text(
        "from pkg.engine import train_one_epoch\nimport pkg.engine\nfrom pkg import engine as eng\n"
        "from .helpers import *\n"
        "train_one_epoch(m, o)\npkg.engine.train_one_epoch(m, o)\neng.train_one_epoch(m, optimizer=o)\n"
    )
    assert find_root(script) == tmp_path.resolve()
    index = RepositoryIndex(tmp_path)
    engine = (tmp_path / "src" / "pkg" / "engine.py").resolve()
    assert index.resolve_module(script, "pkg.engine") == engine
    assert index.resolve_module(script, "helpers", level=1) == (tmp_path / "tools" / "helpers.py").resolve()
    assert index.resolve_module(script, "torch") is None  # not the project's
    view = ProjectView(index, engine)
    assert view.callers_elsewhere("train_one_epoch") == ["tools/train.py:5", "tools/train.py:6", "tools/train.py:7"]
    assert ProjectView(index, script).star_bound_imports() == {"torch": "torch"}


def test_root_without_markers_is_the_folder_above_the_packages(tmp_path):
    """A download without its .git (nor setup.py): a script inside a package folder
    (`runners/scorenet_runner.py`, runners/ holding an __init__.py) belongs to the folder that
    imports `runners` and its sibling `losses` package; a folder named is its own root."""
    project = tmp_path / "ncsn"
    for package in ("runners", "losses"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("")
    (project / "losses" / "sliced_sm.py").write_text("def loss(x):\n    return x\n")
    script = project / "runners" / "toy_runner.py"
    script.write_text("from losses.sliced_sm import *\n")
    (project / "README.md").write_text("ncsn\n")
    (project / "__init__.py").write_text("")  # a top-level __init__.py: the README still ends the climb
    assert find_root(script) == project.resolve()
    assert find_root(project / "runners") == (project / "runners").resolve()  # a folder named: itself
    index = RepositoryIndex(find_root(script))
    assert index.resolve_module(script, "losses.sliced_sm") == (project / "losses" / "sliced_sm.py").resolve()


def test_device_moving_helpers_and_exports(tmp_path):
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "nets.py").write_text(
        "__all__ = ['build']\nimport torch\n"
        "def build(args):\n    net = Net()\n    net.cuda()\n    return net\n"
        "def plain(args):\n    return Net()\n"
        "def chained(args):\n    return Net().to(args.device)\n"
    )
    script = tmp_path / "train.py"
    script.write_text("import nets\nfrom nets import *\nfrom nets import plain, chained as c\n")
    view = ProjectView(RepositoryIndex(tmp_path), script)
    assert view.returns_device_moved("nets.build") == "nets.py:3 build()"
    assert view.returns_device_moved("c") == "nets.py:9 chained()"
    assert view.returns_device_moved("plain") is None
    assert view.returns_device_moved("nets.missing") is None
    assert view.star_bound_imports() == {}  # __all__ does not export torch


def test_a_converted_multi_module_project_trains_on_cpu(tmp_path):
    """The converted star-import project runs: train.py gets torch through `from utils import *`,
    trains three steps under CPU autocast with the GradScaler, and the loss stays finite."""
    pytest.importorskip("torch")
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "star_import_torch" / "expected", tree)
    script = tree / "train.py"
    source = script.read_text()
    model_line = "model = Net().to(device)\n"
    assert model_line in source
    source = source.replace(model_line, model_line + "dtypes = []\nmodel.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))\n")
    source += (
        "\nimport math\nassert math.isfinite(loss.item()), loss\n"
        "assert dtypes == [torch.float16] * 3, dtypes  # the forward passes ran under autocast\n"
        "assert scaler.get_scale() > 0\nprint('trained', loss.item())\n"
    )
    script.write_text(source)
    completed = subprocess.run([sys.executable, "train.py"], cwd=tree, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert "trained" in completed.stdout


_WRAPPER_PROBE = """
import json, sys
import torch
calls = {"step": [], "unscale_": 0}
step, unscale = torch.amp.GradScaler.step, torch.amp.GradScaler.unscale_
def counted_step(self, optimizer, *args, **kwargs):
    calls["step"].append(type(optimizer).__name__)
    return step(self, optimizer, *args, **kwargs)
def counted_unscale(self, optimizer):
    calls["unscale_"] += 1
    return unscale(self, optimizer)
torch.amp.GradScaler.step, torch.amp.GradScaler.unscale_ = counted_step, counted_unscale
import {module}
{module}.{entry}()
print(json.dumps({{"losses": {module}.LOSSES, **calls}}))
"""


@pytest.mark.parametrize("module, entry, steps, unscales",
                         [("train", "main", 8, 8), ("seq2seq_trainer", "run", 4, 4), ("handed_trainer", "run", 4, 4),
                          ("poly_lr_trainer", "run", 4, 4)])
def test_training_through_a_converted_optimizer_wrapper_runs_on_cpu(tmp_path, module, entry, steps, unscales):
    """The converted scripts step Adam through GradScaler inside the project's wrapper classes
    (ScheduledOptim's Noam schedule, seq2seq's clipping Optimizer, which unscales first, BiSeNet's
    PolyOptimizer, which builds its Adam itself, beside another wrapper with a step()), under
    CPU float16 autocast, and train like the float32 originals. (GradScaler.step unscales
    itself when nothing did before: one unscale_ per step either way; a second would raise.)"""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "optimizer_wrapper_classes"
    results = {}
    for side in ("input", "expected"):
        tree = tmp_path / side
        shutil.copytree(case / side, tree)
        probe = _WRAPPER_PROBE.replace("{module}", module).replace("{entry}", entry).replace("{{", "{").replace("}}", "}")
        completed = subprocess.run([sys.executable, "-c", probe], cwd=tree, capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        results[side] = json.loads(completed.stdout.strip().splitlines()[-1])
    original, converted = results["input"], results["expected"]
    assert original["step"] == [] and original["unscale_"] == 0
    assert converted["step"] == ["Adam"] * steps and converted["unscale_"] == unscales
    assert len(converted["losses"]) == len(original["losses"]) == steps
    for mixed, full in zip(converted["losses"], original["losses"]):
        assert mixed == pytest.approx(full, rel=5e-2), (converted["losses"], original["losses"])


def test_without_a_project_marker_the_named_folder_is_the_project(tmp_path):
    """A downloaded archive has no .git: the folder the user names is the project, so a wrapper
    class in a sibling package (Speech-Transformer's src/transformer/optimizer.py) is seen from
    src/solver/solver.py, whose self.optimizer may be one: refused, not turned into
    scaler.step(wrapper)."""
    tree = tmp_path / "Speech-Transformer"
    (tree / "src" / "transformer").mkdir(parents=True)
    (tree / "src" / "solver").mkdir(parents=True)
    (tree / "src" / "transformer" / "optimizer.py").write_text(
        "class TransformerOptimizer(object):\n"
        "    def __init__(self, optimizer, k):\n"
        "        self.optimizer = optimizer\n"
        "        self.k = k\n"
        "    def step(self):\n"
        "        self.optimizer.step()\n"
    )
    (tree / "src" / "solver" / "solver.py").write_text(
        "import torch\n\n\n"
        "class Solver(object):\n"
        "    def __init__(self, model, optimizer):\n"
        "        self.model = model.cuda()\n"
        "        self.optimizer = optimizer\n\n"
        "    def run_epoch(self, loader):\n"
        "        for x, y in loader:\n"
        "            loss = torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda())\n"
        "            self.optimizer.zero_grad()\n"
        "            loss.backward()\n"
        "            self.optimizer.step()\n"
    )
    before = _tree(tree)
    completed = subprocess.run([sys.executable, "-m", "ampify", "Speech-Transformer"], cwd=tmp_path,
                               capture_output=True, text=True)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "src/transformer/optimizer.py:5 TransformerOptimizer.step() has a step() of its own" in completed.stdout
    assert _tree(tree) == before


@pytest.mark.parametrize("use, converts", [
    ("self.optimizer.update(total, epoch)", True),
    ("print(self.optimizer.optimizer)", True),
    # a torch optimizer's own attribute, which the wrapper does not have: it may be a plain one
    ("self.optimizer.update(total, epoch)\n        print(self.optimizer.param_groups[0]['lr'])", False),
    # under a type test the use is no evidence
    ("if hasattr(self.optimizer, 'update'):\n            self.optimizer.update(total, epoch)", False),
    # a member both have (zero_grad) tells nothing
    ("self.optimizer.zero_grad()", False),
])
def test_a_trainer_handed_its_optimizer_steps_through_the_wrapper_only_when_used_as_one(tmp_path, use, converts):
    """pytorch-seq2seq's trainer is handed `optimizer` (a parameter: a torch optimizer or the
    project's wrapper, whose step() would make scaler.step(self.optimizer) fail). A use of a member
    only the wrapper has, in the trainer's class, says which; anything less stays refused (AMP215)."""
    tree = tmp_path / "repo"
    (tree / ".git").mkdir(parents=True)
    (tree / "optim.py").write_text(
        "class Optimizer(object):\n"
        "    def __init__(self, optim):\n"
        "        self.optimizer = optim\n"
        "    def step(self):\n"
        "        self.optimizer.step()\n"
        "    def update(self, loss, epoch):\n"
        "        pass\n"
    )
    (tree / "trainer.py").write_text(
        "import torch\n\n\n"
        "class Trainer(object):\n"
        "    def __init__(self, model, optimizer):\n"
        "        self.model = model.cuda()\n"
        "        self.optimizer = optimizer\n\n"
        "    def run_epoch(self, loader, epoch):\n"
        "        total = 0.0\n"
        "        for x, y in loader:\n"
        "            loss = torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda())\n"
        "            loss.backward()\n"
        "            self.optimizer.step()\n"
        "            total += loss.item()\n"
        f"        {use}\n"
    )
    completed = subprocess.run([sys.executable, "-m", "ampify", ".", "--check", "--report", str(tmp_path / "r.json")],
                               cwd=tree, capture_output=True, text=True)
    entries = {Path(e["path"]).name: e for e in json.loads((tmp_path / "r.json").read_text())["files"]}
    trainer = entries["trainer.py"]
    if converts:
        assert trainer["status"] == "changed", completed.stdout
        assert entries["optim.py"]["status"] == "changed", completed.stdout
        assert "self.optimizer.step(scaler=self.scaler)" in completed.stdout + json.dumps(trainer), completed.stdout
    else:
        assert trainer["status"] == "not converted", completed.stdout
        assert [f["code"] for f in trainer["findings"]] == ["AMP215"], completed.stdout
        assert entries["optim.py"]["status"] == "not applicable"


def test_a_wrapper_method_name_another_class_defines_too_is_not_followed(tmp_path):
    """`step_and_update_lr` is ScheduledOptim's stepping method, but a scheduler class of the
    project has a method of that name too: `sched.step_and_update_lr()` may be either, so no
    scaler is threaded through it and the step stays refused (AMP220)."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "optimizer_wrapper_classes" / "input", tree)
    (tree / "nmt" / "schedule.py").write_text(
        "class WarmupSchedule:\n"
        "    def __init__(self, optimizer):\n"
        "        self.optimizer = optimizer\n"
        "    def step_and_update_lr(self):\n"
        "        for group in self.optimizer.param_groups:\n"
        "            group['lr'] *= 0.99\n"
    )
    completed = subprocess.run([sys.executable, "-m", "ampify", "--check", str(tree / "train.py"), "--report",
                                str(tmp_path / "r.json")], capture_output=True, text=True, cwd=tmp_path)
    entry = json.loads((tmp_path / "r.json").read_text())["files"][0]
    assert entry["status"] == "not converted", completed.stdout
    assert {f["code"] for f in entry["findings"]} == {"AMP220"}


def test_a_tf1_file_that_trains_through_a_helper_module_names_it(tmp_path):
    """BERT's run_classifier.py gets its train op from optimization.create_optimizer(): named alone,
    it is not converted and the warning names the file to run ampify on (the wrapper goes there);
    with the repository, it needs no change and says where its optimizer is converted."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "tf1_optimizer_built_by_helper" / "input", tree)
    alone = subprocess.run([sys.executable, "-m", "ampify", "--check", str(tree / "run_classifier.py"), "--report",
                            str(tmp_path / "alone.json")], capture_output=True, text=True, cwd=tmp_path)
    assert alone.returncode == 1, alone.stderr
    [entry] = json.loads((tmp_path / "alone.json").read_text())["files"]
    assert entry["status"] == "not converted"
    [finding] = entry["findings"]
    assert (finding["code"], finding["line"]) == ("AMP123", 14)
    assert "optimization.create_optimizer() at optimization.py:8, which is not in this run" in finding["message"]
    assert "run ampify on optimization.py or on the repository" in finding["message"]
    whole = subprocess.run([sys.executable, "-m", "ampify", "--check", str(tree), "--report", str(tmp_path / "all.json")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert whole.returncode == 1, whole.stderr  # --check: a file would change
    by_name = {Path(f["path"]).name: f for f in json.loads((tmp_path / "all.json").read_text())["files"]}
    assert by_name["optimization.py"]["status"] == "changed"
    assert by_name["run_classifier.py"]["reason"].startswith(
        "trains through optimization.create_optimizer() (optimization.py:8), which builds the optimizer")
    assert not by_name["run_classifier.py"]["findings"]


@pytest.mark.parametrize("backend, code", [("native", "AMP237"), ("apex", "AMP327")])
def test_a_driver_named_without_its_engine_is_not_converted_and_names_it(backend, code, tmp_path):
    """main.py builds the optimizer and hands it to engine.train_one_epoch(): named alone it is
    not converted (it was "no training code"), and the warning names engine.py; named with
    engine.py, both change together."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "engine_split" / "input", tree)
    (tree / ".git").mkdir()
    alone = subprocess.run([sys.executable, "-m", "ampify", "--check", "--backend", backend, str(tree / "main.py"),
                            "--report", str(tmp_path / "alone.json")], capture_output=True, text=True, cwd=tmp_path)
    assert alone.returncode == 1, alone.stderr
    [entry] = json.loads((tmp_path / "alone.json").read_text())["files"]
    assert entry["status"] == "not converted"
    [finding] = entry["findings"]
    assert (finding["code"], finding["line"]) == (code, 14)
    assert finding["message"].startswith("train_one_epoch() (engine.py:4) runs the training step with optimizer, "
                                         "created here at line 11, and engine.py is not in this run")
    both = subprocess.run([sys.executable, "-m", "ampify", "--check", "--backend", backend, str(tree / "main.py"),
                           str(tree / "engine.py"), "--report", str(tmp_path / "both.json")],
                          capture_output=True, text=True, cwd=tmp_path)
    statuses = {Path(f["path"]).name: f["status"] for f in json.loads((tmp_path / "both.json").read_text())["files"]}
    assert statuses == {"main.py": "changed", "engine.py": "changed"}, both.stdout


def test_a_driver_that_hands_its_optimizer_to_a_checkpoint_helper_is_not_told_to_add_it(tmp_path):
    """Only a function that runs backward() itself counts as the step a driver relies on: handing the
    optimizer to `utils.save_checkpoint()` of a module that also trains elsewhere says nothing."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "utils.py").write_text(
        "import torch\n\n\ndef save_checkpoint(model, optimizer, path):\n"
        "    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, path)\n\n\n"
        "def finetune(model, optimizer, batches):\n    for x in batches:\n        optimizer.zero_grad()\n"
        "        model(x).sum().backward()\n        optimizer.step()\n"
    )
    (tmp_path / "export.py").write_text(
        "import torch\nimport torch.nn as nn\n\nfrom utils import save_checkpoint\n\n"
        "model = nn.Linear(4, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "save_checkpoint(model, optimizer, 'out.pt')\n"
    )
    run = subprocess.run([sys.executable, "-m", "ampify", "--check", str(tmp_path / "export.py"), "--report",
                          str(tmp_path / "r.json")], capture_output=True, text=True, cwd=tmp_path)
    [entry] = json.loads((tmp_path / "r.json").read_text())["files"]
    assert entry["status"] == "not applicable" and not entry["findings"], run.stdout


@pytest.mark.parametrize("backend, code", [("native", "AMP237"), ("apex", "AMP327")])
def test_a_driver_that_hands_its_optimizer_to_a_trainer_class_of_another_module_names_it(backend, code, tmp_path):
    """The DDP tutorial's layout split in two files: main.py builds the optimizer and hands it to
    `Trainer(model, data, optimizer, gpu_id)` of trainer.py. Named alone it is not converted (it was
    "not applicable"), and the warning says the conversion goes into that class."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "trainer.py").write_text(
        "import torch\n\n\nclass Trainer:\n    def __init__(self, model, train_data, optimizer, gpu_id):\n"
        "        self.model = model.to(gpu_id)\n        self.train_data = train_data\n        self.optimizer = optimizer\n\n"
        "    def train(self):\n        for source, targets in self.train_data:\n            self.optimizer.zero_grad()\n"
        "            loss = torch.nn.functional.cross_entropy(self.model(source), targets)\n"
        "            loss.backward()\n            self.optimizer.step()\n"
    )
    (tmp_path / "main.py").write_text(
        "import torch\n\nfrom trainer import Trainer\n\n\ndef main(device):\n    model = torch.nn.Linear(20, 2)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)\n    Trainer(model, [], optimizer, device).train()\n"
    )
    subprocess.run([sys.executable, "-m", "ampify", "--check", "--backend", backend, str(tmp_path / "main.py"),
                    "--report", str(tmp_path / "r.json")], capture_output=True, text=True, cwd=tmp_path)
    [entry] = json.loads((tmp_path / "r.json").read_text())["files"]
    assert entry["status"] == "not converted"
    [finding] = entry["findings"]
    assert (finding["code"], finding["line"]) == (code, 9)
    assert finding["message"].startswith("Trainer() (trainer.py:4) runs the training step with optimizer, created here "
                                         "at line 8, and trainer.py is not in this run: that class's step is where")


_LOSSES_PROBE = """
import json, runpy, sys
import torch
dtypes = []
original_linear = torch.nn.functional.linear
def recording_linear(*args, **kwargs):
    out = original_linear(*args, **kwargs)
    dtypes.append(str(out.dtype))
    return out
torch.nn.functional.linear = recording_linear
sys.path.insert(0, ".")
found = runpy.run_path("train.py", run_name="not_main")
print(json.dumps({"losses": found["LOSSES"], "probabilities": found.get("PROBABILITIES"), "dtypes": sorted(set(dtypes))}))
"""


def _run_losses(tree: Path) -> dict:
    completed = subprocess.run([sys.executable, "-c", _LOSSES_PROBE], cwd=tree, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_a_sigmoid_model_of_another_module_fused_computes_the_same_fp32_losses_then_trains_in_float16(tmp_path):
    """models.py's Discriminator ends in nn.Sigmoid, train.py feeds it to nn.BCELoss: the fusion
    alone (the Sigmoid dropped in models.py, BCEWithLogitsLoss and torch.sigmoid(...) for the
    logged D(x) in train.py) trains as the original does, to 1e-6; the converted project (the
    golden's expected tree) trains with its forward passes in float16 under CPU autocast."""
    pytest.importorskip("torch")
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_logits import fuse_imported_sigmoid_model

    case = ROOT / "fixtures" / "repositories" / "bce_model_in_other_module"
    original = tmp_path / "original"
    shutil.copytree(case / "input", original)
    (original / ".git").mkdir()
    fused_tree = tmp_path / "fused"
    shutil.copytree(case / "input", fused_tree)
    (fused_tree / ".git").mkdir()
    train = fused_tree / "train.py"
    module = cst.parse_module(train.read_text())
    view = ProjectView(RepositoryIndex(fused_tree), train, [fused_tree])
    fused, fusion, companion = fuse_imported_sigmoid_model(module, ImportMap.from_module(module), view, "train.py")
    assert "nn.Sigmoid()" not in companion.new.decode() and "BCEWithLogitsLoss()" in fused.code
    assert "D_x = torch.sigmoid(output).mean().item()" in fused.code and fusion.wrapped
    train.write_text(fused.code)
    Path(companion.key).write_bytes(companion.new)
    expected, same = _run_losses(original), _run_losses(fused_tree)
    assert len(same["losses"]) == 6 and same["losses"] == pytest.approx(expected["losses"], abs=1e-6)
    assert same["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-6)
    assert expected["dtypes"] == same["dtypes"] == ["torch.float32"]
    converted = tmp_path / "converted"
    shutil.copytree(case / "expected", converted)
    mixed = _run_losses(converted)
    assert "torch.float16" in mixed["dtypes"], mixed["dtypes"]
    assert len(mixed["losses"]) == 6 and all(math.isfinite(loss) for loss in mixed["losses"]), mixed["losses"]


def test_a_sigmoid_model_of_a_module_outside_the_run_is_named_and_nothing_is_written(tmp_path):
    """train.py named alone: its model's Sigmoid lies in models.py, which is not in the run, so
    neither file changes and the BCE warning says where the sigmoid is and what to run."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "bce_model_in_other_module" / "input", tree)
    (tree / ".git").mkdir()
    before = _tree(tree)
    completed = subprocess.run([sys.executable, "-m", "ampify", "train.py"], cwd=tree, capture_output=True, text=True)
    assert completed.returncode in (0, 1), completed.stderr
    assert _tree(tree) == before
    warning = next(line for line in completed.stdout.splitlines() if "AMP210" in line)
    assert "Discriminator (models.py:28)" in warning and "models.py is not in this run" in warning, warning


def test_a_helper_of_another_module_that_only_inspects_a_model_is_told_apart_from_one_that_calls_it(tmp_path):
    """utils.print_network(net) reads net.parameters() and prints net: the model's output is not read
    there; utils.probe(net) calls it. Only the first lets a BCE fusion follow the model."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "utils.py").write_text(
        "def print_network(net):\n    n = sum(p.numel() for p in net.parameters())\n    print(net)\n    print(n)\n\n\n"
        "def probe(net):\n    return net(None) > 0.5\n")
    (tmp_path / "train.py").write_text("import utils\nfrom utils import probe\n")
    view = ProjectView(RepositoryIndex(tmp_path), tmp_path / "train.py", [tmp_path])
    allowed = ("parameters", "state_dict")
    assert view.only_inspects_parameter("utils.print_network", 0, None, allowed)
    assert not view.only_inspects_parameter("probe", 0, None, allowed)
    assert not view.only_inspects_parameter("utils.print_network", 1, None, allowed)
    assert not view.only_inspects_parameter("utils.missing", 0, None, allowed)


_APEX_STANDIN = ROOT / "fixtures" / "verify" / "apex_standin"

_LOSS_OBJECT_PROGRAM = (
    "import json, sys, torch; sys.path.insert(0, '.')\n"
    "from loss import NLLLoss\nfrom trainer import SupervisedTrainer\n"
    "torch.manual_seed(0)\n"
    "model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5), torch.nn.LogSoftmax(-1))\n"
    "data = [(torch.randn(3, 4, 6), torch.randint(0, 5, (3, 4))) for _ in range(3)]\n"
    "scaled = []\n"
    "try:\n"
    "    from apex import amp\n"
    "    scale_loss = amp.scale_loss\n"
    "    def counted(loss, optimizers, **kw):\n"
    "        scaled.append(type(optimizers).__name__)\n"
    "        return scale_loss(loss, optimizers, **kw)\n"
    "    amp.scale_loss = counted\n"
    "except ImportError:\n"
    "    pass\n"
    "losses = SupervisedTrainer(NLLLoss()).train(model, data, 2)\n"
    "print(json.dumps({'losses': losses, 'scaled': scaled}))\n")


def test_a_loss_object_with_its_own_backward_trains_under_apex_against_the_standin(tmp_path):
    """pytorch-seq2seq's `loss.backward()` on a Loss whose backward() runs self.acc_loss.backward():
    on apex the class's backward() takes the step's optimizer and runs its backward under
    amp.scale_loss (loss.py, one change set with trainer.py), and the step passes it. Run against
    the apex stand-in (float16 forward passes, a loss scale of 2**16 with skip-on-overflow), the
    converted project trains like the float32 one; without an optimizer the class backpropagates
    as before."""
    pytest.importorskip("torch")
    folder = ROOT / "fixtures" / "repositories" / "apex_loss_class_with_own_backward"
    runs = []
    for side, env in (("input", {}), ("expected", {"PYTHONPATH": str(_APEX_STANDIN)})):
        tree = tmp_path / side
        shutil.copytree(folder / side, tree)
        completed = subprocess.run([sys.executable, "-c", _LOSS_OBJECT_PROGRAM], cwd=tree, capture_output=True,
                                   text=True, timeout=300, env=dict(os.environ, **env))
        assert completed.returncode == 0, completed.stderr
        runs.append(json.loads(completed.stdout.strip().splitlines()[-1]))
    assert runs[0]["scaled"] == [] and runs[1]["scaled"] == ["Adam"] * 6
    fp32, apex = runs[0]["losses"], runs[1]["losses"]
    assert len(apex) == len(fp32) == 6 and all(math.isfinite(loss) for loss in apex)
    # the first step's loss comes from the float16 forward pass (within its tolerance); the
    # updates after it are skipped on an overflow or taken on the unscaled gradients, so the
    # second epoch over the same three batches has the lower loss, as in float32
    assert apex[0] == pytest.approx(fp32[0], rel=1e-2) and apex != fp32
    assert sum(fp32[3:]) < sum(fp32[:3]) and sum(apex[3:]) < sum(apex[:3])
    text = (tmp_path / "expected" / "loss.py").read_text()
    assert "with amp.scale_loss(self.acc_loss, amp_optimizer) as scaled_loss:" in text


def test_an_apex_loss_object_of_a_module_not_in_the_run_is_refused_naming_it(tmp_path):
    """trainer.py named alone: the Loss class it fills lies in loss.py, outside the run, so neither
    file changes and the warning names loss.py."""
    folder = ROOT / "fixtures" / "repositories" / "apex_loss_class_with_own_backward"
    tree = tmp_path / "repo"
    shutil.copytree(folder / "input", tree)
    (tree / ".git").mkdir()
    completed = subprocess.run([sys.executable, "-m", "ampify", "trainer.py", "--backend", "apex"], cwd=tree,
                               capture_output=True, text=True)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert _tree(tree) == _tree(folder / "input")
    assert "loss.py is not in this run: run ampify on both files or on the repository" in completed.stdout


def _loss_object_tree(tmp_path, folder: str) -> Path:
    tree = tmp_path / folder
    shutil.copytree(ROOT / "fixtures" / "repositories" / "loss_object_three_modules" / folder, tree)
    return tree


def _printed_json(tree: Path, code: str):
    """What `code`, run in `tree`, prints as JSON on its last line."""
    completed = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _run_main(tree: Path) -> list:
    return _printed_json(tree, "import json, sys; sys.path.insert(0, '.'); import main; print(json.dumps(main.main()))")


def test_a_loss_object_scaled_in_its_own_class_trains_as_the_fp32_project_does(tmp_path):
    """loss_object_three_modules: main.py trains through trainer.py, whose step fills a Perplexity
    (losses.py) with eval_batch() and calls its backward(). Converted, Loss.backward() takes
    scaler=None and backpropagates scaler.scale(self.acc_loss): without a scaler its gradients are
    the original's exactly; with a CPU GradScaler (scale 2**10) under float16 autocast they are the
    fp32 gradients within float16 tolerance once unscaled; and the converted project trains on CPU
    (float16 autocast, a real GradScaler) with losses within 1e-2 of the fp32 project's."""
    torch = pytest.importorskip("torch")
    import importlib

    original, converted = _loss_object_tree(tmp_path, "input"), _loss_object_tree(tmp_path, "expected")

    def losses_module(tree):
        sys.path.insert(0, str(tree))
        try:
            sys.modules.pop("losses", None)
            return importlib.import_module("losses")
        finally:
            sys.path.remove(str(tree))
            sys.modules.pop("losses", None)

    before, after = losses_module(original), losses_module(converted)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8),
                                torch.nn.LogSoftmax(dim=-1))
    inputs, targets = torch.randn(3, 4, 16), torch.randint(0, 8, (3, 4))

    def gradients(module, scaler=None):
        model.zero_grad()
        loss = module.Perplexity()
        with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=scaler is not None):
            for step in range(3):
                loss.eval_batch(model(inputs[step]), targets[step])
        if scaler is None:
            loss.backward()
        else:
            loss.backward(scaler=scaler)
            scale = scaler.get_scale()
            return [p.grad.clone() / scale for p in model.parameters()]
        return [p.grad.clone() for p in model.parameters()]

    fp32 = gradients(before)
    assert all(torch.equal(a, b) for a, b in zip(fp32, gradients(after)))
    scaled = gradients(after, torch.amp.GradScaler("cpu", init_scale=2.0 ** 10))
    for a, b in zip(fp32, scaled):
        assert torch.allclose(a, b.float(), rtol=5e-2, atol=1e-3), (a - b).abs().max()
    fp32_losses, amp_losses = _run_main(original), _run_main(converted)
    assert len(amp_losses) == len(fp32_losses) == 6
    assert amp_losses == pytest.approx(fp32_losses, rel=1e-2)
    assert "self.scaler = torch.amp.GradScaler(self.device.type)" in (converted / "trainer.py").read_text()


def test_a_loss_object_held_in_a_private_attribute_trains_converted_on_cpu(tmp_path):
    """loss_object_on_self_attribute: the trainer fills `self.__loss` and calls its backward(); the
    converted trainer (a GradScaler on the CPU, float16 autocast) trains, its first loss within 1e-2
    of the fp32 trainer's and every loss finite."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "loss_object_on_self_attribute"
    program = (
        "import json, math, sys, torch; sys.path.insert(0, '.')\n"
        "from losses import TokenNLL\nfrom trainer import Seq2SeqTrainer\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Embedding(20, 16), torch.nn.Linear(16, 20), torch.nn.LogSoftmax(-1))\n"
        "batches = [(torch.randint(1, 20, (4, 5)), torch.randint(1, 20, (4, 5))) for _ in range(3)]\n"
        "print(json.dumps(Seq2SeqTrainer(TokenNLL(), 'cpu').train(model, batches, 2)))\n")
    runs = []
    for folder in ("input", "expected"):
        tree = tmp_path / folder
        shutil.copytree(case / folder, tree)
        completed = subprocess.run([sys.executable, "-c", program], cwd=tree, capture_output=True, text=True,
                                   timeout=300)
        assert completed.returncode == 0, completed.stderr
        runs.append(json.loads(completed.stdout.strip().splitlines()[-1]))
    fp32, amp = runs
    assert len(amp) == len(fp32) == 6
    assert amp[0] == pytest.approx(fp32[0], rel=1e-2) and amp[0] != fp32[0]
    assert all(math.isfinite(loss) for loss in amp)


def test_a_loss_object_in_bfloat16_gets_autocast_only(tmp_path):
    """With --dtype bfloat16 there is no scaler: the step's forward pass and eval_batch() calls go
    under autocast, `loss.backward()` and losses.py stay as they are."""
    tree = _loss_object_tree(tmp_path, "input")
    completed = subprocess.run([sys.executable, "-m", "ampify", ".", "--dtype", "bfloat16"], cwd=tree,
                               capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    trainer = (tree / "trainer.py").read_text()
    assert "with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):\n            outputs = model(inputs)" \
        in trainer
    assert "        loss.backward()\n" in trainer and "GradScaler" not in trainer
    original = ROOT / "fixtures" / "repositories" / "loss_object_three_modules" / "input"
    assert (tree / "losses.py").read_bytes() == (original / "losses.py").read_bytes()


def test_a_loss_object_whose_module_is_not_in_the_run_is_refused_naming_it(tmp_path):
    """ampify trainer.py alone: Loss.backward() in losses.py would need the scaler; nothing is written
    and the warning names the module to add."""
    tree = _loss_object_tree(tmp_path, "input")
    completed = subprocess.run([sys.executable, "-m", "ampify", "trainer.py"], cwd=tree, capture_output=True, text=True)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "losses.py is not in this run: run ampify on both files or on the repository" in completed.stdout
    assert _tree(tree) == _tree(ROOT / "fixtures" / "repositories" / "loss_object_three_modules" / "input")


def test_a_loss_object_whose_subclass_overrides_backward_is_refused(tmp_path):
    """A subclass with a backward() of its own would not take the scaler: refused, with that reason."""
    tree = _loss_object_tree(tmp_path, "input")
    losses = tree / "losses.py"
    losses.write_text(losses.read_text() + "\n\nclass Masked(Loss):\n    def backward(self):\n"
                                           "        (self.acc_loss * 0.5).backward()\n")
    completed = subprocess.run([sys.executable, "-m", "ampify", "."], cwd=tree, capture_output=True, text=True)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "Masked (losses.py), a subclass of Loss, has a backward() of its own" in completed.stdout
    assert (tree / "trainer.py").read_bytes() == (
        ROOT / "fixtures" / "repositories" / "loss_object_three_modules" / "input" / "trainer.py").read_bytes()


def test_a_model_with_its_own_backward_trains_converted_on_cpu(tmp_path):
    """model_with_own_backward (torch-points3d's BaseModel shape): train.py calls model.set_input(),
    model.forward() (which computes self.loss) and model.backward(). Converted, forward() runs under
    float16 autocast and BaseModel.backward() backpropagates scaler.scale(self.loss): the converted
    project trains on CPU with a real GradScaler: its first loss within 1e-2 of the fp32 project's, all finite."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "model_with_own_backward"
    runs = []
    for folder in ("input", "expected"):
        tree = tmp_path / folder
        shutil.copytree(case / folder, tree)
        completed = subprocess.run(
            [sys.executable, "-c", "import runpy, json, sys; sys.path.insert(0, '.'); "
                                   "print(json.dumps(runpy.run_path('train.py')['LOSSES']))"],
            cwd=tree, capture_output=True, text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        runs.append(json.loads(completed.stdout.strip().splitlines()[-1]))
    fp32, amp = runs
    assert len(amp) == len(fp32) == 10
    # the first loss comes before any update; later ones part ways as GradScaler skips the steps
    # whose float16 gradients overflow at its initial scale (2**16), as it should
    assert amp[0] == pytest.approx(fp32[0], rel=1e-2)
    assert amp[0] != fp32[0]  # float16 autocast really ran
    assert all(math.isfinite(loss) for loss in amp)


def test_a_class_reexported_by_a_package_is_found_where_it_is_defined(tmp_path):
    """`from models import Discriminator` with models/__init__.py re-exporting it from .dcgan (two
    levels): the class is found in models/dcgan.py; the package counts as a user of the class only
    when it does more than re-export it."""
    (tmp_path / ".git").mkdir()
    package = tmp_path / "models"
    (package / "nets").mkdir(parents=True)
    (package / "nets" / "__init__.py").write_text("from .dcgan import Discriminator\n")
    (package / "nets" / "dcgan.py").write_text("import torch.nn as nn\n\n\nclass Discriminator(nn.Module):\n    pass\n")
    (package / "__init__.py").write_text("from .nets import Discriminator\n__all__ = ['Discriminator']\n")
    train = tmp_path / "train.py"
    train.write_text("from models import Discriminator\n\nnetD = Discriminator()\n")
    view = ProjectView(RepositoryIndex(tmp_path), train)
    key, display, name, line, trains = view.imported_class("Discriminator")
    assert (Path(key), display, name, line, trains) == (
        (package / "nets" / "dcgan.py").resolve(), "models/nets/dcgan.py", "Discriminator", 4, False)
    index = RepositoryIndex(tmp_path)
    assert index.users_of(package / "nets" / "dcgan.py", "Discriminator", [train]) == []
    (package / "__init__.py").write_text("from .nets import Discriminator\n\n\ndef build():\n    return Discriminator()\n")
    index = RepositoryIndex(tmp_path)
    assert index.users_of(package / "nets" / "dcgan.py", "Discriminator", [train]) == [(package / "__init__.py").resolve()]


def test_a_vae_of_another_module_fused_computes_the_same_fp32_losses_then_trains_in_float16(tmp_path):
    """models.py's VAE.decode() returns torch.sigmoid(...), train.py feeds the output to
    F.binary_cross_entropy and keeps a decoded sample: the fusion alone (the sigmoid dropped in
    models.py, F.binary_cross_entropy_with_logits and torch.sigmoid(model.decode(z)) in train.py)
    computes the original's losses and sample to 1e-5; the converted project (the golden's
    expected tree) trains with its forward passes in float16 under CPU autocast."""
    pytest.importorskip("torch")
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.bce_functional import fuse_imported_functional_bce

    case = ROOT / "fixtures" / "repositories" / "bce_functional_model_in_other_module"
    original = tmp_path / "original"
    shutil.copytree(case / "input", original)
    (original / ".git").mkdir()
    fused_tree = tmp_path / "fused"
    shutil.copytree(case / "input", fused_tree)
    (fused_tree / ".git").mkdir()
    train = fused_tree / "train.py"
    module = cst.parse_module(train.read_text())
    view = ProjectView(RepositoryIndex(fused_tree), train, [fused_tree])
    fused, fusion, companion = fuse_imported_functional_bce(module, ImportMap.from_module(module), view, "train.py")
    assert "return self.fc4(h3)\n" in companion.new.decode() and "binary_cross_entropy_with_logits(" in fused.code
    assert "torch.sigmoid(model.decode(z))" in fused.code and fusion.wrapped
    train.write_text(fused.code)
    Path(companion.key).write_bytes(companion.new)
    expected, same = _run_losses(original), _run_losses(fused_tree)
    assert len(same["losses"]) == 6 and same["losses"] == pytest.approx(expected["losses"], rel=1e-5)
    assert same["probabilities"] == pytest.approx(expected["probabilities"], abs=1e-6)
    assert expected["dtypes"] == same["dtypes"] == ["torch.float32"]
    converted = tmp_path / "converted"
    shutil.copytree(case / "expected", converted)
    mixed = _run_losses(converted)
    assert "torch.float16" in mixed["dtypes"], mixed["dtypes"]
    assert len(mixed["losses"]) == 6 and all(math.isfinite(loss) for loss in mixed["losses"]), mixed["losses"]


@pytest.mark.parametrize("backend, dtype, status", [("native", "float16", "1 would be changed (1 incomplete)"),
                                                    ("apex", "float16", "1 not converted"),
                                                    ("native", "bfloat16", "1 would be changed, 0")])
def test_a_gradient_penalty_of_another_module_is_found_through_re_exports_and_named(backend, dtype, status, tmp_path):
    """`gan.gradient_penalty(D, real, fake)`, re-exported by two star imports, runs
    torch.autograd.grad(create_graph=True) in a helper of its module: the step that adds it is
    refused with float16 (it would be differentiated unscaled), naming the file and line."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "gradient_penalty_in_package" / "input", tree)
    completed = subprocess.run([sys.executable, "-m", "ampify", "--check", "--backend", backend, "--dtype", dtype,
                                str(tree)], capture_output=True, text=True, cwd=tmp_path)
    assert status in completed.stdout.splitlines()[-1], completed.stdout
    named = "gan.gradient_penalty() runs torch.autograd.grad(..., create_graph=True) (torchprob/gan/gradient_penalty.py:11)"
    if dtype == "float16":
        assert named in completed.stdout, completed.stdout
    else:
        assert "gradient_penalty" not in completed.stdout.replace(str(tree), ""), completed.stdout


def test_a_gradient_penalty_of_another_module_scaled_there_equals_the_fp32_penalty(tmp_path):
    """gradient_penalty_in_package_scaled: torchprob's gradient_penalty() got `scaler=None` and scales
    the outputs it differentiates when given one. Called with a GradScaler under CPU float16
    autocast it computes the fp32 penalty (the scale divided out); without one it is unchanged; and
    the converted project trains (12 critic steps, the later ones finite)."""
    torch = pytest.importorskip("torch")
    import importlib
    import math

    case = ROOT / "fixtures" / "repositories" / "gradient_penalty_in_package_scaled"
    tree = tmp_path / "converted"
    shutil.copytree(case / "expected", tree)
    sys.path.insert(0, str(tree))
    try:
        for name in [m for m in sys.modules if m == "torchprob" or m.startswith("torchprob.")]:
            del sys.modules[name]
        penalty = importlib.import_module("torchprob.gan.gradient_penalty").gradient_penalty
    finally:
        sys.path.remove(str(tree))
    torch.manual_seed(0)
    D = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))
    real, fake = torch.randn(16, 8), torch.randn(16, 8)
    torch.manual_seed(1)
    fp32 = penalty(D, real, fake).item()
    torch.manual_seed(1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        scaled = penalty(D, real, fake, scaler=scaler).item()
    assert scaled == pytest.approx(fp32, rel=5e-2, abs=1e-3)
    completed = subprocess.run(
        [sys.executable, "-c", "import runpy, json, sys; sys.path.insert(0, '.'); "
                               "print(json.dumps(runpy.run_path('train.py')['LOSSES']))"],
        cwd=tree, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    losses = json.loads(completed.stdout.strip().splitlines()[-1])
    assert len(losses) == 12 and all(math.isfinite(d) and math.isfinite(gp) for d, gp in losses[4:]), losses


@pytest.mark.parametrize("workers", ["1", "2"])
def test_two_trainers_sharing_a_penalty_module_both_pass_their_scaler(tmp_path, workers):
    """train.py and train_dragan.py both call torchprob's gradient_penalty(): the change set written
    first scales it there; the second finds it scaled (not a parameter clash) and only passes its
    scaler. The penalty module is written once, as in the single-trainer golden."""
    case = ROOT / "fixtures" / "repositories" / "gradient_penalty_in_package_scaled"
    tree = tmp_path / "repo"
    shutil.copytree(case / "input", tree)
    (tree / "train_dragan.py").write_bytes((tree / "train.py").read_bytes())
    (tree / ".git").mkdir()
    completed = subprocess.run([sys.executable, "-m", "ampify", ".", "-j", workers], cwd=tree,
                               capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "3 changed" in completed.stdout.split("ampify: scanned")[-1], completed.stdout
    expected = case / "expected"
    assert (tree / "train.py").read_bytes() == (expected / "train.py").read_bytes()
    assert (tree / "train_dragan.py").read_bytes() == (expected / "train.py").read_bytes()
    penalty = "torchprob/gan/gradient_penalty.py"
    assert (tree / penalty).read_bytes() == (expected / penalty).read_bytes()


def test_a_script_training_wholly_through_a_trainer_of_another_module_named_alone_is_not_converted(tmp_path):
    """minGPT's chargpt.py: no optimizer and no backward() here, `Trainer(model).run()` of trainer.py
    trains. Named alone it stays float32, so it is "not converted" with AMP237 naming trainer.py (it
    said "no training code"); with the trainer in the run, trainer.py converts and run.py needs nothing."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "trainer.py").write_text(
        "import torch\n\n\nclass Trainer:\n    def __init__(self, model):\n        self.model = model\n\n"
        "    def run(self, batches):\n        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)\n"
        "        for x, y in batches:\n            loss = torch.nn.functional.mse_loss(self.model(x), y)\n"
        "            optimizer.zero_grad()\n            loss.backward()\n            optimizer.step()\n")
    (tmp_path / "run.py").write_text(
        "import torch\n\nfrom trainer import Trainer\n\nmodel = torch.nn.Linear(4, 1)\n"
        "Trainer(model).run([(torch.randn(2, 4), torch.randn(2, 1))])\n")
    alone = subprocess.run([sys.executable, "-m", "ampify", "run.py", "--check"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert alone.returncode == 1, alone.stdout + alone.stderr
    assert "run.py: not converted: the training step is in trainer.py, not in this run" in alone.stdout
    assert "AMP237 warning: Trainer() (trainer.py:4) runs this script's training step" in alone.stdout
    both = subprocess.run([sys.executable, "-m", "ampify", ".", "--check", "-v"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert "1 would be changed" in both.stdout and "AMP237" not in both.stdout, both.stdout


def test_apex_refuses_a_wrapper_that_clips_before_it_steps_under_o2(tmp_path):
    """optimizer_wrapper_classes/variants/apex (O1) hands apex the optimizer inside the wrapper
    (`optimizer._optimizer`): O1 keeps no master copy, so the gradients seq2seq's wrapper clips are the
    model's own, unscaled when amp.scale_loss exits. Under O2 apex steps float32 master copies, which
    that clip would not reach: the wrapper that clips is refused with that reason, the one that only
    schedules the learning rate converts."""
    case = ROOT / "fixtures" / "repositories" / "optimizer_wrapper_classes"
    tree = tmp_path / "repo"
    shutil.copytree(case / "input", tree)
    completed = subprocess.run(
        [sys.executable, "-m", "ampify", str(tree), "-j", "1", "--backend", "apex", "--opt-level", "O2", "--diff"],
        capture_output=True, text=True, cwd=tmp_path)
    assert completed.returncode in (0, 1), completed.stderr
    refusals = [line for line in completed.stdout.splitlines() + completed.stderr.splitlines() if "AMP317" in line]
    assert any("seq2seq_trainer.py" in line and "master copies" in line for line in refusals), refusals
    assert "model, optimizer._optimizer = amp.initialize(model, optimizer._optimizer, opt_level=\"O2\")" \
        in completed.stdout


def test_an_optimizer_another_module_applies_foreign_gradients_through_is_left_unwrapped(tmp_path):
    """tf1_a3c_global_optimizer: worker.py applies a local estimator's gradients with the global
    estimator's `.optimizer`, so estimators.py's optimizer is not wrapped (AMP115 there names
    worker.py's line). When the other module computes the gradients it applies with that same
    optimizer (`.optimizer.compute_gradients(...)`), the optimizer is wrapped as usual."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "tf1_a3c_global_optimizer" / "input", tree)
    refused = subprocess.run([sys.executable, "-m", "ampify", "--diff", str(tree)], capture_output=True, text=True,
                             cwd=tmp_path)
    assert "tf.train.RMSPropOptimizer not wrapped: worker.py:11 applies gradients through ValueEstimator's " \
           ".optimizer" in refused.stderr, refused.stderr
    assert refused.stdout == ""
    worker = tree / "worker.py"
    worker.write_text(worker.read_text().replace(
        "    local_grads, _ = zip(*local_estimator.grads_and_vars)\n",
        "    local_grads, _ = zip(*global_estimator.optimizer.compute_gradients(local_estimator.loss))\n"))
    converted = subprocess.run([sys.executable, "-m", "ampify", "--diff", str(tree)], capture_output=True,
                               text=True, cwd=tmp_path)
    assert "enable_mixed_precision_graph_rewrite(tf.train.RMSPropOptimizer(0.00025, 0.99, 0.0, 1e-6))" \
           in converted.stdout, converted.stderr
    assert "not wrapped: worker.py" not in converted.stderr
    # a subclass in another module applying gradients through what it inherits (baselines' MicrobatchedModel:
    # `self.trainer.apply_gradients(...)` of gradients the same optimizer computed) is no other object's optimizer
    (tree / "microbatched.py").write_text(
        "import tensorflow as tf\n"
        "from estimators import ValueEstimator\n\n\n"
        "class MicrobatchedEstimator(ValueEstimator):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.grads_ph = [tf.placeholder(tf.float32, v.shape) for _, v in self.grads_and_vars]\n"
        "        self.apply_op = self.optimizer.apply_gradients(zip(self.grads_ph, [v for _, v in self.grads_and_vars]))\n")
    subclass = subprocess.run([sys.executable, "-m", "ampify", "--diff", str(tree / "estimators.py")],
                              capture_output=True, text=True, cwd=tmp_path)
    assert "enable_mixed_precision_graph_rewrite(" in subclass.stdout, subclass.stderr


@pytest.mark.parametrize("setup", [
    "sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'lib'))",
    "sys.path.append(os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), '..', 'lib')))",
    "sys.path.insert(0, str(Path(__file__).resolve().parent.parent / 'lib'))",
    "HERE = Path(__file__).parent\nsys.path.insert(0, str(HERE.parent / 'lib'))",
    "sys.path.insert(0, '../lib')",
])
def test_folders_a_script_puts_on_sys_path_are_searched_for_its_imports(setup, tmp_path):
    """`python tools/train.py` with lib/ put on sys.path by the script itself (the forms below) finds
    `core.engine` in lib/; without such a line it is not found (nothing there on the default path)."""
    (tmp_path / "lib" / "core").mkdir(parents=True)
    (tmp_path / "lib" / "core" / "__init__.py").write_text("")
    (tmp_path / "lib" / "core" / "engine.py").write_text("def train_one_epoch(model, optimizer):\n    pass\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "setup.py").write_text("")
    script = tmp_path / "tools" / "train.py"
    script.write_text(f"import os\nimport sys\nfrom pathlib import Path\n{setup}\nfrom core.engine import train_one_epoch\n")
    index = RepositoryIndex(tmp_path)
    assert index.resolve_module(script, "core.engine") == (tmp_path / "lib" / "core" / "engine.py").resolve()
    script.write_text("import os\nimport sys\nfrom core.engine import train_one_epoch\n")
    assert RepositoryIndex(tmp_path).resolve_module(script, "core.engine") is None


def test_a_step_helper_called_from_other_modules_is_refused_naming_them(tmp_path):
    """The golden step_helper_in_a_base_class: BaseAgent.take_optimisation_step() is handed its
    losses by agents in other modules (p-christ's layout); converting the helper alone would leave
    their forward passes in float32 and their calls without the scaler, so it is refused naming
    the caller's module."""
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "fixtures" / "repositories" / "step_helper_in_a_base_class" / "input", tree)
    completed = subprocess.run([sys.executable, "-m", "ampify", "--check", str(tree)],
                               capture_output=True, text=True, cwd=tmp_path)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "take_optimisation_step() steps the loss it is handed, and is called from agents/dqn.py" in completed.stdout


def _losses_of(tree: Path) -> list:
    return _printed_json(tree, "import json, runpy; print(json.dumps(runpy.run_path('train.py')['LOSSES']))")


def test_a_sigmoid_fused_through_its_module_computes_the_fp32_losses_and_the_conversion_trains(tmp_path):
    """bce_model_reached_through_its_module: with network.py's sigmoid dropped and the criterion
    BCEWithLogitsLoss (the fusion alone, in float32), every loss equals the original's to 1e-6; the
    whole conversion (CPU float16 autocast, GradScaler) trains with finite losses."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "bce_model_reached_through_its_module"
    original, fused, converted = tmp_path / "original", tmp_path / "fused", tmp_path / "converted"
    shutil.copytree(case / "input", original)
    shutil.copytree(case / "input", fused)
    shutil.copytree(case / "expected", converted)
    shutil.copy(case / "expected" / "network.py", fused / "network.py")
    script = fused / "train.py"
    script.write_text(script.read_text().replace("nn.BCELoss()", "nn.BCEWithLogitsLoss()"))
    reference, fusion_only = _losses_of(original), _losses_of(fused)
    assert len(reference) == len(fusion_only) == 6
    assert fusion_only == pytest.approx(reference, rel=1e-6, abs=1e-6)
    trained = _losses_of(converted)
    assert len(trained) == 6 and all(math.isfinite(loss) for loss in trained), trained


_BASE_TRAINER_PROBE = """
import json, torch
import train
from trainer import Trainer
steps, dtypes = [], []
scaler_step = torch.amp.GradScaler.step
def counted(self, optimizer, *args, **kwargs):
    steps.append(type(optimizer).__name__)
    return scaler_step(self, optimizer, *args, **kwargs)
torch.amp.GradScaler.step = counted
make = train.MnistModel
def hooked(*args, **kwargs):
    model = make(*args, **kwargs)
    model.fc2.register_forward_hook(lambda m, i, o: dtypes.append(str(o.dtype)))
    return model
train.MnistModel = hooked
torch.manual_seed(0)
log = train.main({"epochs": 1, "lr": 0.01, "save_dir": "."})
state = torch.load("checkpoint.pth")
print(json.dumps({"loss": log["loss"], "steps": steps, "dtypes": dtypes, "saved": sorted(state)}))
"""


def test_a_trainer_whose_base_sets_the_optimizer_trains_in_float16_on_cpu(tmp_path):
    """pytorch-template's shape, converted: the subclass's scaler (created after the base's
    __init__, which sets self.optimizer) steps the optimizer the driver built, the forward passes
    run in float16 under CPU autocast, the loss stays near fp32's, and the base's checkpoint still
    saves (without the scaler: AMP224 says so)."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "optimizer_set_by_a_base_trainer"
    results = {}
    for side in ("input", "expected"):
        tree = tmp_path / side
        shutil.copytree(case / side, tree)
        completed = subprocess.run([sys.executable, "-c", _BASE_TRAINER_PROBE], cwd=tree, capture_output=True,
                                   text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        results[side] = json.loads(completed.stdout.strip().splitlines()[-1])
    original, converted = results["input"], results["expected"]
    assert original["steps"] == [] and original["dtypes"] == ["torch.float32"] * 3
    assert converted["steps"] == ["SGD"] * 3
    assert converted["dtypes"] == ["torch.float16"] * 3
    assert math.isfinite(converted["loss"]) and abs(converted["loss"] - original["loss"]) < 0.05
    assert converted["saved"] == original["saved"] == ["epoch", "optimizer", "state_dict"]


_TRIPLET_PROBE = """
import json, sys, torch
pow_ = torch.pow
def float32_pow(x, *args, **kwargs):
    # CUDA autocast runs torch.pow in float32 (its float32 list); CPU autocast does not: mimicked here
    if torch.is_autocast_enabled("cpu"):
        return pow_(x.float(), *args, **kwargs)
    return pow_(x, *args, **kwargs)
torch.pow = float32_pow
from losses import TripletLoss
torch.manual_seed(0)
features = torch.randn(8, 8)
targets = torch.arange(4).repeat(2)
reference = TripletLoss()(features, targets).item()
try:
    with torch.autocast("cpu", dtype=torch.float16):
        mixed = TripletLoss()(features.half(), targets).item()
    error = None
except RuntimeError as exc:
    mixed, error = None, str(exc)
losses = None
if "--train" in sys.argv:
    from engine.triplet import main
    losses = main()
print(json.dumps({"reference": reference, "mixed": mixed, "error": error, "losses": losses}))
"""


def test_an_inplace_product_of_the_loss_module_runs_under_autocast_once_cast(tmp_path):
    """deep-person-reid's triplet loss under autocast, with torch.pow in float32 as CUDA autocast runs
    it: the original `dist.addmm_(inputs, inputs.t())` raises (float32 receiver, float16 matrices);
    the companion rewrite's `inputs.to(dist.dtype)` runs, its loss equals fp32's to float16 precision,
    and the converted project trains three steps with finite losses."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "inplace_product_in_the_loss_module"
    results = {}
    for side, flags in (("input", []), ("expected", ["--train"])):
        tree = tmp_path / side
        shutil.copytree(case / side, tree)
        completed = subprocess.run([sys.executable, "-c", _TRIPLET_PROBE, *flags], cwd=tree, capture_output=True,
                                   text=True, timeout=300)
        assert completed.returncode == 0, completed.stderr
        results[side] = json.loads(completed.stdout.strip().splitlines()[-1])
    original, converted = results["input"], results["expected"]
    assert original["mixed"] is None and "same dtype" in original["error"]
    assert converted["error"] is None
    assert converted["mixed"] == pytest.approx(converted["reference"], rel=1e-2, abs=1e-2)
    assert converted["reference"] == pytest.approx(original["reference"], abs=1e-6)
    assert len(converted["losses"]) == 3 and all(math.isfinite(loss) for loss in converted["losses"])


def test_an_inplace_product_in_a_module_outside_the_run_is_said_and_leaves_the_conversion_incomplete(tmp_path):
    """Named alone, the engine converts (the loss module may be imported and never run by its step,
    as a package importing every loss is), says which module it could not cast (AMP250) and is
    "changed, incomplete"; the loss module is not written."""
    case = ROOT / "fixtures" / "repositories" / "inplace_product_in_the_loss_module"
    tree = tmp_path / "repo"
    shutil.copytree(case / "input", tree)
    completed = subprocess.run([sys.executable, "-m", "ampify", "engine/triplet.py", "--report", str(tmp_path / "r.json")],
                               cwd=tree, capture_output=True, text=True)
    assert completed.returncode in (0, 1), completed.stderr
    entry = json.loads((tmp_path / "r.json").read_text())["files"][0]
    assert entry["status"] == "changed, incomplete"
    warning = next(f for f in entry["findings"] if f["code"] == "AMP250")
    assert "losses/hard_mine_triplet_loss.py is not in this run" in warning["message"]
    assert (tree / "losses" / "hard_mine_triplet_loss.py").read_bytes() == \
        (case / "input" / "losses" / "hard_mine_triplet_loss.py").read_bytes()


def test_a_bce_of_a_sigmoid_in_the_discriminator_module_fused_computes_the_fp32_losses_then_trains(tmp_path):
    """MUNIT's layout: the discriminator of networks.py computes its own BCE of a sigmoid, which CUDA
    autocast refuses. Its companion rewrite (BCE with logits, no sigmoid) trains the fp32 project as
    the original does, to 1e-6; the converted project (the golden's expected tree) runs its forward
    passes in float16 under CPU autocast with finite losses, and no BCE on probabilities is left."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "bce_of_a_sigmoid_in_the_discriminator_module"
    original = tmp_path / "original"
    shutil.copytree(case / "input", original)
    fused_only = tmp_path / "fused"
    shutil.copytree(case / "input", fused_only)
    shutil.copy(case / "expected" / "networks.py", fused_only / "networks.py")
    networks = (fused_only / "networks.py").read_text()
    assert "binary_cross_entropy(" not in networks and networks.count("binary_cross_entropy_with_logits(") == 3
    expected, same = _run_losses(original), _run_losses(fused_only)
    reference = [value for pair in expected["losses"] for value in pair]
    assert len(same["losses"]) == 3 and [value for pair in same["losses"] for value in pair] == \
        pytest.approx(reference, abs=1e-6)
    assert expected["dtypes"] == same["dtypes"] == ["torch.float32"]
    converted = tmp_path / "converted"
    shutil.copytree(case / "expected", converted)
    mixed = _run_losses(converted)
    assert "torch.float16" in mixed["dtypes"], mixed["dtypes"]
    flat = [value for pair in mixed["losses"] for value in pair]
    assert len(flat) == 6 and all(math.isfinite(value) for value in flat), flat
    assert flat == pytest.approx(reference, rel=5e-2, abs=5e-3)


def test_two_loss_classes_binding_the_same_criterion_name_are_fused_apart_and_train(tmp_path):
    """Tramac's loss module: EncNetLoss applies self.bceloss to a sigmoid, OhemLoss builds its own
    self.bceloss and never calls it. Each class's name is its own: the first is fused (BCE with
    logits of the SE head), the second left as it is (no BCE runs); the converted project trains in
    float16 under CPU autocast with the fp32 project's losses, to float16 precision."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "bce_criteria_of_two_loss_classes"
    loss_module = (case / "expected" / "core" / "loss.py").read_text()
    assert loss_module.count("nn.BCEWithLogitsLoss(weight)") == 1 and loss_module.count("nn.BCELoss(weight)") == 1
    results = {}
    for side in ("input", "expected"):
        tree = tmp_path / side
        shutil.copytree(case / side, tree)
        results[side] = _run_losses(tree)
    original, converted = results["input"], results["expected"]
    assert original["dtypes"] == ["torch.float32"] and "torch.float16" in converted["dtypes"]
    assert len(converted["losses"]) == 3
    assert converted["losses"] == pytest.approx(original["losses"], rel=1e-2, abs=1e-2)


@pytest.mark.parametrize("backend, code", [("native", "AMP253"), ("apex", "AMP344")])
def test_a_loss_that_trains_its_discriminator_outside_the_run_makes_the_trainer_incomplete(backend, code, tmp_path):
    """EDSR's layout: the trainer's loss goes through `Adversarial.forward()`, which runs the
    discriminator's backward() and step(). Converted alone, the trainer says the inner step would
    run unscaled and names the module (changed, incomplete); with that module in the run (the
    golden `loss_that_trains_its_discriminator`), it is converted in its own right."""
    case = ROOT / "fixtures" / "repositories" / "loss_that_trains_its_discriminator" / "input"
    project = tmp_path / "project"
    shutil.copytree(case, project)
    (project / ".git").mkdir()
    result = subprocess.run([sys.executable, "-m", "ampify", "--check", f"--backend={backend}", "train.py"],
                            capture_output=True, text=True, cwd=project)
    assert "train.py: would be changed, incomplete" in result.stdout, result.stdout
    assert f"{code} warning: Adversarial.forward() (loss/adversarial.py:21)" in result.stdout, result.stdout
    assert "loss/adversarial.py is not in this run" in result.stdout
    whole = subprocess.run([sys.executable, "-m", "ampify", "--check", f"--backend={backend}", "."],
                           capture_output=True, text=True, cwd=project)
    assert code not in whole.stdout, whole.stdout


def test_two_penalty_functions_and_a_gram_matrix_of_one_module_are_one_edit_that_runs(tmp_path):
    """BasicSR's layout (two_penalties_and_a_gram_matrix_in_one_module): the step calls
    r1_penalty() and g_path_regularize() of losses.py, whose StyleLoss computes a Gram matrix. The
    three edits of losses.py are one (the second used to replace the first, and the step then
    passed `scaler=` to a function that did not take it). The converted project runs twelve
    iterations on the CPU under float16 autocast with a GradScaler: the first penalties overflow at
    GradScaler's first scales (those steps are skipped, as designed), the last ones are finite."""
    pytest.importorskip("torch")
    case = ROOT / "fixtures" / "repositories" / "two_penalties_and_a_gram_matrix_in_one_module"
    tree = tmp_path / "converted"
    shutil.copytree(case / "expected", tree)
    script = (tree / "train.py").read_text()
    script = script.replace('torch.device("cuda")', 'torch.device("cpu")').replace("range(1000)", "range(12)")
    script += "\n    print('losses', float(l_d), float(l_d_r1), float(l_g))\n"
    (tree / "train.py").write_text(script)
    completed = subprocess.run([sys.executable, "train.py"], capture_output=True, text=True, cwd=tree, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line.split()[1:] for line in completed.stdout.splitlines() if line.startswith("losses ")]
    assert len(lines) == 12 and all(math.isfinite(float(value)) for line in lines[-3:] for value in line), completed.stdout


def test_a_penalty_of_another_module_keeping_its_statistic_in_place_is_refused_with_float16(tmp_path):
    """losses.py's path length penalty keeps its running mean in the generator's buffer
    (`G.pl_mean.copy_(mean.detach())`, NVlabs' style) and computes the penalty from it: the
    overflowing steps GradScaler skips would leave it non-finite, so the step is refused with that
    reason (AMP212) and losses.py is not changed; with bfloat16 (no loss scaling) it converts."""
    case = ROOT / "fixtures" / "repositories" / "path_length_mean_fed_back" / "input"
    tree = tmp_path / "repo"
    shutil.copytree(case, tree)
    (tree / ".git").mkdir()
    (tree / "losses.py").write_text(
        "import torch\nfrom torch import autograd\n\n\n"
        "def g_path_regularize(G, fake_img, latents, decay=0.01):\n"
        "    noise = torch.randn_like(fake_img)\n"
        "    grad = autograd.grad(outputs=(fake_img * noise).sum(), inputs=latents, create_graph=True)[0]\n"
        "    path_lengths = torch.sqrt(grad.pow(2).sum(1))\n"
        "    path_mean = G.pl_mean.lerp(path_lengths.mean(), decay)\n"
        "    G.pl_mean.copy_(path_mean.detach())\n"
        "    return (path_lengths - path_mean).pow(2).mean()\n")
    train = (tree / "train.py").read_text()
    train = train.replace("l_g_path, mean_path_length = g_path_regularize(fake_img, latents, mean_path_length)",
                          "l_g_path = g_path_regularize(synthesis, fake_img, latents)")
    assert "g_path_regularize(synthesis," in train
    (tree / "train.py").write_text(train)
    before = (tree / "losses.py").read_bytes()
    completed = subprocess.run([sys.executable, "-m", "ampify", "--check", str(tree)],
                               capture_output=True, text=True, cwd=tmp_path)
    assert "AMP212" in completed.stdout and "keeps a running statistic of its gradients in G.pl_mean" in \
        completed.stdout, completed.stdout
    assert (tree / "losses.py").read_bytes() == before
    bf16 = subprocess.run([sys.executable, "-m", "ampify", "--check", "--dtype", "bfloat16", str(tree)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert "AMP212" not in bf16.stdout and "1 would be changed" in bf16.stdout, bf16.stdout


def test_a_step_fed_by_another_module_stays_plain_and_trains_as_in_float32(tmp_path):
    """architecture_gradients_from_another_module: alpha_optim's gradients come from
    architect.unrolled_backward() (architect.py), never scaled. The converted search.py leaves that
    step plain: run on CPU with a GradScaler and float16 autocast, the architecture parameters move
    as in float32 (through GradScaler they would have been divided by 65536), and the weights train."""
    torch = pytest.importorskip("torch")
    import importlib

    case = ROOT / "fixtures" / "repositories" / "architecture_gradients_from_another_module"

    def run(folder: Path, steps: int = 3):
        sys.path.insert(0, str(folder))
        try:
            for name in ("search", "architect"):
                sys.modules.pop(name, None)
            search = importlib.import_module("search")
            search.device = torch.device("cpu")
            source = (folder / "search.py").read_text()
            model = search.main(steps)
            return model, source
        finally:
            sys.path.remove(str(folder))
            for name in ("search", "architect"):
                sys.modules.pop(name, None)

    before = torch.zeros(8)
    fp32, _ = run(case / "input")
    mixed, source = run(case / "expected")
    assert "alpha_optim.step()" in source and "scaler.step(w_optim)" in source
    moved = (fp32.alpha.detach() - before).abs().max().item()
    assert moved > 1e-3, moved
    assert torch.allclose(mixed.alpha.detach(), fp32.alpha.detach(), rtol=5e-2, atol=moved * 5e-2)
    assert all(torch.isfinite(p).all() for p in mixed.parameters())


@pytest.mark.parametrize("initialized_elsewhere", [False, True])
def test_apex_scale_loss_with_no_initialize_in_the_file_names_where_it_runs(tmp_path, initialized_elsewhere):
    """taesungp/contrastive-unpaired-translation's cycle_gan_model.py scales its losses with apex
    under `if self.opt.amp:` and no module calls amp.initialize (apex raises at the first scaled
    step): said so, not "it runs in another module". When another module calls it, that one is named."""
    tree = tmp_path / "repo"
    (tree / "models").mkdir(parents=True)
    (tree / ".git").mkdir()
    (tree / "models" / "__init__.py").write_text("")
    (tree / "models" / "cycle_gan_model.py").write_text(
        "import torch\ntry:\n    from apex import amp\nexcept ImportError as error:\n    print(error)\n\n\n"
        "class CycleGANModel:\n    def __init__(self, opt, netD):\n        self.opt = opt\n        self.netD = netD\n"
        "        self.optimizer_D = torch.optim.Adam(netD.parameters(), lr=2e-4)\n\n"
        "    def optimize_parameters(self, fake, real):\n        self.optimizer_D.zero_grad()\n"
        "        loss_D = (self.netD(fake.detach()) - self.netD(real)).mean()\n        if self.opt.amp:\n"
        "            with amp.scale_loss(loss_D, self.optimizer_D) as scaled_loss:\n                scaled_loss.backward()\n"
        "        else:\n            loss_D.backward()\n        self.optimizer_D.step()\n")
    (tree / "train.py").write_text(
        "from models.cycle_gan_model import CycleGANModel\n" + (
            "from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
            if initialized_elsewhere else "model = CycleGANModel(opt, netD)\n"))
    completed = subprocess.run([sys.executable, "-m", "ampify", "--check", "models/cycle_gan_model.py"],
                               capture_output=True, text=True, cwd=tree)
    assert "AMP411" in completed.stdout, completed.stdout
    if initialized_elsewhere:
        assert "no amp.initialize in this file (it runs in train.py): migrate that one" in completed.stdout
    else:
        assert "no amp.initialize in this file nor in any other module of the repository" in completed.stdout
        assert "it runs in another module" not in completed.stdout


def test_a_logged_sigmoid_of_the_loss_module_stays_finite_when_the_discriminator_is_confident():
    """non_saturating_loss_in_the_loss_module: losses.py's `torch.sigmoid(logits)` then
    `torch.log(p + 1e-8)` takes a float32 copy of the logits in the converted tree. Run on CPU
    under float16 autocast with a discriminator whose logits sit near -20 (where a float16 sigmoid
    is 0 and its log -inf), the generator's loss is finite and equals the fp32 loss; the fp32 tree
    computes exactly what it did."""
    torch = pytest.importorskip("torch")
    import importlib

    case = ROOT / "fixtures" / "repositories" / "non_saturating_loss_in_the_loss_module"

    def run(folder: Path):
        sys.path.insert(0, str(folder))
        try:
            for name in ("train", "losses"):
                sys.modules.pop(name, None)
            train = importlib.import_module("train")
            train.device = torch.device("cpu")
            return train.main(steps=3, confident_bias=-20.0)
        finally:
            sys.path.remove(str(folder))
            for name in ("train", "losses"):
                sys.modules.pop(name, None)

    fp32 = run(case / "input")
    mixed = run(case / "expected")
    assert all(math.isfinite(loss) for loss in fp32) and fp32[0] > 15, fp32
    assert all(math.isfinite(loss) for loss in mixed), mixed
    assert mixed == pytest.approx(fp32, rel=1e-2)


def test_a_clamp_helper_of_a_model_package_picked_at_run_time_keeps_its_bound_in_float16():
    """model_module_picked_at_run_time: py_factory.py imports `models.<name>` by a name computed at
    run time; the package's modules are read, and CornerNet's `_sigmoid` clamp helper clamps a
    float32 copy in the converted tree. Fed float16 logits (what autocast hands it), the focal loss
    of a confident false positive stays finite and equals the fp32 loss; unchanged, it is inf."""
    torch = pytest.importorskip("torch")
    import importlib.util

    case = ROOT / "fixtures" / "repositories" / "model_module_picked_at_run_time"

    def load(tree: str):
        path = case / tree / "models" / "py_utils" / "kp_utils.py"
        spec = importlib.util.spec_from_file_location(f"kp_utils_{tree}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    logits = torch.full((1, 1, 4, 4), 10.0)  # confident everywhere
    gt = torch.zeros(1, 1, 4, 4)
    gt[0, 0, 0, 0] = 1.0  # one true corner; the others are confident false positives

    def loss(module, dtype):
        return module._neg_loss([module._sigmoid(logits.clone().to(dtype))], gt).float().item()

    original, converted = load("input"), load("expected")
    fp32 = loss(original, torch.float32)
    assert math.isfinite(fp32)
    assert not math.isfinite(loss(original, torch.float16))
    assert loss(converted, torch.float16) == pytest.approx(fp32, rel=1e-3)
    assert loss(converted, torch.float32) == fp32


@pytest.mark.parametrize("argument", ['"models.{}".format(name)', 'f"models.{name}"', '"models." + name',
                                      '"models.%s" % name', 'module_file'])
def test_a_module_picked_at_run_time_brings_its_package_into_the_import_closure(tmp_path, argument):
    (tmp_path / ".git").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "resnet.py").write_text("import torch\n")
    (tmp_path / "models" / "vgg.py").write_text("import torch\n")
    (tmp_path / "train.py").write_text(
        f"import importlib\nname = 'resnet'\nmodule_file = 'models.{{}}'.format(name)\n"
        f"net = importlib.import_module({argument})\n")
    index = RepositoryIndex(tmp_path)
    closure = {p.name for p in index.imported_closure(tmp_path / "train.py")}
    assert {"resnet.py", "vgg.py"} <= closure
    (tmp_path / "other.py").write_text("import importlib\nnet = importlib.import_module(name)\n")
    assert not {p.name for p in index.imported_closure(tmp_path / "other.py")}


def test_a_symlink_loop_in_a_package_picked_at_run_time_is_passed_over(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "resnet.py").write_text("import torch\n")
    (tmp_path / "models" / "loop.py").symlink_to(tmp_path / "models" / "loop.py")
    (tmp_path / "train.py").write_text("import importlib\nnet = importlib.import_module(f'models.{name}')\n")
    closure = {p.name for p in RepositoryIndex(tmp_path).imported_closure(tmp_path / "train.py")}
    assert "resnet.py" in closure and "loop.py" not in closure


@pytest.mark.parametrize("test, followed", [
    ("torch.__version__.startswith('0')", False),
    ("torch.__version__ < '1.0'", False),
    ("torch.__version__ <= '1.5.1'", False),
    ("torch.__version__.startswith('2')", True),
    ("torch.__version__ >= '1.0'", True),
    ("use_abn", True),
])
def test_the_import_closure_follows_dotted_and_function_imports_not_code_for_a_torch_before_autocast(
        tmp_path, test, followed):
    # DB's `import structure.model` and the loss its model imports inside __init__; HRNet's
    # bn_helper.py importing its compiled InPlaceABN only under a torch 0.x test
    (tmp_path / ".git").mkdir()
    (tmp_path / "structure").mkdir()
    (tmp_path / "structure" / "__init__.py").write_text("")
    (tmp_path / "structure" / "model.py").write_text(
        "import torch.nn as nn\n\n\nclass SegModel(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        from losses import BalanceLoss\n        self.criterion = BalanceLoss()\n")
    (tmp_path / "losses.py").write_text("import torch\n")
    (tmp_path / "abn.py").write_text("import torch\n")
    (tmp_path / "plain_bn.py").write_text("import torch\n")
    (tmp_path / "bn_helper.py").write_text(
        f"import torch\nuse_abn = False\nif {test}:\n    from abn import InPlaceABN as BatchNorm2d\n"
        "    def make():\n        import abn\nelse:\n    from plain_bn import BatchNorm2d\n")
    (tmp_path / "builder.py").write_text("import structure.model\nimport bn_helper\n")
    closure = {p.name for p in RepositoryIndex(tmp_path).imported_closure(tmp_path / "builder.py")}
    assert {"model.py", "losses.py", "plain_bn.py"} <= closure
    assert ("abn.py" in closure) == followed


def test_a_weight_average_of_another_module_steps_as_it_was_and_the_teacher_follows_on_cpu(tmp_path, monkeypatch):
    """self-ensemble's `teacher_optimizer = optim_weight_ema.EMAWeightOptimizer(teacher_net, student_net)`
    (a class of another module, imported inside the function, named like an optimizer): its step()
    averages weights and has no param_groups, so `scaler.step(teacher_optimizer)` would raise on the
    first batch. The converted experiment keeps it a plain step after the student's; run on CPU
    (float16 autocast, GradScaler("cpu") from scale 1, so that no first step is skipped for overflow),
    the student and the teacher end as the float32 run's do."""
    import functools

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=1.0))
    case = ROOT / "fixtures" / "repositories" / "weight_average_of_another_module"
    converted = (case / "expected" / "experiment_meanteacher.py").read_text()
    assert "        teacher_optimizer.step()\n" in converted and "scaler.step(teacher_optimizer)" not in converted
    results = {}
    for side, folder in (("fp32", case / "input"), ("amp", case / "expected")):
        sys.path.insert(0, str(folder))
        try:
            sys.modules.pop("optim_weight_ema", None)
            namespace = {"__name__": side}
            exec(compile((folder / "experiment_meanteacher.py").read_text(), f"{side}.py", "exec"), namespace)
            student, teacher = namespace["experiment"](torch.device("cpu"), steps=4)
        finally:
            sys.path.remove(str(folder))
            sys.modules.pop("optim_weight_ema", None)
        results[side] = [torch.cat([p.detach().flatten() for p in net.parameters()]) for net in (student, teacher)]
    for fp32, amp in zip(results["fp32"], results["amp"]):
        assert torch.allclose(amp, fp32, atol=5e-3), (amp - fp32).abs().max()
