"""Forward passes whose outputs a training step reads back from a list filled elsewhere.

Policy-gradient code (REINFORCE, actor-critic: pytorch/examples' reinforcement_learning, its RPC
agents) runs the model in `select_action(state)`, once per environment step, and keeps what the
loss needs on an object: `policy.saved_log_probs.append(m.log_prob(action))`. At the end of the
episode `finish_episode()` builds the loss from that list and steps. The loss's own function
holds no forward pass, so the autocast region found by tracing the loss back (autocast_regions)
calls no model. `SavedOutputs` follows the list to the functions of this file that fill it and
returns the statements there that run the model for the value added: those go under autocast
too, in their own function. It plans, it never edits.

Only lists named by an attribute chain (`policy.saved_log_probs`, `self.saved_actions`,
`self.saved_log_probs[ob_id]`) are followed: the same object in both functions (a module-level
name bound once, or `self` of the same class). The value added must come from the model in the
same block as the `append`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.training_loop import Block, Scope, TrainingStructure


@dataclass
class SavedForward:
    """Statements body[start..end] of `block`, in the function `scope`, run the model for a value
    that `call` adds to the list `container` (or an assignment keeps as the attribute
    `container`), which the loss reads."""

    block: Block
    start: int
    end: int
    scope: Scope
    container: str
    call: cst.CSTNode


class SavedOutputs:
    """Finds, for the names a loss needs, the forward passes that filled the lists among them."""

    def __init__(self, structure: TrainingStructure) -> None:
        self.structure = structure
        self._filling_calls: Optional[Dict[str, List[cst.CSTNode]]] = None

    def forwards_for(self, needed: Set[str], loss_scope: Scope, models: Set[str]) -> List[SavedForward]:
        """The forward passes, in other functions of this file, whose outputs were added to a
        list among `needed` (names and attribute chains the loss is computed from). A forward
        pass calls one of `models` (the models the stepped optimizers train, as named where
        the loss is: `policy`, `self.policy`)."""
        found: List[SavedForward] = []
        for container in sorted(name for name in needed if "." in name):
            for call in self._fillers().get(container, []):
                scope = self.structure.scope_of(call)
                if scope is loss_scope or not self._same_object(container, scope, loss_scope):
                    continue
                if isinstance(call, cst.Assign) and not self._runs_outside_training_iterations(scope):
                    continue
                here = {m for m in models if self._same_object(m, scope, loss_scope)}
                forward = self._forward_before(call, scope, container, here)
                if forward is not None:
                    found.append(forward)
        return found

    def _fillers(self) -> Dict[str, List[cst.CSTNode]]:
        """Every `<chain>.append(...)` (and extend, insert ...) of the module, and every plain
        assignment to an attribute chain (actor-critic agents keep `self.log_probs =
        dist.log_prob(action)` from choose_action() for learn()), by chain."""
        if self._filling_calls is None:
            self._filling_calls = {}
            for call in statements.nodes_of_type(self.structure.module, cst.Call):
                container = statements.filled_container(call)
                if container and "." in container:
                    self._filling_calls.setdefault(container, []).append(call)
            for assign in statements.nodes_of_type(self.structure.module, cst.Assign):
                if len(assign.targets) == 1:
                    container = dotted_name(assign.targets[0].target)
                    if container and "." in container:
                        self._filling_calls.setdefault(container, []).append(assign)
        return self._filling_calls

    def _runs_outside_training_iterations(self, scope: Scope) -> bool:
        """Does a function that keeps a value on an attribute run outside every training
        iteration (choose_action(), called from the environment loop)? One that an iteration calls
        (pix2pix's `self.forward()` in optimize_parameters()) is put under autocast at that call."""
        if not isinstance(scope, cst.FunctionDef):
            return False
        name = scope.name.value
        for unit in self.structure.units:
            bodies = [unit.owner] + [helper for backward in unit.backwards if backward.delegation is not None
                                     for helper in backward.delegation.helpers]
            for body in bodies:
                for call in statements.calls_within(body):
                    if (dotted_name(call.func) or "").split(".")[-1] == name:
                        return False
        return True

    def _same_object(self, container: str, filler_scope: Scope, loss_scope: Scope) -> bool:
        """Does `container` name the same object in both functions? `self.x`: methods of one
        class; `policy.x`: a module-level name that neither function binds itself."""
        s = self.structure
        root = container.split(".")[0]
        if root == "self":
            if container == "self":
                return False  # the model is the object itself: its forward runs in its own methods
            klass = s.class_of(filler_scope)
            return klass is not None and klass is s.class_of(loss_scope)
        bindings_there = s.bindings_visible(root, filler_scope)
        bindings_here = s.bindings_visible(root, loss_scope)
        return bool(bindings_here) and bindings_there == bindings_here and all(
            b.scope is s.module for b in bindings_here
        )

    def _forward_before(self, call: cst.CSTNode, scope: Scope, container: str, models: Set[str]) -> Optional[SavedForward]:
        """The statements before the filling call (or assignment), in its block, that run a model
        for the value it adds (traced back through the names that value is computed from)."""
        s = self.structure
        statement = s.statement_of(call)
        block = s.block_of(statement) if statement is not None else None
        if block is None:
            return None
        body: Sequence[cst.CSTNode] = list(block.body)
        index = next(i for i, candidate in enumerate(body) if candidate is statement)
        needed = set()
        for value in ([call.value] if isinstance(call, cst.Assign) else [argument.value for argument in call.args]):
            needed |= statements.used_names(value)
        forwards: List[int] = []
        if isinstance(call, cst.Assign) and _calls_one_of(statement, models):
            forwards.append(index)  # `self.values = self.critic(obs)`
        for candidate in range(index - 1, -1, -1):
            earlier = body[candidate]
            if isinstance(earlier, (cst.FunctionDef, cst.ClassDef)):
                break
            if statements.assigned_names(earlier) & needed:
                needed |= statements.used_names(earlier)
                if _calls_one_of(earlier, models):
                    forwards.append(candidate)
        if not forwards:
            return None
        start, end = min(forwards), max(forwards)
        if isinstance(call, cst.Assign):
            # the kept value is computed from the model's outputs by the statements in between
            # (`sigma = T.exp(sigma)`, `dist.log_prob(action)`): under autocast with them, as the
            # loss computed from it would be in the step itself
            end = index
        stepping = {id(c) for c in self._backward_and_step_calls()}
        for held in body[start:end + 1]:
            if any(id(c) in stepping for c in statements.calls_within(held)):
                return None
        return SavedForward(block, start, end, scope, container, call)

    def _backward_and_step_calls(self) -> List[cst.Call]:
        s = self.structure
        return [b.call for b in s.backwards] + [st.call for st in s.steps]


def _calls_one_of(statement: cst.CSTNode, models: Set[str]) -> bool:
    """Does the statement call one of the models (`policy(state)`, `self.policy.forward(x)`)?"""
    for call in statements.calls_within(statement):
        called = dotted_name(call.func)
        if called is not None and (called in models or (called.endswith(".forward") and called[:-8] in models)):
            return True
    return False
