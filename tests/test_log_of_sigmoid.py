"""The log of a sigmoid's probability (transforms/kit/log_of_sigmoid.py): what is the hazard, and
the float32 forms that are not."""

import libcst as cst
import pytest

from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.log_of_sigmoid import log_of_probability_calls

HEAD = ("import torch\nimport torch.nn as nn\n"
        "D = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid())\nx = torch.randn(2, 4)\n")


def _logs(line: str):
    module = cst.parse_module(HEAD + line + "\n")
    return [source for _, source in log_of_probability_calls(module, ImportMap.from_module(module))]


@pytest.mark.parametrize("line", [
    "loss = -torch.log(D(x) + 1e-8).mean()",
    "p = D(x)\nloss = torch.log(1 - p + 1e-8).mean()",
    "loss = torch.log(torch.sigmoid(x.sum(1))).mean()",
    "loss = torch.log(1. - torch.sigmoid(x.sum(1)) + 1e-8).mean()",
    "loss = x.sum(1).sigmoid().log().mean()",
])
def test_a_float16_probability_in_a_log_is_the_hazard(line):
    assert _logs(line)


@pytest.mark.parametrize("line", [
    "loss = torch.log(torch.sigmoid(D(x).float()) + 1e-8).mean()",
    "loss = torch.log(1 - torch.sigmoid(D(x).float()) + 1e-8).mean()",
    "loss = torch.log(1. - torch.sigmoid(x.sum(1).double())).mean()",
    "loss = x.sum(1).float().sigmoid().log().mean()",
    "loss = torch.log(torch.sigmoid(x.sum(1).to(torch.float32))).mean()",
    "loss = torch.log(D(x) + 1e-3).mean()",  # an epsilon float16 keeps
])
def test_a_float32_probability_or_a_normal_epsilon_is_not(line):
    assert _logs(line) == []


def test_a_value_ampify_cannot_follow_in_a_file_with_a_sigmoid_model_is_taken_for_a_probability():
    assert _logs("p = models['D'](x)\nloss = torch.log(1 - p + 1e-8).mean()")
    assert _logs("u = torch.rand_like(x)\nu = models['D'](x)\nloss = torch.log(1 - u).mean()")


@pytest.mark.parametrize("draw", [
    "x.new(2, 4).uniform_(1e-5, 1.0 - 1e-5)",  # r9y9/wavenet_vocoder's logistic sampling
    "torch.rand_like(x)",
    "torch.empty(2, 4).uniform_()",
    "np.random.uniform(size=(2, 4))",
])
def test_a_random_draw_is_no_probability(draw):
    assert _logs(f"u = {draw}\nsample = torch.log(u) - torch.log(1. - u)") == []
