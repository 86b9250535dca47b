"""The training-structure analysis on its own: what it finds, independent of any rewrite."""

from __future__ import annotations

import textwrap

import libcst as cst

from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.torch.names import (
    is_optimizer_qualname,
    looks_like_device_name,
    looks_like_optimizer_name,
)
from ampify.transforms.torch.training_loop import analyze_training


def analyze(source: str):
    module = cst.parse_module(textwrap.dedent(source))
    return analyze_training(module, ImportMap.from_module(module))


def test_optimizer_names():
    for name in ["optimizer", "optimizerD", "optimizer_G", "opt_g", "optD", "g_optim", "self.optimizer", "optim"]:
        assert looks_like_optimizer_name(name), name
    for name in ["scheduler", "lr_scheduler", "env", "trainer", "opts", "options", "optimizer_scheduler"]:
        assert not looks_like_optimizer_name(name), name


def test_device_names():
    for name in ["device", "args.device", "self.gpu_id", "local_rank", "cfg.train_device", "dev"]:
        assert looks_like_device_name(name), name
    for name in ["dtype", "x", "target.dtype", "half", "developer"]:
        assert not looks_like_device_name(name), name


def test_optimizer_qualified_names():
    assert is_optimizer_qualname("torch.optim.SGD")
    assert is_optimizer_qualname("transformers.AdamW")
    assert is_optimizer_qualname("apex.optimizers.FusedAdam")
    assert not is_optimizer_qualname("torch.optim.lr_scheduler.StepLR")
    assert not is_optimizer_qualname("torch.optim.swa_utils.SWALR")
    assert not is_optimizer_qualname("torch.nn.Linear")


GAN = """
import torch
from torch import optim
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
opt_d = optim.Adam(D.parameters())
opt_g = optim.Adam(G.parameters())
sched = optim.lr_scheduler.StepLR(opt_d, 10)
netD = torch.nn.DataParallel(D)
for epoch in range(3):
    for real in loader:
        d_loss = D(real).mean()
        d_loss.backward()
        torch.nn.utils.clip_grad_norm_(D.parameters(), 1.0)
        opt_d.step()
        opt_d.zero_grad()
        g_loss = -D(G(z)).mean()
        g_loss.backward()
        opt_g.step()
    sched.step()
torch.save({"d": opt_d.state_dict()}, "ckpt.pt")
opt_g.load_state_dict(torch.load("g.pt"))
"""


def test_gan_structure():
    s = analyze(GAN)
    assert set(s.optimizers) == {"opt_d", "opt_g"}
    assert s.optimizers["opt_d"].reason == "torch.optim.Adam"
    assert s.optimizers["opt_d"].model_names == ["D"] and s.optimizers["opt_g"].model_names == ["G"]
    assert [site.receiver for site in s.other_steps] == ["sched"]  # the scheduler is not an optimizer
    assert len(s.units) == 1
    unit = s.units[0]
    assert isinstance(unit.owner, cst.For) and s.line(unit.owner) == 10  # the inner loop
    assert unit.optimizers == ["opt_d", "opt_g"]
    assert [s.line(b.call) for b in unit.backwards] == [12, 17]
    assert len(unit.clips) == 1 and len(unit.zero_grads) == 1
    assert [site.receiver for site in s.optimizer_state_saves] == ["opt_d"]
    assert [site.receiver for site in s.optimizer_state_loads] == ["opt_g"]
    assert [b.name for b in s.device_bindings] == ["device"]
    assert len(s.parallel_wraps) == 1
    assert not s.unpaired_backwards and not s.mixed_precision_uses


def test_optimizer_bindings_by_kind():
    s = analyze(
        """
        import torch

        def build():
            model, optimizer = make()
            return model, optimizer

        def train(model, loader, optimizer):
            for x in loader:
                model(x).sum().backward()
                optimizer.step()

        class Trainer:
            def __init__(self, model):
                self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

            def step(self, x):
                loss = self.model(x)
                loss.backward()
                self.optimizer.step()
        """
    )
    kinds = {(b.name, b.kind) for b in s.bindings if "optimizer" in b.name}
    assert ("optimizer", "tuple") in kinds
    assert ("optimizer", "parameter") in kinds
    assert ("self.optimizer", "attribute") in kinds
    self_binding = next(b for b in s.bindings if b.name == "self.optimizer")
    assert self_binding.klass is not None and self_binding.klass.name.value == "Trainer"
    assert self_binding.qualified_call == "torch.optim.SGD"
    # the method unit is the whole method body: no loop around backward/step
    method_unit = next(u for u in s.units if u.klass is not None)
    assert isinstance(method_unit.owner, cst.FunctionDef) and method_unit.owner.name.value == "step"


def test_hazards_and_wrappers():
    s = analyze(
        """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class Wrapped:
            def step(self):
                self.optimizer.step()

        crit = nn.BCELoss()
        head = nn.Sequential(nn.Linear(2, 1), nn.Sigmoid())
        wrapped = Wrapped()
        lbfgs = torch.optim.LBFGS(params)
        y = F.binary_cross_entropy(p, t)
        g = torch.autograd.grad(out, inp, create_graph=True)
        s1 = scores.masked_fill(mask, -1e9)
        s2 = scores.masked_fill(mask, float("-inf"))
        s3 = scores.masked_fill(mask, -1e4)
        s4 = scores.masked_fill(mask, torch.finfo(torch.float32).min)
        s5 = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        for x in data:
            loss = f(x)
            loss.backward()
            wrapped.step()

        def fit():
            lbfgs.step(closure)
        """
    )
    kinds = sorted(h.kind for h in s.hazards)
    assert kinds == ["bce", "bce", "closure", "create_graph", "masked_fill", "masked_fill", "sigmoid", "wrapper_class"]
    assert "wrapped" not in s.optimizers  # a wrapper instance is not treated as an optimizer
    assert len(s.unpaired_backwards) == 1


def test_already_mixed_precision_is_seen_through_aliases():
    s = analyze(
        """
        import torch.cuda.amp as amp
        with amp.autocast():
            pass
        """
    )
    assert s.mixed_precision_uses
    s = analyze("from apex import amp\nmodel, opt = amp.initialize(model, opt)\n")
    assert s.mixed_precision_uses


def test_an_import_alone_is_no_mixed_precision_use():
    s = analyze("try:\n    from apex import amp, optimizers\nexcept ImportError:\n    pass\nimport torch.cuda.amp\n")
    assert s.mixed_precision_uses == []


def test_navigation_helpers():
    s = analyze(GAN)
    unit = s.units[0]
    backward = unit.backwards[0]
    path = s.block_path(backward.call, stop=unit.body)
    assert len(path) == 1 and path[0][0] is unit.body
    full = s.block_path(backward.call)
    assert isinstance(full[-1][0], cst.Module) and len(full) == 3
    assert s.scope_of(backward.call) is s.module
    assert s.fresh_name("scaler") == "scaler" and s.fresh_name("opt_d", "x") == "x"
