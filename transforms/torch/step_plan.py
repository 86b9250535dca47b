"""Where the mixed precision pieces go inside one training iteration.

`StepPlanner` answers three placement questions for a `TrainingUnit`, or raises `Unconvertible`
with the reason shown to the user: which statements form the forward pass + loss of each
backward() (the autocast regions), after which statement `scaler.update()` runs exactly once per
iteration, and before which clipping calls `scaler.unscale_(optimizer)` goes. Shared by the
PyTorch backends; it plans, it never edits.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.torch.training_loop import Block, BackwardCall, TrainingStructure, TrainingUnit, Unconvertible

#: reductions allowed on the loss inside `<loss>.backward()` (`loss.mean().backward()`)
_LOSS_REDUCTIONS = {"mean", "sum", "float", "squeeze", "view", "reshape", "double"}


class StepPlanner:
    """Placement decisions for the training units of one analysed module."""

    def __init__(self, structure: TrainingStructure, imports: ImportMap) -> None:
        self.structure = structure
        self.imports = imports
        #: per unit (by id): (statement, "after"/"before") in early-exit branches where
        #: scaler.update() also goes
        self.early_exit_updates: Dict[int, List[Tuple[cst.CSTNode, str]]] = {}

    def autocast_regions(self, unit: TrainingUnit) -> List[Tuple[Block, int, int]]:
        """(block, first index, last index) runs of statements to put under autocast: for every
        backward() of the unit, the forward pass through the statement computing its loss."""
        barriers = self._barrier_statements(unit)
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
        loss_names = self._loss_names(backward)
        if not loss_names:
            raise Unconvertible("cannot tell which tensor backward() is called on", backward.call)
        found = None
        path = s.block_path(backward.call, stop=stop)
        for level, (block, statement) in enumerate(path):
            body = list(block.body)
            index = index_of(body, statement)
            for candidate in range(index - 1, -1, -1):
                if statements.assigned_names(body[candidate]) & loss_names:
                    found = (block, body, candidate)
                    break
            if found:
                break
        if found is None:
            raise Unconvertible(
                f"the loss of backward() ({', '.join(sorted(loss_names))}) is not computed in this loop, "
                "so the forward pass cannot be put under autocast",
                backward.call,
            )
        block, body, end = found
        start, before_barrier, needed = self._forward_start(body, end, barriers)
        self._check_outer_forward(path[level + 1:], needed, by_block, backward)
        planned = by_block.get(id(block), (block, []))[1]
        if before_barrier is not None and not any(a <= before_barrier <= b for a, b in planned):
            # an earlier region that starts after it with no backward()/step() in between
            # (WGAN: `fake = G(z)` right before the real-batch forward and backward) grows to hold it
            for k, (a, b) in enumerate(planned):
                if before_barrier < a and not any(id(body[i]) in barriers for i in range(before_barrier, a)):
                    planned[k] = (before_barrier, b)
                    break
        if before_barrier is not None and not any(a <= before_barrier <= b for a, b in planned):
            raise Unconvertible(
                f"part of the forward pass for this loss (line {s.line(body[before_barrier])}) runs before "
                "an earlier backward()/step(), outside any autocast region: put torch.autocast "
                "around it by hand",
                backward.call,
            )
        if not any(self._calls_model(body[index]) for index in range(start, end + 1)):
            first, last = s.line(body[start]), s.line(body[end])
            lines = f"line {first}" if first == last else f"lines {first}-{last}"
            raise Unconvertible(
                f"the loss of backward() is computed from tensors made elsewhere: {lines}, which compute it, call "
                "no model ampify recognises (a module built in this file, or one that is called like one), so the "
                "forward pass runs elsewhere; put torch.autocast around it by hand",
                backward.call,
            )
        start = self._stateful_forward_start(body, start, barriers)
        ranges = by_block.setdefault(id(block), (block, []))[1]
        ranges.append((start, end))

    def _stateful_forward_start(self, body: Sequence[cst.CSTNode], start: int, barriers: Set[int]) -> int:
        """Move a region's start back over `self.forward()`: a method call whose result is dropped
        runs the forward pass for its effect on self (pix2pix, CUT: `self.forward()` sets
        self.fake_B, which the loss then reads), so tracing the loss's names cannot find it."""
        first = start
        for index in range(start - 1, -1, -1):
            statement = body[index]
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) or id(statement) in barriers:
                break
            if _is_dropped_self_call(statement) and self._runs_model_directly(statement):
                first = index
        return first

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
            if not bindings or not all(b.qualified_call in names.TENSOR_FACTORIES for b in bindings):
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

    def _calls_model(self, statement: cst.CSTNode) -> bool:
        """Does the statement call something other than imported functions, tensor methods and
        builtins: a model, a loss module, a helper that runs them?"""
        for call in statements.calls_within(statement):
            if self.imports.resolve(call.func) is not None:
                continue
            if isinstance(call.func, cst.Attribute):
                called = call.func.attr.value
            elif isinstance(call.func, cst.Name):
                called = call.func.value
            else:
                return True
            if called not in names.TENSOR_ARITHMETIC_CALLS:
                return True
        return False

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
        return barrier_ids

    def _loss_names(self, backward) -> Set[str]:
        loss = backward.loss
        if loss is None:
            return set()
        for call in statements.calls_within(loss):
            method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
            if method not in _LOSS_REDUCTIONS:
                raise Unconvertible(
                    "the loss is computed inside the backward() call itself; assign it to a variable first",
                    backward.call,
                )
        return statements.used_names(loss) - {"self"}

    def _forward_start(
        self, body: Sequence[cst.CSTNode], end: int, barriers: Set[int]
    ) -> Tuple[int, Optional[int], Set[str]]:
        """First statement of the forward pass that leads to the loss statement body[end], and
        the index of a statement with a model call that the loss needs but that sits before a
        backward()/step() barrier (it can only be under autocast if another region holds it), and
        the names the loss still needs from before the block."""
        needed = statements.used_names(body[end])
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
            if statements.assigned_names(statement) & needed:
                needed |= statements.used_names(statement)
                if crossed_barrier:
                    if before_barrier is None and self._calls_model(statement):
                        before_barrier = index
                elif statements.has_forward_call(statement):
                    start = index
        return start, before_barrier, needed

    def _check_outer_forward(self, outer_levels, needed: Set[str], by_block, backward) -> None:
        """The loss is computed in a nested block (an `if`): a model call before that block that
        the loss needs would stay outside the autocast region, so refuse unless a region holds it."""
        s = self.structure
        for block, holder in outer_levels:
            body = list(block.body)
            planned = by_block.get(id(block), (block, []))[1]
            for index in range(index_of(body, holder) - 1, -1, -1):
                statement = body[index]
                if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                    return
                if statements.assigned_names(statement) & needed:
                    needed = needed | statements.used_names(statement)
                    if self._calls_model(statement) and not any(a <= index <= b for a, b in planned):
                        raise Unconvertible(
                            f"the forward pass for this loss (line {s.line(statement)}) is outside the block "
                            "that computes the loss: put torch.autocast around both by hand",
                            backward.call,
                        )

    # scaler.update() -------------------------------------------------------------------

    def update_anchor(self, unit: TrainingUnit) -> cst.CSTNode:
        """The statement after which `scaler.update()` runs exactly once per iteration that stepped:
        after the last step, in the deepest block holding every step, with no jump in between."""
        s = self.structure
        steps = sorted(unit.steps, key=lambda st: (s.line(st.call), s.position(st.call).column))
        paths = [list(reversed(s.block_path(st.call, stop=unit.body))) for st in steps]  # outermost first
        common_depth = 0
        while all(len(p) > common_depth for p in paths) and len({id(p[common_depth][0]) for p in paths}) == 1:
            common_depth += 1
        if common_depth == 0:
            raise Unconvertible("the optimizer steps are not in one loop body", steps[0].call)
        common_block = paths[0][common_depth - 1][0]
        anchors = [p[common_depth - 1][1] for p in paths]
        body = list(common_block.body)
        if not any(len(p) == common_depth and isinstance(p[-1][1], cst.SimpleStatementLine) for p in paths):
            raise Unconvertible(
                "every optimizer step is conditional, in different branches: place scaler.update() by hand "
                "so that it runs exactly once after the steps",
                steps[-1].call,
            )
        # a loop between the unit body and the steps would run update() several times
        for block, statement in paths[0][: common_depth]:
            if statement is not anchors[0] and isinstance(statement, (cst.For, cst.While)):
                raise Unconvertible("the optimizer steps run in an inner loop", steps[0].call)
        for depth in range(common_depth - 1):
            if isinstance(paths[0][depth][1], (cst.For, cst.While)):
                raise Unconvertible("the optimizer steps run in an inner loop", steps[0].call)
        first = min(index_of(body, a) for a in anchors)
        last = max(index_of(body, a) for a in anchors)
        self.early_exit_updates[id(unit)] = []
        for index in range(first, last + 1):
            jump = statements.find_jump(body[index])
            if jump is None:
                continue
            exit_anchor = self._early_exit_anchor(body[index], unit, body[:index], anchors)
            if exit_anchor is None:
                raise Unconvertible(
                    "a continue/break/return between the optimizer steps could skip scaler.update(); "
                    "convert this step by hand",
                    jump,
                )
            self.early_exit_updates[id(unit)].append(exit_anchor)
        return body[last]

    def _early_exit_anchor(
        self, statement: cst.CSTNode, unit: TrainingUnit, earlier: Sequence[cst.CSTNode], anchors: Sequence[cst.CSTNode]
    ) -> Optional[Tuple[cst.CSTNode, str]]:
        """An `if` whose branch leaves the iteration (`continue`/`break`/`return` as its last
        statement) after the iteration has stepped: where that path gets its own
        `scaler.update()`. Two shapes are followed:
        - the branch steps itself, then leaves (a warm-up phase:
          `if warmup: loss.backward(); opt.step(); continue`): update after its last step;
        - the branch only leaves, after unconditional steps earlier in the iteration (a critic
          stepping every iteration, `if i % n_critic: continue`, then the generator): update
          right before the jump.
        None (refuse) for any other jump."""
        s = self.structure
        if not isinstance(statement, cst.If) or statement.orelse is not None:
            return None
        branch = statement.body
        if not isinstance(branch, cst.IndentedBlock) or not branch.body:
            return None
        inner = list(branch.body)
        last = inner[-1]
        if not (
            isinstance(last, cst.SimpleStatementLine)
            and len(last.body) == 1
            and isinstance(last.body[0], (cst.Continue, cst.Break, cst.Return))
        ):
            return None
        if any(statements.find_jump(other) is not None for other in inner[:-1]):
            return None
        steps_inside = [st for st in unit.steps if s.contains(statement, st.call)]
        if not steps_inside:
            # every step before this `if` must have run exactly once on this path
            stepped_before = [a for a in anchors if any(a is e for e in earlier)]
            if not stepped_before or any(not isinstance(a, cst.SimpleStatementLine) for a in stepped_before):
                return None
            return last, "before"
        holders = [s.statement_of(st.call) for st in steps_inside]
        if any(holder is None or s.block_of(holder) is not branch for holder in holders):
            return None  # a step nested deeper in the branch: its count per pass is unclear
        if any(not isinstance(holder, cst.SimpleStatementLine) for holder in holders):
            return None
        return max(holders, key=lambda holder: index_of(inner, holder)), "after"

    # scaler.unscale_ before clipping ---------------------------------------------------

    def unscale_points(self, unit: TrainingUnit) -> List[Tuple[cst.CSTNode, str]]:
        """(statement, optimizer) pairs: `scaler.unscale_(optimizer)` goes right before each
        statement that needs true gradients (gradient clipping, the script's own reads of
        `p.grad` between backward() and step()), once per optimizer step."""
        s = self.structure
        planned: List[Tuple[cst.CSTNode, str]] = []
        unscaled: Dict[str, cst.CSTNode] = {}
        steps = sorted(unit.steps, key=lambda st: self._where(st.call))
        needs: List[Tuple[Tuple[int, int], str, cst.CSTNode]] = [
            (self._where(clip.call), "clip", clip.call) for clip in unit.clips
        ]
        needs += [(self._where(read.node), "grad", read.node) for read in self._grad_reads_before_step(unit)]
        needs += [(self._where(call), "clip", call) for call in self._gradient_helper_calls(unit)]
        for where, kind, node in sorted(needs, key=lambda item: item[0]):
            following = [st for st in steps if self._where(st.call) > where]
            if not following:
                if kind == "grad":
                    continue
                raise Unconvertible("gradient clipping after the last optimizer step", node)
            step = following[0]
            step_block = s.block_of(s.statement_of(step.call))
            if kind == "clip":
                statement = s.statement_of(node)
                if not isinstance(statement, cst.SimpleStatementLine):
                    raise Unconvertible("gradient clipping inside a one-line compound statement", node)
                if not any(block is step_block for block, _ in s.block_path(node, stop=unit.body)):
                    raise Unconvertible(
                        "gradient clipping runs more often than the optimizer step it precedes "
                        "(scaler.unscale_ may be called only once per step)",
                        node,
                    )
            else:
                statement = self._grad_read_statement(unit, node, step_block, step)
            if step.receiver in unscaled:
                earlier = unscaled[step.receiver]
                if s.block_of(earlier) is not s.block_of(statement):
                    # e.g. `if clip: clip_gradients(...)` then `log_grad_norm(...)`: one unscale_
                    # before the step-level statement that holds the first of them
                    hoisted = self._grad_read_statement(unit, earlier, step_block, step)
                    planned = [(hoisted if st is earlier else st, r) for st, r in planned]
                    unscaled[step.receiver] = hoisted
                continue
            unscaled[step.receiver] = statement
            planned.append((statement, step.receiver))
        return planned

    def _where(self, node: cst.CSTNode) -> Tuple[int, int]:
        position = self.structure.position(node)
        return position.line, position.column

    def _gradient_helper_calls(self, unit: TrainingUnit) -> List[cst.Call]:
        """Calls of the script's own helpers that look at gradients (`clip_gradients(model, c)`,
        `utils.get_grad_norm(...)`, `average_gradients(model)`) after the iteration's first
        backward() and before its last step(): they get `scaler.unscale_` before them like
        clipping (unscaling early is harmless; reading scaled gradients is not)."""
        if not unit.backwards or not unit.steps:
            return []
        first_backward = min(self._where(b.call) for b in unit.backwards)
        last_step = max(self._where(st.call) for st in unit.steps)
        known = {id(site.call) for site in unit.clips}
        found: List[cst.Call] = []
        for call in statements.calls_within(unit.body):
            if id(call) in known or not first_backward < self._where(call) < last_step:
                continue
            if (self.imports.resolve(call.func) or "").startswith("torch."):
                continue
            if isinstance(call.func, cst.Attribute):
                called = call.func.attr.value
            elif isinstance(call.func, cst.Name):
                called = call.func.value
            else:
                continue
            lowered = called.lower()
            if lowered in names.NOT_GRADIENT_HELPERS or not ("clip" in lowered or "grad" in lowered):
                continue
            where = self._where(call)
            next_step = min((self._where(st.call) for st in unit.steps if self._where(st.call) > where), default=None)
            if next_step is None or any(where < self._where(b.call) < next_step for b in unit.backwards):
                continue  # a backward() follows before the step (a gradient penalty, say): not a gradient reader
            found.append(call)
        return found

    def _grad_reads_before_step(self, unit: TrainingUnit):
        """`.grad` accesses after the iteration's first backward() and before its last step():
        with float16 loss scaling they would see scaled gradients."""
        if not unit.backwards or not unit.steps:
            return []
        first_backward = min(self._where(b.call) for b in unit.backwards)
        last_step = max(self._where(st.call) for st in unit.steps)
        return [r for r in unit.grad_reads if first_backward < self._where(r.node) < last_step]

    def _grad_read_statement(self, unit: TrainingUnit, node: cst.CSTNode, step_block, step) -> cst.CSTNode:
        """The statement of the step's block that holds a `.grad` read: `scaler.unscale_` goes
        before it. Refuse when the gradients' owner is ambiguous or unscaling there is unsafe."""
        s = self.structure
        line = s.line(node)
        if len(unit.optimizers) > 1:
            raise Unconvertible(
                f"line {line} reads .grad between backward() and step() in an iteration with several "
                "optimizers; ampify cannot tell whose gradients they are: call scaler.unscale_(<optimizer>) "
                "before it by hand (scaled gradients would be read otherwise)",
                node,
            )
        statement = None
        for block, holder in s.block_path(node, stop=unit.body):
            if block is step_block:
                statement = holder
                break
        if statement is None:
            raise Unconvertible(
                f"line {line} reads .grad (scaled by the GradScaler) in a block that runs more or less often "
                "than the optimizer step: call scaler.unscale_(optimizer) before it by hand",
                node,
            )
        holder_start, step_at = self._where(statement), self._where(step.call)
        for backward in unit.backwards:
            if s.contains(statement, backward.call) or holder_start < self._where(backward.call) < step_at:
                raise Unconvertible(
                    f"line {line} reads .grad between backward() calls of one step: scaler.unscale_ cannot go "
                    "before it; unscale by hand after the last backward()",
                    node,
                )
        if s.contains(statement, step.call):
            raise Unconvertible(
                f"line {line} reads .grad in the statement that steps the optimizer: call "
                "scaler.unscale_(optimizer) before the read by hand",
                node,
            )
        return statement

    # where the scaler lives ------------------------------------------------------------


def index_of(body: Sequence[cst.CSTNode], statement: cst.CSTNode) -> int:
    """Position of a statement in its block's body (by identity)."""
    for index, candidate in enumerate(body):
        if candidate is statement:
            return index
    raise Unconvertible("internal: statement not found in its block", statement)


#: calls that only prepare a step (no forward pass): they do not make a prelude region
_BOOKKEEPING_CALLS = names.NOT_GRADIENT_HELPERS | names.DATA_PREPARATION_CALLS


def _is_dropped_self_call(statement: cst.CSTNode) -> bool:
    """`self.forward(...)` as a statement of its own, its result dropped."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return False
    func = small.value.func
    return isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
