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
from ampify.transforms.torch.statements import argument_for, calls_within, parameter_positions
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
    if not found:
        found = _models_passed_with(s, unit, optimizer)
    return found


def _models_passed_with(s: TrainingStructure, unit: TrainingUnit, optimizer: str) -> Set[str]:
    """The optimizer is a parameter of the unit's module-level function, which this module calls
    (stylegan2-pytorch's `train(args, loader, generator, discriminator, g_optim, d_optim, ...)`, its
    optimizers built under `if __name__ == "__main__":` from `discriminator.parameters()`): the
    parameters through which every call passes the models that optimizer was built from, so that
    `discriminator.zero_grad()` in the function is known to zero d_optim's gradients. Empty when a
    call passes something else, the calls disagree, there is none, or the function rebinds them."""
    function = unit.scope
    if "." in optimizer or not isinstance(function, cst.FunctionDef) or function not in s.module.body:
        return set()
    cache = s.__dict__.setdefault("_models_passed_with", {})
    key = (id(function), optimizer)
    if key not in cache:
        cache[key] = _models_passed_to(s, function, optimizer)
    return cache[key]


def _models_passed_to(s: TrainingStructure, function: cst.FunctionDef, optimizer: str) -> Set[str]:
    positions = parameter_positions(function)
    if optimizer not in positions:
        return set()
    calls = [call for call in calls_within(s.module) if dotted_name(call.func) == function.name.value]
    agreed: Optional[Set[str]] = None
    for call in calls:
        passed = argument_for(call, optimizer, positions)
        name = dotted_name(passed) if passed is not None else None
        if name is None or "." in name:
            return set()
        caller = s.scope_of(call)
        built_from: Set[str] = set()
        for binding in s.bindings_visible(name, caller):
            if isinstance(binding.value, cst.Call):
                built_from |= _parameter_receivers_of(binding.value)
        parameters = {parameter for parameter in positions
                      if dotted_name(argument_for(call, parameter, positions) or cst.Name("_")) in built_from}
        if not parameters or (agreed is not None and parameters != agreed):
            return set()
        agreed = parameters
    if not agreed:
        return set()
    rebound = {binding.name for binding in s.bindings if binding.scope is function and binding.kind != "parameter"}
    return set() if agreed & rebound else agreed


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
