"""Gram matrix functions of another module rewritten to compute in float32 (gram_matrix_float32.py),
as companions of the training file's conversion: the rewrite itself, what it refuses, and a CPU run
of a converted two-module project whose float16 style loss is finite only with the rewrite."""

import json
import subprocess
import sys

import libcst as cst
import pytest

from ampify.transforms.torch.gram_matrix_float32 import float32_gram_functions

UTILS = '''\
import torch


def gram_matrix(y):
    """The Gram matrix of a batch of feature maps."""
    (b, ch, h, w) = y.size()
    features = y.view(b, ch, w * h)
    features_t = features.transpose(1, 2)
    gram = features.bmm(features_t) / (ch * h * w)
    return gram
'''


def test_the_function_body_runs_with_autocast_off_on_a_float32_copy():
    rewritten, refused = float32_gram_functions(cst.parse_module(UTILS), ["gram_matrix"])
    assert refused is None
    assert rewritten.module.code == UTILS.replace('''    (b, ch, h, w) = y.size()
    features = y.view(b, ch, w * h)
    features_t = features.transpose(1, 2)
    gram = features.bmm(features_t) / (ch * h * w)
    return gram''', '''    with torch.autocast(device_type=y.device.type, enabled=False):
        y = y.float()
        (b, ch, h, w) = y.size()
        features = y.view(b, ch, w * h)
        features_t = features.transpose(1, 2)
        gram = features.bmm(features_t) / (ch * h * w)
        return gram''')
    assert rewritten.rewritten == [("gram_matrix", 4)]
    # a second run finds nothing left to do
    assert float32_gram_functions(rewritten.module, ["gram_matrix"]) == (None, None)


def test_a_module_without_torch_gets_the_import():
    source = "def gram(t, normalize=True):\n    f = t.reshape(t.size(0), t.size(1) * t.size(2))\n    return f @ f.T\n"
    rewritten, _ = float32_gram_functions(cst.parse_module(source), ["gram"])
    assert rewritten.module.code.startswith("import torch\n")
    assert "with torch.autocast(device_type=t.device.type, enabled=False):\n        t = t.float()" in rewritten.module.code


@pytest.mark.parametrize("signature, reason", [
    ("def gram(x, y):", "takes more than one required argument"),
    ("def gram(*features):", "takes *args or **kwargs"),
    ("def gram():", "takes no feature map"),
    ("async def gram(x):", "is a coroutine"),
])
def test_functions_it_cannot_tell_are_refused_with_the_reason(signature, reason):
    source = f"import torch\n\n\n{signature}\n    f = x.view(2, 3 * 4)\n    return torch.mm(f, f.t())\n"
    rewritten, refused = float32_gram_functions(cst.parse_module(source), ["gram"])
    assert rewritten is None and reason in refused


@pytest.mark.parametrize("line", ["x.div_(255.0)", "x[:, 0] = 0"])
def test_a_function_changing_its_argument_in_place_is_refused(line):
    source = f"import torch\n\n\ndef gram(x):\n    {line}\n    f = x.view(2, 3 * 4)\n    return torch.mm(f, f.t())\n"
    rewritten, refused = float32_gram_functions(cst.parse_module(source), ["gram"])
    assert rewritten is None and "a float32 copy would no longer do for the caller" in refused


def test_a_method_of_a_model_class_is_rewritten_after_self():
    source = ("import torch\n\n\nclass GramMatrix(torch.nn.Module):\n    def forward(self, y, normalize=True):\n"
              "        f = y.view(y.size(0), y.size(1) * y.size(2))\n        return torch.mm(f, f.t())\n")
    rewritten, refused = float32_gram_functions(cst.parse_module(source), ["GramMatrix.forward"])
    assert refused is None and rewritten.rewritten == [("GramMatrix.forward", 5)]
    assert ("    def forward(self, y, normalize=True):\n"
            "        with torch.autocast(device_type=y.device.type, enabled=False):\n"
            "            y = y.float()\n") in rewritten.module.code
    assert float32_gram_functions(rewritten.module, ["GramMatrix.forward"]) == (None, None)


def test_a_function_defined_twice_is_refused():
    source = ("import torch\n\n\ndef gram(x):\n    f = x.view(2, 3 * 4)\n    return torch.mm(f, f.t())\n\n\n"
              "def gram(x):\n    f = x.view(2, 3 * 4)\n    return torch.mm(f, f.t()) / 12\n")
    rewritten, refused = float32_gram_functions(cst.parse_module(source), ["gram"])
    assert rewritten is None and "defined 2 times" in refused


def test_a_name_that_is_no_function_nor_method_is_refused():
    source = "import torch\n\n\nclass G:\n    def gram(self, x):\n        f = x.view(2, 12)\n        return torch.mm(f, f.t())\n"
    rewritten, refused = float32_gram_functions(cst.parse_module(source), ["gram"])
    assert rewritten is None and "not a function defined at the module's top level" in refused


TRAIN = '''\
import json
import sys

import torch
import torch.nn as nn

import utils

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 100.0


model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
mse_loss = nn.MSELoss()
x = torch.rand(2, 3, 64, 64, device=device)
with torch.no_grad():
    target = utils.gram_matrix(model(x).float()) * 0.5  # a style target of the same scale

losses = []
for step in range(2):
    optimizer.zero_grad()
    features = model(x)
    loss = mse_loss(utils.gram_matrix(features), target)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
json.dump({"losses": losses}, sys.stdout)
'''


def _run(folder):
    completed = subprocess.run([sys.executable, "train.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return json.loads(completed.stdout)


def test_a_converted_style_loss_is_finite_only_with_its_gram_matrix_in_float32(tmp_path):
    """The project converted by the CLI (train.py, and utils.py as its companion) runs two float16
    steps on CPU with finite losses equal to the fp32 ones (the Gram matrix is float32, the features
    float16); the same train.py with the original utils.py has an inf loss at every step."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "setup.py").write_text("")
    (project / "utils.py").write_text(UTILS)
    (project / "train.py").write_text(TRAIN)
    fp32 = _run(project)
    assert all(0 < loss < float("inf") for loss in fp32["losses"])

    converted = subprocess.run([sys.executable, "-m", "ampify", str(project), "-j", "1"],
                               capture_output=True, text=True, cwd=tmp_path)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert "AMP245" in converted.stdout
    assert "torch.autocast(device_type=y.device.type, enabled=False)" in (project / "utils.py").read_text()
    train = (project / "train.py").read_text()
    assert "scaler.scale(loss).backward()" in train and "torch.autocast(" in train

    mixed = _run(project)
    for ours, theirs in zip(mixed["losses"], fp32["losses"]):
        assert ours == pytest.approx(theirs, rel=2e-2)

    (project / "utils.py").write_text(UTILS)  # the companion edit undone: the float16 Gram matrix overflows
    broken = _run(project)
    assert broken["losses"] == [float("inf")] * 2


def test_a_gram_matrix_module_outside_the_run_refuses_the_training_file(tmp_path):
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "utils.py").write_text(UTILS)
    (tmp_path / "train.py").write_text(TRAIN)
    completed = subprocess.run([sys.executable, "-m", "ampify", "--check", str(tmp_path / "train.py")],
                               capture_output=True, text=True, cwd=tmp_path)
    assert "train.py: not converted" in completed.stdout
    assert "AMP238" in completed.stdout
    assert "utils.py is not in this run: run ampify on both files or on the repository" in completed.stdout


def test_a_gram_matrix_function_of_the_training_file_runs_in_float32_under_cpu_autocast():
    """The golden gram_matrix_function_in_the_training_file, converted, run on this CPU: the Gram
    matrix comes out float32 inside the float16 autocast region, and the loss is finite."""
    torch = pytest.importorskip("torch")
    from pathlib import Path

    converted = (Path(__file__).resolve().parent.parent / "fixtures" / "torch_native"
                 / "gram_matrix_function_in_the_training_file.out.py").read_text()
    code = converted.replace("range(10)", "range(2)") + (
        "\nwith torch.autocast(device_type=device.type, dtype=torch.float16):\n"
        "    GRAM_DTYPE = gram_matrix(net(x)).dtype\nLOSS = loss.item()\n")
    namespace = {"__name__": "converted"}
    exec(compile(code, "<converted>", "exec"), namespace)
    assert namespace["GRAM_DTYPE"] == torch.float32
    assert abs(namespace["LOSS"]) < float("inf")


@pytest.mark.parametrize("imports, product", [
    ("import torch as th", "th.bmm(f, th.transpose(f, 1, 2))"),
    ("from torch import bmm", "bmm(f, f.transpose(1, 2))"),
    ("from torch import bmm as batch_mm", "batch_mm(f, f.transpose(1, 2))"),
])
def test_a_gram_matrix_through_an_alias_of_torch_is_found(imports, product):
    import ast

    from ampify.transforms.torch.gram_matrix_functions import gram_matrix_line, torch_names

    tree = ast.parse(f"{imports}\n\n\ndef gram(t):\n    f = t.view(2, 3, 4 * 5)\n    return {product}\n")
    assert gram_matrix_line(tree.body[1], torch_names(tree)) == 6
    assert gram_matrix_line(tree.body[1]) == 0  # without the module's names: not taken for torch's
