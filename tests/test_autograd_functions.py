"""Custom autograd Functions that break under autocast (AMP241 / apex AMP334): found in the training
file and in the model code it imports, refused naming each one; dtype-agnostic Functions and
Functions already decorated with custom_fwd convert. The premise is shown on CPU autocast: a
backward() convolving the reduced-precision gradient with the float32 weight it saved raises, and
custom_fwd(cast_inputs=torch.float32) / custom_bwd, the fix the warning names, makes it train. A Function
whose backward() ignores the gradient it receives drops the loss scale (AMP242 / apex AMP335, float16
only): shown with GradScaler on CPU."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.transforms.torch.autograd_functions import unsafe_autograd_functions

CONV_FUNCTION = '''
class Conv(torch.autograd.Function):
    {decorator_fwd}
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return F.conv2d(x, w, padding=1)

    {decorator_bwd}
    def backward(ctx, grad_output):
        x, w = ctx.saved_tensors
        grad_x = F.conv_transpose2d(grad_output, w, padding=1)
        grad_w = torch.nn.grad.conv2d_weight(x, w.shape, grad_output, padding=1)
        return grad_x, grad_w
'''


def conv_function(device_type: str = "", fixed: bool = False) -> str:
    if fixed:
        return CONV_FUNCTION.format(
            decorator_fwd=f"@staticmethod\n    @torch.amp.custom_fwd(device_type=\"{device_type}\", cast_inputs=torch.float32)",
            decorator_bwd=f"@staticmethod\n    @torch.amp.custom_bwd(device_type=\"{device_type}\")")
    return CONV_FUNCTION.format(decorator_fwd="@staticmethod", decorator_bwd="@staticmethod")


GRADIENT_REVERSAL = '''
class GradReverse(Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg() * ctx.alpha, None
'''

STRAIGHT_THROUGH = '''
class StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inputs, codebook):
        indices = torch.argmin(torch.cdist(inputs, codebook), dim=1)
        ctx.save_for_backward(indices, codebook)
        return torch.index_select(codebook, 0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        indices, codebook = ctx.saved_tensors
        grad_codebook = torch.zeros_like(codebook)
        grad_codebook.index_add_(0, indices, grad_output)
        return grad_output.clone(), grad_codebook
'''

EXTENSION_LOADED = '''
import torch
from torch.autograd import Function
from torch.utils.cpp_extension import load

fused = load("fused", sources=["fused_bias_act.cpp", "fused_bias_act_kernel.cu"])


class FusedLeakyReLUFunction(Function):
    @staticmethod
    def forward(ctx, input, bias, negative_slope, scale):
        empty = input.new_empty(0)
        return fused.fused_bias_act(input, bias, empty, 3, 0, negative_slope, scale)
'''


@pytest.mark.parametrize("source,expected", [
    ("import torch\nimport torch.nn.functional as F\n" + conv_function(), [(4, "Conv", "conv_transpose2d()")]),
    ("import torch\nimport torch.nn.functional as F\n" + conv_function("cuda", fixed=True), []),
    ("from torch.autograd import Function\n" + GRADIENT_REVERSAL, []),
    ("import torch\n" + STRAIGHT_THROUGH, []),
    (EXTENSION_LOADED, [(9, "FusedLeakyReLUFunction", "compiled extension fused.fused_bias_act()")]),
    ("import torch\nimport DCN_cuda\nclass DeformConv(torch.autograd.Function):\n    @staticmethod\n"
     "    def forward(ctx, x, offset):\n        return DCN_cuda.forward(x, offset)\n",
     [(3, "DeformConv", "compiled extension DCN_cuda.forward()")]),
    ("import torch\nfrom . import _C\nclass ROIAlign(torch.autograd.Function):\n    @staticmethod\n"
     "    def forward(ctx, x, rois):\n        return _C.roi_align_forward(x, rois)\n",
     [(3, "ROIAlign", "compiled extension _C.roi_align_forward()")]),
    ("import torch\nclass Lin(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x, w):\n"
     "        ctx.save_for_backward(x, w)\n        return x @ w.t()\n    @staticmethod\n"
     "    def backward(ctx, g):\n        x, w = ctx.saved_tensors\n        return g @ w, g.t() @ x\n",
     [(2, "Lin", "multiplies matrices (`@`)")]),
])
def test_which_functions_break_under_autocast(source, expected):
    found = unsafe_autograd_functions(ast.parse(source))
    assert [(line, name) for line, name, _ in found] == [(line, name) for line, name, _ in expected]
    for (_, _, why), (_, _, words) in zip(found, expected):
        assert words in why, why


TRAINING = '''
for step in range(3):
    inputs = torch.randn(2, 3, 8, 8, device=device)
    loss = model(inputs).float().pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def model_module(function_source: str) -> str:
    return textwrap.dedent('''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        ''') + function_source + textwrap.dedent('''

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.stem = nn.Conv2d(3, 3, 1)
                self.weight = nn.Parameter(torch.randn(4, 3, 3, 3) * 0.1)

            def forward(self, x):
                return Conv.apply(self.stem(x), self.weight)
        ''')


def driver(device: str) -> str:
    return textwrap.dedent(f'''
        import torch
        from model import Net

        device = torch.device("{device}")
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        ''') + TRAINING


def run_ampify(*args):
    return subprocess.run([sys.executable, "-m", "ampify", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONIOENCODING="utf-8"))


@pytest.mark.parametrize("backend,code", [("native", "AMP241"), ("apex", "AMP334")])
def test_a_function_in_the_imported_model_code_blocks_the_training_file(tmp_path, backend, code):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'gan'\n")
    (tmp_path / "model.py").write_text(model_module(conv_function()))
    (tmp_path / "train.py").write_text(driver("cuda"))
    before = (tmp_path / "train.py").read_bytes()
    run = run_ampify("--diff", "--backend", backend, tmp_path / "train.py")
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert f"train.py:13:5: {code} warning: model.py:6 Conv: its backward() runs conv_transpose2d()" in output, output
    assert "train.py: not converted: a custom autograd Function breaks under" in output
    assert (tmp_path / "train.py").read_bytes() == before


def test_decorated_as_the_warning_says_the_project_converts(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'gan'\n")
    (tmp_path / "model.py").write_text(model_module(conv_function("cuda", fixed=True)))
    (tmp_path / "train.py").write_text(driver("cuda"))
    run = run_ampify("--diff", tmp_path / "train.py")
    assert run.returncode == 0 and "AMP241" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert "scaler.scale(loss).backward()" in run.stdout


def test_a_function_in_the_training_file_itself_is_decorated_without_a_project():
    """Found in the training file's own tree (no project): decorated there (AMP247) and the step
    converts; on apex, which ignores the decorators, still refused (AMP334)."""
    source = model_module(conv_function()) + "\nmodel = Net()\ndevice = 'cuda'\noptimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n" + TRAINING
    conversion = convert_source(source, Options())
    assert conversion.status is FileStatus.CHANGED, conversion
    assert any(f.code == "AMP247" and "Conv (line 6)" in f.message for f in conversion.findings), conversion.findings
    assert '@torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)' in conversion.converted
    apex = convert_source(source, Options(backend="apex"))
    assert apex.status is FileStatus.UNCONVERTED, apex
    assert any(f.code == "AMP334" and "line 6 Conv" in f.message for f in apex.findings), apex.findings


@pytest.mark.parametrize("fixed", [False, True])
def test_the_premise_on_cpu_autocast(tmp_path, fixed):
    """Unfixed: the first backward raises (dtype mismatch in the Function's backward); decorated as
    the warning says (device "cpu" here), the step runs and the loss is finite."""
    (tmp_path / "model.py").write_text(model_module(conv_function("cpu", fixed=fixed)))
    script = textwrap.dedent('''
        import torch
        from model import Net

        torch.manual_seed(0)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(2):
            inputs = torch.randn(2, 3, 8, 8)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(inputs).float().pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print("finite", bool(torch.isfinite(loss)))
        ''')
    (tmp_path / "run.py").write_text(script)
    run = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    if fixed:
        assert run.returncode == 0 and "finite True" in run.stdout, run.stderr
    else:
        assert run.returncode != 0 and "should be the same" in run.stderr, run.stderr


def test_functions_are_found_through_folders_the_entry_script_puts_on_sys_path(tmp_path):
    """faster-rcnn.pytorch: trainval_net.py does `import _init_paths` (lib/ on sys.path), imports
    model.faster_rcnn.vgg16, which imports model.faster_rcnn.faster_rcnn from lib/ too (only the
    entry script put it there), which runs RoIPoolFunction over a compiled extension."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'detector'\n")
    (tmp_path / "_init_paths.py").write_text(
        "import os.path as osp\nimport sys\n\nsys.path.insert(0, osp.join(osp.dirname(__file__), 'lib'))\n")
    lib = tmp_path / "lib" / "model"
    (lib / "faster_rcnn").mkdir(parents=True)
    (lib / "roi_pooling").mkdir()
    for folder in (lib, lib / "faster_rcnn", lib / "roi_pooling"):
        (folder / "__init__.py").write_text("")
    (lib / "roi_pooling" / "roi_pool.py").write_text(textwrap.dedent('''
        import torch
        from torch.autograd import Function
        from ._ext import roi_pooling


        class RoIPoolFunction(Function):
            @staticmethod
            def forward(ctx, features, rois):
                output = features.new_zeros(rois.size(0), features.size(1), 7, 7)
                roi_pooling.roi_pooling_forward_cuda(7, 7, 0.0625, features, rois, output)
                return output
        '''))
    (lib / "faster_rcnn" / "faster_rcnn.py").write_text(textwrap.dedent('''
        import torch.nn as nn
        from model.roi_pooling.roi_pool import RoIPoolFunction


        class FasterRCNN(nn.Module):
            def forward(self, features, rois):
                return RoIPoolFunction.apply(features, rois).mean()
        '''))
    (lib / "faster_rcnn" / "vgg16.py").write_text("from model.faster_rcnn.faster_rcnn import FasterRCNN\n\n\n"
                                                  "class vgg16(FasterRCNN):\n    pass\n")
    (tmp_path / "trainval_net.py").write_text(textwrap.dedent('''
        import _init_paths
        import torch
        from model.faster_rcnn.vgg16 import vgg16

        model = vgg16().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for features, rois in loader:
            loss = model(features.cuda(), rois.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        '''))
    run = run_ampify("--diff", tmp_path / "trainval_net.py")
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    assert "AMP241 warning: lib/model/roi_pooling/roi_pool.py:7 RoIPoolFunction: its forward() calls the compiled " \
           "extension roi_pooling.roi_pooling_forward_cuda()" in output, output


GRADIENT_DROPPING = '''
class SquaredError(torch.autograd.Function):
    @staticmethod
    def forward(ctx, acts, targets):
        ctx.grads = 2 * (acts - targets) / acts.numel()
        return ((acts - targets) ** 2).mean()

    @staticmethod
    def backward(ctx, grad_output):
        return {returned}, None
'''


@pytest.mark.parametrize("returned,dropped", [
    ("ctx.grads", True),  # warp-ctc before August 2020
    ("ctx.grads * grad_output", False),
    ("ctx.grads.mul_(grad_output.to(ctx.grads.device))", False),
])
def test_which_functions_drop_the_incoming_gradient(returned, dropped):
    from ampify.transforms.torch.autograd_functions import gradient_dropping_functions
    tree = ast.parse(textwrap.dedent(GRADIENT_DROPPING.format(returned=returned)) + GRADIENT_REVERSAL
                     + "\nclass NotDifferentiable(Function):\n    @staticmethod\n    def backward(ctx, *grads):\n"
                       "        return None, None\n")
    found = gradient_dropping_functions(tree)
    assert [name for _, name, _ in found] == (["SquaredError"] if dropped else []), found


def test_binding_imports_are_found_anywhere_in_the_module():
    from ampify.transforms.torch.autograd_functions import gradient_dropping_imports
    tree = ast.parse("import torch\nif opt.baiduCTC:\n    from warpctc_pytorch import CTCLoss\n"
                     "def f():\n    import warprnnt_pytorch as rnnt\nfrom warp_rnnt_other import x\n")
    assert gradient_dropping_imports(tree) == [(3, "warpctc_pytorch"), (5, "warprnnt_pytorch")]


@pytest.mark.parametrize("backend,dtype,code,converted", [
    ("native", "float16", "AMP242", False), ("apex", "float16", "AMP335", False), ("native", "bfloat16", None, True)])
def test_a_gradient_dropping_function_in_the_imported_code_blocks_float16_only(tmp_path, backend, dtype, code, converted):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'ocr'\n")
    (tmp_path / "losses.py").write_text("import torch\n" + textwrap.dedent(GRADIENT_DROPPING.format(returned="ctx.grads")))
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import torch
        from losses import SquaredError

        device = torch.device("cuda")
        model = torch.nn.Linear(8, 4).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(4, 8, device=device)
            loss = SquaredError.apply(model(x).float(), torch.zeros(4, 4, device=device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        '''))
    run = run_ampify("--diff", "--backend", backend, "--dtype", dtype, tmp_path / "train.py")
    output = run.stdout + run.stderr
    if converted:
        assert run.returncode == 0 and "AMP242" not in output and "torch.autocast" in run.stdout, output
    else:
        assert run.returncode == 1, output
        assert f"{code} warning: losses.py:3 SquaredError: its backward() never reads the incoming gradient" in output
        assert "train.py: not converted: a custom autograd Function drops" in output


@pytest.mark.parametrize("multiplies", [False, True])
def test_the_premise_a_dropped_gradient_loses_the_scale(multiplies):
    """GradScaler on CPU: through a Function that returns its precomputed gradient, the parameters'
    gradients after unscale_ are the fp32 ones divided by the scale (65536); multiplying by grad_output
    gives the fp32 gradients back."""
    namespace = {"torch": torch_module()}
    exec(textwrap.dedent(GRADIENT_DROPPING.format(returned="ctx.grads * grad_output" if multiplies else "ctx.grads")),
         namespace)
    torch = namespace["torch"]
    function = namespace["SquaredError"]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    function.apply(model(x), y).backward()
    reference = model.weight.grad.clone()
    model.zero_grad()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(function.apply(model(x), y)).backward()
    scaler.unscale_(optimizer)
    ratio = (reference.norm() / model.weight.grad.norm()).item()
    if multiplies:
        assert torch.allclose(model.weight.grad, reference, rtol=1e-5, atol=1e-7)
    else:
        assert ratio == pytest.approx(65536.0, rel=1e-4)


def torch_module():
    import torch
    return torch
