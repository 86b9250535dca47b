"""backward() in a helper method: pair it with the optimizer step of the iteration that calls it.

pix2pix, CycleGAN and many GAN code bases split one training iteration over methods of a model
class:

    def backward_D(self):
        ...
        self.loss_D = (self.loss_D_fake + self.loss_D_real) * 0.5
        self.loss_D.backward()

    def optimize_parameters(self):
        self.forward()
        self.optimizer_D.zero_grad()
        self.backward_D()
        self.optimizer_D.step()

On its own, `backward_D` has a backward() and no step, so `analyze_training` leaves it unpaired.
`pair_helper_backwards` follows such a backward() to the calls of its method (`self.backward_D()`),
also through helpers of helpers (CycleGAN: backward_D_A -> backward_D_basic). When every call of
the helper is a statement of its own, in a method of the same class, and runs in one iteration that
steps an optimizer, each call joins that iteration's training unit as a delegated backward (see
`Delegation`). Anything less certain leaves the backward unpaired, with the reason in
`TrainingStructure.helper_refusals`, so that it is reported as before.

Both backends follow helpers: native scales the helper's backward through `self.scaler`, apex
wraps it in `amp.scale_loss(loss, <the optimizer stepped after the helper call>)`.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.statements import calls_within
from ampify.transforms.torch.training_loop import (
    BackwardCall,
    Delegation,
    StepCall,
    TrainingStructure,
    TrainingUnit,
    UnitOwner,
    loop_body_owners,
    names_passed_for,
    method_calls,
)

#: helpers of helpers followed at most this deep (CycleGAN needs 2)
MAX_HELPER_DEPTH = 3

#: (helper calls from the iteration down, the helpers they call, the iteration's owner)
_Route = Tuple[List[cst.Call], List[cst.FunctionDef], UnitOwner]


class _NoRoute(Exception):
    """The helper cannot be followed safely; the message says why (shown to the user)."""


def pair_helper_backwards(structure: TrainingStructure) -> None:
    """Move each unpaired backward() that runs in a helper method into the training units of the
    iterations that call it (see the module docstring); record why for those that stay unpaired."""
    if not structure.unpaired_backwards:
        return
    step_owner_ids = {
        id(owner) for step in structure.steps for owner in loop_body_owners(structure, step.call, step.scope)
    }
    per_helper: Dict[int, int] = {}
    for backward in structure.unpaired_backwards:
        per_helper[id(backward.scope)] = per_helper.get(id(backward.scope), 0) + 1
    units = {id(unit.owner): unit for unit in structure.units}
    still_unpaired: List[BackwardCall] = []
    for backward in structure.unpaired_backwards:
        helper = backward.scope
        try:
            if not isinstance(helper, cst.FunctionDef):
                raise _NoRoute("it is not in a function")
            if per_helper[id(helper)] > 1:
                raise _NoRoute(f"{helper.name.value}() calls backward() more than once")
            _check_helper_body(structure, helper)
            routes = _routes_to_iterations(structure, helper, step_owner_ids, depth=0)
            owners = {id(owner): sites[0] for sites, _, owner in routes}
            if len(owners) > 1:
                # if one of those steps were refused, the helper's scaled backward would feed an
                # optimizer stepped without the scaler: follow a helper into one step only
                places = ", ".join(f"{_where(structure, site)}" for site in owners.values())
                raise _NoRoute(f"{helper.name.value}() is called from {len(owners)} training steps ({places})")
        except _NoRoute as refusal:
            structure.helper_refusals[id(backward.call)] = str(refusal)
            still_unpaired.append(backward)
            continue
        for sites, helpers, owner in routes:
            unit = units.get(id(owner))
            if unit is None:
                scope = structure.scope_of(sites[0])
                unit = TrainingUnit(owner, scope, structure.class_of(scope))
                units[id(owner)] = unit
                structure.units.append(unit)
                _adopt_sites_of(structure, unit)
            site = sites[0]
            unit.backwards.append(
                BackwardCall(
                    site,
                    structure.statement_of(site),
                    None,
                    structure.scope_of(site),
                    loss=None,
                    delegation=Delegation(backward, sites, helpers),
                )
            )
            structure.delegated_sites.extend(sites)
    structure.unpaired_backwards = still_unpaired
    for unit in structure.units:
        if any(b.delegation is not None for b in unit.backwards):
            unit.backwards.sort(key=lambda b: (structure.line(b.call), structure.position(b.call).column))


def helper_refusal_note(structure: TrainingStructure, backward: BackwardCall) -> str:
    """For the warning on an unpaired backward() in a method: why its method was not followed
    (empty when nothing was tried)."""
    refusal = structure.helper_refusals.get(id(backward.call))
    if not refusal or not isinstance(backward.scope, cst.FunctionDef) or structure.class_of(backward.scope) is None:
        return ""
    return f" (its method was not followed to the step that uses it: {refusal})"


def distinct_losses(unit: TrainingUnit) -> List[BackwardCall]:
    """The real `<loss>.backward()` calls of a unit, each once, in the order the iteration reaches
    them (a helper's backward may be reached by several helper calls: CycleGAN's backward_D_basic)."""
    found: List[BackwardCall] = []
    seen: Set[int] = set()
    for backward in unit.backwards:
        real = backward.delegation.inner if backward.delegation is not None else backward
        if id(real.call) not in seen:
            seen.add(id(real.call))
            found.append(real)
    return found


def call_of_unfollowed_backward(structure: TrainingStructure, unit: TrainingUnit) -> Optional[Tuple[str, cst.Call]]:
    """A call in the unit's iteration of a function that runs a backward() no unit holds
    (`self.aux_backward()`), with a message; None if there is none. Such an iteration cannot be
    converted: its optimizer step would unscale gradients that were never scaled."""
    unfollowed: Dict[str, BackwardCall] = {}
    for backward in structure.unpaired_backwards:
        if isinstance(backward.scope, cst.FunctionDef):
            unfollowed.setdefault(backward.scope.name.value, backward)
    if not unfollowed:
        return None
    for call in calls_within(unit.owner):
        func = call.func
        called = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        backward = unfollowed.get(called) if called else None
        if backward is not None and not _may_call(structure, func, backward.scope):
            backward = None  # `model.train()` is nn.Module's mode switch, not this file's train()
        if backward is not None:
            return (
                f"this training step calls {called}() (line {structure.line(call)}), which runs a backward() "
                f"(line {structure.line(backward.call)}) that ampify could not pair with its optimizer step: "
                "the step would unscale gradients that were never scaled",
                call,
            )
    return None


def backward_for_its_hooks(structure: TrainingStructure, unit: TrainingUnit) -> Optional[Tuple[str, cst.Call]]:
    """A backward() whose gradients are cleared before any step uses them: `fisher_loss.backward()`
    then `optimizer.zero_grad()` and the real loss's backward and step (ACKTR's K-FAC). It runs for
    what hooks see during it (K-FAC's Fisher statistics), and scaling its loss would scale those
    too. With a message; None when every backward reaches a step. Only the source order of one
    iteration is read: a zero_grad() of the optimizer that steps next, with no step in between."""
    steps = sorted((structure.line(step.call), step.receiver) for step in unit.steps)
    for backward in unit.backwards:
        if backward.delegation is not None:
            continue
        line = structure.line(backward.call)
        later_steps = [(at, receiver) for at, receiver in steps if at > line]
        if not later_steps:
            continue
        next_step, stepped = later_steps[0]
        # blocks that hold the backward: a zero_grad() there runs whenever the backward did (one
        # in a branch of its own, `if skip: optimizer.zero_grad(); continue`, drops a bad batch)
        around = {id(block) for block, _ in structure.block_path(backward.call)}
        for clear in unit.zero_grads:
            at = structure.line(clear.call)
            statement = structure.statement_of(clear.call)
            unconditional = statement is not None and id(structure.block_of(statement)) in around
            if line < at < next_step and clear.receiver == stepped and unconditional:
                return (
                    f"the gradients of this backward() are cleared by {clear.receiver}.zero_grad() (line {at}) "
                    "before any step uses them: it runs for what hooks see during it (K-FAC's Fisher statistics, say), "
                    "and loss scaling (or autocast) would change that too; convert by hand",
                    backward.call,
                )
    return None


@dataclass
class StepFedElsewhere:
    """An optimizer step of a unit whose gradients no backward() of the unit computes."""

    step: StepCall
    #: the line of its zero_grad() before it in the same block
    cleared: int
    #: the calls between that zero_grad() and the step (what computes its gradients)
    between: List[cst.Call]

    @property
    def source(self) -> Optional[cst.Call]:
        """The call most likely computing the gradients: one named like a backward, else the first."""
        return next((call for call in self.between if "backward" in (dotted_name(call.func) or "")), None) or (
            self.between[0] if self.between else None)


def steps_fed_elsewhere(structure: TrainingStructure, unit: TrainingUnit) -> List[StepFedElsewhere]:
    """The optimizer steps of the unit whose gradients no backward() of the unit computes: the
    step's `zero_grad()` and `step()` sit in one block with no backward of the unit (nor a helper
    call reaching one) between them (khanrc/pt.darts: `alpha_optim.zero_grad()`,
    `architect.unrolled_backward(...)` of another module, `alpha_optim.step()`). GradScaler would
    unscale those gradients, never scaled, by the loss scale."""
    found = []
    reached = [backward.delegation.sites[0] if backward.delegation is not None and backward.delegation.sites
               else backward.call for backward in unit.backwards]
    for step in unit.steps:
        if step.wrapper is not None or not step.receiver:
            continue
        statement = structure.statement_of(step.call)
        block = structure.block_of(statement) if statement is not None else None
        if block is None:
            continue
        at = structure.line(step.call)
        clears = [clear for clear in unit.zero_grads if clear.receiver == step.receiver
                  and structure.line(clear.call) < at and structure.statement_of(clear.call) is not None
                  and structure.block_of(structure.statement_of(clear.call)) is block]
        if not clears:
            continue
        cleared = max(structure.line(clear.call) for clear in clears)
        if any(cleared < structure.line(call) < at for call in reached):
            continue
        between = [call for call in calls_within(unit.owner) if cleared < structure.line(call) < at]
        found.append(StepFedElsewhere(step, cleared, between))
    return found


def describe_step_fed_elsewhere(structure: TrainingStructure, fed: StepFedElsewhere) -> str:
    """"alpha_optim.step() (line 133) steps gradients that no backward() of this training step
    computes (...)" for a message."""
    source = fed.source
    shown = (f"they come from {dotted_name(source.func) or 'a call'}() (line {structure.line(source)}), "
             if source is not None else "")
    receiver = fed.step.receiver
    return (f"{receiver}.step() (line {structure.line(fed.step.call)}) steps gradients that no backward() of this "
            f"training step computes ({receiver}.zero_grad() at line {fed.cleared}, no backward() before the step; "
            f"{shown}not scaled)")


def step_of_gradients_from_elsewhere(structure: TrainingStructure, unit: TrainingUnit
                                     ) -> Optional[Tuple[str, cst.Call]]:
    """The first of steps_fed_elsewhere, with apex's refusal message; None when there is none."""
    found = steps_fed_elsewhere(structure, unit)
    if not found:
        return None
    return (describe_step_fed_elsewhere(structure, found[0]) + ": O1 casts what computes them to float16 as well, "
            "with no amp.scale_loss, and amp would unscale them as if they were scaled; convert by hand, or use "
            "--backend native (which leaves such a step plain, in float32)", found[0].step.call)


#: receivers of a `.step()` that is no optimizer's: schedulers, profilers, progress bars, agents
_STEPS_NOT_AN_OPTIMIZER = re.compile(r"sched|warmup|^lr_|_lr$|prof|timer|progress|bar$|^env|_env$|^self$", re.IGNORECASE)


def unknown_step_after_backward(structure: TrainingStructure, unit: TrainingUnit) -> Optional[Tuple[str, cst.Call]]:
    """A `.step()` ampify does not take for an optimizer's, after the unit's first backward() in its
    iteration (`extra.mapping.step()` beside `optimizer.step()`): if it is an optimizer's, it
    would step on scaled gradients. Schedulers, profilers, progress bars and
    environments (by name or by the call that builds them) are not asked about. With a message;
    None when there is no such step."""
    if not unit.backwards or not unit.steps:
        return None
    first = min(structure.line(backward.call) for backward in unit.backwards)
    for site in structure.other_steps:
        if site.call.args or site.scope is not unit.scope or not structure.contains(unit.body, site.call):
            continue
        receiver = site.receiver or ""
        if structure.line(site.call) <= first:
            continue
        if _STEPS_NOT_AN_OPTIMIZER.search(receiver.rsplit(".", 1)[-1]):
            continue
        built = [binding.qualified_call or "" for binding in structure.bindings_visible(receiver, site.scope)]
        if any(_STEPS_NOT_AN_OPTIMIZER.search(call) or "lr_scheduler" in call for call in built):
            continue
        if receiver in structure.weight_averages or _step_of_a_class_reading_no_gradients(structure, receiver, site.scope):
            continue
        return (
            f"{receiver}.step() (line {structure.line(site.call)}) runs after this backward() in its iteration, "
            f"and ampify cannot tell whether {receiver} is an optimizer: if it is, it would step on scaled "
            "gradients; convert by hand (or give the optimizer a name ampify knows: optimizer, optim, opt_*)",
            site.call,
        )
    return None


def _step_of_a_class_reading_no_gradients(structure: TrainingStructure, receiver: str, scope) -> bool:
    """Is `receiver` (or every name the calls of its function hand it, for a parameter) an
    instance of a class of this file, with no base, whose step() reads no `.grad` (MixMatch's
    `WeightEMA`: an average of the weights)? Scaled gradients cannot reach such a step."""
    bindings = structure.bindings_visible(receiver, scope)
    if bindings and all(binding.kind == "parameter" for binding in bindings):
        passed = names_passed_for(structure, receiver, bindings[0].scope)
        if not passed:
            return False
        bindings = [b for name, _, where in passed for b in structure.bindings_visible(name, where)]
    if not bindings:
        return False
    classes = {node.name.value: node for node in structure.module.body if isinstance(node, cst.ClassDef)}
    for binding in bindings:
        value = binding.value
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)) or value.func.value not in classes:
            return False
        klass = classes[value.func.value]
        if any(dotted_name(base.value) != "object" for base in klass.bases):
            return False
        body = klass.body.body if isinstance(klass.body, cst.IndentedBlock) else []
        step = next((item for item in body if isinstance(item, cst.FunctionDef) and item.name.value == "step"), None)
        if step is None or ".grad" in structure.module.code_for_node(step):
            return False
    return True


def _may_call(structure: TrainingStructure, func: cst.BaseExpression, function: cst.FunctionDef) -> bool:
    """Can a call of `func` run `function`? A module-level function is called by its bare name,
    a method through `self.` (or `super()`); `other.name()` is another object's method."""
    if structure.class_of(function) is None:
        return isinstance(func, cst.Name)
    if isinstance(func, cst.Attribute):
        receiver = func.value
        return (isinstance(receiver, cst.Name) and receiver.value == "self") or (
            isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Name) and receiver.func.value == "super"
        )
    return False


def _check_helper_body(structure: TrainingStructure, helper: cst.FunctionDef) -> None:
    """Gradients must not be read, clipped or stepped inside the helper: they are scaled there."""
    for site in structure.clips:
        if site.scope is helper:
            raise _NoRoute(
                f"{helper.name.value}() clips gradients after its backward(), where they are still scaled"
            )
    for read in structure.grad_reads:
        if read.scope is helper:
            raise _NoRoute(f"{helper.name.value}() reads .grad after its backward(), where gradients are still scaled")


def _routes_to_iterations(
    structure: TrainingStructure, helper: cst.FunctionDef, step_owner_ids: Set[int], depth: int
) -> List[_Route]:
    """Every way the iterations of this file reach `helper`; raises _NoRoute unless each call of
    it is followed to an iteration that steps an optimizer."""
    name = helper.name.value
    klass = structure.class_of(helper)
    if klass is None:
        raise _NoRoute(f"{name}() is not a method (helpers that are plain functions are not followed)")
    calls, other_uses = method_calls(structure, helper, klass)
    if name == "backward" and not calls:
        raise _NoRoute(
            f"it is the backward() of {klass.name.value}, a loss class: training code calls it on its instances "
            "(`loss.backward()`): the native backend converts it from the steps that fill and call such an object; "
            "the apex backend does not"
        )
    if other_uses:
        raise _NoRoute(f"{name} is used other than as self.{name}() ({_where(structure, other_uses[0])})")
    if not calls:
        raise _NoRoute(f"{name}() is never called as self.{name}() in this file")
    routes: List[_Route] = []
    for call in calls:
        statement = structure.statement_of(call)
        if not _is_call_statement(statement, call):
            raise _NoRoute(f"self.{name}() is called inside an expression ({_where(structure, call)})")
        caller = structure.scope_of(call)
        if not isinstance(caller, cst.FunctionDef) or structure.class_of(caller) is not klass:
            raise _NoRoute(f"self.{name}() is called outside the methods of its class ({_where(structure, call)})")
        owner = next((o for o in loop_body_owners(structure, call, caller) if id(o) in step_owner_ids), None)
        if owner is not None:
            routes.append(([call], [helper], owner))
            continue
        if depth + 1 >= MAX_HELPER_DEPTH:
            raise _NoRoute(f"self.{name}() is reached through too many helper methods")
        where = f"self.{name}() is called in {caller.name.value}(), where no optimizer steps"
        if any(b.scope is caller for b in structure.backwards):
            raise _NoRoute(f"{where}, and which runs a backward() of its own")
        try:
            _check_helper_body(structure, caller)
            outer_routes = _routes_to_iterations(structure, caller, step_owner_ids, depth + 1)
        except _NoRoute as refusal:
            raise _NoRoute(f"{where}; following {caller.name.value}() further: {refusal}") from None
        for sites, helpers, outer_owner in outer_routes:
            routes.append((sites + [call], helpers + [helper], outer_owner))
    return routes


def _where(structure: TrainingStructure, node: cst.CSTNode) -> str:
    """Where a node is ("in train_step()", "at module level"), without computing line numbers
    (positions cost a code generation of the module, and most refusals happen in library code
    whose report needs no more than the backward's own line)."""
    scope = structure.scope_of(node)
    return f"in {scope.name.value}()" if isinstance(scope, cst.FunctionDef) else "at module level"


def _is_call_statement(statement: Optional[cst.CSTNode], call: cst.Call) -> bool:
    """`self.helper(...)` or `x = self.helper(...)` as a statement of its own."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if isinstance(small, cst.Expr):
        return small.value is call
    if isinstance(small, (cst.Assign, cst.AnnAssign)):
        return small.value is call
    return False


def _adopt_sites_of(structure: TrainingStructure, unit: TrainingUnit) -> None:
    """A unit made for a delegated backward: its steps, clips, zero_grads and .grad reads."""
    owner_id = id(unit.owner)

    def innermost_is_unit(node: cst.CSTNode, scope) -> bool:
        for owner in loop_body_owners(structure, node, scope):
            if id(owner) == owner_id:
                return True
            if any(id(owner) == id(u.owner) for u in structure.units if u is not unit):
                return False
        return False

    for attribute in ("steps", "clips", "zero_grads"):
        getattr(unit, attribute).extend(
            site for site in getattr(structure, attribute) if innermost_is_unit(site.call, site.scope)
        )
    unit.grad_reads.extend(read for read in structure.grad_reads if innermost_is_unit(read.node, read.scope))
