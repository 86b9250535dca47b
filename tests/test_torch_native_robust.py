"""Generated training-like modules must never crash the native transform, never produce code
that does not compile, and never be converted twice."""

from __future__ import annotations

import textwrap

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options

SIMPLE = [
    "loss = model(x)",
    "out = model(x)",
    "loss = criterion(out, y)",
    "loss = loss / 2",
    "loss.backward()",
    "loss.backward(retain_graph=True)",
    "(loss + out).backward()",
    "model(x).sum().backward()",
    "optimizer.step()",
    "opt_g.step()",
    "self.optimizer.step()",
    "optimizer.step(closure)",
    "optimizer.zero_grad()",
    "scheduler.step()",
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
    "opt_g = torch.optim.Adam(params)",
    "self.optimizer = torch.optim.SGD(params)",
    "device = torch.device('cuda')",
    "x = x.to(device)",
    "torch.save({'optimizer': optimizer.state_dict()}, 'c.pt')",
    "ckpt['optimizer'] = optimizer.state_dict()",
    "optimizer.load_state_dict(ckpt['optimizer'])",
    "train(model, optimizer)",
    "train(model, optimizer=optimizer)",
    "self.train_epoch(loader, self.optimizer)",
    "self.train_epoch(loader, optimizer=opt_g)",
    "train(model, self.optimizer)",
    "continue",
    "break",
    "return loss",
    "pass",
    "if i % 2 == 0: optimizer.step()",
    "x = [t.backward() for t in ts]",
    "lambda: loss.backward()",
]
HEADERS = [
    "for x, y in loader:",
    "def main():",
    "for i, x in enumerate(loader):",
    "while True:",
    "if cond:",
    "else:",
    "def train(model, optimizer):",
    "def step(self, x):",
    "def train_epoch(self, loader, optimizer):",
    "class Trainer:",
    "with torch.no_grad():",
]

#: whole training steps, so that many generated modules are really converted
STEPS = [
    "out = model(x)\nloss = criterion(out, y)\nloss.backward()\noptimizer.step()",
    "optimizer.zero_grad()\nloss = model(x).mean()\nloss.backward()\ntorch.nn.utils.clip_grad_norm_(p, 1.0)\noptimizer.step()",
    "d_loss = D(x)\nd_loss.backward()\nopt_d.step()\ng_loss = D(G(z))\ng_loss.backward()\nopt_g.step()",
    "self.optimizer.zero_grad()\nloss = self.model(x)\nloss.backward()\nself.optimizer.step()",
    "loss = model(x) / k\nloss.backward()\nif (i + 1) % k == 0:\n    optimizer.step()\n    optimizer.zero_grad()",
]
statement = st.one_of(st.sampled_from(SIMPLE), st.sampled_from(STEPS))
block = st.recursive(
    st.lists(statement, min_size=1, max_size=4),
    lambda children: st.lists(
        st.one_of(statement, st.tuples(st.sampled_from(HEADERS), children)), min_size=1, max_size=5
    ),
    max_leaves=25,
)


def render(items, indent=0) -> str:
    lines = []
    for item in items:
        if isinstance(item, str):
            lines.extend("    " * indent + line for line in item.split("\n"))
        else:
            header, body = item
            lines.append("    " * indent + header)
            lines.append(render(body, indent + 1))
    return "\n".join(lines)


def compiles(source: str) -> bool:
    try:
        compile(source, "<generated>", "exec")
    except SyntaxError:
        return False
    return True


#: module-level optimizers, so that generated loops have something to step
PREAMBLE = "optimizer = torch.optim.SGD(p)\nopt_d = torch.optim.Adam(d)\nopt_g = torch.optim.Adam(g)\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(body=block, dtype=st.sampled_from(["float16", "bfloat16"]), preamble=st.booleans())
def test_generated_modules_never_break(body, dtype, preamble):
    source = "import torch\n" + (PREAMBLE if preamble else "") + render(body) + "\n"
    assume(compiles(source))
    options = Options(dtype=dtype)
    conversion = convert_source(source, options)  # raises ConversionError if output did not compile
    assert not any(f.code == "AMP200" for f in conversion.findings), (source, conversion.findings)
    if conversion.converted is not None:
        again = convert_source(conversion.converted, options)
        assert again.converted is None
        assert again.status is FileStatus.ALREADY_MIXED_PRECISION


def test_odd_but_valid_code_is_reported_not_crashed():
    source = textwrap.dedent(
        """
        import torch
        for x in loader:
            if x: loss = model(x); loss.backward(); optimizer.step()
        """
    )
    conversion = convert_source(source)
    assert conversion.status in (FileStatus.CHANGED, FileStatus.UNCONVERTED)
    assert not any(f.code == "AMP200" for f in conversion.findings)
