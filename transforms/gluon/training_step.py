"""Plan the loss scaling of a Gluon training loop: which trainer each backward pass feeds, where
its `amp.scale_loss` block goes, and where `amp.unscale` must come before a gradient is read.

    with autograd.record():                       with autograd.record():
        out = net(x)                                  out = net(x)
        loss = loss_fn(out, y)                        loss = loss_fn(out, y)
    loss.backward()                        ->         with amp.scale_loss(loss, trainer) as scaled_loss:
    clip_global_norm(grads, 1.0)                          scaled_loss.backward()
    trainer.step(batch_size)                      amp.unscale(trainer)
                                                  clip_global_norm(grads, 1.0)
                                                  trainer.step(batch_size)

The scaling multiplies the loss, so it must be recorded: a backward pass inside the record block
is scaled in place, one right after it (a lone statement or a `for l in losses: l.backward()`
loop) moves into it, any other is scaled under a record block of its own. Each backward pass
feeds the first trainer that steps after it in the same function; a backward whose gradients two
trainers apply, or that no trainer of this file applies, is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.gluon.survey import Backward, GluonSurvey

_SUITES = (cst.IndentedBlock, cst.Module)


@dataclass
class ScaledBackward:
    backward: Backward
    #: the statement replaced: the backward's line, or the `for` loop that holds it
    unit: cst.BaseStatement
    #: the loss (a list of losses for the loop form)
    loss: cst.BaseExpression
    trainer: str
    #: write `autograd.backward(scaled)` (a loop over losses, or the functional form) with this callee
    functional: Optional[str]
    #: the record block the unit moves to the end of (it came right after it)
    move_into: Optional[cst.With] = None
    #: the record call to open around the scaling (neither inside nor right after a record block)
    own_record: Optional[str] = None
    #: the trainer is a name this file does not build (a parameter), taken to be its one Trainer
    assumed: bool = False


@dataclass
class StepPlan:
    scaled: List[ScaledBackward] = field(default_factory=list)
    #: statement -> trainers to unscale right before it (it reads the gradients)
    unscale_before: Dict[int, Tuple[cst.BaseStatement, List[str]]] = field(default_factory=dict)
    #: (node, reason) that stops the whole conversion
    obstacle: Optional[Tuple[cst.CSTNode, str]] = None


class _Tree:
    """Statement navigation over the survey's parent map."""

    def __init__(self, parents: Dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.parents = parents
        self._chains: Dict[int, Set[int]] = {}

    def statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement holding `node` that sits directly in a suite (an IndentedBlock or the module)."""
        current = node
        while current is not None and not isinstance(self.parents.get(current), _SUITES):
            current = self.parents.get(current)
        return current

    def ancestors(self, node: cst.CSTNode) -> Set[int]:
        key = id(node)
        chain = self._chains.get(key)
        if chain is None:
            chain = set()
            current = self.parents.get(node)
            while current is not None:
                chain.add(id(current))
                current = self.parents.get(current)
            self._chains[key] = chain
        return chain

    def contains(self, statement: cst.CSTNode, node: cst.CSTNode) -> bool:
        return statement is node or id(statement) in self.ancestors(node)

    def following(self, statement: cst.BaseStatement) -> Iterator[cst.BaseStatement]:
        """The statements that run after `statement`, outward to the end of its function."""
        current = statement
        while True:
            suite = self.parents[current]
            body = list(suite.body)
            index = next(i for i, s in enumerate(body) if s is current)
            yield from body[index + 1:]
            if isinstance(suite, cst.Module):
                return
            owner = self.statement_of(suite)
            if owner is None or isinstance(owner, (cst.FunctionDef, cst.ClassDef)):
                return
            current = owner

    def previous_sibling(self, statement: cst.BaseStatement) -> Optional[cst.BaseStatement]:
        body = list(self.parents[statement].body)
        index = next(i for i, s in enumerate(body) if s is statement)
        return body[index - 1] if index else None


def plan_steps(survey: GluonSurvey, trainer_names: Set[str], code_for, autograd_backward: Optional[str],
               record_spelling: Optional[str]) -> StepPlan:
    """The scaling of every backward pass of the module, or the obstacle that stops it.

    `code_for(node)` gives a node's source; `autograd_backward` spells `mxnet.autograd.backward`
    in this module (None: it cannot be spelled), `record_spelling` its `autograd.record`."""
    plan = StepPlan()
    tree = _Tree(survey.parents)
    record_ids = {id(block) for block in survey.record_blocks}
    backward_nodes = [b.call for b in survey.backwards]
    for backward in survey.backwards:
        if backward.problem:
            plan.obstacle = (backward.call, f"a backward pass with {backward.problem}")
            return plan
        unit, loss, functional = _unit_of(backward, tree, code_for, autograd_backward)
        if unit is None:
            plan.obstacle = (backward.call, loss)
            return plan
        found = _trainer_after(unit, survey, tree, trainer_names)
        if isinstance(found, str):
            plan.obstacle = (backward.call, found)
            return plan
        trainer, step_statement = found
        second = _second_trainer(step_statement, trainer, survey, tree, trainer_names, backward_nodes)
        if second is not None:
            plan.obstacle = (backward.call, f"one backward pass whose gradients both {trainer} and {second} apply "
                                            "(amp.scale_loss scales the loss for one trainer)")
            return plan
        scaled = ScaledBackward(backward, unit, loss, trainer, functional, assumed=trainer not in trainer_names)
        if not any(i in record_ids for i in tree.ancestors(unit)):
            before = tree.previous_sibling(unit)
            if isinstance(before, cst.With) and id(before) in record_ids and isinstance(before.body, cst.IndentedBlock):
                scaled.move_into = before
            elif record_spelling is not None:
                scaled.own_record = record_spelling
            else:
                plan.obstacle = (backward.call, "no autograd.record() block in this file to record the loss scaling in")
                return plan
        plan.scaled.append(scaled)
        _plan_unscale(plan, unit, step_statement, trainer, survey, tree)
    return plan


def _unit_of(backward: Backward, tree: _Tree, code_for, autograd_backward):
    """(the statement to replace, the loss, the functional callee or None), or (None, why)."""
    statement = backward.statement
    parent = tree.parents.get(statement)
    owner = tree.parents.get(parent) if isinstance(statement, cst.SimpleStatementLine) else parent
    loop = owner if isinstance(owner, cst.For) else None
    if loop is not None and _single_statement_body(loop) and loop.orelse is None and not loop.asynchronous \
            and isinstance(loop.target, cst.Name) and _backward_of(backward, code_for) == loop.target.value:
        if autograd_backward is None:
            return None, "a loop of backward passes and no spelling of mxnet.autograd.backward in this file", None
        return loop, loop.iter, autograd_backward
    if isinstance(statement, cst.SimpleStatementSuite):
        return None, "a backward pass written on its compound statement's line", None
    if backward.loss is None:
        return None, "a backward pass whose loss cannot be followed", None
    return statement, backward.loss, code_for(backward.call.func) if backward.functional else None


def _single_statement_body(loop: cst.For) -> bool:
    body = loop.body
    statements = body.body
    if isinstance(body, cst.SimpleStatementSuite):
        return len(statements) == 1
    return len(statements) == 1 and isinstance(statements[0], cst.SimpleStatementLine) and len(statements[0].body) == 1


def _backward_of(backward: Backward, code_for) -> Optional[str]:
    """The name the backward pass is taken of (`l` in `l.backward()` or `autograd.backward(l)`)."""
    loss = backward.loss
    if backward.functional and backward.call.args[1:]:
        return None
    if not backward.functional and backward.call.args:
        return None
    return loss.value if isinstance(loss, cst.Name) else None


def _step_receiver(call_receiver: str, trainer_names: Set[str]) -> Optional[str]:
    if call_receiver in trainer_names:
        return call_receiver
    if len(trainer_names) == 1 and "trainer" in call_receiver.rsplit(".", 1)[-1].lower():
        return call_receiver  # the one trainer of the file, passed in under a trainer's name
    return None


def _trainer_after(unit, survey: GluonSurvey, tree: _Tree, trainer_names: Set[str]):
    """(trainer, the statement that steps it) for the first trainer step after `unit`, or why none."""
    others = []
    for statement in tree.following(unit):
        for receiver, call in survey.steps:
            if not tree.contains(statement, call):
                continue
            trainer = _step_receiver(receiver, trainer_names)
            if trainer is not None:
                return trainer, statement
            if call.func.attr.value == "step":
                others.append(receiver)
    if others:
        return f"a backward pass whose gradients {others[0]}.step() applies, and {others[0]} is not a Gluon Trainer " \
               "built in this file (amp.init_trainer must be called on it)"
    return "a backward pass with no trainer step after it in the same function (the step is elsewhere)"


def _second_trainer(step_statement, trainer, survey, tree, trainer_names, backward_nodes) -> Optional[str]:
    """Another trainer stepping on the same gradients before the next backward pass, if any."""
    candidates = [step_statement, *tree.following(step_statement)]
    for statement in candidates:
        if statement is not step_statement and any(tree.contains(statement, node) for node in backward_nodes):
            return None  # new gradients from here on
        for receiver, call in survey.steps:
            if tree.contains(statement, call):
                other = _step_receiver(receiver, trainer_names)
                if other is not None and other != trainer:
                    return other
    return None


def _plan_unscale(plan: StepPlan, unit, step_statement, trainer, survey: GluonSurvey, tree: _Tree) -> None:
    """`amp.unscale(trainer)` right before the innermost statement that first reads the gradients
    after the backward pass: it then runs only when that read runs (`if clip:`, the accumulation
    boundary `if (i + 1) % n == 0:`), never on a micro-step whose gradients keep accumulating
    scaled. A second unscale before the step changes nothing (the trainer's scale is then 1)."""
    for statement in tree.following(unit):
        read = next((read for read in survey.gradient_reads if tree.contains(statement, read)), None)
        if read is not None:
            innermost = tree.statement_of(read)
            _, trainers = plan.unscale_before.setdefault(id(innermost), (innermost, []))
            if trainer not in trainers:
                trainers.append(trainer)
            return
        if statement is step_statement:
            return
