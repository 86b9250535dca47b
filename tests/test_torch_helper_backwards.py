"""backward() in helper methods (pix2pix / CycleGAN style): what is followed, what is refused and why.

The converted shapes themselves are golden cases (fixtures/torch_native/pix2pix_helper_methods,
cyclegan_helpers_of_helpers, cut_forward_for_its_effect, helper_backward_not_followed) and run
under real PyTorch in test_torch_native_exec (gan_helper_methods, forward_for_its_effect).
"""

from __future__ import annotations

from pathlib import Path

from ampify.convert import convert_source
from ampify.findings import FileStatus
from ampify.options import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "torch_native"


def _messages(conversion, code=None):
    """Line -> message of the refusals: AMP220 (a backward() with no step that can be paired, with
    why its helper was not followed) and AMP215 (a training step refused), or just `code`."""
    codes = (code,) if code else ("AMP215", "AMP220")
    return {f.line: f.message for f in conversion.findings if f.code in codes}


def test_each_refusal_says_why_the_helper_was_not_followed():
    source = (FIXTURES / "helper_backward_not_followed.in.py").read_text()
    conversion = convert_source(source, Options())
    assert conversion.status is FileStatus.UNCONVERTED
    messages = _messages(conversion)
    # called from a method where nothing steps
    assert "self.backward_net() is called in gradients_for_inspection(), where no optimizer steps" in messages[16]
    # clips the gradients while they are still scaled
    assert "backward_other() clips gradients after its backward()" in messages[20]
    # a plain function: reported as before, with no claim about methods
    assert "its method was not followed" not in messages[37]
    # reads .grad inside the helper
    assert "aux_backward() reads .grad after its backward()" in messages[59]
    # the iteration that calls it is refused as a whole: its step would unscale unscaled gradients
    assert "calls aux_backward() (line 66)" in messages[66] and "never scaled" in messages[66]


def test_iteration_calling_an_unfollowed_helper_is_refused_by_apex_too():
    source = (FIXTURES / "helper_backward_not_followed.in.py").read_text()
    conversion = convert_source(source, Options(backend="apex"))
    assert conversion.status is FileStatus.UNCONVERTED
    assert "calls aux_backward() (line 66)" in _messages(conversion, "AMP317")[66]


def test_helper_reached_from_two_iterations_is_not_followed():
    """If one of the two steps could not be converted, the helper's scaled backward would feed an
    optimizer stepped without the scaler: a helper is followed into one training step only."""
    source = '''import torch


class Model:
    def __init__(self, net):
        self.net = net
        self.opt_a = torch.optim.SGD(net.parameters(), lr=0.1)
        self.opt_b = torch.optim.Adam(net.parameters(), lr=0.1)

    def backward_common(self, x):
        self.loss = self.net(x).mean()
        self.loss.backward()

    def step_a(self, x):
        self.opt_a.zero_grad()
        self.backward_common(x)
        self.opt_a.step()

    def step_b(self, x):
        self.opt_b.zero_grad()
        self.backward_common(x)
        self.opt_b.step()
'''
    for options, code in ((Options(), "AMP220"), (Options(backend="apex"), "AMP316")):
        conversion = convert_source(source, options)
        assert conversion.status is FileStatus.UNCONVERTED, options
        assert conversion.converted is None
        assert list(_messages(conversion, code)) == [12]
        assert "backward_common() is called from 2 training steps (in step_a(), in step_b())" in _messages(conversion, code)[12]


def test_helper_of_an_iteration_with_local_optimizers_is_refused():
    source = '''import torch


class Model:
    def backward_step(self, x):
        loss = self.net(x).mean()
        loss.backward()

    def fit(self, data):
        optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        for x in data:
            optimizer.zero_grad()
            self.backward_step(x)
            optimizer.step()
'''
    conversion = convert_source(source, Options())
    assert conversion.status is FileStatus.UNCONVERTED
    message = _messages(conversion)[13]
    assert "runs in the method backward_step()" in message and "not attributes of self" in message


def test_helper_used_other_than_by_a_call_is_not_followed():
    source = '''import torch


class Model:
    def __init__(self, net):
        self.net = net
        self.opt = torch.optim.SGD(net.parameters(), lr=0.1)
        self.hooks = [self.backward_net]

    def backward_net(self):
        self.loss = self.net(self.x).mean()
        self.loss.backward()

    def optimize_parameters(self):
        self.opt.zero_grad()
        self.backward_net()
        self.opt.step()
'''
    conversion = convert_source(source, Options())
    assert conversion.status is FileStatus.UNCONVERTED
    assert "backward_net is used other than as self.backward_net() (in __init__())" in _messages(conversion)[12]
