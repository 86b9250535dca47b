"""Gradient penalties under apex amp: the equivalent of PyTorch's AMP recipe (gradient_penalty.py).

apex has no `scaler.scale(outputs)` for `torch.autograd.grad` (apex issue #873: "This isn't possible
with apex amp"), but its loss scale is public: `amp.state_dict()["loss_scaler<k>"]["loss_scale"]`
(apex/amp/frontend.py), the scale `amp.scale_loss(loss, optimizer, loss_id=k)` multiplies the loss
by. So the penalty's gradients are taken of the outputs times that scale, in float32, and divided by
it again, as the native backend does with the GradScaler:

    penalty_scale = amp.state_dict()["loss_scaler0"]["loss_scale"]
    gradients = torch.autograd.grad(outputs=d_out.float() * penalty_scale, inputs=x, create_graph=True)[0]
    gradients = gradients / penalty_scale

`k` is the loss the penalty is added to: when those gradients overflow, that loss is inf, its
scaler skips the step and lowers the very scale read here (the scale of another loss would never
come down, and every step would be skipped). Converted where the native backend converts the
penalty (a plain `g = autograd.grad(...)[0]` in the step or in a helper of the file whose every use
is a direct call; amp is process-wide, so a helper needs no new parameter); anything else stays
AMP312. It plans, it edits nothing itself.
"""

from __future__ import annotations

from typing import List, Optional, Set

import libcst as cst

from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.gradient_penalty import PenaltySite, bridges_of_unit
from ampify.transforms.torch.training_loop import BackwardCall, TrainingStructure, TrainingUnit, Unconvertible


def loss_index_of_penalty(s: TrainingStructure, unit: TrainingUnit, losses: List[BackwardCall],
                          site: PenaltySite) -> int:
    """The index (apex's loss_id) of the unit's loss the penalty is added to."""
    if len(losses) == 1:
        return 0
    where = [site.statement] if site.helper is None else [c for c in site.helper_calls if s.contains(unit.owner, c)] + [
        c for bridge in bridges_of_unit(s, unit, site, None) or [] for c in bridge.calls]
    found = [index for index, backward in enumerate(losses)
             if any(s.contains(statement, node) for statement in _statements_feeding(s, unit, backward) for node in where)]
    if len(found) != 1:
        raise Unconvertible(
            f"the gradient penalty at line {s.line(site.call)} is added to {'none' if not found else 'more than one'} of "
            "this iteration's losses as far as ampify can follow: its gradients must be scaled by the loss scale of "
            "that loss; scale them by hand, or use --backend native",
            site.call,
        )
    return found[0]


def _statements_feeding(s: TrainingStructure, unit: TrainingUnit, backward: BackwardCall) -> List[cst.CSTNode]:
    """The statements before `<loss>.backward()`, in its block and the blocks around it up to the
    unit's body, that compute what the loss is computed from."""
    if backward.loss is None:
        return []
    needed: Set[str] = statements.used_names(backward.loss)
    found: List[cst.CSTNode] = []
    for block, statement in s.block_path(backward.call, stop=unit.body):
        body = list(block.body)
        index = next(i for i, candidate in enumerate(body) if candidate is statement)
        for earlier in reversed(body[:index]):
            if isinstance(earlier, (cst.FunctionDef, cst.ClassDef)):
                break
            if (statements.assigned_names(earlier) | statements.filled_containers(earlier)) & needed:
                needed |= statements.used_names(earlier)
                found.append(earlier)
    return found


def write_apex_penalty(edits, site: PenaltySite, amp: str, loss_id: int, scale_name: str) -> Optional[str]:
    """Plan the scaled outputs and the division for one penalty; None when the outputs are not one
    tensor expression (a list of outputs is left to AMP312)."""
    value = site.outputs.value
    if isinstance(value, (cst.List, cst.Tuple)):
        return None
    outputs = statements.code_of(value)
    if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        outputs = f"({outputs})"
    scale = f'{amp}.state_dict()["loss_scaler{loss_id}"]["loss_scale"]'
    edits.insert_before(site.statement, f"{scale_name} = {scale}")
    scaled = cst.parse_expression(f"{outputs}.float() * {scale_name}")
    arguments = [a.with_changes(value=scaled) if a is site.outputs else a for a in site.call.args]
    edits.replace_call(site.call, site.call.with_changes(args=arguments))
    edits.insert_after(site.statement, site.unscale(scale_name))
    return scale
