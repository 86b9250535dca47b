"""Training loops a third-party library runs, handed the optimizer this file builds.

A script with no backward() of its own may still train: szagoruyko's attention-transfer builds an
SGD optimizer and hands it to torchnet's `Engine().train(h, loader, epochs, optimizer)`, whose
loop runs the forward pass, `loss.backward()` and `optimizer.step(closure)`; moskomule's
senet.pytorch hands its optimizer to homura's `SupervisedTrainer(model, optimizer, ...)`. The
step is in the library, where ampify writes nothing, so the file is refused with that reason
rather than called inference or model code.

Only a call that looks like a training loop counts: its callee (or the class of the object whose
method it is) is named like one (`train`, `fit`, `Trainer`, `Engine`, `Learner`, `Runner`...), it
resolves to a package that is neither the standard library, torch, nor a module of this project,
and one of its arguments is a name this file binds and calls like an optimizer. A scheduler, a
distributed wrapper or a checkpoint helper handed the optimizer is no loop.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import libcst as cst

from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements

#: words of a callee or class that runs a training loop
_LOOP_WORDS = re.compile(r"train|fit|engine|learner|runner|loop", re.IGNORECASE)
#: ... and of those that only hold the optimizer
_HOLDER_WORDS = re.compile(r"sched|warmup|lr|distributed|broadcast|checkpoint|save|load|wrap|swa|lookahead",
                           re.IGNORECASE)
#: packages whose calls never run a training loop that owns the step
_NOT_LOOP_PACKAGES = frozenset({"torch", "apex", "horovod", "deepspeed", "timm", "transformers", "wandb", "mlflow",
                                "tensorboardX", "torch_optimizer", "torchcontrib", "warmup_scheduler",
                                "pytorch_warmup", "numpy"})


@dataclass(frozen=True)
class LibraryLoop:
    """The call that hands the optimizer to a library's loop."""

    call: cst.Call
    #: what the call resolves to: "torchnet.engine.Engine.train", "homura.trainers.SupervisedTrainer"
    qualified: str
    optimizer: str


def _third_party(qualified: str, in_project: Callable[[str], bool]) -> bool:
    package = qualified.split(".", 1)[0]
    if package in _NOT_LOOP_PACKAGES or package in sys.stdlib_module_names:
        return False
    return not in_project(package)


def library_loop(module: cst.Module, imports: ImportMap, in_project: Callable[[str], bool]) -> Optional[LibraryLoop]:
    """The first call handing an optimizer this module builds to a third-party training loop."""
    built: Dict[str, str] = {}  # local name -> qualified class of the object it holds
    optimizers = set()
    for statement in statements.nodes_of_type(module, cst.Assign):
        assert isinstance(statement, cst.Assign)
        for target in statement.targets:
            name = dotted_name(target.target)
            if name is None or not isinstance(statement.value, cst.Call):
                continue
            qualified = imports.resolve(statement.value.func)
            if qualified is not None:
                built[name] = qualified
            if names.looks_like_optimizer_name(name):
                optimizers.add(name)
    if not optimizers:
        return None
    for call in statements.calls_within(module):
        handed = next((dotted_name(arg.value) for arg in call.args
                       if dotted_name(arg.value) in optimizers), None)
        if handed is None:
            continue
        qualified = imports.resolve(call.func)
        if qualified is None and isinstance(call.func, cst.Attribute):
            receiver = dotted_name(call.func.value)
            if receiver in built:
                qualified = f"{built[receiver]}.{call.func.attr.value}"
        if qualified is None or not _third_party(qualified, in_project):
            continue
        callee = qualified.rsplit(".", 2)[-2:]
        if _HOLDER_WORDS.search(qualified.rsplit(".", 1)[-1]) or not any(_LOOP_WORDS.search(part) for part in callee):
            continue
        return LibraryLoop(call, qualified, handed)
    return None
