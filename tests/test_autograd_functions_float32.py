"""Custom autograd Functions that break under autocast, decorated to run in float32
(autograd_functions_float32.py, AMP247): the rewrite, what it refuses, the conversion of a file with
its own Function, and a CPU run of PyTorch's recipe."""

import textwrap

import libcst as cst
import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options
from ampify.transforms.torch.autograd_functions_float32 import float32_functions

SPMM = textwrap.dedent('''\
    import torch


    class SpecialSpmm(torch.autograd.Function):
        """pyGAT's sparse product: backward() multiplies the incoming gradient with saved tensors."""

        @staticmethod
        def forward(ctx, indices, values, shape, b):
            a = torch.sparse_coo_tensor(indices, values, shape)
            ctx.save_for_backward(a, b)
            ctx.N = shape[0]
            return torch.matmul(a, b)

        @staticmethod
        def backward(ctx, grad_output):
            a, b = ctx.saved_tensors
            grad_values = grad_output.matmul(b.t())
            edge_idx = a._indices()[0, :] * ctx.N + a._indices()[1, :]
            grad_values = grad_values.view(-1)[edge_idx]
            grad_b = a.t().matmul(grad_output)
            return None, grad_values, None, grad_b
    ''')


def test_forward_and_backward_get_the_decorators_below_staticmethod():
    functions, refused = float32_functions(cst.parse_module(SPMM), ["SpecialSpmm"])
    assert refused is None
    assert functions.module.code == SPMM.replace(
        "    @staticmethod\n    def forward",
        '    @staticmethod\n    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)\n    def forward',
    ).replace(
        "    @staticmethod\n    def backward",
        '    @staticmethod\n    @torch.amp.custom_bwd(device_type="cuda")\n    def backward',
    )
    assert functions.decorated == [("SpecialSpmm", 4)] and functions.devices == ("cuda",)
    assert float32_functions(functions.module, ["SpecialSpmm"]) == (None, None)


def test_a_function_built_inside_a_function_is_decorated_too():
    source = textwrap.dedent('''\
        from torch import autograd


        def conv2d_gradfix(weight_shape):
            class Conv2d(autograd.Function):
                @staticmethod
                def forward(ctx, input, weight):
                    return input

                @staticmethod
                def backward(ctx, grad_output):
                    return grad_output, None

            return Conv2d
        ''')
    functions, refused = float32_functions(cst.parse_module(source), ["Conv2d"])
    assert refused is None
    assert functions.module.code.startswith("import torch\nfrom torch import autograd\n")
    assert '        @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)\n        def forward' \
        in functions.module.code


@pytest.mark.parametrize("source, reason", [
    ("class F(Function):\n    def forward(self, x):\n        return x\n", "is no @staticmethod (a legacy Function)"),
    ("class F(Function):\n    pass\n", "has no forward() of its own"),
    ("class F(Function):\n    @staticmethod\n    def forward(ctx, x):\n        return x\n"
     "class F(Function):\n    @staticmethod\n    def forward(ctx, x):\n        return x\n", "2 classes are named F"),
])
def test_what_it_cannot_decorate_is_refused_with_the_reason(source, reason):
    functions, refused = float32_functions(cst.parse_module("import torch\nfrom torch.autograd import Function\n" + source),
                                           ["F"])
    assert functions is None and reason in refused


TRAIN = SPMM + textwrap.dedent('''\


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x, indices, values):
            h = self.fc(x)
            return SpecialSpmm.apply(indices, values, torch.Size([8, 8]), h)


    device = torch.device("cuda")
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    indices = torch.tensor([[0, 1, 2], [1, 2, 3]], device=device)
    for step in range(3):
        x = torch.randn(8, 8, device=device)
        values = torch.rand(3, device=device)
        optimizer.zero_grad()
        loss = model(x, indices, values).pow(2).mean()
        loss.backward()
        optimizer.step()
    ''')


def test_a_training_file_with_its_own_function_converts_with_it_decorated():
    conversion = convert_source(TRAIN, Options())
    assert conversion.status is FileStatus.CHANGED, conversion
    assert '@torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)' in conversion.converted
    assert "scaler.scale(loss).backward()" in conversion.converted
    assert any(f.code == "AMP247" and f.line == 4 for f in conversion.findings), conversion.findings
    assert convert_source(conversion.converted, Options()).status is FileStatus.ALREADY_MIXED_PRECISION


def test_apex_still_refuses_it():
    conversion = convert_source(TRAIN, Options(backend="apex"))
    assert conversion.status is FileStatus.UNCONVERTED
    assert any(f.code == "AMP334" for f in conversion.findings)


def test_the_recipe_on_cpu_the_decorated_function_runs_in_float32_where_the_plain_one_raises():
    """PyTorch's recipe, shown with the CPU's device type (ampify writes "cuda"): under float16
    autocast the plain Function's backward() multiplies the float16 gradient with a float32 tensor
    it saved and raises; decorated, it runs in float32 and its gradients equal the fp32 ones."""
    torch = pytest.importorskip("torch")
    decorated = float32_functions(cst.parse_module(SPMM), ["SpecialSpmm"])[0].module.code
    plain_namespace, decorated_namespace = {}, {}
    exec(compile(SPMM, "<plain>", "exec"), plain_namespace)
    exec(compile(decorated.replace('"cuda"', '"cpu"'), "<decorated>", "exec"), decorated_namespace)
    indices = torch.tensor([[0, 1, 2], [1, 2, 3]])
    values = torch.rand(3, requires_grad=True)
    weight = torch.randn(4, 4, requires_grad=True)

    def gradients(function, autocast):
        values.grad = weight.grad = None
        with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=autocast):
            b = torch.mm(torch.ones(4, 4), weight)  # float16 under autocast
            out = function.apply(indices, values, torch.Size([4, 4]), b)
        out.float().sum().backward()
        return values.grad.clone(), weight.grad.clone(), out.dtype

    reference = gradients(plain_namespace["SpecialSpmm"], autocast=False)
    with pytest.raises(RuntimeError):
        gradients(plain_namespace["SpecialSpmm"], autocast=True)
    values_grad, weight_grad, dtype = gradients(decorated_namespace["SpecialSpmm"], autocast=True)
    assert dtype == torch.float32
    assert torch.allclose(values_grad, reference[0], rtol=1e-2, atol=1e-2)
    assert torch.allclose(weight_grad, reference[1], rtol=1e-2, atol=1e-2)


def test_a_converted_script_that_may_pick_the_cpu_runs_there_with_the_cpu_decorators_too(tmp_path):
    """The golden input custom_function_backward_convolves_the_saved_weight picks
    `"cuda" if torch.cuda.is_available() else "cpu"`: its Function gets the "cuda" and the "cpu"
    decorators, and the converted script trains on this CPU under float16 autocast with finite
    losses; without the decorators its first backward() raises."""
    pytest.importorskip("torch")
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "fixtures" / "torch_native"
              / "custom_function_backward_convolves_the_saved_weight.in.py").read_text()
    conversion = convert_source(source, Options())
    assert conversion.status is FileStatus.CHANGED, conversion
    code = conversion.converted.replace("range(100)", "range(2)")
    assert code.count('device_type="cpu"') == 2 and code.count('device_type="cuda"') == 2
    code += "\nLOSS = loss.item()\n"
    namespace = {"__name__": "converted"}
    exec(compile(code, "<converted>", "exec"), namespace)
    assert namespace["LOSS"] == namespace["LOSS"] and abs(namespace["LOSS"]) < float("inf")
    undecorated = "\n".join(line for line in code.splitlines() if "custom_fwd" not in line and "custom_bwd" not in line)
    with pytest.raises(RuntimeError):
        exec(compile(undecorated, "<undecorated>", "exec"), {"__name__": "undecorated"})
