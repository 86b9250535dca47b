"""Whose gradients does a clip read, when one iteration steps several optimizers?

`scaler.unscale_(optimizer)` must run, once per step, before anything that reads that optimizer's
gradients. With one optimizer there is no question. With several (an encoder and a decoder, a
generator and a discriminator stepped after one backward), the unscale_ before a clip must be the
clipped parameters' optimizer: unscaling another one leaves the clip reading gradients 65536
times too large (and the step then shrinks them to nothing). The owner is read from the clip's
arguments:

    clip_grad_norm_(decoder.parameters(), c)      -> the optimizer built from decoder.parameters()
    clip_gradient(encoder_optimizer, c)           -> encoder_optimizer (a helper handed an optimizer)
    clip_grad_norm_(opt.param_groups[0]["params"]) -> opt

Anything else is ambiguous, and the caller refuses the step.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Set

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.statements import calls_within
from ampify.transforms.torch.training_loop import TrainingStructure, TrainingUnit

_PARAMETER_METHODS = ("parameters", "named_parameters")


def optimizer_of_gradients(s: TrainingStructure, unit: TrainingUnit, call: cst.Call, clip: bool) -> Optional[str]:
    """The one optimizer of `unit` whose gradients `call` reads, or None when that cannot be told.
    `clip`: a torch clipping call, whose first argument alone names the parameters."""
    arguments: Sequence[cst.Arg] = call.args[:1] if clip else call.args
    mentioned = _dotted_names_in(arguments)
    direct = [name for name in unit.optimizers if name in mentioned]
    if direct:
        return direct[0] if len(direct) == 1 else None
    trained = {name: models_of(s, unit, name) for name in unit.optimizers}
    receivers = _parameter_receivers(arguments)
    if not clip:
        # a helper handed a model: clip_gradients(model, c)
        every_model = set().union(*trained.values())
        receivers |= mentioned & (every_model | {_root(m) for m in every_model})
    if not receivers:
        return None
    exact = [name for name, models in trained.items() if receivers <= models]
    if len(exact) == 1:
        return exact[0]
    if exact:
        return None
    roots = {_root(r) for r in receivers}
    by_root = [name for name, models in trained.items() if roots <= {_root(m) for m in models}]
    return by_root[0] if len(by_root) == 1 else None


def models_of(s: TrainingStructure, unit: TrainingUnit, optimizer: str) -> Set[str]:
    """Receivers of `.parameters()` in the optimizer's constructions (one assignment followed:
    `params = model.parameters()`; `filter(lambda p: ..., model.parameters())` included)."""
    found: Set[str] = set()
    for binding in s.bindings_visible(optimizer, unit.scope):
        if not isinstance(binding.value, cst.Call):
            continue
        sources: List[cst.CSTNode] = [binding.value]
        for argument in binding.value.args:
            name = dotted_name(argument.value)
            if name is not None:
                sources += [b.value for b in s.bindings_visible(name, binding.scope) if b.value is not None]
        for source in sources:
            found |= _parameter_receivers_of(source)
    return found


def _parameter_receivers(arguments: Sequence[cst.Arg]) -> Set[str]:
    found: Set[str] = set()
    for argument in arguments:
        found |= _parameter_receivers_of(argument.value)
    return found


def _parameter_receivers_of(node: cst.CSTNode) -> Set[str]:
    found = set()
    calls = list(calls_within(node))
    if isinstance(node, cst.Call):
        calls.append(node)
    for call in calls:
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _PARAMETER_METHODS:
            receiver = dotted_name(call.func.value)
            if receiver is not None:
                found.add(receiver)
    return found


def _dotted_names_in(arguments: Sequence[cst.Arg]) -> Set[str]:
    """Every name and dotted attribute chain in the arguments (`opt`, `opt.param_groups`, `model`)."""
    found: Set[str] = set()

    class _Collect(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            name = dotted_name(node)
            if name is not None:
                parts = name.split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))

        def visit_Name(self, node: cst.Name) -> None:
            found.add(node.value)

    for argument in arguments:
        argument.value.visit(_Collect())
    return found


def _root(receiver: str) -> str:
    """`model.encoder` -> `model`, `self.model.head` -> `self.model`."""
    parts = receiver.split(".")
    keep = 2 if parts[0] == "self" and len(parts) > 1 else 1
    return ".".join(parts[:keep])
