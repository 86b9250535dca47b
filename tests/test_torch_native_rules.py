"""Focused checks of the native transform that golden files do not show well."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus, Severity
from ampify.options import Options
from ampify.transforms.torch import native_amp as torch_native_amp
from ampify.transforms.kit.imports import ImportMap
from ampify.rules import BY_CODE as RULES
from ampify.transforms.torch.native_amp import TorchNativeAmp
from ampify.transforms.torch.training_loop import analyze_training


def test_bytes_keep_crlf_and_tab_indentation():
    source = b"import torch\r\nopt = torch.optim.SGD(p)\r\nfor x in loader:\r\n\tloss = model(x)  # fwd\r\n\tloss.backward()\r\n\topt.step()\r\n"
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED
    assert conversion.converted == (
        b"import torch\r\nopt = torch.optim.SGD(p)\r\nscaler = torch.amp.GradScaler(\"cuda\")\r\n"
        b"for x in loader:\r\n\twith torch.autocast(device_type=\"cuda\", dtype=torch.float16):\r\n"
        b"\t\tloss = model(x)  # fwd\r\n\tscaler.scale(loss).backward()\r\n\tscaler.step(opt)\r\n\tscaler.update()\r\n"
    )


def test_an_analysis_that_raises_leaves_the_file_unchanged_with_the_internal_error_code(monkeypatch):
    """One policy for every target (tests/test_rules.py): AMP200 for this one, also for RecursionError."""
    def broken(*args, **kwargs):
        raise RecursionError("deep")

    monkeypatch.setattr(torch_native_amp, "analyze_training", broken)
    conversion = convert_source("import torch\nfor x in data:\n    loss = model(x)\n    loss.backward()\n    opt.step()\n")
    assert conversion.converted is None and conversion.status.value == "not converted"
    assert [(f.code, f.severity) for f in conversion.findings] == [("AMP200", Severity.ERROR)]
    assert "RecursionError: deep" in conversion.findings[0].message


def test_every_emitted_code_is_documented():
    source = (
        "import torch\nopt = torch.optim.SGD(p)\nfor x in loader:\n    loss = model(x)\n"
        "    loss.backward()\n    torch.nn.utils.clip_grad_norm_(p, 1.0)\n    opt.step()\n"
        "torch.save({'opt': opt.state_dict()}, 'c.pt')\n"
    )
    conversion = convert_source(source)
    codes = {f.code for f in conversion.findings}
    assert codes == {"AMP201", "AMP202", "AMP203", "AMP204", "AMP205", "AMP206", "AMP216"}
    assert codes <= set(RULES)


def test_apex_backend_leaves_the_file_to_the_apex_transform():
    source = "import torch\nopt = torch.optim.SGD(p)\nfor x in l:\n    loss = m(x)\n    loss.backward()\n    opt.step()\n"
    transform = TorchNativeAmp()
    assert not transform.may_apply(source.encode(), Options(backend="apex"))
    assert transform.may_apply(source.encode(), Options())


def test_insertion_point_after_both_branches_of_an_if():
    source = textwrap.dedent(
        """
        import torch
        def main(args):
            if args.sgd:
                optimizer = torch.optim.SGD(p, lr=0.1)
            else:
                optimizer = torch.optim.Adam(p)
            for x in loader:
                loss = model(x)
                loss.backward()
                optimizer.step()
        """
    )
    module = cst.parse_module(source)
    structure = analyze_training(module, ImportMap.from_module(module))
    bindings = [b.statement for b in structure.bindings if b.name == "optimizer"]
    loop = structure.units[0].owner
    anchor = structure.insertion_point(bindings, [loop])
    assert isinstance(anchor, cst.If)
    assert structure.insertion_point([loop], bindings) is None

    conversion = convert_source(source)
    assert "        optimizer = torch.optim.Adam(p)\n    scaler = torch.amp.GradScaler(" in conversion.converted


def test_bfloat16_adds_no_scaler_and_keeps_closures_reported():
    source = "import torch\nopt = torch.optim.SGD(p)\nfor x in l:\n    loss = m(x)\n    loss.backward()\n    opt.step()\n"
    conversion = convert_source(source, Options(dtype="bfloat16"))
    assert "GradScaler" not in conversion.converted and "scaler" not in conversion.converted
    assert "dtype=torch.bfloat16" in conversion.converted
    assert {f.code for f in conversion.findings} == {"AMP201", "AMP216"}


def test_to_dtype_or_tensor_is_not_taken_for_a_device():
    source = textwrap.dedent(
        """
        import torch
        dtype = torch.float32
        opt = torch.optim.SGD(p)
        for x, y in loader:
            x = x.to(dtype)
            y = y.to(x)
            loss = model(x, y)
            loss.backward()
            opt.step()
        """
    )
    conversion = convert_source(source)
    assert "torch.device(dtype)" not in conversion.converted and "torch.device(x)" not in conversion.converted
    assert 'device_type="cuda"' in conversion.converted
    assert any(f.code == "AMP216" and f.severity is Severity.WARNING for f in conversion.findings)


def test_import_torch_inside_a_function_does_not_count():
    source = textwrap.dedent(
        """\
        from torch import optim

        def make(params):
            import torch
            return torch.optim.SGD(params, lr=0.1)

        optimizer = make(p)
        for x in loader:
            loss = model(x)
            loss.backward()
            optimizer.step()
        """
    )
    conversion = convert_source(source)
    assert conversion.converted.startswith("import torch\nfrom torch import optim\n")


def test_aliased_torch_is_used_as_is():
    source = "import torch as th\nopt = th.optim.SGD(p)\nfor x in l:\n    loss = m(x)\n    loss.backward()\n    opt.step()\n"
    converted = convert_source(source).converted
    assert "th.autocast(" in converted and "th.amp.GradScaler(" in converted and "import torch\n" not in converted


def test_class_attribute_is_not_taken_for_the_module_variable():
    source = textwrap.dedent(
        """\
        import torch

        class Config:
            optimizer = torch.optim.SGD(params, lr=0.1)

        for x in loader:
            loss = model(x)
            loss.backward()
            optimizer.step()
        """
    )
    conversion = convert_source(source)
    assert conversion.status is FileStatus.UNCONVERTED
    assert "scaler" not in (conversion.converted or "")
    assert any(
        f.code == "AMP215" and "no assignment to optimizer that the module body can see" in f.message
        for f in conversion.findings
    ), [f.message for f in conversion.findings]


def test_scaler_in_init_waits_for_a_device_set_after_the_optimizers():
    """StarGAN's Solver sets self.device a line after the optimizers: the scaler is created after
    it (and uses it); created before it, `self.device.type` would raise AttributeError."""
    torch = __import__("pytest").importorskip("torch")
    source = textwrap.dedent(
        """\
        import torch
        from torch import nn


        class Solver:
            def __init__(self, lr):
                self.G = nn.Linear(4, 4)
                self.D = nn.Linear(4, 1)
                self.g_optimizer = torch.optim.Adam(self.G.parameters(), lr)
                self.d_optimizer = torch.optim.Adam(self.D.parameters(), lr)
                self.device = torch.device("cpu")
                self.G.to(self.device)

            def train_step(self, x):
                d_loss = self.D(self.G(x).detach()).mean() - self.D(x).mean()
                self.d_optimizer.zero_grad()
                d_loss.backward()
                self.d_optimizer.step()
                g_loss = -self.D(self.G(x)).mean()
                self.g_optimizer.zero_grad()
                g_loss.backward()
                self.g_optimizer.step()
                return d_loss.item(), g_loss.item()
        """
    )
    conversion = convert_source(source, Options())
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    lines = conversion.converted.splitlines()
    assert lines.index("        self.scaler = torch.amp.GradScaler(self.device.type)") == (
        lines.index('        self.device = torch.device("cpu")') + 1
    )
    assert not [f for f in conversion.findings if f.severity is Severity.WARNING]
    namespace: dict = {}
    exec(compile(conversion.converted, "solver.py", "exec"), namespace)
    solver = namespace["Solver"](1e-3)
    assert isinstance(solver.scaler, torch.amp.GradScaler)
    losses = solver.train_step(torch.randn(8, 4))
    assert all(loss == loss for loss in losses)


def test_autocast_and_the_scaler_never_disagree_on_the_device_in_any_golden():
    """A GradScaler on the script's device with autocast hard-coded to "cuda" (or the reverse)
    keeps scaling on a CPU run while autocast has switched itself off (issue #12, item 10)."""
    import re

    from golden import discover_cases

    checked = 0
    for case in discover_cases("torch_native"):
        if not case.output_path.exists():
            continue
        text = case.output_path.read_text()
        scalers = re.findall(r"amp\.GradScaler\(([^\n]*)\)[ \t]*$", text, flags=re.M)
        autocasts = re.findall(r"autocast\(device_type=(.+?), dtype=", text)
        if len(scalers) != 1 or not autocasts:
            continue  # several scalers: several training steps, each may have its own device
        checked += 1
        literal = {'"cuda"'}
        kinds = {"literal" if device.strip() in literal else "script" for device in [*scalers, *autocasts]}
        assert len(kinds) == 1, (case.id, scalers, autocasts)
    assert checked >= 15


def test_an_optimizer_created_on_every_call_of_a_looped_function_says_its_scaler_restarts():
    """meliketoy/wide-resnet.pytorch builds its optimizer inside train(epoch) (a new learning rate
    each epoch), called once per epoch: the GradScaler made beside it restarts its loss scale
    every call, and the finding says so. Called once, nothing is added to the message."""
    looped = textwrap.dedent("""\
        import torch

        def train(epoch):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1 / (epoch + 1))
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(net(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()

        for epoch in range(10):
            train(epoch)
        """)
    for source, says in ((looped, True), (looped.replace("for epoch in range(10):\n    train(epoch)", "train(0)"), False)):
        conversion = convert_source(source)
        assert conversion.status is FileStatus.CHANGED
        created = [f.message for f in conversion.findings if f.code == "AMP204"]
        assert len(created) == 1
        assert ("train() creates its optimizer on every call" in created[0]) is says, created[0]


def test_the_bce_warning_names_every_sigmoid_when_there_are_several():
    """ClusterGAN: the generator's image output ends in a Sigmoid, the discriminator adds one under a
    flag; the BCE warning names both lines, not only the first (the generator's, which BCE never reads)."""
    source = textwrap.dedent('''\
        import torch
        import torch.nn as nn

        generator = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid()).cuda()
        discriminator = nn.Sequential(nn.Linear(8, 1))
        if not wass:
            discriminator = nn.Sequential(discriminator, nn.Sigmoid())
        discriminator = discriminator.cuda()
        bce_loss = nn.BCELoss()
        optimizer = torch.optim.Adam(discriminator.parameters())
        for z, real in loader:
            optimizer.zero_grad()
            loss = bce_loss(discriminator(generator(z)), real)
            loss.backward()
            optimizer.step()
        ''')
    result = convert_source(source, Options(), filename="clustergan.py")
    [warning] = [f for f in result.findings if f.code == "AMP210"]
    assert "nn.Sigmoid at lines 4 and 7: drop the one that ends the model feeding this loss" in warning.message


def test_optimizers_drawn_from_a_list_in_the_loop_convert_one_step_and_update_per_iteration():
    """MorvanZhou's optimizer comparison trains four nets, `for net, opt in zip(nets, optimizers)`:
    each iteration of that loop is a whole training step, so it gets scaler.step(opt) and its
    update(), the scaler created with the list. A list built in the loop header (`zip(nets,
    [sgd, adam])`) is not followed: refused, saying the optimizer is a loop variable over a
    collection (it used to say that the optimizer is created inside the training loop)."""
    source = textwrap.dedent("""\
        import torch
        nets = [torch.nn.Linear(2, 1) for _ in range(2)]
        optimizers = [torch.optim.SGD(nets[0].parameters(), lr=0.1), torch.optim.Adam(nets[1].parameters())]
        for x, y in loader:
            for net, opt in zip(nets, optimizers):
                loss = torch.nn.functional.mse_loss(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        """)
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED, conversion.findings
    assert "scaler.scale(loss).backward()\n        scaler.step(opt)\n        scaler.update()" in conversion.converted
    assert conversion.converted.index("scaler = torch.amp.GradScaler") > conversion.converted.index("optimizers = [")
    literal = source.replace("zip(nets, optimizers)", "zip(nets, [optimizers[0], optimizers[1]])")
    refused = convert_source(literal)
    assert refused.status is FileStatus.UNCONVERTED and refused.converted is None
    (finding,) = [f for f in refused.findings if f.code == "AMP215"]
    assert "opt is a loop variable, drawn from a collection of optimizers in the loop" in finding.message


def test_gradients_reduced_across_ranks_by_hand_are_refused_with_that_reason_on_both_backends():
    """cleanrl's multi-GPU PPO all-reduces `.grad` by hand: unscaling before it (where ampify puts
    unscale_ for `.grad` reads) lets ranks disagree on skipped steps, so both backends refuse, and
    say so (this used to be refused as a parameter update by hand, for `offset += param.numel()`)."""
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "fixtures" / "torch_native"
              / "gradients_all_reduced_by_hand.in.py").read_text()
    for backend, code in (("native", "AMP215"), ("apex", "AMP317")):
        conversion = convert_source(source, Options(backend=backend))
        assert conversion.status is FileStatus.UNCONVERTED and conversion.converted is None
        (finding,) = [f for f in conversion.findings if f.code == code]
        assert finding.message.startswith("the gradients are reduced across ranks by hand after this backward() "
                                          "(torch.distributed.all_reduce, line 24)"), finding.message


def test_a_hand_update_through_a_name_bound_to_the_gradient_is_still_caught():
    """`d_p = p.grad.data; p.data.add_(d_p, alpha=-lr)` in the branch where the optimizer does not step:
    loss scaling would hand it scaled gradients (a counter beside a gradient edit is not such an update)."""
    source = textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            model.zero_grad()
            loss.backward()
            if use_optimizer:
                optimizer.step()
            else:
                for p in model.parameters():
                    if p.grad is not None:
                        d_p = p.grad.data
                        p.data.add_(d_p, alpha=-0.1)
        """)
    conversion = convert_source(source)
    assert conversion.status is FileStatus.UNCONVERTED
    assert [f.code for f in conversion.findings] == ["AMP226"]


@pytest.mark.parametrize("case, reason", [
    ("optimizer_may_be_none",
     "encoder_optimizer may be None (line 17: `encoder_optimizer = ... if fine_tune_encoder else None`)"),
    ("optimizer_stepped_when_not_none",
     "encoder_optimizer is stepped only under `if encoder_optimizer:` (line 31)"),
])
def test_an_optimizer_that_may_be_none_converts_natively_and_apex_refuses_naming_it(case, reason):
    """a-PyTorch-Tutorial-to-Image-Captioning's encoder optimizer is None unless fine-tuning: apex's
    amp.initialize([...], [decoder_optimizer, None]) and amp.scale_loss(loss, [..., None]) fail on
    it (the script crashed by default), while a GradScaler steps only the optimizers that exist."""
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "fixtures" / "torch_native" / f"{case}.in.py").read_text()
    native = convert_source(source)
    assert native.status is FileStatus.CHANGED
    apex = convert_source(source, Options(backend="apex"))
    assert apex.status is FileStatus.UNCONVERTED and apex.converted is None
    (finding,) = [f for f in apex.findings if f.code == "AMP317"]
    assert reason in finding.message and "--backend native" in finding.message


_STEPPED_TWICE = """\
import torch
import torch.nn as nn

model = nn.Linear(4, 1).cuda()
other = nn.Linear(4, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
other_optimizer = torch.optim.SGD(other.parameters(), lr=0.1)
for x in loader:
    optimizer.zero_grad()
    loss = model(x).mean()
    loss.backward()
    optimizer.step()
{between}
    second = model(x).pow(2).mean()
    second.backward()
    optimizer.step()
{after}
"""


@pytest.mark.parametrize("between, after, reason", [
    # gradients of the first backward are still there at the second step: the update() between
    # would rescale them
    ("", "    other_optimizer.zero_grad()\n    third = other(x).mean()\n    third.backward()\n    other_optimizer.step()",
     "no optimizer.zero_grad() and backward() between line 12 and its step at line 16"),
    # the steps after the first are all conditional, and not the same optimizer's alone: an
    # update() in the first branch could leave the other's step without one, one after both could
    # run with no step since the last
    ("    optimizer.zero_grad()",
     "    if x.mean() > 0:\n        other_optimizer.zero_grad()\n        third = other(x).mean()\n"
     "        third.backward()\n        other_optimizer.step()",
     "leave the iteration's last update() without a step that always runs after it"),
])
def test_an_optimizer_stepped_twice_is_refused_when_an_update_between_would_be_wrong(between, after, reason):
    source = _STEPPED_TWICE.format(between=between, after=after)
    if between:
        source = source.replace("    second.backward()\n    optimizer.step()",
                                "    if x.sum() > 0:\n        second.backward()\n        optimizer.step()")
    conversion = convert_source(source)
    assert conversion.status is FileStatus.UNCONVERTED, conversion.status
    (finding,) = [f for f in conversion.findings if "stepped twice" in f.message]
    assert "optimizer is stepped twice in one iteration" in finding.message and reason in finding.message, finding.message


def test_an_optimizer_stepped_again_in_a_last_branch_gets_the_last_update_in_that_branch():
    """stylegan2's lazy regularization: the generator is stepped for its loss, then again in
    `if g_regularize:`; update() follows the first step, and the iteration's last update() goes
    after the conditional step, in its branch (never after the `if`, where it would run with no
    step since the previous update() whenever the branch is skipped)."""
    source = _STEPPED_TWICE.format(between="    optimizer.zero_grad()", after="").replace(
        "    second.backward()\n    optimizer.step()",
        "    if x.sum() > 0:\n        second.backward()\n        optimizer.step()")
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED, conversion.findings
    tail = conversion.converted.split("optimizer.zero_grad()\n", 2)[2]
    assert tail.endswith(
        "    with torch.autocast(device_type=\"cuda\", dtype=torch.float16):\n"
        "        second = model(x).pow(2).mean()\n"
        "    if x.sum() > 0:\n"
        "        scaler.scale(second).backward()\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n\n"), tail
    assert conversion.converted.count("scaler.update()") == 2


def test_an_optimizer_stepped_twice_gets_an_update_after_its_first_step():
    source = _STEPPED_TWICE.format(
        between="    optimizer.zero_grad()",
        after="    other_optimizer.zero_grad()\n    third = other(x).mean()\n    third.backward()\n    other_optimizer.step()")
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED
    lines = conversion.converted.splitlines()
    steps = [i for i, line in enumerate(lines) if "scaler.step(optimizer)" in line]
    assert len(steps) == 2 and lines[steps[0] + 1].strip() == "scaler.update()"
    assert sum(line.strip() == "scaler.update()" for line in lines) == 2


LOG_HEADER = """import torch
import torch.nn as nn
import torch.nn.functional as F


"""


@pytest.mark.parametrize("code, flagged", [
    # a Sequential ending in nn.Sigmoid, its output logged (directly, 1 - p, clamped, as a method)
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\np = D(x)\nloss = torch.log(1 - p + 1e-8)", True),
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = torch.log(D(x).view(-1))", True),
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = D(x).clamp(1e-7, 1 - 1e-7).log()", True),
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = torch.log1p(-D(x))", True),
    # a class whose forward returns a sigmoid, its instance moved to the device
    ("class Net(nn.Module):\n    def forward(self, x):\n        return torch.sigmoid(self.fc(x))\n\n"
     "net = Net().to(device)\nloss = torch.log(net(x) + 1e-8)", True),
    # a DCGAN-style class: a Sequential attribute ending in Sigmoid, its output reshaped
    ("class Disc(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.main = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n\n    def forward(self, x):\n"
     "        out = self.main(x)\n        return out.view(-1, 1).squeeze(1)\n\n"
     "netD = Disc()\nloss = -torch.mean(torch.log(1. - netD(x)))", True),
    # a helper taking the log, a function returning a tuple with the probability first
    ("def log(x):\n    return torch.log(x + 1e-8)\n\nD_gan = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n\n"
     "def D(x):\n    return D_gan(x), x\n\nD_real, _ = D(x)\nloss = log(D_real)", True),
    # a sigmoid applied in the step
    ("probs = torch.sigmoid(logits)\nloss = torch.log(probs)", True),
    # `1 - x` logged in a file whose model ends in a sigmoid, x not followed (a model picked from a dict)
    ("D = {'model': nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())}\nloss = torch.log(1 - D['model'](x))", True),
    # ... but not `1 - exp(-x)`: exp runs in float32 under autocast, and it is no sigmoid's probability
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = torch.log(1 - torch.exp(-rate * t))", False),
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = torch.log(1. - (-x).exp() + 1e-8)", False),
    # an epsilon of 1e-3 (also through a module constant): finite in float16
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = torch.log(1 - D(x) + 1e-3)", False),
    ("EPS = 1e-3\nD = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = torch.log(D(x) + EPS)", False),
    # softmax probabilities (autocast runs softmax in float32), a model not ending in a sigmoid
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = torch.log(F.softmax(y, 1))", False),
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nC = nn.Sequential(nn.Linear(4, 1), nn.ReLU())\n"
     "loss = torch.log(C(x) + 1e-8)", False),
    # logged before the sigmoid / logsigmoid: nothing to flag
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nloss = F.logsigmoid(logits) + torch.log(var + 1e-8)", False),
    # GAIL's predict_reward(): a log taken with gradients off feeds no loss (it runs from the rollout loop)
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nwith torch.no_grad():\n    s = D(x)\n"
     "    reward = s.log() - (1 - s).log()", False),
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\n\n@torch.no_grad()\ndef reward(x):\n    s = D(x)\n"
     "    return s.log() - (1 - s).log()", False),
    ("D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nwith torch.no_grad():\n    pass\nloss = torch.log(D(x))", True),
])
def test_the_log_of_a_sigmoid_probability_is_told_from_other_logs(code, flagged):
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.training_loop import HazardKind, analyze_training

    module = cst.parse_module(LOG_HEADER + code + "\n")
    structure = analyze_training(module, ImportMap.from_module(module))
    assert any(h.kind is HazardKind.LOG_OF_PROBABILITY for h in structure.hazards) is flagged


def test_a_loss_summed_by_a_helper_from_log_probabilities_kept_during_the_rollout_is_refused_natively():
    """p-christ's REINFORCE: the policy runs while acting (pick_action stores its log-probability
    through another method) and actor_learn() gets the loss from a helper method that only sums the
    kept list. The autocast region around that helper held no model: the file was written
    "changed" and trained in float32. The native backend now refuses, naming the helper; apex
    converts (O1 patches the functions the policy calls wherever it runs, no region needed)."""
    source = textwrap.dedent("""\
        import torch
        from torch.distributions import Categorical

        class Agent:
            def __init__(self):
                self.device = torch.device("cuda")
                self.policy = torch.nn.Linear(4, 2).to(self.device)
                self.optimizer = torch.optim.Adam(self.policy.parameters())
                self.log_probabilities = []

            def act(self, state):
                probabilities = torch.softmax(self.policy(state.to(self.device)), -1)
                distribution = Categorical(probabilities)
                action = distribution.sample()
                self.store(distribution.log_prob(action))
                return action

            def store(self, log_probability):
                self.log_probabilities.append(log_probability)

            def policy_loss(self, reward):
                losses = []
                for log_probability in self.log_probabilities:
                    losses.append(-log_probability * reward)
                return torch.cat(losses).sum()

            def learn(self, reward):
                loss = self.policy_loss(reward)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        """)
    apex = convert_source(source, Options(backend="apex"))
    assert apex.status is FileStatus.CHANGED and "amp.scale_loss(loss, self.optimizer)" in apex.converted
    for backend, code in (("native", "AMP215"),):
        conversion = convert_source(source, Options(backend=backend))
        assert conversion.status is FileStatus.UNCONVERTED and conversion.converted is None, backend
        (finding,) = [f for f in conversion.findings if f.code == code]
        assert "the loss of backward() is computed from tensors made elsewhere: line 28, which computes it, calls no " \
               "model" in finding.message and "policy_loss(), of this file, runs none" in finding.message, finding.message
    # the same helper reading a model output computed in the step itself still converts
    converted = convert_source(source.replace(
        "loss = self.policy_loss(reward)",
        "self.log_probabilities = [torch.log_softmax(self.policy(reward), -1)]\n        loss = self.policy_loss(reward)"))
    assert converted.status is FileStatus.CHANGED
    assert "with torch.autocast(" in converted.converted


def test_a_model_written_out_as_a_function_of_raw_tensors_is_still_a_forward_pass():
    """`def model(x): return x @ w + b` over tensors an optimizer trains calls no module, but its
    matmul is what autocast runs in float16: the step converts (a helper is taken to run no
    model only when it also calls none of the ops autocast lowers)."""
    for body in ("return x @ w + b", "return torch.mm(x, w) + b", "return torch.nn.functional.linear(x, w.t(), b)"):
        source = textwrap.dedent(f"""\
            import torch
            device = torch.device("cuda")
            w = torch.randn(4, 2, device=device, requires_grad=True)
            b = torch.zeros(2, device=device, requires_grad=True)
            optimizer = torch.optim.SGD([w, b], lr=0.1)

            def model(x):
                {body}

            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """)
        conversion = convert_source(source)
        assert conversion.status is FileStatus.CHANGED, (body, conversion.findings)
        assert "    with torch.autocast(device_type=device.type, dtype=torch.float16):\n" \
               "        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))\n" in conversion.converted


def test_a_scheduler_object_called_on_self_before_the_forward_pass_stays_out_of_the_autocast_region():
    """pytorch-deeplab-xception calls `self.scheduler(self.optimizer, i, epoch, best)` (an object
    stored on self) before zero_grad() and the forward pass: a dropped self-call that runs a model
    for its effect (pix2pix's `self.forward()`) starts the region, a stored callable object does not."""
    source = textwrap.dedent("""\
        import torch

        class Trainer:
            def __init__(self, model, scheduler):
                self.model = model.cuda()
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
                self.scheduler = scheduler

            def training(self, loader, epoch):
                for i, (image, target) in enumerate(loader):
                    self.scheduler(self.optimizer, i, epoch)
                    self.optimizer.zero_grad()
                    output = self.model(image.cuda())
                    loss = torch.nn.functional.cross_entropy(output, target.cuda())
                    loss.backward()
                    self.optimizer.step()
        """)
    converted = convert_source(source).converted
    assert (
        "            self.scheduler(self.optimizer, i, epoch)\n"
        "            self.optimizer.zero_grad()\n"
        '            with torch.autocast(device_type="cuda", dtype=torch.float16):\n'
        "                output = self.model(image.cuda())\n"
    ) in converted, converted


def test_the_backward_of_an_lbfgs_closure_is_not_reported_as_a_hidden_optimizer():
    """pytorch/examples' time_sequence_prediction steps LBFGS with a closure that runs backward():
    the file is refused for the closure (AMP211 / AMP311), and that is the only warning (it used to
    add AMP220, "no optimizer step ... wrapped or hidden optimizer?", for the closure's backward)."""
    source = textwrap.dedent("""\
        import torch
        model = torch.nn.Linear(3, 1).cuda()
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8)
        for i in range(10):
            def closure():
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
        """)
    for backend, code in (("native", "AMP211"), ("apex", "AMP311")):
        conversion = convert_source(source, Options(backend=backend))
        assert conversion.status is FileStatus.UNCONVERTED and conversion.converted is None
        assert [f.code for f in conversion.findings if f.severity is Severity.WARNING] == [code], conversion.findings


_STEP_WITH_INPUT_GRADIENTS = textwrap.dedent("""\
    import torch
    import torch.nn.functional as F
    device = torch.device("cuda")
    model = torch.nn.Linear(8, 4).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


    def saliency(x, y):
        x = x.to(device).requires_grad_(True)
        return torch.autograd.grad(F.cross_entropy(model(x), y.to(device)), x)[0].abs()


    for x, y in loader:
        x, y = x.to(device).requires_grad_(True), y.to(device)
        clean_loss = F.cross_entropy(model(x), y)
        GRADIENT
        loss = clean_loss + F.cross_entropy(model((x + 0.1 * x_grad.sign()).detach()), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    """)


@pytest.mark.parametrize("gradient, native_status", [
    ("x_grad = torch.autograd.grad(clean_loss, x, retain_graph=True)[0]", FileStatus.CHANGED),
    ("x_grad = torch.autograd.grad(clean_loss, x, retain_graph=True, allow_unused=True)[0]", FileStatus.UNCONVERTED),
    # unpacked from the tuple (stylegan2's R1 writes it so): each unpacked name is divided
    ("x_grad, = torch.autograd.grad(clean_loss, x, retain_graph=True)", FileStatus.CHANGED),
    ("x_grad = torch.autograd.grad(clean_loss, x, retain_graph=True)[0].detach()", FileStatus.UNCONVERTED),
])
def test_an_autograd_grad_in_the_step_is_scaled_where_it_can_be_and_refused_elsewhere(gradient, native_status):
    """FGSM in the step: an assigned `torch.autograd.grad(loss, x)[0]` (or `x_grad, = ...`) is scaled
    (AMP230); gradients that may be None (allow_unused) or a form not followed are refused (AMP212);
    apex refuses every one (AMP312). The saliency function outside the training loop is not flagged."""
    source = _STEP_WITH_INPUT_GRADIENTS.replace("GRADIENT", gradient)
    native = convert_source(source)
    assert native.status is native_status, native.findings
    codes = [f.code for f in native.findings if f.severity is Severity.WARNING]
    if native_status is FileStatus.CHANGED:
        assert "torch.autograd.grad(scaler.scale(clean_loss), x, retain_graph=True)" in native.converted
        assert "x_grad = x_grad / scaler.get_scale()" in native.converted
        assert "torch.autograd.grad(F.cross_entropy(model(x), y.to(device)), x)[0].abs()" in native.converted
        assert codes == []
    else:
        assert codes == ["AMP212"], native.findings
    bfloat16 = convert_source(source, Options(dtype="bfloat16"))
    assert bfloat16.status is FileStatus.CHANGED and "scaler" not in bfloat16.converted
    apex = convert_source(source, Options(backend="apex"))
    assert apex.status is FileStatus.UNCONVERTED
    assert [f.code for f in apex.findings if f.severity is Severity.WARNING] == ["AMP312"], apex.findings


_HANDED_OPTIMIZER = """\
import torch
import torch.nn as nn


def train(loader, net, opt):
    for x in loader:
        net.zero_grad()
        loss = net(x).mean()
        loss.backward()
        opt.step()
        net.zero_grad()
        second = net(x).pow(2).mean()
        second.backward()
        opt.step()


if __name__ == "__main__":
    a = nn.Linear(4, 1).cuda()
    b = nn.Linear(4, 1).cuda()
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
    train(loader, a, opt_a)
{second_call}
"""


@pytest.mark.parametrize("second_call, converts", [
    ("    train(loader, b, opt_b)", True),
    # the second call hands the optimizer of another model: net.zero_grad() is not known to zero opt's
    ("    train(loader, a, opt_b)", False),
])
def test_a_model_handed_in_with_its_optimizer_zeroes_its_gradients(second_call, converts):
    """`net.zero_grad()` clears the gradients of `opt` when every call of the function hands it the
    model that optimizer was built from (stylegan2's `discriminator.zero_grad()` in train(), its
    d_optim built under `__main__`): the second step of one iteration then gets its own update()."""
    conversion = convert_source(_HANDED_OPTIMIZER.format(second_call=second_call))
    if converts:
        assert conversion.status is FileStatus.CHANGED, conversion.findings
        assert conversion.converted.count("scaler.update()") == 2
    else:
        assert conversion.status is FileStatus.UNCONVERTED
        (finding,) = [f for f in conversion.findings if "stepped twice" in f.message]
        assert "no opt.zero_grad() and backward() between" in finding.message, finding.message


_TUNED_BETWEEN_STEPS = """\
import torch
import torch.nn as nn


class Tuner:
    def __init__(self):
        self.p = 0.0

    {decorator}
    def tune(self, pred):
        self.p = float(torch.sign(pred).mean())
        return self.p


model = nn.Linear(4, 1).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
tuner = Tuner()
p = 0.0
for i, x in enumerate(loader):
    pred = model(x * p)
    loss = pred.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if i > 10:
        p = tuner.tune(pred)
    if i % 4 == 0:
        again = model(x * p).pow(2).mean()
        optimizer.zero_grad()
        again.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("decorator", ["@torch.no_grad()", "@torch.inference_mode()", "@staticmethod"])
def test_a_value_from_a_no_grad_method_is_no_forward_pass_of_the_next_loss(decorator):
    """`p = tuner.tune(pred)` in an `if` before the regularization step: with tune() under
    torch.no_grad() what it returns carries no gradient, so the step converts; a plain method may
    run a model whose output the loss then needs outside any autocast region: refused."""
    source = _TUNED_BETWEEN_STEPS.format(decorator=decorator)
    if decorator == "@staticmethod":
        source = source.replace("    @staticmethod\n", "")
    conversion = convert_source(source)
    if decorator == "@staticmethod":
        assert conversion.status is FileStatus.UNCONVERTED
        assert any("is outside the block that computes the loss" in f.message for f in conversion.findings)
    else:
        assert conversion.status is FileStatus.CHANGED, conversion.findings


_STEP_HELPER = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def take_step(optimizer, loss):
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


model = nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
{call}
"""


@pytest.mark.parametrize("call, reason", [
    ("    take_step(optimizer, F.mse_loss(model(x), y))",
     "does not hand it the loss as a variable: bind the loss to a name before the call"),
    ("    loss = F.mse_loss(model(x), y)\n    done = take_step(optimizer, loss)",
     "is not a statement of its own"),
    ("    loss = F.mse_loss(model(x), y)\n    take_step(optimizer, loss)\n    callbacks = [take_step]",
     "uses it otherwise than by the calls ampify follows"),
    ("    loss = F.mse_loss(y, y)\n    take_step(optimizer, loss)",
     "is computed from tensors made elsewhere"),
])
def test_a_step_helper_whose_calls_cannot_be_followed_is_refused_with_the_reason(call, reason):
    conversion = convert_source(_STEP_HELPER.format(call=call))
    assert conversion.status is FileStatus.UNCONVERTED, conversion.status
    assert any(reason in f.message for f in conversion.findings), [f.message for f in conversion.findings]


def test_a_step_helper_handed_the_loss_gets_the_scaler_and_its_caller_the_autocast_region():
    conversion = convert_source(_STEP_HELPER.format(call="    loss = F.mse_loss(model(x), y)\n    take_step(optimizer, loss)"))
    assert conversion.status is FileStatus.CHANGED, conversion.findings
    assert conversion.converted.endswith(
        "for x, y in loader:\n"
        "    with torch.autocast(device_type=device.type, dtype=torch.float16):\n"
        "        loss = F.mse_loss(model(x), y)\n"
        "    take_step(optimizer, loss, scaler=scaler)\n")
    assert "def take_step(optimizer, loss, scaler):\n    optimizer.zero_grad()\n    scaler.scale(loss).backward()\n" \
           "    scaler.step(optimizer)\n    scaler.update()\n" in conversion.converted


def test_a_loss_computed_by_criteria_alone_from_logits_handed_in_is_refused():
    """The golden loss_compute_handed_the_logits: the loss object's __call__ runs only its criteria
    on logits the training loop computed; calling a criterion is no forward pass, so an autocast
    region there would leave the model in float32 under a "changed" status."""
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "fixtures" / "torch_native"
              / "loss_compute_handed_the_logits.in.py").read_text()
    conversion = convert_source(source)
    assert conversion.status is FileStatus.UNCONVERTED
    (finding,) = conversion.findings
    assert "computed from tensors made elsewhere" in finding.message
    assert "self.clf_criterion(), self.lm_criterion() are losses, not a model" in finding.message


def test_a_step_helper_whose_loss_reads_a_forward_pass_before_its_block_gets_a_region_there():
    """`out = model(x)` before `if i % 2 == 0: loss = F.mse_loss(out, y); take_step(optimizer, loss)`:
    the model call gets an autocast block of its own, as for a loss computed in place."""
    source = _STEP_HELPER.format(call="    out = model(x)\n    if x.sum() > 0:\n        loss = F.mse_loss(out, y)\n"
                                      "        take_step(optimizer, loss)")
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED, conversion.findings
    assert conversion.converted.endswith(
        "for x, y in loader:\n"
        "    with torch.autocast(device_type=device.type, dtype=torch.float16):\n"
        "        out = model(x)\n"
        "    if x.sum() > 0:\n"
        "        with torch.autocast(device_type=device.type, dtype=torch.float16):\n"
        "            loss = F.mse_loss(out, y)\n"
        "        take_step(optimizer, loss, scaler=scaler)\n")


def test_a_model_bound_to_the_name_of_its_module_is_a_forward_pass_beside_a_criterion():
    """meijieru/crnn.pytorch: `import models.crnn as crnn`, then `crnn = crnn.CRNN(...)`; the step's
    `crnn(image)` is the forward pass (the name no longer holds the module), so the step converts
    although its criterion call is no forward pass."""
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn
        import models.crnn as crnn

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        criterion = nn.CTCLoss()
        crnn = crnn.CRNN(32, 1, 37, 256).to(device)
        optimizer = torch.optim.Adam(crnn.parameters())
        for image, text, sizes, lengths in loader:
            preds = crnn(image)
            cost = criterion(preds, text, sizes, lengths)
            optimizer.zero_grad()
            cost.backward()
            optimizer.step()
        """)
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED, conversion.findings
    assert "        preds = crnn(image)\n        cost = criterion(preds, text, sizes, lengths)\n" in conversion.converted


@pytest.mark.parametrize("cuda_line, flagged", [
    ("if torch.cuda.is_available():\n    torch.cuda.manual_seed_all(0)\n", True),
    ("print(torch.cuda.device_count())\n", True),
    ("noise = torch.cuda.FloatTensor(8).normal_()\n", False),  # a tensor made on the GPU
    ("torch.set_default_tensor_type('torch.cuda.FloatTensor')\n", False),
    ("x = torch.randn(2).cuda\n", False),  # a method read, to call later
])
def test_cuda_queries_alone_leave_a_script_on_the_cpu(cuda_line, flagged):
    """AMP228 ("changed, incomplete": the script trains on the CPU) where the only CUDA the file
    names are torch.cuda.is_available() / manual_seed / device_count; anything else that names
    cuda may put the tensors on a GPU, and the file stays "changed"."""
    source = ("import torch\nimport torch.nn as nn\n" + cuda_line +
              "model = nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "for x in [torch.randn(2, 4)]:\n    loss = model(x).sum()\n    opt.zero_grad()\n"
              "    loss.backward()\n    opt.step()\n")
    conversion = convert_source(source)
    codes = {f.code for f in conversion.findings}
    assert ("AMP228" in codes) is flagged, codes
    assert conversion.status.value == ("changed, incomplete" if flagged else "changed")


@pytest.mark.parametrize("made, flagged", [
    ("img = torch.randn(1, 3, 8, 8, requires_grad=True)", True),
    ("img = Variable(0.1 * torch.randn(1, 3, 8, 8), requires_grad=True)", True),
    ("img = torch.zeros(1, 3, 8, 8).requires_grad_()", True),
    ("img = torch.randn(1, 3, 8, 8, device='cuda', requires_grad=True)", False),
    ("img = load_image('x.png').requires_grad_()", False),
])
def test_an_optimized_tensor_made_here_on_no_device_trains_on_the_cpu(made, flagged):
    source = ("import torch\nimport torch.nn as nn\nfrom torch.autograd import Variable\n"
              "net = nn.Conv2d(3, 3, 3)\n" + made + "\nopt = torch.optim.Adam([img], lr=0.1)\n"
              "for _ in range(3):\n    opt.zero_grad()\n    loss = net(img).pow(2).mean()\n    loss.backward()\n"
              "    opt.step()\n")
    conversion = convert_source(source)
    codes = {f.code for f in conversion.findings}
    assert ("AMP228" in codes) is flagged, codes


@pytest.mark.parametrize("helper, status, unscaled_before", [
    ("sync_grads", FileStatus.CHANGED, False),
    ("average_gradients", FileStatus.CHANGED, False),
    ("clip_grads", FileStatus.CHANGED, True),
    ("sync_and_clip_grads", FileStatus.UNCONVERTED, False),
])
def test_a_helper_reducing_the_gradients_across_ranks_is_unscaled_after(helper, status, unscaled_before):
    """HER's `sync_grads(network)`: no scaler.unscale_() before a reduction across ranks (the step
    unscales after it, so every rank's inf check sees the reduced gradients); a clipping helper gets
    one; a helper that does both is refused (AMP215)."""
    source = textwrap.dedent(f"""\
        import torch
        import torch.nn as nn
        from dist_utils import {helper}

        model = nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            loss = model(torch.randn(8, 4).cuda()).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            {helper}(model, 1.0)
            optimizer.step()
        """)
    conversion = convert_source(source, Options(backend="native"))
    assert conversion.status is status, (conversion.reason, conversion.findings)
    if status is FileStatus.CHANGED:
        text = conversion.converted
        assert ("scaler.unscale_(optimizer)" in text) is unscaled_before, text
        assert text.index("scaler.scale(loss).backward()") < text.index(f"{helper}(model, 1.0)") < \
            text.index("scaler.step(optimizer)")
    else:
        assert any(f.code == "AMP215" and "both reduces" in f.message for f in conversion.findings)


def test_a_step_function_fetching_its_optimizer_gets_no_scaler_of_its_own():
    """stacked hourglass: `optimizer = train_cfg['optimizer']` inside a function that runs one step per
    call; a GradScaler after that line would restart at 65536 every step: refused, naming the fetch."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    source = (root / "fixtures" / "torch_native" / "optimizer_fetched_in_a_step_function.in.py").read_text()
    conversion = convert_source(source, Options(), filename="pose.py")
    assert conversion.status is FileStatus.UNCONVERTED and conversion.converted is None
    assert any("make_train() runs one training step per call" in f.message and "fetches optimizer at line 20" in f.message
               for f in conversion.findings), [f.message for f in conversion.findings]


def test_a_factory_whose_first_statement_is_the_step_gets_its_scaler_before_it():
    source = textwrap.dedent('''\
        import torch


        def make_train_step(model, optimizer, loss_fn):
            def train_step(x, y):
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                return loss.item()

            return train_step
        ''')
    conversion = convert_source(source, Options(), filename="steps.py")
    assert conversion.status is FileStatus.CHANGED, conversion.reason
    assert ('def make_train_step(model, optimizer, loss_fn):\n    scaler = torch.amp.GradScaler("cuda")\n'
            '    def train_step(x, y):') in conversion.converted
    compile(conversion.converted, "steps.py", "exec")
