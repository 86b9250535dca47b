"""Model classes whose forward() returns a sigmoid's probability (torch/sigmoid_models.py), and
the training files that take the log of one imported from another module (ProjectView)."""

import ast
import textwrap

import pytest

from ampify.repository import ProjectView, RepositoryIndex
from ampify.transforms.torch.sigmoid_models import sigmoid_model_classes


def _classes(source: str) -> dict:
    return sigmoid_model_classes(ast.parse(textwrap.dedent(source)))


@pytest.mark.parametrize("forward, init", [
    ("return self.main(x).view(-1)", "self.main = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())"),
    ("return self.sig(self.fc(x))", "self.sig = nn.Sigmoid()"),
    ("h = self.fc(x)\n                return torch.sigmoid(h)", ""),
    ("h = self.fc(x)\n                p = F.sigmoid(h)\n                return p.squeeze(1)", ""),
    ("return self.fc(x).sigmoid()", ""),
    ("return torch.special.expit(self.fc(x)).float()", ""),
    ("x = self.fc(x)\n                x = torch.sigmoid(x)\n                return x", ""),
])
def test_a_model_ending_in_a_sigmoid_is_found(forward, init):
    found = _classes(f"""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class D(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)
                {init or "pass"}

            def forward(self, x):
                {forward}
        """)
    assert found == {"D": 6}


@pytest.mark.parametrize("forward", [
    # the sigmoid of a float64 / float32 copy runs in that dtype under autocast (locuslab/TCN)
    "h = self.fc(x).double()\n                return self.sig(h)",
    "return torch.sigmoid(self.fc(x).float())",
    "return torch.sigmoid(self.fc(x).to(torch.float32))",
    "return self.fc(x).to(dtype=torch.float64).sigmoid()",
    # logits, or a probability on some returns only
    "return self.fc(x)",
    "if self.training:\n                    return self.fc(x)\n                return torch.sigmoid(self.fc(x))",
    "return torch.sigmoid(self.fc(x)), self.fc(x)",
    "return torch.softmax(self.fc(x), 1)",
])
def test_logits_and_wide_copies_are_not(forward):
    assert _classes(f"""
        import torch
        import torch.nn as nn

        class D(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)
                self.sig = nn.Sigmoid()

            def forward(self, x):
                {forward}
        """) == {}


def test_a_sigmoid_of_another_library_is_not_torch():
    assert _classes("""
        import torch.nn as nn
        from scipy.special import expit

        class D(nn.Module):
            def forward(self, x):
                return expit(x)
        """) == {}


def _project(tmp_path, files: dict) -> ProjectView:
    (tmp_path / "setup.py").write_text("")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return ProjectView(RepositoryIndex(tmp_path), tmp_path / "train.py")


_MODELS = """
    import torch.nn as nn

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(nn.Linear(784, 1), nn.Sigmoid())

        def forward(self, x):
            return self.main(x)

    class Generator(nn.Module):
        def forward(self, z):
            return z
    """


@pytest.mark.parametrize("imports, called", [
    ("from models import Discriminator", "Discriminator"),
    ("from models import Discriminator as D", "D"),
    ("import models", "models.Discriminator"),
    ("import models as m", "m.Discriminator"),
    ("from models import *", "Discriminator"),
    ("from gan.models import Discriminator", "Discriminator"),
])
def test_imported_probability_models_by_the_name_they_are_called(tmp_path, imports, called):
    files = {"models.py": _MODELS, "gan/__init__.py": "", "gan/models.py": _MODELS, "train.py": imports + "\n"}
    found = _project(tmp_path, files).probability_models()
    assert list(found) == [called]
    assert found[called].endswith("models.py:4 Discriminator")


def test_no_probability_models_without_a_sigmoid(tmp_path):
    view = _project(tmp_path, {"models.py": _MODELS.replace("nn.Sigmoid()", "nn.Identity()"),
                               "train.py": "from models import Discriminator\n"})
    assert view.probability_models() == {}
