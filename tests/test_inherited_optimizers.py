"""Optimizers a base class of the project sets for the subclass that steps them
(transforms/torch/inherited_optimizers.py, and the scaler placed after the base's __init__)."""

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from ampify.transforms.torch.inherited_optimizers import class_named, inherited_attribute

IMPORTS = {"torch": ("torch", None, 0), "optim": ("torch", "optim", 0), "Lookahead": ("lookahead", "Lookahead", 0)}


def _fact(source: str, attribute: str = "optimizer"):
    tree = ast.parse(textwrap.dedent(source))
    return inherited_attribute(class_named(tree, "Base"), attribute, IMPORTS, lambda line: f"base.py:{line}")


@pytest.mark.parametrize("assignment", [
    "self.optimizer = optimizer",
    "self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)",
    "self.optimizer = optim.Adam(model.parameters())",
    "self.optimizer = getattr(torch.optim, config['type'])(model.parameters())",
    "self.optimizer = get_instance(torch.optim, 'optimizer', config, model.parameters())",
])
def test_a_base_that_sets_an_optimizer_in_its_init(assignment):
    fact = _fact(f"""
        class Base:
            def __init__(self, model, optimizer, config):
                self.model = model
                {assignment}

            def save(self):
                return {{"optimizer": self.optimizer.state_dict()}}
        """)
    assert fact is not None and fact.problem == ""
    assert fact.where == "base.py:5" and fact.state_saved_at == ("base.py:8",)


@pytest.mark.parametrize("body, problem", [
    ("    def __init__(self, optimizer):\n        self.optimizer = Lookahead(optimizer)\n",
     "sets self.optimizer to `Lookahead(optimizer)` (base.py:3), which ampify does not follow"),
    ("    def __init__(self, model, optimizer):\n        self.model, self.optimizer = model, optimizer\n",
     "to a value through an unpacking (base.py:3)"),
    ("    def __init__(self, optimizer):\n        self.optimizer = optimizer\n"
     "    def build(self, model):\n        self.optimizer = torch.optim.SGD(model.parameters(), lr=1)\n",
     "sets self.optimizer in build() (base.py:5), not only in __init__"),
    ("    def __init__(self, optimizer):\n        self.optimizer = optimizer\n"
     "    def warmup(self, loss):\n        loss.backward()\n        self.optimizer.step()\n",
     "steps self.optimizer itself (base.py:6)"),
])
def test_a_base_ampify_cannot_rely_on_says_why(body, problem):
    fact = _fact("class Base:\n" + body)
    assert fact is not None and problem in fact.problem, fact


def test_a_base_that_never_sets_it():
    assert _fact("class Base:\n    def __init__(self):\n        self.model = None\n") is None
    fact = _fact("class Base(Root):\n    def __init__(self):\n        super().__init__()\n")
    assert fact is not None and "ampify follows one base class" in fact.problem


def _convert(tmp_path, files, *flags):
    (tmp_path / "setup.py").write_text("")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    completed = subprocess.run([sys.executable, "-m", "ampify", "trainer.py", "--report", "report.json", *flags],
                               cwd=tmp_path, capture_output=True, text=True)
    assert completed.returncode in (0, 1), completed.stderr
    entry = next(f for f in json.loads((tmp_path / "report.json").read_text())["files"] if f["path"].endswith("trainer.py"))
    return entry, (tmp_path / "trainer.py").read_text()


_STEP = """
    def train_epoch(self, loader):
        for x, y in loader:
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x.to(self.device)), y.to(self.device))
            loss.backward()
            self.optimizer.step()
"""


def test_a_base_class_of_the_same_module(tmp_path):
    entry, text = _convert(tmp_path, {"trainer.py": textwrap.dedent("""
        import torch


        class Base:
            def __init__(self, model, lr):
                self.model = model
                self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)


        class Trainer(Base):
            def __init__(self, model, lr, device):
                Base.__init__(self, model, lr)
                self.device = device
        """) + _STEP})
    assert entry["status"] == "changed"
    assert "        Base.__init__(self, model, lr)\n        self.scaler = torch.amp.GradScaler(torch.device(device).type)\n" \
        in text
    assert "self.scaler.step(self.optimizer)" in text


def test_a_subclass_without_an_init_of_its_own_is_refused_with_the_reason(tmp_path):
    entry, text = _convert(tmp_path, {
        "base.py": """
            class Base:
                def __init__(self, model, optimizer, device):
                    self.model, self.device = model, device
                    self.optimizer = optimizer
            """,
        "trainer.py": "import torch\nfrom base import Base\n\n\nclass Trainer(Base):\n" + textwrap.dedent(_STEP).replace(
            "\n", "\n    ").rstrip() + "\n"})
    assert entry["status"] == "not converted"
    messages = " ".join(f["message"] for f in entry["findings"])
    assert "is set by Base.__init__ (base.py:5), which Trainer inherits" in messages
    assert "has no __init__ of its own" in messages
    assert "GradScaler" not in text


def test_a_base_setting_a_wrapper_is_refused_with_the_reason(tmp_path):
    entry, _ = _convert(tmp_path, {
        "base.py": """
            from lookahead import Lookahead


            class Base:
                def __init__(self, model, optimizer, device):
                    self.model, self.device = model, device
                    self.optimizer = Lookahead(optimizer)
            """,
        "trainer.py": textwrap.dedent("""
            import torch
            from base import Base


            class Trainer(Base):
                def __init__(self, model, optimizer, device):
                    super(Trainer, self).__init__(model, optimizer, device)
            """) + _STEP})
    assert entry["status"] == "not converted"
    messages = " ".join(f["message"] for f in entry["findings"])
    assert "self.optimizer is inherited from Base: Base sets self.optimizer to `Lookahead(optimizer)` (base.py:8)" \
        in messages


def test_the_scaler_follows_the_device_the_subclass_sets_after_the_base(tmp_path):
    entry, text = _convert(tmp_path, {"trainer.py": textwrap.dedent("""
        import torch


        class Base:
            def __init__(self, model, lr):
                self.model = model
                self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)


        class Trainer(Base):
            def __init__(self, model, lr):
                super().__init__(model, lr)
                self.log = []
                self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
                self.model.to(self.device)
        """) + _STEP})
    assert entry["status"] == "changed"
    assert ('        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
            "        self.scaler = torch.amp.GradScaler(self.device.type)\n        self.model.to(self.device)\n") in text
