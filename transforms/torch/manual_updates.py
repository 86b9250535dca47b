"""Training steps that update the parameters by hand, with no optimizer
(`p.data.add_(p.grad, alpha=-lr)`, `p -= lr * p.grad` under `torch.no_grad()`).

GradScaler steps an optimizer; without one there is nothing to hand the scaled gradients to, so
float16 is refused (with that reason, suggesting bfloat16). bfloat16 needs no loss scaling: the
forward pass and loss go under autocast and the update stays as it is.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.statements import calls_within
from ampify.transforms.torch.training_loop import TrainingStructure, TrainingUnit, loop_body_owners

def manual_update_units(s: TrainingStructure) -> Dict[int, TrainingUnit]:
    """Units (no steps) for backward() calls with no optimizer step whose loop updates the
    parameters from their gradients by hand, by id of the backward call."""
    units: Dict[int, TrainingUnit] = {}
    by_owner: Dict[int, TrainingUnit] = {}
    for backward in s.unpaired_backwards:
        if backward.delegation is not None:
            continue
        owners = loop_body_owners(s, backward.call, backward.scope)
        if not owners:
            continue  # inside a lambda or a nested def: no iteration to follow
        owner = owners[0]
        candidates = [read for read in s.grad_reads
                      if s.contains(owner, read.node) and _updates_a_parameter(read.statement)]
        if not candidates:
            continue  # (lines are compared only when needed: positions cost a pass over the module)
        after = s.line(backward.call)
        updates = [read for read in candidates if s.line(read.statement) > after]
        if not updates:
            continue
        unit = by_owner.get(id(owner))
        if unit is None:
            unit = by_owner[id(owner)] = TrainingUnit(owner, backward.scope, s.class_of(backward.scope))
        unit.backwards.append(backward)
        units[id(backward.call)] = unit
    return units


def manual_update_beside_steps(s: TrainingStructure, unit: TrainingUnit) -> Optional[cst.CSTNode]:
    """The first statement that updates a parameter from its gradient by hand in the loop of a
    unit that also steps an optimizer (`if args.use_optimizer: optimizer.step()` / `else: for p in
    model.parameters(): p.data.add_(p.grad, alpha=-lr)`, pytorch/examples' word language model),
    else None. Loss scaling would hand that update scaled gradients."""
    for backward in unit.backwards:
        if backward.delegation is not None:
            continue
        owners = loop_body_owners(s, backward.call, backward.scope)
        if not owners:
            continue
        after = s.line(backward.call)
        for read in s.grad_reads:
            if (s.contains(owners[0], read.node) and s.line(read.statement) > after
                    and _updates_a_parameter(read.statement)):
                return read.statement
    return None


#: collectives that exchange tensors across ranks (`dist.all_reduce(all_grads)`)
_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "reduce", "broadcast", "all_reduce_coalesced")


def gradients_reduced_by_hand(s: TrainingStructure, unit: TrainingUnit):
    """(message, node) when the unit's iteration averages the gradients across ranks by hand
    after backward() (cleanrl's multi-GPU PPO: `.grad` flattened, `dist.all_reduce(...)`, copied
    back); None otherwise. GradScaler's inf check runs in unscale_: before such an all-reduce each
    rank checks its own gradients, and a rank that saw none steps with the inf another rank's
    gradients spread into its own. Only the iteration's source after the first backward is read."""
    steps = [s.line(step.call) for step in unit.steps]
    for backward in unit.backwards:
        if backward.delegation is not None:
            continue
        owners = loop_body_owners(s, backward.call, backward.scope)
        if not owners:
            continue
        after = s.line(backward.call)
        for read in s.grad_reads:
            if not s.contains(owners[0], read.node) or s.line(read.statement) <= after:
                continue
            if steps and s.line(read.statement) > max(steps):
                continue
            for statement in _statements_around(s, read.statement, owners[0]):
                for call in calls_within(statement):
                    called = s.imports.resolve(call.func) or dotted_name(call.func) or ""
                    if called.rsplit(".", 1)[-1] in _COLLECTIVES and ("distributed" in called or called.startswith("dist.")):
                        return (
                            f"the gradients are reduced across ranks by hand after this backward() ({called}, line "
                            f"{s.line(call)}): the loss scaler's inf check (GradScaler.unscale_, the exit of apex's "
                            "scale_loss) must see the reduced gradients, or a rank that found no inf steps with the inf "
                            "another rank's gradients spread into its own; unscale after the reduction by hand, or use "
                            "DistributedDataParallel",
                            backward.call,
                        )
    return None


def gradients_reduced_by_a_helper(s: TrainingStructure, unit: TrainingUnit):
    """(message, node) for apex when a helper named for a reduction of the gradients across ranks
    (HER's `sync_grads(self.actor_network)`, `average_gradients(model)`) runs between a backward()
    of the unit and the step after it: amp.scale_loss unscales and checks for inf on its exit,
    before the reduction, so a rank that found none would step with the inf another rank's
    gradients spread into its own. None otherwise. (Native AMP unscales in the step, after it.)"""
    from ampify.transforms.torch.names import reduces_gradients

    backwards = sorted(s.line(backward.call) for backward in unit.backwards)
    steps = sorted(s.line(step.call) for step in unit.steps)
    if not backwards or not steps:
        return None
    for call in calls_within(unit.body):
        called = dotted_name(call.func) or ""
        if not reduces_gradients(called):
            continue
        at = s.line(call)
        if any(b < at for b in backwards) and any(at < step for step in steps):
            return (
                f"{called}() (line {at}) reduces the gradients across ranks between backward() and step(): amp.scale_loss "
                "unscales them and checks for inf when it exits, before that reduction, and a rank that found none would "
                "step with the inf another rank's gradients spread into its own; use --backend native (GradScaler "
                "unscales in the step, after the reduction), or DistributedDataParallel",
                call,
            )
    return None


def _statements_around(s: TrainingStructure, statement: cst.CSTNode, owner: cst.CSTNode):
    """The statement holding a `.grad` read and the compound statements around it, up to the
    iteration's body (the all-reduce sits beside the loops that read the gradients)."""
    found = [statement]
    for ancestor in s.ancestors(statement):
        if ancestor is owner:
            break
        if isinstance(ancestor, cst.BaseCompoundStatement):
            found.append(ancestor)
    return found


def _updates_a_parameter(statement: cst.CSTNode) -> bool:
    """Does this statement (holding a `.grad` read) write a tensor other than a gradient from a
    gradient (`p -= lr * p.grad`, `p.data.add_(p.grad, alpha=-lr)`)? A counter bumped beside a
    gradient edit (`offset += param.numel()` after `param.grad.data.copy_(...)`, cleanrl's
    all-reduce by hand) updates no parameter."""
    found = False
    held: set = set()  # names bound to a gradient in the statement (`d_p = p.grad.data`)

    class _Holders(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if _reads_a_gradient(node.value, held):
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        held.add(target.target.value)

    class _Writes(cst.CSTVisitor):
        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            nonlocal found
            target = dotted_name(node.target) or ""
            if (not target.endswith(".grad") and isinstance(node.operator, (cst.SubtractAssign, cst.AddAssign))
                    and _reads_a_gradient(node.value, held)):
                found = True

        def visit_Assign(self, node: cst.Assign) -> None:
            nonlocal found
            if (any((dotted_name(t.target) or "").endswith(".data") for t in node.targets)
                    and _reads_a_gradient(node.value, held)):
                found = True

        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("add_", "sub_", "copy_", "addcmul_", "addcdiv_"):
                receiver = dotted_name(func.value) or ""
                if (not receiver.endswith(".grad") and not receiver.endswith(".grad.data")
                        and any(_reads_a_gradient(arg.value, held) for arg in node.args)):
                    found = True

    walk(statement, _Holders())
    walk(statement, _Writes())
    return found


def _reads_a_gradient(node: cst.CSTNode, held=frozenset()) -> bool:
    """Does the expression read some `<tensor>.grad`, directly or through a name the statement
    bound to one (`held`), or a name that says it holds one (`grad_p`)?"""
    found = False

    class _Reads(cst.CSTVisitor):
        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            nonlocal found
            if attribute.attr.value == "grad":
                found = True

        def visit_Name(self, name: cst.Name) -> None:
            nonlocal found
            if name.value in held or "grad" in name.value.lower():
                found = True

    walk(node, _Reads())
    return found


def backwards_of(units: Dict[int, TrainingUnit]) -> List[TrainingUnit]:
    """Each unit once, in order of first backward."""
    seen: List[TrainingUnit] = []
    for unit in units.values():
        if all(unit is not other for other in seen):
            seen.append(unit)
    return seen
