"""Which statements of a training iteration run under autocast.

For every backward() of a `TrainingUnit`: the forward pass through the statement that computes
its loss, as runs of statements in their block; and the index assignments of model outputs into
float32 tensors that must be cast back. Raises `Unconvertible` with the reason shown to the user.
Shared by the PyTorch backends; it plans, it never edits.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.saved_outputs import SavedForward, SavedOutputs
from ampify.transforms.torch.training_loop import (
    BackwardCall, Block, LossNotFound, Scope, TrainingStructure, TrainingUnit, Unconvertible, receiver_of,
)

#: reductions allowed on the loss inside `<loss>.backward()` (`loss.mean().backward()`)
LOSS_REDUCTIONS = {"mean", "sum", "float", "squeeze", "view", "reshape", "double"}


class AutocastPlanner:
    """Autocast regions for the training units of one analysed module."""

    def __init__(self, structure: TrainingStructure, imports: ImportMap, project=None) -> None:
        self.structure = structure
        self.imports = imports
        #: ProjectFacts (None for a lone file): calls into the project's own training code are barriers
        self.project = project
        self.saved_outputs = SavedOutputs(structure)
        self._models: Set[str] = set()
        #: id(block) -> the SavedForward planned in it (a region outside the unit's function)
        self.saved_forwards: Dict[int, SavedForward] = {}
        #: id(block) -> (the function holding it, the step helper its call hands a loss to): a region
        #: around the forward pass of a loss that a caller computes and hands to the function that
        #: steps (`take_optimisation_step(optimizer, network, loss)`)
        self.caller_regions: Dict[int, Tuple[Scope, cst.FunctionDef]] = {}
        #: id of a `loss.backward()` call -> the loss object it runs the backward() of (loss_objects.py)
        self.loss_objects: Dict[int, Any] = {}
        self._data_helper_names: Optional[Set[str]] = None
        self._model_free_names: Optional[Dict[str, List[cst.FunctionDef]]] = None
        self._project_training_calls: Optional[List[cst.Call]] = None
        self._training_helper_calls: Optional[List[cst.Call]] = None
        #: ids of the statements that are barriers only because they call a helper that trains
        self._helper_barriers: Set[int] = set()
        self._self_attributes: Optional[Set[str]] = None
        #: (object, method, id(scope)) -> is it a no_grad method of the object's class (computed once)
        self._no_grad_seen: Dict[Tuple[str, str, int], bool] = {}

    def _data_helpers(self) -> Set[str]:
        """The module's functions and methods that only prepare data (computed once)."""
        if self._data_helper_names is None:
            self._data_helper_names = statements.data_preparation_helpers(self.structure.module, self.imports)
        return self._data_helper_names

    def autocast_regions(self, unit: TrainingUnit) -> List[Tuple[Block, int, int]]:
        """(block, first index, last index) runs of statements to put under autocast: for every
        backward() of the unit, the forward pass through the statement computing its loss."""
        barriers = self._barrier_statements(unit)
        self._models = self._models_of(unit)
        by_block: Dict[int, Tuple[Block, List[Tuple[int, int]]]] = {}
        for backward in unit.backwards:
            if backward.delegation is None:
                self._plan_loss_region(backward, unit.body, barriers, by_block)
                continue
            # a helper method runs the backward (`self.backward_D()`): the forward pass and loss
            # in the innermost helper, and the forward calls right before each helper call
            delegation = backward.delegation
            self._plan_loss_region(delegation.inner, delegation.helpers[-1].body, barriers, by_block)
            for site in delegation.sites:
                self._plan_prelude_region(site, barriers, by_block)
        regions: List[Tuple[Block, int, int]] = []
        for block, ranges in by_block.values():
            ranges.sort()
            merged: List[List[int]] = []
            for start, end in ranges:
                if merged and start <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            body = list(block.body)
            for start, end in merged:
                if any(id(body[i]) in barriers for i in range(start, end + 1)):
                    raise Unconvertible(
                        "the forward passes of several backward() calls are interleaved with "
                        "backward()/step() calls", body[start]
                    )
                regions.append((block, start, end))
        return regions

    def _plan_loss_region(
        self, backward: BackwardCall, stop: Block, barriers: Set[int],
        by_block: Dict[int, Tuple[Block, List[Tuple[int, int]]]],
    ) -> None:
        """Plan the autocast region of one `<loss>.backward()`: from the forward pass to the
        statement computing the loss, searched in the blocks from the backward up to `stop`."""
        s = self.structure
        found = None
        path = s.block_path(backward.call, stop=stop)
        loss_object = self.loss_objects.get(id(backward.call))
        if loss_object is not None:
            # a loss object (loss_objects.py): the region ends at the last call that fills it
            loss_names = {loss_object.receiver}
            level = next(k for k, (block, _) in enumerate(path) if block is loss_object.block)
            found = (loss_object.block, list(loss_object.block.body), loss_object.index)
        else:
            loss_names = self._loss_names(backward)
            if not loss_names:
                raise Unconvertible("cannot tell which tensor backward() is called on", backward.call)
        for level, (block, statement) in enumerate(path if found is None else []):
            body = list(block.body)
            index = index_of(body, statement)
            for candidate in range(index - 1, -1, -1):
                if statements.assigned_names(body[candidate]) & loss_names:
                    found = (block, body, candidate)
                    break
            if found:
                break
        if found is None and self._plan_caller_regions(backward, loss_names, barriers, by_block):
            return
        if found is None:
            raise LossNotFound(
                f"the loss of backward() ({', '.join(sorted(loss_names))}) is not computed in this loop, "
                "so the forward pass cannot be put under autocast",
                backward.call, receiver_of(backward),
            )
        block, body, end = found
        if loss_object is None and isinstance(body[end], cst.If) and id(body[end]) in barriers:
            # the loss is computed in each branch of an if that also trains (BY571's SAC: `if not
            # FIXED_ALPHA:` steps the temperature, then computes the actor loss; `else:` computes it
            # alone): a region in each branch, none around the whole if
            self._plan_branch_regions(body[end], [(block, body[end]), *path[level + 1:]], loss_names, barriers,
                                      by_block, backward)
            return
        start, before_barrier, needed = self._forward_start(body, end, barriers, loss_names)
        outer_forwards = self._check_outer_forward(path[level + 1:], needed, barriers, by_block, backward)
        planned = by_block.get(id(block), (block, []))[1]
        if before_barrier is not None and not any(a <= before_barrier <= b for a, b in planned):
            # an earlier region that starts after it with no backward()/step() in between
            # (WGAN: `fake = G(z)` right before the real-batch forward and backward) grows to hold it
            for k, (a, b) in enumerate(planned):
                if before_barrier < a and not any(id(body[i]) in barriers for i in range(before_barrier, a)):
                    planned[k] = (before_barrier, b)
                    break
                # or one that ends right before it (ClusterGAN: `D_real = discriminator(real_imgs)`
                # right after the generator step's `D_gen = discriminator(gen_imgs)`)
                if b < before_barrier and not any(id(body[i]) in barriers for i in range(b + 1, before_barrier + 1)):
                    planned[k] = (a, before_barrier)
                    break
        if before_barrier is not None and not any(a <= before_barrier <= b for a, b in planned):
            self._plan_region_before_helpers(block, body, before_barrier, start, barriers, by_block, backward)
            planned = by_block[id(block)][1]
        saved = self._plan_saved_forwards(needed, backward, by_block)
        # a helper of this module that runs no model (REINFORCE's loss summed from log-probabilities
        # kept during the rollout) is no forward pass
        model_free = self._model_free()
        if not saved and not any(self._calls_beyond_losses(body[index], model_free)
                                 or self._calls_own_method_running_a_model(body[index], model_free)
                                 for index in range(start, end + 1)) and not self._forward_in_earlier_region(
                body, end, barriers, planned, outer_forwards):
            first, last = s.line(body[start]), s.line(body[end])
            lines = f"line {first}, which computes it, calls" if first == last else \
                f"lines {first}-{last}, which compute it, call"
            helpers = sorted({name.split(".")[-1] + "()" for index in range(start, end + 1)
                              for call in statements.calls_within(body[index])
                              if (name := dotted_name(call.func)) in model_free})
            via = f"; {', '.join(helpers)}, of this file, {'runs' if len(helpers) == 1 else 'run'} none" if helpers else ""
            losses = sorted({name + "()" for index in range(start, end + 1)
                             for call in statements.calls_within(body[index])
                             if (name := dotted_name(call.func)) is not None and names_a_loss_function(name)})
            if losses:
                via += f"; {', '.join(losses)} {'is a loss' if len(losses) == 1 else 'are losses'}, not a model"
            raise LossNotFound(
                f"the loss of backward() is computed from tensors made elsewhere: {lines} "
                f"no model ampify recognises (a module built in this file, or one that is called like one{via}), "
                "so the forward pass runs elsewhere; put torch.autocast around it by hand",
                backward.call, receiver_of(backward),
            )
        start = self._stateful_forward_start(body, start, barriers)
        ranges = by_block.setdefault(id(block), (block, []))[1]
        ranges.append((start, end))

    def _plan_region_before_helpers(self, block: Block, body: Sequence[cst.CSTNode], before_barrier: int, start: int,
                                    barriers: Set[int], by_block, backward: BackwardCall) -> None:
        """Part of the loss's forward pass (body[before_barrier]) runs before a call that trains
        elsewhere, a helper of this file or a project module (RL-Adventure-2's GAIL: the rollout,
        then `ppo_update(...)`, then the discriminator's loss on the rollout's states and actions):
        that part gets an autocast region of its own, ending before the call. Unconvertible when
        a backward() or step() of this file's own code sits in between, or when that part reaches
        further back past one."""
        s = self.structure
        own_step_between = any(id(body[index]) in barriers and id(body[index]) not in self._helper_barriers
                               for index in range(before_barrier + 1, start))
        first, further, _ = self._forward_start(body, before_barrier, barriers)
        if own_step_between or further is not None:
            line = s.line(body[before_barrier if own_step_between else further])
            raise Unconvertible(
                f"part of the forward pass for this loss (line {line}) runs before an earlier backward()/step(), "
                "outside any autocast region: put torch.autocast around it by hand",
                backward.call,
            )
        first = self._stateful_forward_start(body, first, barriers)
        by_block.setdefault(id(block), (block, []))[1].append((first, before_barrier))

    def _plan_branch_regions(self, statement: cst.If, outer_levels, loss_names: Set[str], barriers: Set[int],
                             by_block, backward: BackwardCall) -> None:
        """Regions for a loss every branch of `statement` (an if/elif/else holding a backward or a
        step) computes: in each branch, from its forward pass to its last binding of the loss, as
        for a loss in the loop's own block; what they need from before the if, as for a nested loss.
        Unconvertible when a branch does not compute it (an if with no else included) or computes it
        inside a deeper block that trains."""
        s = self.structure
        branches = [branch.body for branch in _if_chain(statement)]
        last = _if_chain(statement)[-1].orelse
        if not isinstance(last, cst.Else):
            raise Unconvertible(
                f"the loss of this backward() ({', '.join(sorted(loss_names))}) is computed in an if with no else "
                f"(line {s.line(statement)}) that also runs a backward() or step(): put torch.autocast around its "
                "forward pass by hand", backward.call)
        branches.append(last.body)
        needed_before: Set[str] = set()
        for branch in branches:
            body = list(branch.body) if isinstance(branch, cst.IndentedBlock) else []
            end = next((i for i in range(len(body) - 1, -1, -1)
                        if statements.assigned_names(body[i]) & loss_names), None)
            if end is None or id(body[end]) in barriers:
                raise Unconvertible(
                    f"the loss of this backward() ({', '.join(sorted(loss_names))}) is not computed plainly in every "
                    f"branch of the if at line {s.line(statement)}, which also runs a backward() or step(): put "
                    "torch.autocast around its forward pass by hand", backward.call)
            start, before_barrier, needed = self._forward_start(body, end, barriers, loss_names)
            planned = by_block.get(id(branch), (branch, []))[1]
            if before_barrier is not None and not any(a <= before_barrier <= b for a, b in planned):
                raise Unconvertible(
                    f"part of the forward pass for this loss (line {s.line(body[before_barrier])}) runs before "
                    "an earlier backward()/step(), outside any autocast region: put torch.autocast around it by hand",
                    backward.call)
            # what the branch reads and binds nowhere in it comes from before the if
            needed_before |= needed - set().union(*(statements.assigned_names(line) for line in body[:end]))
            by_block.setdefault(id(branch), (branch, []))[1].append((self._stateful_forward_start(body, start, barriers),
                                                                     end))
        self._check_outer_forward(outer_levels, needed_before, barriers, by_block, backward)

    def _plan_caller_regions(self, backward: BackwardCall, loss_names: Set[str], barriers: Set[int],
                             by_block: Dict[int, Tuple[Block, List[Tuple[int, int]]]]) -> bool:
        """The loss is a parameter of the function that runs backward() and the step, a step helper
        (p-christ's `take_optimisation_step(optimizer, network, loss, clipping_norm)`): each of its
        calls in this module is a statement of its own that hands it a variable, computed before
        it in the caller by a forward pass; that forward pass gets the autocast region. False when
        the loss is no such parameter (the caller then refuses as before); Unconvertible, with the
        reason, when a call cannot be followed."""
        s = self.structure
        function = s.scope_of(backward.call)
        if not isinstance(function, cst.FunctionDef) or len(loss_names) != 1:
            return False
        (loss,) = loss_names
        helper = helper_calls(s, function)
        if helper is None:
            return False
        positions, calls = helper
        if loss not in positions or any(b.scope is function and b.kind != "parameter"
                                        for b in s.bindings if b.name == loss):
            return False
        name = function.name.value
        elsewhere: Sequence[str] = ()
        if self.project is not None:
            klass = s.class_of(function)
            if klass is None:
                elsewhere = self.project.callers_elsewhere(name)
            else:
                spelled = self.project.attribute_spelled_elsewhere(klass.name.value, name)
                elsewhere = [spelled] if spelled else []
        if not calls:
            where = f", and is called from {', '.join(elsewhere)}" if elsewhere else ", and no call of it in this file hands one"
            raise Unconvertible(f"{name}() steps the loss it is handed{where}: a step helper whose callers are in "
                                "other files is not converted yet; put torch.autocast around the forward pass of "
                                "its callers by hand", backward.call)
        stray = _other_uses(s, function, calls)
        if stray is not None:
            raise Unconvertible(f"{name}() steps the loss it is handed, and line {s.line(stray)} uses it otherwise than "
                                "by the calls ampify follows (another class, a callback): put torch.autocast around "
                                "the forward pass of its callers by hand", backward.call)
        if elsewhere:
            raise Unconvertible(f"{name}() steps the loss it is handed, and is also called from {', '.join(elsewhere)}, "
                                "whose forward pass this run would leave in float32: run ampify on the repository, "
                                "or put torch.autocast there by hand", backward.call)
        caller_barriers = set(barriers)
        for call in calls:
            caller_barriers |= {id(ancestor) for ancestor in s.ancestors(call)}
        for call in calls:
            statement = s.statement_of(call)
            if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                    and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is call):
                raise Unconvertible(f"the call of {name}() at line {s.line(call)} is not a statement of its own: "
                                    "put torch.autocast around the forward pass of its loss by hand", call)
            passed = statements.argument_for(call, loss, positions)
            if not isinstance(passed, cst.Name):
                raise Unconvertible(f"the call of {name}() at line {s.line(call)} does not hand it the loss as a "
                                    f"variable: bind the loss to a name before the call, then rerun ampify", call)
            caller = s.scope_of(call)
            # the iteration the call runs in: its innermost loop, else the caller's whole body
            loop = next((a for a in s.ancestors(call) if isinstance(a, (cst.For, cst.While, cst.FunctionDef))), None)
            stop = loop.body if loop is not None else s.module
            found = None
            path = s.block_path(call, stop=stop)
            for level, (block, holder) in enumerate(path):
                body = list(block.body)
                index = index_of(body, holder)
                candidate = next((k for k in range(index - 1, -1, -1)
                                  if passed.value in statements.assigned_names(body[k])), None)
                if candidate is not None:
                    found = (block, body, candidate, level)
                    break
            if found is None:
                raise Unconvertible(f"the loss {name}() is handed at line {s.line(call)} ({passed.value}) is not "
                                    "computed in the block of that call: put torch.autocast around its forward "
                                    "pass by hand", call)
            block, body, end, level = found
            start, before_barrier, needed = self._forward_start(body, end, caller_barriers, {passed.value})
            if before_barrier is not None:
                raise Unconvertible(f"part of the forward pass of the loss {name}() is handed at line {s.line(call)} "
                                    f"(line {s.line(body[before_barrier])}) runs before an earlier backward()/step(): "
                                    "put torch.autocast around it by hand", call)
            # a model call before the block that computes the loss (`out = model(x)` before `if ...:`)
            # gets a region of its own there, or the step is refused (as for a loss computed in place)
            outer = self._check_outer_forward(path[level + 1:], needed, caller_barriers, by_block, backward)
            if not outer and not any(self._calls_beyond_losses(body[k], self._model_free()) for k in range(start, end + 1)):
                raise Unconvertible(f"the loss {name}() is handed at line {s.line(call)} ({passed.value}) is computed "
                                    "from tensors made elsewhere, by no model ampify recognises: put torch.autocast "
                                    "around its forward pass by hand", call)
            start = self._stateful_forward_start(body, start, caller_barriers)
            by_block.setdefault(id(block), (block, []))[1].append((start, end))
            self.caller_regions[id(block)] = (caller, function)
        return True

    def _plan_saved_forwards(self, needed: Set[str], backward: BackwardCall,
                             by_block: Dict[int, Tuple[Block, List[Tuple[int, int]]]]) -> bool:
        """The loss reads model outputs kept in a list that another function of this file fills
        (REINFORCE's `policy.saved_log_probs`, see saved_outputs): plan autocast regions around
        the forward passes there. False when there is none."""
        forwards = self.saved_outputs.forwards_for(needed, self.structure.scope_of(backward.call), self._models)
        for forward in forwards:
            by_block.setdefault(id(forward.block), (forward.block, []))[1].append((forward.start, forward.end))
            self.saved_forwards[id(forward.block)] = forward
        return bool(forwards)

    def _models_of(self, unit: TrainingUnit) -> Set[str]:
        """The models the unit's optimizers train (`policy` in Adam(policy.parameters()))."""
        models: Set[str] = set()
        for name in unit.optimizers:
            optimizer = self.structure.optimizers.get(name)
            if optimizer is not None:
                models.update(optimizer.model_names)
            parts = name.split(".")
            if len(parts) == 3 and parts[0] == "self" and (optimizer is None or not optimizer.model_names):
                # `self.actor.optimizer`: a network that builds its own optimizer over its parameters
                models.add(f"self.{parts[1]}")
        return models

    def scope_of_region(self, block: Block, unit_scope):
        """The function whose names an autocast region's header may use: the unit's, or for a
        forward pass whose outputs are kept for the loss, the function that runs it."""
        forward = self.saved_forwards.get(id(block))
        if forward is not None:
            return forward.scope
        caller = self.caller_regions.get(id(block))
        return caller[0] if caller is not None else unit_scope

    def _forward_in_earlier_region(self, body: Sequence[cst.CSTNode], end: int, barriers: Set[int],
                                   planned: List[Tuple[int, int]], outer_forwards: int = 0) -> bool:
        """The loss (Softmax GAN's `g_loss`, after the discriminator's backward and step) is built
        from model outputs computed before an earlier backward()/step() of this iteration, each
        inside that earlier backward's autocast region: its forward pass did run under autocast.
        `outer_forwards`: such model outputs found in the blocks around the loss's block (SAC's
        temperature loss under `if args.autotune:` from the actor's log-probabilities), all of
        them in autocast regions (`_check_outer_forward` refuses otherwise)."""
        needed = statements.used_names(body[end])
        model_calls = []
        for index in range(end - 1, -1, -1):
            statement = body[index]
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                break
            if id(statement) in barriers:
                continue
            if statements.assigned_names(statement) & needed:
                needed |= statements.used_names(statement)
                if self._calls_model(statement):
                    model_calls.append(index)
        return bool(model_calls or outer_forwards) and all(any(a <= index <= b for a, b in planned) for index in model_calls)

    def _stateful_forward_start(self, body: Sequence[cst.CSTNode], start: int, barriers: Set[int]) -> int:
        """Move a region's start back over `self.forward()`: a method call whose result is dropped
        runs the forward pass for its effect on self (pix2pix, CUT: `self.forward()` sets
        self.fake_B, which the loss then reads), so tracing the loss's names cannot find it."""
        first = start
        for index in range(start - 1, -1, -1):
            statement = body[index]
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or id(statement) in barriers:
                break
            if _is_dropped_self_call(statement) and self._runs_model_directly(statement) \
                    and not self._calls_stored_object(statement):
                first = index
        return first

    def _calls_stored_object(self, statement: cst.SimpleStatementLine) -> bool:
        """`self.scheduler(self.optimizer, i, epoch)`: a callable object stored on self (an
        attribute assigned somewhere in the module), not a method run for its effect."""
        if self._self_attributes is None:
            self._self_attributes = statements.assigned_self_attributes(self.structure.module)
        call = statement.body[0].value
        return call.func.attr.value in self._self_attributes

    def _plan_prelude_region(
        self, site: cst.Call, barriers: Set[int], by_block: Dict[int, Tuple[Block, List[Tuple[int, int]]]]
    ) -> None:
        """The statements right before a helper call that runs a backward() (`self.forward()`
        before `self.backward_D()`), back to the previous backward()/step(): those that run a
        model go under autocast too (bookkeeping such as zero_grad() at either end stays out)."""
        s = self.structure
        statement = s.statement_of(site)
        block = s.block_of(statement) if statement is not None else None
        if block is None:
            return
        body = list(block.body)
        index = index_of(body, statement)
        first = index
        for candidate in range(index - 1, -1, -1):
            if isinstance(body[candidate], (cst.FunctionDef, cst.ClassDef)) or id(body[candidate]) in barriers:
                break
            first = candidate
        running = [i for i in range(first, index) if self._runs_model_directly(body[i])]
        if running:
            by_block.setdefault(id(block), (block, []))[1].append((running[0], running[-1]))

    def index_assignments_to_cast(self, node: cst.CSTNode, scope) -> List[Tuple[cst.Assign, str]]:
        """(assignment, target tensor name) for `values[mask] = net(x)...` inside node, where
        `values` is made by torch.zeros(...) & co: under autocast (or apex O1) the right side is
        float16 and index assignment into the float32 tensor raises (index_put needs equal dtypes;
        the PyTorch DQN tutorial's target values). Casting the value to `values.dtype` fixes it
        and is a no-op in float32. Python values (`.item()`) and non-tensor targets are skipped."""
        s = self.structure
        found: List[Tuple[cst.Assign, str]] = []
        for assign in statements.nodes_of_type(node, cst.Assign):
            if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Subscript):
                continue
            root = assign.targets[0].target.value
            if not isinstance(root, cst.Name):
                continue
            bindings = s.bindings_visible(root.value, scope)
            if not bindings or not all(b.qualified_call in names.TENSOR_FACTORIES or self._made_by_a_factory(b.value)
                                       for b in bindings):
                continue
            value = assign.value
            outer = value.func if isinstance(value, cst.Call) else None
            outer_name = (
                outer.attr.value if isinstance(outer, cst.Attribute)
                else outer.value if isinstance(outer, cst.Name) else None
            )
            if outer_name in names.PYTHON_VALUE_CALLS or not self._calls_model(value):
                continue
            found.append((assign, root.value))
        return found

    def _made_by_a_factory(self, value: Optional[cst.BaseExpression]) -> bool:
        """A tensor factory's result through Variable(...) and dtype or device moves:
        Pytorch-Double-DQN's `V_next_state = Variable(torch.zeros(batch_size).type(Tensor))`."""
        for _ in range(8):
            if not isinstance(value, cst.Call):
                return False
            called = self.imports.resolve(value.func) or dotted_name(value.func) or ""
            if called in names.TENSOR_FACTORIES:
                return True
            if called in ("torch.autograd.Variable", "torch.autograd.variable.Variable") and value.args:
                value = value.args[0].value
            elif isinstance(value.func, cst.Attribute) and value.func.attr.value in _FACTORY_RESULT_METHODS:
                value = value.func.value
            else:
                return False
        return False

    def _calls_model(self, statement: cst.CSTNode) -> bool:
        """Does the statement call something other than imported functions, tensor methods,
        builtins and this module's model-free helpers (StarGAN's `self.label2onehot(labels, dim)`):
        a model, a loss module, a helper that runs them?"""
        model_free = self._model_free()
        no_grad = self._no_grad_calls(statement)
        if no_grad:
            model_free = {**model_free, **{name: [] for name in no_grad}}
        return statements.calls_model(statement, self.imports, model_free)

    def _calls_beyond_losses(self, statement: cst.CSTNode, model_free) -> bool:
        """calls_model, with calls of a loss function left out (`self.lm_criterion(lm_logits, x)`,
        `criterion(out, y)`, `self.loss_fn(...)`): a loss computed by them alone from tensors
        handed in runs no forward pass (pytorch-openai-transformer-lm's LossCompute, handed the
        logits the model computed in train.py), so an autocast region around it leaves the model
        in float32."""
        losses = {name: [] for call in statements.calls_within(statement)
                  if (name := dotted_name(call.func)) is not None and names_a_loss_function(name)}
        if statements.calls_model(statement, self.imports, {**model_free, **losses} if losses else model_free):
            return True
        # a model bound to the name of the module it was built from (meijieru/crnn.pytorch:
        # `import models.crnn as crnn`, then `crnn = crnn.CRNN(...)`): a call of it is a forward pass
        s = self.structure
        return any(isinstance(call.func, cst.Name) and self.imports.resolve(call.func) is not None
                   and any(b.kind == "assign" and isinstance(b.value, cst.Call)
                           for b in s.bindings_visible(call.func.value, s.scope_of(call)))
                   for call in statements.calls_within(statement))

    def _no_grad_calls(self, statement: cst.CSTNode) -> Set[str]:
        """Calls in the statement of a method decorated `@torch.no_grad()` on an object built from
        a class of this module or of another project module (stylegan2's `ada_aug_p =
        ada_augment.tune(real_pred)`, AdaptiveAugment in non_leaking.py): what they return carries
        no gradient, so they run no forward pass a loss is computed from."""
        s = self.structure
        found: Set[str] = set()
        for call in statements.calls_within(statement):
            func = call.func
            if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
                continue
            key = (func.value.value, func.attr.value, id(s.scope_of(call)))
            known = self._no_grad_seen.get(key)
            if known is None:
                bindings = s.bindings_visible(func.value.value, s.scope_of(call))
                classes = {dotted_name(b.value.func) if isinstance(b.value, cst.Call) else None for b in bindings}
                known = len(classes) == 1 and None not in classes and self._no_grad_method(classes.pop(), func.attr.value)
                self._no_grad_seen[key] = known
            if known:
                found.add(f"{func.value.value}.{func.attr.value}")
        return found

    def _no_grad_method(self, klass: str, method: str) -> bool:
        own = next((statement for statement in self.structure.module.body
                    if isinstance(statement, cst.ClassDef) and statement.name.value == klass), None)
        if own is not None:
            return any(isinstance(member, cst.FunctionDef) and member.name.value == method
                       and any(_is_no_grad_decorator(d.decorator) for d in member.decorators)
                       for member in own.body.body)
        return self.project is not None and self.project.no_grad_method(klass, method)

    def _calls_own_method_running_a_model(self, statement: cst.CSTNode, model_free) -> bool:
        """`loss = self.update(view_1, view_2)` (sthalles/PyTorch-BYOL): a method of this module's
        classes, called on self, that is not model-free runs the forward pass, whatever its name
        (`update` also names meters' bookkeeping, which is why calls_model lets it pass)."""
        own = self.__dict__.get("_own_methods")
        if own is None:
            own = {f"self.{member.name.value}" for statement_ in self.structure.module.body
                   if isinstance(statement_, cst.ClassDef) for member in statement_.body.body
                   if isinstance(member, cst.FunctionDef)}
            self._own_methods = own
        return any((name := dotted_name(call.func)) in own and name not in model_free
                   for call in statements.calls_within(statement))

    def _model_free(self) -> Dict[str, List[cst.FunctionDef]]:
        """The module's functions and methods that run no model, by name (computed once)."""
        if self._model_free_names is None:
            self._model_free_names = statements.model_free_helpers(self.structure.module, self.imports)
        return self._model_free_names

    def _helper_reads(self, statement: cst.CSTNode) -> Set[str]:
        """The attributes of self (`self.log_probabilities`) read by the model-free methods the
        statement calls (`loss = self.policy_loss(reward)`): the loss is made from them too."""
        helpers = self._model_free()
        read: Set[str] = set()
        for call in statements.calls_within(statement):
            name = dotted_name(call.func) or ""
            if name.startswith("self.") and name in helpers:
                for function in helpers[name]:
                    read |= {used for used in statements.used_names(function.body) if used.startswith("self.")}
        return read

    def _runs_model_directly(self, statement: cst.CSTNode) -> bool:
        """Does the statement call a model or a method of this object itself (`self.forward()`,
        `self.netG(x)`, `net(x)`)? Methods of other objects (`self.pool.query(x)`) and
        bookkeeping (`self.set_requires_grad(...)`, `zero_grad()`) do not count."""
        for call in statements.calls_within(statement):
            func = call.func
            if self.imports.resolve(func) is not None:
                continue
            if isinstance(func, cst.Name):
                called = func.value
            elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
                called = func.attr.value
            else:
                continue
            if called not in _BOOKKEEPING_CALLS and called not in names.TENSOR_ARITHMETIC_CALLS:
                return True
        return False

    def _barrier_statements(self, unit: TrainingUnit) -> Set[int]:
        """ids of every statement (at any depth) that holds a backward or step call: an autocast
        region never spans one. (zero_grad() is no barrier: a forward pass written before it must
        still be found, and zero_grad() under autocast is harmless.)"""
        s = self.structure
        barrier_ids: Set[int] = set()
        calls = [b.call for b in s.backwards] + [st.call for st in s.steps] + list(s.delegated_sites)
        for call in calls:
            for ancestor in s.ancestors(call):
                barrier_ids.add(id(ancestor))
        self._helper_barriers = set()
        for call in self._calls_into_project_training() + self._calls_of_training_helpers():
            if s.contains(unit.owner, call):
                self._helper_barriers |= {id(ancestor) for ancestor in s.ancestors(call)} - barrier_ids
        return barrier_ids | self._helper_barriers

    def _calls_of_training_helpers(self) -> List[cst.Call]:
        """Calls of a function or method of this file that runs a backward() or a step itself
        (RL-Adventure-2's GAIL: `ppo_update(...)` between the rollout and the discriminator's loss):
        an autocast region of the caller would hold that helper's backward and step (computed once)."""
        if self._training_helper_calls is not None:
            return self._training_helper_calls
        s = self.structure
        functions = {id(f): f for call in [b.call for b in s.backwards] + [st.call for st in s.steps]
                     if isinstance(f := s.scope_of(call), cst.FunctionDef)}
        calls: List[cst.Call] = []
        self._training_helper_calls = calls
        for function in functions.values():
            helper = helper_calls(s, function)
            if helper is not None:
                calls += [call for call in helper[1] if not s.contains(function, call)]
                continue
            outer = s.scope_of(function)
            if isinstance(outer, cst.FunctionDef) and sum(
                    b.name == function.name.value and b.scope is outer for b in s.bindings) <= 1:
                # a function nested in the one that calls it (`def ppo_update(...)` inside main())
                calls += [call for call in statements.calls_within(outer) if isinstance(call.func, cst.Name)
                          and call.func.value == function.name.value and not s.contains(function, call)]
        return calls

    def _calls_into_project_training(self) -> List[cst.Call]:
        """Calls that run a training step of another project module: a function whose body calls
        backward(), or a method of an object built from a class with such a method (DARTS's
        `architect.step(...)`, whose Architect backpropagates the validation loss and steps its own
        optimizer). Under this file's autocast such a step would run float16 without loss scaling,
        so an autocast region never spans one (computed once)."""
        if self._project_training_calls is None:
            self._project_training_calls = []
            entries = self.project.training_functions_called() if self.project is not None else ()
            if entries:
                s = self.structure
                functions = {dotted for _, _, dotted, is_class in entries if not is_class}
                classes = {dotted for _, _, dotted, is_class in entries if is_class}
                objects = {b.name for b in s.bindings if isinstance(b.value, cst.Call)
                           and dotted_name(b.value.func) in classes}
                for call in statements.calls_within(s.module):
                    func = call.func
                    if dotted_name(func) in functions or (
                            isinstance(func, cst.Attribute) and dotted_name(func.value) in objects
                            and func.attr.value not in _NOT_A_TRAINING_METHOD):
                        self._project_training_calls.append(call)
        return self._project_training_calls

    def _loss_names(self, backward) -> Set[str]:
        loss = backward.loss
        if loss is None:
            return set()
        for call in statements.calls_within(loss):
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            if method not in LOSS_REDUCTIONS:
                raise Unconvertible(
                    "the loss is computed inside the backward() call itself; assign it to a variable first",
                    backward.call,
                )
        return statements.used_names(loss) - {"self"}

    def _forward_start(
        self, body: Sequence[cst.CSTNode], end: int, barriers: Set[int], loss_names: Set[str] = frozenset()
    ) -> Tuple[int, Optional[int], Set[str]]:
        """First statement of the forward pass that leads to the loss statement body[end], and
        the index of a statement with a model call that the loss needs but that sits before a
        backward()/step() barrier (it can only be under autocast if another region holds it), and
        the names the loss still needs from before the block. `loss_names`: every name the
        backward's loss reads (`(gail_loss + grad_pen).backward()`: body[end] computes grad_pen,
        and gail_loss's own forward pass, further up, belongs to the region too)."""
        needed = statements.used_names(body[end]) | set(loss_names) | self._helper_reads(body[end])
        # what the loss statement binds outright is not read from before it (`grad_penalty = 10 * ...`
        # does not need an earlier branch's grad_penalty)
        needed -= _overwritten_names(body[end]) - _read_names(body[end])
        start = end
        crossed_barrier = False
        before_barrier: Optional[int] = None
        for index in range(end - 1, -1, -1):
            statement = body[index]
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                break
            if id(statement) in barriers:
                crossed_barrier = True
                continue
            # a continue/break/return may go inside the region: leaving a `with` block is fine
            wanted = (_bound_or_filled(statement) - THROWAWAY) & needed
            if wanted:
                # `probs = policy(state_pool[i])` makes probs here: an earlier probs (a rollout's,
                # in an outer block) is not what the loss reads
                needed = (needed - _overwritten_names(statement)) | _read_names(statement) | self._helper_reads(statement)
                if crossed_barrier:
                    # of a compound statement only the lines that bind what the loss reads count:
                    # rosinality's `if used_sample > args.phase * 2:` bumps `step` and `alpha` beside
                    # a checkpoint save, which runs no forward pass for the loss
                    inner = _inner_assignments(statement, wanted)
                    if before_barrier is None and any(self._calls_model(line) for line in (inner or [statement])):
                        before_barrier = index
                elif self._computes_with_a_forward_pass(statement, wanted):
                    start = index
        return start, before_barrier, needed

    def _computes_with_a_forward_pass(self, statement: cst.CSTNode, wanted: Set[str]) -> bool:
        """Does the statement run a forward pass for the names `wanted` of it? For a compound
        statement only the lines that make them count (followed back within it), and its header:
        self-critical.pytorch's `if epoch_done:` block sets the learning rate (`utils.set_lr(...)`,
        `init_scorer(...)`) and a flag the loss reads (`sc_flag = True`), which runs no model, so
        the region need not start there."""
        helpers = self._data_helpers()
        if not statements.has_forward_call(statement, self.imports, helpers):
            return False
        if not isinstance(statement, (cst.If, cst.Try)):
            return True
        if isinstance(statement, cst.If) and any(
                statements.has_forward_call(branch.test, self.imports, helpers) for branch in _if_chain(statement)):
            return True
        lines = _inner_lines(statement)
        if lines is None:
            return True
        wanted = set(wanted)
        for _ in range(len(lines) + 1):  # to a fixpoint: a later line may feed an earlier one in a loop
            grown = set(wanted)
            for line in reversed(lines):
                if (_bound_or_filled(line) - THROWAWAY) & grown:
                    if statements.has_forward_call(line, self.imports, helpers):
                        return True
                    grown |= _read_names(line)
            if grown == wanted:
                return False
            wanted = grown
        return True

    def _check_outer_forward(self, outer_levels, needed: Set[str], barriers: Set[int], by_block, backward) -> int:
        """The loss is computed in a nested block (an `if`): a model call before that block that
        the loss needs gets an autocast region of its own in its block, unless one holds it already
        (or part of its forward pass runs before an earlier backward()/step(): refused). Returns
        how many such model calls were found (each inside a region)."""
        s = self.structure
        found = 0
        for block, holder in outer_levels:
            body = list(block.body)
            planned = by_block.get(id(block), (block, []))[1]
            for index in range(index_of(body, holder) - 1, -1, -1):
                statement = body[index]
                if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                    return found
                if (statements.assigned_names(statement) - THROWAWAY) & needed:
                    assigned_here = (statements.assigned_names(statement) - THROWAWAY) & needed
                    inner = _inner_assignments_closed(statement, assigned_here)
                    if inner is not None and not any(self._calls_model(line) for line in inner):
                        # a loop or branch whose only part the loss needs is plain bookkeeping
                        # (a rollout's `steps += 1`): no forward pass there, only what it reads
                        for line in inner:
                            needed = needed | _read_names(line)
                        continue
                    needed = (needed - _overwritten_names(statement)) | _read_names(statement)
                    if self._calls_model(statement):
                        if not any(a <= index <= b for a, b in planned):
                            # a region of its own in that block: from its forward pass to it
                            # (ClusterGAN: `D_gen = discriminator(gen_imgs)` before `if i % n == 0:`,
                            # whose body computes the generator's loss from it); not a whole loop
                            # or branch (a rollout that fills the lists the loss reads)
                            # an `if` computing the forward pass in each branch, with no backward or
                            # step inside (kakaobrain's fast-autoaugment: plain or mixup batches) goes
                            # under autocast whole; a loop or a branch that trains does not
                            if isinstance(statement, cst.BaseCompoundStatement) and not (
                                    isinstance(statement, cst.If) and id(statement) not in barriers):
                                raise Unconvertible(
                                    f"the forward pass for this loss (line {s.line(statement)}) is outside the block "
                                    "that computes the loss: put torch.autocast around both by hand",
                                    backward.call,
                                )
                            start, before_barrier, _ = self._forward_start(body, index, barriers, assigned_here)
                            if before_barrier is not None:
                                raise Unconvertible(
                                    f"the forward pass for this loss (line {s.line(statement)}) is outside the block "
                                    "that computes the loss, and part of it runs before an earlier backward()/step(): "
                                    "put torch.autocast around it by hand",
                                    backward.call,
                                )
                            by_block.setdefault(id(block), (block, planned))[1].append((start, index))
                            planned = by_block[id(block)][1]
                        found += 1
        return found

    # scaler.update() -------------------------------------------------------------------


#: methods that keep a fresh tensor a fresh tensor (its dtype or device changed, filled in place)
_FACTORY_RESULT_METHODS = {"type", "cuda", "to", "float", "double", "detach", "fill_", "zero_", "requires_grad_"}


def names_a_loss_function(dotted: str) -> bool:
    """`criterion`, `self.lm_criterion`, `criterion_GAN`, `self.loss_fn`, `loss_function`: by
    convention a loss, not a model. A method of another object named `loss` (DARTS's
    `self.model.loss(input, target)`, which runs the model) is not one."""
    parts = dotted.split(".")
    last = parts[-1].lower()
    if "criterion" in last:
        return True
    direct = len(parts) == 1 or (len(parts) == 2 and parts[0] == "self")
    return direct and last in ("loss_fn", "lossfn", "loss_func", "loss_function")


def helper_calls(s: TrainingStructure, function: cst.FunctionDef) -> Optional[Tuple[Dict[str, int], List[cst.Call]]]:
    """(positions of its parameters as its calls pass them, its calls in this module) for a
    module-level function (called by its name) or a method of a module-level class (called as
    `self.<name>` in that class); None for anything else (nested functions, a name bound twice)."""
    module = s.module
    positions = statements.parameter_positions(function)
    if function in module.body:
        if sum(isinstance(st, (cst.FunctionDef, cst.ClassDef)) and st.name.value == function.name.value
               for st in module.body) != 1:
            return None
        calls = [c for c in statements.calls_within(module) if isinstance(c.func, cst.Name)
                 and c.func.value == function.name.value]
        return positions, calls
    klass = next((st for st in module.body if isinstance(st, cst.ClassDef) and function in st.body.body), None)
    if klass is None or any(isinstance(d.decorator, cst.Name) and d.decorator.value in ("staticmethod", "classmethod")
                            for d in function.decorators):
        return None
    if sum(isinstance(m, cst.FunctionDef) and m.name.value == function.name.value for m in klass.body.body) != 1:
        return None
    positions = {name: index - 1 for name, index in positions.items() if index > 0}
    calls = [c for c in statements.calls_within(klass) if dotted_name(c.func) == f"self.{function.name.value}"]
    return positions, calls


def _other_uses(s: TrainingStructure, function: cst.FunctionDef, calls: Sequence[cst.Call]) -> Optional[cst.CSTNode]:
    """A use of the step helper's name in the module besides its definition and `calls`: a call
    from a subclass (`.take_step(` outside the class), the function handed on as a value."""
    name = function.name.value
    followed = {id(call.func) for call in calls}
    followed |= {id(call.func.attr) for call in calls if isinstance(call.func, cst.Attribute)}

    class _Uses(cst.CSTVisitor):
        found: Optional[cst.CSTNode] = None

        def visit_Name(self, node: cst.Name) -> None:
            if node.value == name and node is not function.name and id(node) not in followed and self.found is None:
                self.found = node

    visitor = _Uses()
    s.module.visit(visitor)
    return visitor.found


def _is_no_grad_decorator(decorator: cst.BaseExpression) -> bool:
    """`@torch.no_grad()`, `@torch.no_grad`, `@torch.inference_mode()` (no arguments)."""
    if isinstance(decorator, cst.Call):
        if decorator.args:
            return False
        decorator = decorator.func
    return (dotted_name(decorator) or "").rsplit(".", 1)[-1] in ("no_grad", "inference_mode")


#: `_`: a value thrown away (`actions, _, _ = actor.get_action(obs)`, `for _ in range(k)`), never
#: the data a loss is computed from
THROWAWAY = frozenset({"_"})


def _bound_or_filled(statement: cst.CSTNode) -> Set[str]:
    """Names a statement binds, and the lists it adds to (`policy_loss.append(-log_prob * R)`
    in a loop makes `policy_loss`, which the loss is then summed from)."""
    return statements.assigned_names(statement) | statements.filled_containers(statement)


def _inner_assignments_closed(statement: cst.CSTNode, wanted: Set[str]) -> Optional[List[cst.SimpleStatementLine]]:
    """_inner_assignments, followed within the compound statement to a fixpoint: the lines that
    bind `wanted`, and those binding what they read (`loss = mixup_loss(preds, ...)` reads `preds`,
    which `preds = model(data)` of the same branch makes)."""
    bound = statements.assigned_names(statement) - THROWAWAY
    wanted = set(wanted)
    while True:
        lines = _inner_assignments(statement, wanted)
        if lines is None:
            return None
        grown = wanted | {name for line in lines for name in _read_names(line)} & bound
        if grown == wanted:
            return lines
        wanted = grown


def _inner_assignments(statement: cst.CSTNode, wanted: Set[str]) -> Optional[List[cst.SimpleStatementLine]]:
    """The simple statements inside a compound statement that bind any of `wanted`; None when it
    is not a compound statement, or when its own header binds one (`for x in ...:`, `with ... as x:`,
    `except E as x:`), which is not followed line by line."""
    if not isinstance(statement, cst.BaseCompoundStatement):
        return None
    lines: List[cst.SimpleStatementLine] = []

    class _Lines(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            if (statements.assigned_names(node) - THROWAWAY) & wanted:
                lines.append(node)
            return False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

    statement.visit(_Lines())
    bound_by_lines: Set[str] = set()
    for line in lines:
        bound_by_lines |= statements.assigned_names(line)
    if (wanted & (statements.assigned_names(statement) - THROWAWAY)) - bound_by_lines:
        return None  # bound by a header (a for target, an `as` name), or a nested def
    return lines


def _if_chain(statement: cst.If) -> List[cst.If]:
    """The `if` and its `elif`s."""
    chain = []
    current: Optional[cst.CSTNode] = statement
    while isinstance(current, cst.If):
        chain.append(current)
        current = current.orelse
    return chain


def _inner_lines(statement: cst.CSTNode) -> Optional[List[cst.SimpleStatementLine]]:
    """Every simple statement inside an if/try, in order; None when a nested compound statement
    binds names in its header (`for x in ...`, `with ... as x`, `except E as x`), followed no further."""
    lines: List[cst.SimpleStatementLine] = []
    headers = []

    class _Lines(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            lines.append(node)
            return False

        def visit_For(self, node: cst.For) -> bool:
            headers.append(node)
            return False

        def visit_While(self, node: cst.While) -> bool:
            headers.append(node)
            return False

        def visit_With(self, node: cst.With) -> bool:
            headers.append(node)
            return False

        def visit_ExceptHandler(self, node: cst.ExceptHandler) -> bool:
            if node.name is not None:
                headers.append(node)
            return True

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            headers.append(node)
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            headers.append(node)
            return False

    for block in _bodies(statement):
        block.visit(_Lines())
    return None if headers else lines


def _bodies(statement: cst.CSTNode) -> List[cst.CSTNode]:
    """The blocks of an if/elif/else chain or a try statement (tests and headers excluded)."""
    if isinstance(statement, cst.If):
        blocks: List[cst.CSTNode] = []
        current: Optional[cst.CSTNode] = statement
        while isinstance(current, cst.If):
            blocks.append(current.body)
            current = current.orelse
        if isinstance(current, cst.Else):
            blocks.append(current.body)
        return blocks
    if isinstance(statement, cst.Try):
        blocks = [statement.body, *(handler.body for handler in statement.handlers)]
        blocks += [part.body for part in (statement.orelse, statement.finalbody) if part is not None]
        return blocks
    return []


def _overwritten_names(statement: cst.CSTNode) -> Set[str]:
    """Names a simple statement rebinds outright (`probs = policy(x)`, `a, b = f()`): before it,
    their earlier values are not read through it. Subscript and attribute targets, augmented
    assignments and anything inside a compound statement (which may not run) do not count."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    found: Set[str] = set()
    for small in statement.body:
        if not isinstance(small, cst.Assign):
            continue
        for target in small.targets:
            node = target.target
            elements = node.elements if isinstance(node, (cst.Tuple, cst.List)) else [node]
            for element in elements:
                value = element.value if isinstance(element, (cst.Element, cst.StarredElement)) else element
                if isinstance(value, cst.Name):
                    found.add(value.value)
    return found


def _read_names(statement: cst.CSTNode) -> Set[str]:
    """The names a statement reads: of a line of plain assignments, their values and any
    non-name targets (`x[i] = ...` reads x); else every name in it."""
    if not isinstance(statement, cst.SimpleStatementLine) or not all(isinstance(s, cst.Assign) for s in statement.body):
        return statements.used_names(statement)
    read: Set[str] = set()
    for small in statement.body:
        read |= statements.used_names(small.value)
        for target in small.targets:
            node = target.target
            elements = node.elements if isinstance(node, (cst.Tuple, cst.List)) else [node]
            for element in elements:
                value = element.value if isinstance(element, (cst.Element, cst.StarredElement)) else element
                if not isinstance(value, cst.Name):
                    read |= statements.used_names(value)
    return read


def index_of(body: Sequence[cst.CSTNode], statement: cst.CSTNode) -> int:
    """Position of a statement in its block's body (by identity)."""
    for index, candidate in enumerate(body):
        if candidate is statement:
            return index
    raise Unconvertible("internal: statement not found in its block", statement)


#: calls that only prepare a step (no forward pass): they do not make a prelude region
_BOOKKEEPING_CALLS = names.NOT_GRADIENT_HELPERS | names.DATA_PREPARATION_CALLS

#: methods of an object whose class trains (one of its methods calls backward()) that run no step:
#: its forward pass (a model class with a backward() of its own), its bookkeeping
_NOT_A_TRAINING_METHOD = names.DATA_PREPARATION_CALLS | {
    "forward", "__call__", "parameters", "named_parameters", "state_dict", "load_state_dict", "modules",
    "children", "apply", "requires_grad_", "half", "double", "backward",
}


def _is_dropped_self_call(statement: cst.CSTNode) -> bool:
    """`self.forward(...)` as a statement of its own, its result dropped."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return False
    func = small.value.func
    return isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
