"""Which classes of a project are optimizer wrappers, and which of their methods step
(ampify/optimizer_wrappers.py, part of the repository model)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ampify.optimizer_wrappers import wrapper_steps


def _steps(source: str):
    return {(s.klass, s.method): s for s in wrapper_steps(Path("optim.py"), textwrap.dedent(source).encode())}


def test_a_scheduling_wrapper_and_a_clipping_wrapper():
    found = _steps("""
        import torch

        class ScheduledOptim():
            def __init__(self, optimizer, d_model):
                self._optimizer = optimizer
            def step_and_update_lr(self):
                self._update_learning_rate()
                self._optimizer.step()
            def zero_grad(self):
                self._optimizer.zero_grad()

        class Optimizer(object):
            def __init__(self, optim, max_grad_norm=0):
                self.optimizer = optim
            def step(self):
                torch.nn.utils.clip_grad_norm_(self.params, 5)
                self.optimizer.step()
        """)
    assert set(found) == {("ScheduledOptim", "step_and_update_lr"), ("Optimizer", "step")}
    scheduled, clipping = found["ScheduledOptim", "step_and_update_lr"], found["Optimizer", "step"]
    assert scheduled.inner == "_optimizer" and not scheduled.reads_gradients and scheduled.obstacle is None
    assert clipping.inner == "optimizer" and clipping.reads_gradients


def test_trainers_optimizers_and_schedulers_are_not_wrappers():
    found = _steps("""
        import torch

        class Trainer:
            def __init__(self, model, optimizer):
                self.optimizer = optimizer
            def train_step(self, x):
                loss = self.model(x).sum()
                loss.backward()
                self.optimizer.step()

        class Lookahead(torch.optim.Optimizer):
            def __init__(self, base):
                self.base = base
            def step(self):
                self.base.step()

        class Holder:
            def __init__(self):
                self.optimizer = make()
            def step(self):
                self.optimizer.step()
        """)
    assert found == {}


def test_methods_that_cannot_take_the_scaler_say_why_and_converted_ones_are_known():
    found = _steps("""
        class A:
            def __init__(self, optimizer):
                self.opt = optimizer
            def step(self, **kwargs):
                self.opt.step()
            def step_twice(self):
                self.opt.step()
                self.opt.step()
            def logged_step(self):
                return log(self.opt.step())

        class B:
            def __init__(self, optimizer):
                self.opt = optimizer
            def step(self, scaler=None):
                if scaler is not None:
                    scaler.step(self.opt)
                else:
                    self.opt.step()
        """)
    assert found["A", "step"].obstacle == "it takes *args or **kwargs"
    assert ("A", "step_twice") not in found
    assert found["A", "logged_step"].obstacle == "its inner step() is part of a larger expression"
    assert found["B", "step"].takes_scaler and found["B", "step"].obstacle is None
