"""Where a training unit's GradScaler is created, and how the unit's code reaches it.

One scaler per training setup: after the latest binding of the optimizers in the scope that
creates them (`scaler`), next to the class's `self.<optimizer>` assignment (`self.scaler`), or,
when the step's function receives the optimizers as parameters, in every in-file caller, passed
in as a new keyword argument. Anything else raises Unconvertible with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampify.transforms.base import CallSite, ProjectFacts
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.training_loop import (
    Block,
    Scope,
    TrainingStructure,
    TrainingUnit,
    Unconvertible,
    collection_of_optimizers,
    method_calls,
)


#: the scaler reference a call passes for an optimizer whose step() does nothing (see
#: `no_op_optimizer_class`); written as `<torch>.amp.GradScaler(enabled=False)`
DISABLED_SCALER = "<disabled GradScaler>"
#: what idle_optimizers records for a call that passes None for the optimizer
NO_OPTIMIZER = "None"


def no_op_optimizer_class(
    s: TrainingStructure, argument: Optional[cst.BaseExpression], scope: Optional[Scope] = None
) -> Optional[str]:
    """The class name when `argument` builds an instance of a class of this module whose step()
    does nothing (`DummyOptimizer()` of the Annotated Transformer, passed for evaluation runs of
    the training function), or is a name (seen from `scope`) only ever bound to one; None
    otherwise. A GradScaler built with enabled=False delegates step() to it and does nothing
    else, so such a call behaves exactly as before."""
    if isinstance(argument, cst.Name) and scope is not None:
        bindings = s.bindings_visible(argument.value, scope)
        classes = {no_op_optimizer_class(s, b.value) if b.kind == "assign" else None for b in bindings}
        return classes.pop() if len(classes) == 1 and bindings else None
    if not (isinstance(argument, cst.Call) and isinstance(argument.func, cst.Name)):
        return None
    name = argument.func.value
    classes = [
        statement for statement in s.module.body
        if isinstance(statement, cst.ClassDef) and statement.name.value == name
    ]
    if len(classes) != 1 or any(b.name == name for b in s.bindings):
        return None
    klass = classes[0]
    if not isinstance(klass.body, cst.IndentedBlock):
        return None
    steps = [item for item in klass.body.body if isinstance(item, cst.FunctionDef) and item.name.value == "step"]
    if len(steps) != 1 or steps[0].decorators:
        return None
    return name if _does_nothing(steps[0].body) else None


def _does_nothing(body: cst.BaseSuite) -> bool:
    """A function body of `pass`, `None`, `...`, a docstring or a bare `return` / `return None`."""
    statements_ = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for line in statements_:
        if not isinstance(line, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return False
        for small in line.body:
            if isinstance(small, cst.Pass):
                continue
            if isinstance(small, cst.Expr) and isinstance(small.value, (cst.Name, cst.Ellipsis, cst.SimpleString,
                                                                          cst.ConcatenatedString)):
                if isinstance(small.value, cst.Name) and small.value.value != "None":
                    return False
                continue
            if isinstance(small, cst.Return) and (
                    small.value is None or (isinstance(small.value, cst.Name) and small.value.value == "None")):
                continue
            return False
    return True


class FarApart(Unconvertible):
    """Two steps of one scope use optimizers created too far apart for one GradScaler created
    after both (a calling module may create one after each instead)."""


@dataclass
class ScalerHome:
    """Where a scaler is created and how code refers to it."""

    scope: Scope
    reference: str  # "scaler" or "self.scaler"
    after: cst.CSTNode  # the statement the creation goes after
    device_scope: Scope
    line: int  # line of `after`, for findings and ordering checks
    optimizers: List[str] = field(default_factory=list)
    #: optimizers created after the scaler (stepped through it all the same)
    created_later: List[str] = field(default_factory=list)
    #: the first line that uses the scaler (a training loop), when known
    first_use: Optional[int] = None
    #: earlier statements that create the same optimizer (a notebook or script that builds a
    #: model and optimizer, trains, then builds new ones): a scaler is created after each too, so
    #: the step function finds one whichever optimizer it steps
    also_after: List[cst.CSTNode] = field(default_factory=list)
    #: optimizers a base class of the project sets (`self.optimizer` of pytorch-template's
    #: BaseTrainer): (receiver, base, "base/base_trainer.py:18", where the base saves its state)
    inherited: List[Tuple[str, str, str, Tuple[str, ...]]] = field(default_factory=list)
    #: the function that creates the optimizers and trains, called in a loop (`train(epoch)` of
    #: meliketoy/wide-resnet.pytorch): its scaler starts again at the initial scale each call
    recreated_per_call: Optional[str] = None
    #: the creation goes before `after`, not after it (a factory's first statement is the step
    #: function it returns)
    before: bool = False
    #: (factory, step function) when the scaler is created in a factory of the step (_factory_of)
    factory: Optional[Tuple[str, str]] = None


@dataclass
class UnitPlan:
    """Everything to write for one training unit."""

    unit: TrainingUnit
    reference: str  # how the unit's code refers to the scaler
    regions: List[Tuple[Block, int, int]]  # (block, first index, last index) to wrap in autocast
    update_after: Optional[cst.CSTNode] = None
    #: steps in a branch that leaves the iteration (`continue`): scaler.update() after them too
    early_exit_updates: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    #: steps of an optimizer stepped again later in the iteration: scaler.update() after each
    restep_updates: List[cst.CSTNode] = field(default_factory=list)
    unscale_before: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    home: Optional[ScalerHome] = None
    #: functions that receive the scaler as a new parameter, with their in-file calls
    threaded_function: Optional[cst.FunctionDef] = None
    threaded_calls: List[Tuple[cst.Call, str]] = field(default_factory=list)  # (call, scaler reference)
    #: callers that receive the optimizers as parameters too and pass the scaler on (new parameter)
    relay_functions: List[cst.FunctionDef] = field(default_factory=list)
    caller_homes: List[ScalerHome] = field(default_factory=list)
    #: the calling modules' edits when the step is called from other files (CallerPlan each)
    companions: List = field(default_factory=list)
    #: re-plan each of them with a given device expression (to agree with autocast's)
    replan_companions: List = field(default_factory=list)
    #: the device expression autocast must use (set when the modules disagree)
    forced_device: Optional[str] = None
    #: gradient penalties of other modules the step calls: (call, CompanionChange of the penalty's
    #: module, its autograd.grad line), the call passing the scaler by keyword
    foreign_penalties: List = field(default_factory=list)
    #: loss objects whose backward() the step calls: (LossObjectUse, CompanionChange of the loss
    #: class's module or None), the call passing the scaler by keyword
    loss_objects: List = field(default_factory=list)


class ScalerPlacement:
    """The scaler homes of one module, shared by all its training units (one per setup)."""

    def __init__(
        self, structure: TrainingStructure, scaler_name: str, project: Optional[ProjectFacts] = None, display: str = ""
    ) -> None:
        self.structure = structure
        self.scaler_name = scaler_name
        #: this module, as findings in other modules name it
        self.display = display
        #: the rest of the project, to name the callers in other files
        self.project = project
        #: id(scope or class) -> its scaler home
        self.homes: Dict[int, ScalerHome] = {}
        #: calls that pass an optimizer whose step() does nothing, and its class (they get DISABLED_SCALER)
        self.idle_optimizers: List[Tuple[cst.Call, str]] = []

    def place(self, plan: UnitPlan) -> None:
        """Decide where the unit's GradScaler is created and how its code refers to it (sets
        `plan.reference`, and `plan.home` or the threaded parameter and its callers)."""
        s = self.structure
        unit = plan.unit
        # `for optimizer in optimizers: optimizer.step()`: the scaler goes where the collection is made
        receivers = list(dict.fromkeys(self._collection_of(r, unit) or r for r in unit.optimizers))
        owners = _owners_of_owned_optimizers(s, unit, receivers)
        if owners:
            # `self.Q_eval.optimizer`: the networks the agent holds build their own optimizers; the
            # agent's scaler is created after it builds them (one scaler for the unit, as for its
            # own optimizers)
            plan.reference = f"self.{self.scaler_name}"
            plan.home = self._class_home(unit.klass, unit.scope, owners, unit.steps[0].call)
            plan.home.optimizers = list(dict.fromkeys(list(receivers) + [o for o in plan.home.optimizers
                                                                         if o not in owners]))
            return
        if all(r.startswith("self.") for r in receivers):
            plan.reference = f"self.{self.scaler_name}"
            if unit.klass is None:
                raise Unconvertible("self.<optimizer> used outside a method", unit.steps[0].call)
            plan.home = self._class_home(unit.klass, unit.scope, receivers, unit.steps[0].call)
            return
        other_attributes = [r for r in receivers if "." in r and not r.startswith("self.")]
        if other_attributes:
            raise Unconvertible(
                f"the optimizer {other_attributes[0]} is an attribute of another object; ampify follows "
                "variables and self.<attribute> only: create the GradScaler next to it by hand",
                unit.steps[0].call,
            )
        if any(r.startswith("self.") for r in receivers):
            raise Unconvertible(
                f"optimizers {', '.join(receivers)} are reached in different ways (self attribute and variable)",
                unit.steps[0].call,
            )
        kinds = {}
        for receiver in receivers:
            bindings = s.bindings_visible(receiver, unit.scope)
            if not bindings:
                raise Unconvertible(s.not_found_reason(receiver, unit.scope), unit.steps[0].call)
            kinds[receiver] = "parameter" if any(b.kind == "parameter" for b in bindings) else "variable"
        if set(kinds.values()) == {"variable"}:
            if isinstance(unit.owner, (cst.For, cst.While)):
                use_statement = s.statement_of(unit.owner)
            else:
                self._refuse_a_scaler_per_call(unit, receivers)
                use_statement = s.statement_of(unit.backwards[0].call)
            plan.home = self._variable_home(receivers, unit.scope, use_statement, unit.steps[0].call)
            return
        if set(kinds.values()) == {"parameter"} and isinstance(unit.scope, cst.FunctionDef):
            owners = {id(s.bindings_visible(r, unit.scope)[0].scope): s.bindings_visible(r, unit.scope)[0].scope
                      for r in receivers}
            if list(owners) != [id(unit.scope)]:
                factory = self._factory_of(unit.scope, list(owners.values()), receivers)
                if isinstance(factory, str):
                    raise Unconvertible(factory, unit.steps[0].call)
                plan.reference = self.scaler_name
                plan.home = factory
                return
            self._thread_through_parameter(plan, receivers)
            return
        parameters = [r for r in receivers if kinds[r] == "parameter"]
        if isinstance(unit.scope, cst.FunctionDef) and all(
                s.bindings_visible(r, unit.scope)[0].scope is unit.scope for r in parameters):
            # facebookresearch/deepcluster's train(loader, model, crit, opt, epoch) steps the `opt` it is
            # handed and an `optimizer_tl` it builds itself: the GradScaler comes in with `opt`, from
            # where that one is created, and steps both (one scaler may step any optimizers)
            self._thread_through_parameter(plan, parameters)
            return
        raise Unconvertible(
            f"optimizers {', '.join(receivers)} are partly parameters, partly local variables", unit.steps[0].call
        )

    def _refuse_a_scaler_per_call(self, unit, receivers: List[str]) -> None:
        """The step is a function's whole body, with no loop of its own (called once per batch),
        and it fetches its optimizer rather than building it (stacked hourglass's `optimizer =
        train_cfg['optimizer']`): a GradScaler created after that line would be a new one at every
        step, starting again at the initial scale, and a step that overflows there would be skipped
        every time. Refused with that reason."""
        s = self.structure
        if not isinstance(unit.owner, cst.FunctionDef):
            return
        for receiver in receivers:
            local = [b for b in s.bindings_visible(receiver, unit.scope) if b.scope is unit.scope and b.statement is not None]
            if local and not any(isinstance(b.value, cst.Call) for b in local):
                fetched = local[-1]
                raise Unconvertible(
                    f"{unit.owner.name.value}() runs one training step per call (no loop of its own) and fetches "
                    f"{receiver} at line {s.line(fetched.statement)} instead of building it: a GradScaler created "
                    "there would start again at its initial scale at every step; create it where the optimizer is "
                    "created, keep it beside it, and use it here", unit.steps[0].call)

    def _factory_of(self, step_function: cst.FunctionDef, owners: List[Scope], receivers: List[str]):
        """The step function is defined inside the function whose parameter the optimizer is, and
        handed away from there (reid-strong-baseline's `create_supervised_trainer(model, optimizer,
        loss_fn, device)` returns `Engine(_update)`; a trainer factory returning its `train_step`):
        that factory runs once per training run, so the GradScaler is created in it, just before
        the step function, which reads it from the closure. A ScalerHome, or the reason it cannot
        be (a string)."""
        s = self.structure
        owner = owners[0]
        name = getattr(getattr(owner, "name", None), "value", "?")
        by_hand = (f"{receivers[0]} is a parameter of the enclosing function {name}(): create the GradScaler there "
                   "by hand (once per training run) and use it here")
        if len(owners) != 1 or not isinstance(owner, cst.FunctionDef) or s.class_of(owner) is not None:
            return by_hand
        body = list(owner.body.body) if isinstance(owner.body, cst.IndentedBlock) else []
        index = next((i for i, statement in enumerate(body) if statement is step_function), None)
        if index is None:
            return by_hand  # defined deeper (under an if, in a loop): where it runs once is not read
        uses = [node for node in s.name_nodes.get(step_function.name.value, [])
                if node is not step_function.name and s.contains(owner, node)]
        calls = [node for node in uses if isinstance(s.parent(node), cst.Call) and s.parent(node).func is node]
        if calls or not (uses or step_function.decorators):
            return by_hand  # called in place (it runs where the factory runs), or never handed away
        factory_calls, _ = _calls_of_function(s, owner) if s.scope_of(owner) is s.module else ([], [])
        if any(isinstance(a, (cst.For, cst.While)) for call in factory_calls for a in s.ancestors(call)):
            return (f"{name}() builds the training step {step_function.name.value}() and is called in a loop: a "
                    "GradScaler created in it would start again at its initial scale at each call; create it once, "
                    "where the optimizer is created, and hand it in")
        after = body[index - 1] if index > 0 else step_function
        home = ScalerHome(owner, self.scaler_name, after, owner, s.line(after), list(receivers),
                          first_use=s.line(step_function), before=index == 0,
                          factory=(name, step_function.name.value))
        existing = self.homes.get(id(owner))
        if existing is not None:
            return existing
        self.homes[id(owner)] = home
        return home

    def _collection_of(self, receiver: str, unit) -> Optional[str]:
        """`optimizers` when every step of `receiver` runs in `for receiver in optimizers:` (a plain
        name, the loop over the optimizers only: no backward() in it) and the name is bound nowhere
        else in the unit's scope; None otherwise."""
        s = self.structure
        collection = collection_of_optimizers(receiver)
        if collection is not None:
            # `optimizersD[i].step()`, `optims.discriminator.step()`: made with the collection
            return collection
        bindings = s.bindings_visible(receiver, unit.scope)
        if not bindings or any(b.kind not in ("for", "tuple") or not isinstance(b.statement, cst.For) for b in bindings):
            return None
        loops = list({id(b.statement): b.statement for b in bindings}.values())
        # every loop binding it walks the same collection (`for optimizer in optimizers:` around the
        # zero_grad() calls, again around the steps; `for net, opt in zip(nets, optimizers):`)
        walked = {_walked_collection(loop, receiver) for loop in loops}
        if len(walked) != 1 or None in walked:
            return None
        steps = [step for step in unit.steps if step.receiver == receiver]
        if not steps or not all(any(s.contains(loop, step.call) for loop in loops) for step in steps):
            return None
        if any(s.contains(loop, backward.call) for loop in loops for backward in unit.backwards):
            # a whole training step per optimizer (MorvanZhou's optimizer comparison: forward,
            # backward and step of each net in `for net, opt in zip(nets, optimizers):`): one
            # iteration of that loop is the unit, stepped and updated once
            if not any(unit.owner is loop for loop in loops):
                return None
        return walked.pop()

    def _variable_home(
        self, receivers: List[str], scope: Scope, use_statement: Optional[cst.CSTNode], node: cst.CSTNode
    ) -> ScalerHome:
        """Scaler after the latest binding of the optimizers, in the scope that binds them."""
        s = self.structure
        use_line = s.line(use_statement) if use_statement is not None else s.line(node)
        binding_statements: List[cst.CSTNode] = []
        home_scope: Optional[Scope] = None
        for receiver in receivers:
            bindings = [b for b in s.bindings_visible(receiver, scope) if b.statement is not None]
            if not bindings:
                raise Unconvertible(s.not_found_reason(receiver, scope), node)
            if home_scope is None:
                home_scope = bindings[0].scope
            elif bindings[0].scope is not home_scope:
                raise Unconvertible("the optimizers are created in different functions", node)
            if any(b.kind == "for" or isinstance(b.statement, (cst.For, cst.CompFor)) for b in bindings):
                # `for net, opt, l_his in zip(nets, optimizers, losses_his):` (MorvanZhou's optimizer
                # comparison): which optimizers, and where each is built, is not followed
                raise Unconvertible(
                    f"{receiver} is a loop variable, drawn from a collection of optimizers in the loop; ampify does "
                    "not follow the collection to where each optimizer is created", node)
            if home_scope is scope:
                before = [b for b in bindings if s.line(b.statement) < use_line]
                if not before:
                    raise Unconvertible(f"{receiver} is created inside the training loop", node)
                bindings = before
            latest = max(bindings, key=lambda b: s.line(b.statement))
            binding_statements.append(latest.statement)
        assert home_scope is not None
        uses = [use_statement] if (use_statement is not None and home_scope is scope) else []
        after = self._insertion_point(binding_statements, uses, node)
        existing = self.homes.get(id(home_scope))
        if existing is not None and self._may_move_down(existing, after, uses):
            # the next optimizer is created right below, before any loop uses the scaler: create the
            # scaler after it instead (`q_optimizer = ...; actor_optimizer = ...; scaler = ...`)
            existing.after, existing.line = after, s.line(after)
        if existing is not None and _in_exclusive_branches(s, existing.after, after):
            # knowledge-distillation-pytorch: `if "distill" in params.model_version: ... optimizer =
            # ...` / `else: ... optimizer = ...`, each mode then training: one run takes one branch,
            # so the scaler is created in both, after the optimizer of each
            if all(a is not after for a in existing.also_after):
                existing.also_after.append(after)
            existing.optimizers.extend(r for r in receivers if r not in existing.optimizers)
            return existing
        if existing is not None:
            # one scaler per training setup: the existing one must already exist when this loop
            # runs, created in a block around it (an optimizer created later, under `if
            # args.autotune:` say, is stepped through the same scaler)
            if s.line(after) > existing.line and not (uses and self._runs_before(existing.after, uses[0])):
                raise FarApart(self._far_apart(existing, after), node)
            if uses and s.line(uses[0]) <= existing.line:
                raise FarApart(self._far_apart(existing, after), node)
            if s.line(after) > existing.line:
                existing.created_later.extend(r for r in receivers if r not in existing.optimizers)
            existing.optimizers.extend(r for r in receivers if r not in existing.optimizers)
            if uses:
                existing.first_use = min(filter(None, [existing.first_use, s.line(uses[0])]))
            return existing
        home = ScalerHome(home_scope, self.scaler_name, after, home_scope, s.line(after), list(receivers),
                          first_use=s.line(uses[0]) if uses else None)
        if not uses:
            home.also_after = self._earlier_constructions(receivers, scope, home_scope, after)
        elif isinstance(home_scope, cst.FunctionDef) and s.class_of(home_scope) is None and any(
                any(isinstance(a, (cst.For, cst.While)) for a in s.ancestors(call))
                for call in _calls_of_function(s, home_scope)[0]):
            home.recreated_per_call = home_scope.name.value
        self.homes[id(home_scope)] = home
        return home

    def _earlier_constructions(self, receivers: List[str], scope: Scope, home_scope: Scope,
                               after: cst.CSTNode) -> List[cst.CSTNode]:
        """Statements of `home_scope` above `after` that construct one of the optimizers too
        (`optimizer = optim.Adam(...)` in a notebook's CartPole cell, again in its Atari cell; in
        any block: awd-lstm-lm builds SGD or Adam under `if args.optimizer == ...`, then switches
        to ASGD inside the epoch loop): the step function, reading the global, may run after any
        of them, so the scaler must exist from the first."""
        s = self.structure
        found: List[cst.CSTNode] = []
        for receiver in receivers:
            constructions = sorted(
                (b for b in s.bindings_visible(receiver, scope)
                 if b.scope is home_scope and b.statement is not None and b.kind == "assign"
                 and isinstance(b.value, cst.Call) and s.scope_of(b.statement) is home_scope
                 and isinstance(s.statement_of(b.statement) or b.statement, cst.SimpleStatementLine)),
                key=lambda b: s.line(b.statement))
            for binding, following in zip(constructions, constructions[1:]):
                if receiver in statements.used_names(following.value):
                    continue  # `optimizer = Lookahead(optimizer)` wraps it: no new optimizer
                if s.line(binding.statement) < s.line(after) and all(binding.statement is not f for f in found):
                    found.append(binding.statement)
        return sorted(found, key=s.line)

    def _may_move_down(self, existing: ScalerHome, after: cst.CSTNode, uses: List[cst.CSTNode]) -> bool:
        s = self.structure
        if s.line(after) <= existing.line or s.block_of(after) is not s.block_of(existing.after):
            return False
        if existing.first_use is None and not uses:
            # both steps are functions that read the optimizers as globals (`def train_G(): ...
            # G_optimizer.step()`, `def train_D(x): ... D_optimizer.step()`): the scaler is read
            # only when one of them runs, so it may go below the second optimizer if nothing in
            # between can call a function of this module
            return self._calls_nothing_of_this_module(existing.after, after)
        if existing.first_use is None:
            return False
        return s.line(after) < existing.first_use and all(s.line(after) < s.line(use) for use in uses)

    def _far_apart(self, existing: ScalerHome, after: cst.CSTNode) -> str:
        s = self.structure
        return (f"two training steps use optimizers created far apart ({', '.join(existing.optimizers)} at line "
                f"{existing.line}, this one at line {s.line(after)}), with code in between that may already run a "
                "step: one GradScaler cannot be created before both; create it by hand")

    def _calls_nothing_of_this_module(self, first: cst.CSTNode, last: cst.CSTNode) -> bool:
        """No statement of the block after `first` up to `last` (included) calls a function or
        class defined in this module (which might run a step that reads the scaler)."""
        s = self.structure
        block = s.block_of(first)
        body = list(block.body) if block is not None else []
        defined = {
            statement.name.value for statement in s.module.body if isinstance(statement, (cst.FunctionDef, cst.ClassDef))
        }
        try:
            between = body[body.index(first) + 1: body.index(last) + 1]
        except ValueError:
            return False
        for statement in between:
            for call in statements.calls_within(statement):
                if not isinstance(call.func, (cst.Name, cst.Attribute)):
                    return False
                if (dotted_name(call.func) or "").split(".")[0] in defined:
                    return False
        return True

    def _runs_before(self, statement: cst.CSTNode, use: cst.CSTNode) -> bool:
        """Does `statement` always run before `use`: above it, in a block that holds `use`?"""
        s = self.structure
        block = s.block_of(statement)
        return s.line(statement) < s.line(use) and any(b is block for b, _ in s.block_path(use))

    def _insertion_point(
        self, binding_statements: List[cst.CSTNode], uses: List[cst.CSTNode], node: cst.CSTNode
    ) -> cst.CSTNode:
        """The statement after which the scaler is created (see TrainingStructure.insertion_point)."""
        anchor = self.structure.insertion_point(binding_statements, uses)
        if anchor is None:
            raise Unconvertible("the optimizer is created inside the training loop or after it", node)
        return anchor

    def _class_home(self, klass: cst.ClassDef, scope: Scope, receivers: List[str], node: cst.CSTNode) -> ScalerHome:
        """`self.scaler` created next to the class's `self.<optimizer>` assignment(s)."""
        s = self.structure
        existing = self.homes.get(id(klass))
        if existing is not None:
            return existing
        first_bindings: List[cst.CSTNode] = []
        method: Optional[Scope] = None
        if not any(b.statement is not None for receiver in receivers for b in s.bindings_visible(receiver, scope)):
            inherited = self._inherited_home(klass, receivers, node)
            if inherited is not None:
                self.homes[id(klass)] = inherited
                return inherited
        for receiver in receivers:
            bindings = [b for b in s.bindings_visible(receiver, scope) if b.statement is not None]
            if not bindings:
                raise Unconvertible(s.not_found_reason(receiver, scope), node)
            first = min(bindings, key=lambda b: s.line(b.statement))
            if method is None:
                method = first.scope
            elif first.scope is not method:
                raise Unconvertible("the optimizers are created in different methods", node)
            # every assignment of that method: `if kfac: self.optimizer = KFAC(...) else:
            # self.optimizer = RMSprop(...)` gets the scaler after the whole `if`, not in one branch
            first_bindings.extend(b.statement for b in bindings if b.scope is method)
        after = self._insertion_point(first_bindings, [], node)
        # `self.device = ...` a few lines below the optimizers (StarGAN's Solver): create the
        # scaler after it, so that it can use the script's device
        for binding in s.device_bindings:
            if binding.scope is method and binding.name.startswith("self.") and s.line(binding.statement) > s.line(after):
                later = s.insertion_point(first_bindings + [binding.statement])
                if later is not None:
                    after = later
                break
        home = ScalerHome(method, f"self.{self.scaler_name}", after, method, s.line(after), list(receivers))
        self.homes[id(klass)] = home
        return home

    def _inherited_home(self, klass: cst.ClassDef, receivers: List[str], node: cst.CSTNode) -> Optional[ScalerHome]:
        """`self.scaler` created after the `super().__init__(...)` of the class's __init__ when a
        base class of the project sets every `self.<optimizer>` the class steps and never does
        (pytorch-template's `Trainer(BaseTrainer)`: BaseTrainer.__init__ sets `self.optimizer =
        optimizer`); None when no base sets them (the caller says why)."""
        s = self.structure
        if self.project is None:
            return None
        bases = _project_bases(klass)
        facts = []
        for receiver in receivers:
            if receiver.count(".") != 1:
                return None
            found = _bases_setting(self.project, bases, receiver)
            if not found:
                return None
            if len(found) > 1:
                raise Unconvertible(f"{receiver} is set by several base classes of {klass.name.value} "
                                    f"({', '.join(f.where for _, f in found)}): which one a step runs on is not followed",
                                    node)
            base, fact = found[0]
            if fact.problem:
                raise Unconvertible(f"{receiver} is inherited from {base}: {fact.problem}", node)
            facts.append((receiver, base, fact))
        receiver, base, fact = facts[0]
        init = next((item for item in getattr(klass.body, "body", ())
                     if isinstance(item, cst.FunctionDef) and item.name.value == "__init__"), None)
        if init is None:
            raise Unconvertible(
                f"{receiver} is set by {base}.__init__ ({fact.where}), which {klass.name.value} inherits; "
                f"{klass.name.value} has no __init__ of its own to create the GradScaler in after the base's: add "
                "one that calls super().__init__(...), then run ampify again", node)
        super_call = _base_init_call(init, klass, bases)
        if super_call is None:
            raise Unconvertible(
                f"{receiver} is set by {base}.__init__ ({fact.where}), which {klass.name.value} inherits; "
                f"{klass.name.value}.__init__ calls no super().__init__(...) (or {base}.__init__(self, ...)) at its top "
                "level for the GradScaler to follow", node)
        after: cst.CSTNode = super_call
        for binding in s.device_bindings:
            # `self.device = device` below the base's __init__ (pytorch-template's Trainer): the
            # scaler follows it, to use the script's device
            if binding.scope is init and binding.name.startswith("self.") and s.line(binding.statement) > s.line(after):
                later = s.insertion_point([after, binding.statement])
                if later is not None:
                    after = later
                break
        home = ScalerHome(init, f"self.{self.scaler_name}", after, init, s.line(after), list(receivers))
        home.inherited = [(r, b, f.where, f.state_saved_at) for r, b, f in facts]
        return home

    def _thread_through_parameter(self, plan: UnitPlan, receivers: List[str]) -> None:
        """The loop's function takes the optimizer(s) as parameters: create the scaler in every
        in-file caller, pass it along as a new keyword argument."""
        s = self.structure
        function = plan.unit.scope
        assert isinstance(function, cst.FunctionDef)
        node = plan.unit.steps[0].call
        klass = s.class_of(function)
        if self.scaler_name in {p.name.value for p in statements.all_params(function)}:
            raise Unconvertible("the function already has a parameter named like the scaler", node)
        if klass is not None:
            calls, other_uses = method_calls(s, function, klass)
        else:
            calls, other_uses = _calls_of_function(s, function)
        what = f"{'method ' if klass is not None else ''}{function.name.value}()"
        if other_uses:
            raise Unconvertible(
                f"{what} is used at line {s.line(other_uses[0])} other than by a direct "
                f"{'self.' if klass is not None else ''}{function.name.value}(...) call in this file; "
                "ampify cannot add the scaler to every caller", node,
            )
        positions = statements.parameter_positions(function)
        if not calls and klass is None and not other_uses and self.project is not None:
            sites = list(self.project.call_sites_elsewhere(function.name.value))
            if sites:
                self._thread_across_files(plan, receivers, positions, sites)
                return
        if not calls:
            raise Unconvertible(
                f"{what} receives the optimizer as a parameter and is not called in this file"
                f"{callers_elsewhere_note(self.project, klass, function)}: create the GradScaler where the "
                "optimizer is created and pass it in", node,
            )
        homes: List[ScalerHome] = []
        threaded: List[Tuple[cst.Call, str]] = []
        relays: List[cst.FunctionDef] = []
        self._thread_calls(function, klass, calls, positions, receivers, homes, threaded, relays, depth=0)
        plan.threaded_function = function
        plan.threaded_calls = threaded
        plan.caller_homes = homes
        plan.relay_functions = relays

    def _thread_calls(
        self, function: cst.FunctionDef, klass: Optional[cst.ClassDef], calls: List[cst.Call],
        positions: Dict[str, int], receivers: List[str], homes: List[ScalerHome],
        threaded: List[Tuple[cst.Call, str]], relays: List[cst.FunctionDef], depth: int,
    ) -> None:
        """Each call of `function` passes the scaler: from a scaler created after the optimizers
        in the caller's scope, or, when the caller receives the optimizers as parameters too
        (`main()` -> `train(optimizer)` -> `train_epoch(optimizer)`), from a new parameter of the
        caller, threaded the same way up to where the optimizers are created (a few levels)."""
        s = self.structure
        if klass is not None and not _is_static(function):
            # self.f(a, b): `a` goes to the parameter after self
            positions = {name: index - 1 for name, index in positions.items() if index > 0}
        for call in calls:
            caller_scope = s.scope_of(call)
            arguments = [statements.argument_for(call, receiver, positions) for receiver in receivers]
            if all(isinstance(argument, cst.Name) and argument.value == "None" for argument in arguments):
                # `train_val(model, test_loader, None)` (leftthomas/SimCLR): no optimizer, so no
                # step runs; a disabled GradScaler keeps that call exactly as it was
                threaded.append((call, DISABLED_SCALER))
                self.idle_optimizers.append((call, NO_OPTIMIZER))
                continue
            idle = [no_op_optimizer_class(s, argument, caller_scope) for argument in arguments]
            if all(idle):
                # `run_epoch(..., DummyOptimizer(), mode="eval")`: an optimizer whose step() does
                # nothing gets a disabled GradScaler, whose scale/step/update/unscale_ are then
                # exactly loss.backward() and optimizer.step()
                threaded.append((call, DISABLED_SCALER))
                self.idle_optimizers.append((call, idle[0]))
                continue
            passed = []
            for receiver in receivers:
                argument = statements.argument_for(call, receiver, positions)
                name = dotted_name(argument) if argument is not None else None
                if name is None or ("." in name and not name.startswith("self.")):
                    raise Unconvertible(
                        f"the call of {function.name.value}() at line {s.line(call)} does not pass "
                        f"{receiver} as a variable or self.<attribute>", call,
                    )
                passed.append(name)
            if all(name.startswith("self.") for name in passed):
                caller_class = s.class_of(caller_scope)
                if caller_class is None:
                    raise Unconvertible(f"self.<optimizer> passed outside a method at line {s.line(call)}", call)
                home = self._class_home(caller_class, caller_scope, passed, call)
            elif any(name.startswith("self.") for name in passed):
                raise Unconvertible(
                    f"the call at line {s.line(call)} passes optimizers reached in different ways", call
                )
            else:
                bindings = [b for name in passed for b in s.bindings_visible(name, caller_scope)]
                if any(b.kind == "parameter" for b in bindings):
                    self._relay(call, caller_scope, passed, bindings, homes, threaded, relays, depth)
                    continue
                home = self._variable_home(passed, caller_scope, s.statement_of(call), call)
            homes.append(home)
            threaded.append((call, home.reference))

    def _relay(self, call: cst.Call, caller: Scope, passed: List[str], bindings, homes, threaded, relays, depth: int) -> None:
        """The caller got the optimizers as parameters too: it takes the scaler as a new
        parameter as well and passes it on; its own callers are threaded in turn."""
        s = self.structure
        if not (isinstance(caller, cst.FunctionDef) and all(b.kind == "parameter" and b.scope is caller for b in bindings)):
            raise Unconvertible(
                f"the caller at line {s.line(call)} gets the optimizer from an enclosing function or partly as a "
                "parameter; create the GradScaler where the optimizer is created by hand", call)
        if depth >= 3:
            raise Unconvertible(
                f"the optimizer is passed down more than {depth + 1} levels of calls before line {s.line(call)}; "
                "create the GradScaler where it is created and pass it in by hand", call)
        if self.scaler_name in {p.name.value for p in statements.all_params(caller)}:
            raise Unconvertible(f"{caller.name.value}() already has a parameter named like the scaler", call)
        threaded.append((call, self.scaler_name))
        if any(relay is caller for relay in relays):
            return  # its own callers are threaded already
        relays.append(caller)
        caller_class = s.class_of(caller)
        if caller_class is not None:
            calls, other_uses = method_calls(s, caller, caller_class)
        else:
            calls, other_uses = _calls_of_function(s, caller)
        what = f"{caller.name.value}()"
        if other_uses:
            raise Unconvertible(
                f"{what}, which passes the optimizer on at line {s.line(call)}, is used at line "
                f"{s.line(other_uses[0])} other than by a direct call in this file; ampify cannot add the scaler to "
                "every caller", call)
        if not calls:
            raise Unconvertible(
                f"{what} passes the optimizer it receives on at line {s.line(call)} and is not called in this file"
                f"{callers_elsewhere_note(self.project, caller_class, caller)}: create the GradScaler where the "
                "optimizer is created and pass it in", call)
        self._thread_calls(caller, caller_class, calls, statements.parameter_positions(caller), passed, homes,
                           threaded, relays, depth + 1)

    def _thread_across_files(
        self, plan: UnitPlan, receivers: List[str], positions: Dict[str, int], sites: List[CallSite]
    ) -> None:
        """The step function is called only from other modules: each of them creates the
        scaler after the optimizer it passes and passes it in (one change set with this module)."""
        # caller_threading builds on this module (ScalerPlacement places the caller's scaler too)
        from ampify.transforms.torch.caller_threading import thread_scaler_into_caller

        function = plan.unit.scope
        node = plan.unit.steps[0].call
        here = f"{self.display}:{self.structure.line(node)}"
        by_module: Dict[str, List[CallSite]] = {}
        for site in sites:
            by_module.setdefault(site.key, []).append(site)
        plan.threaded_function = function
        plan.threaded_calls = []
        plan.caller_homes = []
        for key, module_sites in by_module.items():
            where = f"{module_sites[0].display}:{module_sites[0].line}"
            if not self.project.in_this_run(key):
                raise Unconvertible(
                    f"the step at {here} needs the GradScaler from {where}, which this run does not cover: run "
                    f"ampify on both files or on the repository", node,
                )
            source = self.project.source_of(key)
            if source is None:
                raise Unconvertible(f"the step at {here} needs the GradScaler from {where}, which cannot be read", node)

            def replan(device, source=source, module_sites=module_sites):
                return thread_scaler_into_caller(
                    source, module_sites, function.name.value, positions, receivers, self.scaler_name, self.display,
                    device,
                )

            try:
                caller = replan(None)
            except Unconvertible as problem:
                # the same kind of refusal (MixedPrecisionElsewhere stays one), now naming the caller
                raise type(problem)(f"{function.name.value}() is called from {where}: {problem}", node) from None
            plan.companions.append(caller)
            plan.replan_companions.append(replan)


def _owners_of_owned_optimizers(s: TrainingStructure, unit: TrainingUnit, receivers: List[str]) -> List[str]:
    """["self.Q_eval"] when every optimizer the unit steps is `self.<owner>.<attribute>`, each
    owner is set in the unit's class only to instances of one class of this module (phil tabor's
    `self.Q_eval = DeepQNetwork(...)`), and that class sets `self.<attribute>` only to optimizer
    constructions (`self.optimizer = optim.Adam(self.parameters(), lr=lr)` in its __init__).
    Empty otherwise: the step is not followed that way."""
    if unit.klass is None or not receivers:
        return []
    classes = {statement.name.value: statement for statement in s.module.body if isinstance(statement, cst.ClassDef)}
    owners: List[str] = []
    for receiver in receivers:
        parts = receiver.split(".")
        if len(parts) != 3 or parts[0] != "self":
            return []
        owner = f"self.{parts[1]}"
        bindings = s.bindings_visible(owner, unit.scope)
        if not bindings or any(b.kind not in ("assign", "attribute") or not isinstance(b.value, cst.Call)
                               or not isinstance(b.value.func, cst.Name) for b in bindings):
            return []
        owner_classes = {b.value.func.value for b in bindings}
        if len(owner_classes) != 1 or next(iter(owner_classes)) not in classes:
            return []
        owner_class = classes[next(iter(owner_classes))]
        if owner_class is unit.klass or any(b.name == next(iter(owner_classes)) for b in s.bindings):
            return []
        made = [b for b in s.bindings if b.klass is owner_class and b.name == f"self.{parts[2]}"]
        if not made or any(b.kind not in ("assign", "attribute") or not b.qualified_call
                           or not names.is_optimizer_qualname(b.qualified_call) for b in made):
            return []
        if owner not in owners:
            owners.append(owner)
    return owners


def _calls_of_function(structure: TrainingStructure, function: cst.FunctionDef) -> Tuple[List[cst.Call], List[cst.CSTNode]]:
    """In-file calls `f(...)` of a module-level function, and any other use of its name."""
    name = function.name.value
    calls: List[cst.Call] = []
    others: List[cst.CSTNode] = []

    for node in structure.name_nodes.get(name, []):
        if node is function.name:
            continue
        parent = structure.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            calls.append(parent)
        elif isinstance(parent, cst.Attribute) and parent.attr is node:
            continue  # obj.train(...) is another function
        elif isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param, cst.ImportAlias)):
            continue
        elif isinstance(parent, cst.Arg) and parent.keyword is node:
            continue  # f(train=True) names a keyword, not the function
        elif _local_of_another_function(structure, node, name):
            continue  # `train = TranslationDataset(...)`, `def __init__(self, root, train)`: another function's local
        else:
            others.append(node)
    return calls, others


def _local_of_another_function(structure: TrainingStructure, node: cst.CSTNode, name: str) -> bool:
    """Is `node` in a function that binds `name` itself (so the name is that function's local)?"""
    function = next((a for a in structure.ancestors(node) if isinstance(a, (cst.FunctionDef, cst.Lambda))), None)
    if not isinstance(function, cst.FunctionDef):
        return False
    if any(isinstance(g, cst.Global) and any(n.name.value == name for n in g.names)
           for line in _simple_lines(function) for g in line.body):
        return False
    return any(b.name == name and b.scope is function and b.kind in ("assign", "tuple", "for", "with", "parameter")
               for b in structure.bindings)


def _simple_lines(function: cst.FunctionDef):
    stack = [function.body]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.SimpleStatementLine):
            yield node
            continue
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)) and node is not function:
            continue
        stack.extend(child for child in node.children if isinstance(child, (cst.BaseStatement, cst.BaseSuite, cst.CSTNode)))


def _is_static(function: cst.FunctionDef) -> bool:
    return any(dotted_name(d.decorator) in ("staticmethod", "classmethod") for d in function.decorators)


def callers_elsewhere_note(project: Optional[ProjectFacts], klass: Optional[cst.ClassDef], function: cst.FunctionDef) -> str:
    """"; it is called from main.py:212 (...)" when the project shows calls of this
    module-level function in other files: the user learns where the optimizer comes from."""
    if project is None or klass is not None:
        return ""
    callers = list(project.callers_elsewhere(function.name.value))
    if not callers:
        return ""
    shown = ", ".join(callers[:3]) + (f" and {len(callers) - 3} more" if len(callers) > 3 else "")
    return f"; it is called from {shown} (ampify does not thread the scaler across files yet)"


def _walked_collection(loop: cst.For, receiver: str) -> Optional[str]:
    """The plain name of the collection `loop` draws `receiver` from: `optimizers` in `for
    optimizer in optimizers:` or in `for net, opt in zip(nets, optimizers):`; None otherwise."""
    target, walked = loop.target, loop.iter
    if isinstance(target, cst.Name):
        return walked.value if target.value == receiver and isinstance(walked, cst.Name) else None
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(walked, cst.Call):
        return None
    if not (isinstance(walked.func, cst.Name) and walked.func.value == "zip"):
        return None
    names = [element.value.value if isinstance(element.value, cst.Name) and not isinstance(element, cst.StarredElement)
             else None for element in target.elements]
    arguments = [arg for arg in walked.args if arg.keyword is None and not arg.star]
    if receiver not in names or names.count(receiver) != 1 or len(arguments) != len(walked.args) \
            or len(arguments) != len(names):
        return None
    drawn = arguments[names.index(receiver)].value
    return drawn.value if isinstance(drawn, cst.Name) else None


def _base_init_call(init: cst.FunctionDef, klass: cst.ClassDef, bases: List[str]) -> Optional[cst.CSTNode]:
    """The top-level statement of `init` that runs the base's __init__: `super().__init__(...)`,
    `super(Trainer, self).__init__(...)` or `BaseTrainer.__init__(self, ...)`."""
    body = init.body.body if isinstance(init.body, cst.IndentedBlock) else ()
    for statement in body:
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.Call)):
            continue
        function = statement.body[0].value.func
        if not (isinstance(function, cst.Attribute) and function.attr.value == "__init__"):
            continue
        owner = function.value
        if isinstance(owner, cst.Call) and dotted_name(owner.func) == "super":
            arguments = [dotted_name(a.value) for a in owner.args]
            if not arguments or arguments == [klass.name.value, "self"]:
                return statement
        elif dotted_name(owner) in bases:
            return statement
    return None


def inherited_from_a_base(project: Optional[ProjectFacts], klass: Optional[cst.ClassDef], receiver: str):
    """(base, InheritedAttribute) when exactly one base class of `klass` in the project sets
    `self.<attribute>` for `receiver` ("self.optimizer"); None otherwise."""
    if project is None or klass is None or not receiver.startswith("self.") or receiver.count(".") != 1:
        return None
    found = _bases_setting(project, _project_bases(klass), receiver)
    return found[0] if len(found) == 1 else None


def _project_bases(klass: cst.ClassDef) -> List[str]:
    """The class's bases as spelled (`BaseTrainer`, `base.BaseTrainer`), not `object` or keywords."""
    return [name for name in (dotted_name(arg.value) for arg in klass.bases if arg.keyword is None)
            if name not in (None, "object")]


def _bases_setting(project: ProjectFacts, bases: List[str], receiver: str) -> list:
    """(base, InheritedAttribute) for each of `bases` that sets `receiver` ("self.optimizer")."""
    attribute = receiver[len("self."):]
    return [(base, fact) for base in bases for fact in [project.inherited_attribute(base, attribute)]
            if fact is not None]


def _in_exclusive_branches(s: TrainingStructure, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """Do the two statements sit in different branches of one `if` (its body and its `else:` or
    an `elif`), so that no run executes both?"""
    for ancestor in s.ancestors(first):
        if isinstance(ancestor, cst.If) and s.contains(ancestor, second):
            in_body = s.contains(ancestor.body, first)
            return in_body != s.contains(ancestor.body, second) and ancestor.orelse is not None
    return False
