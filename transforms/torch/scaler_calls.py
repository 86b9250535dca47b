"""Where the GradScaler's own calls go inside one training iteration: after which statement
`scaler.update()` runs exactly once per iteration (also in branches that leave it early), and
before which clipping calls or `.grad` reads `scaler.unscale_(optimizer)` goes. Raises
`Unconvertible` with the reason shown to the user; it plans, it never edits.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampify.transforms.kit.calls import nodes_within
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.autocast_regions import index_of
from ampify.transforms.torch.gradient_owners import models_of as unit_models_of, optimizer_of_gradients
from ampify.transforms.torch.training_loop import StepCall, TrainingStructure, TrainingUnit, Unconvertible


class ScalerCallPlanner:
    """update()/unscale_() placement for the training units of one analysed module."""

    def __init__(self, structure: TrainingStructure, imports: ImportMap,
                 touches_grad_elsewhere: Callable[[str], bool] = lambda dotted: False) -> None:
        self.structure = structure
        self.imports = imports
        #: is a dotted call a function of another project module that reads or changes `.grad`?
        self.touches_grad_elsewhere = touches_grad_elsewhere
        #: per unit (by id): (statement, "after"/"before") in early-exit branches where
        #: scaler.update() also goes
        self.early_exit_updates: Dict[int, List[Tuple[cst.CSTNode, str]]] = {}
        #: per unit (by id): steps after which scaler.update() also goes, their optimizer being
        #: stepped again later in the iteration
        self.restep_updates: Dict[int, List[cst.CSTNode]] = {}
        #: per unit (by id): the conditional last step after which the iteration's last
        #: `scaler.update()` goes, in its branch, when an update() already follows that
        #: optimizer's earlier step (stylegan2's `if g_regularize: ... g_optim.step()`)
        self.last_update_in_branch: Dict[int, cst.CSTNode] = {}
        #: clipping statements (by id) whose unscale_ is a loop over the optimizers a later loop
        #: steps: the iterable's code (`optimizers` for `for optimizer in optimizers: scaler.unscale_(optimizer)`)
        self.unscale_loops: Dict[int, str] = {}
        #: units (by id) whose conditional steps each get an update() of their own, in their branch
        self.own_branch_updates: Set[int] = set()
        self._grad_functions: Optional[Set[str]] = None

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
        # steps inside `for optimizer in optimizers:`: update() goes after that loop, not in it
        while common_depth > 1 and _loops_over_the_optimizers(s, paths[0][common_depth - 2][1], steps):
            common_depth -= 1
        common_block = paths[0][common_depth - 1][0]
        anchors = [p[common_depth - 1][1] for p in paths]
        body = list(common_block.body)
        if not any(len(p) == common_depth and isinstance(p[-1][1], cst.SimpleStatementLine)
                   or _loops_over_the_optimizers(s, p[common_depth - 1][1], steps) for p in paths) and not (
            self._steps_in_every_branch(anchors, steps, unit)
        ):
            own_updates = self._update_after_each_conditional_step(unit, steps, anchors)
            if own_updates is not None:
                self.early_exit_updates[id(unit)] = []
                self.restep_updates[id(unit)] = own_updates[:-1]
                self.own_branch_updates.add(id(unit))
                check_no_gradients_unscaled_twice(self.structure, unit, steps, self.zero_grads_of)
                return own_updates[-1]
            raise Unconvertible(
                "every optimizer step is conditional, in different branches: place scaler.update() by hand "
                "so that it runs exactly once after the steps",
                steps[-1].call,
            )
        # a loop between the unit body and the steps would run update() several times, unless it
        # loops over the optimizers themselves (`for optimizer in optimizers: optimizer.step()`):
        # update() then goes after that loop, once
        for block, statement in paths[0][: common_depth]:
            if statement is not anchors[0] and isinstance(statement, (cst.For, cst.While)) \
                    and not _loops_over_the_optimizers(self.structure, statement, steps):
                raise Unconvertible("the optimizer steps run in an inner loop", steps[0].call)
        for depth in range(common_depth - 1):
            if isinstance(paths[0][depth][1], (cst.For, cst.While)) \
                    and not _loops_over_the_optimizers(self.structure, paths[0][depth][1], steps):
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
        self.restep_updates[id(unit)] = self._updates_between_steps_of_one_optimizer(unit, steps, paths, common_depth)
        check_no_gradients_unscaled_twice(self.structure, unit, steps, self.zero_grads_of)
        return self.last_update_in_branch.get(id(unit), body[last])

    def _update_after_each_conditional_step(self, unit: TrainingUnit, steps: Sequence[StepCall],
                                            anchors: Sequence[cst.CSTNode]) -> Optional[List[cst.CSTNode]]:
        """Every step is conditional, each in an `if` of its own that also runs the backward()
        calls whose gradients it steps (BicycleGAN's update_D: `if lambda_GAN > 0: zero_grad, backward,
        optimizer_D.step()`, then `if lambda_GAN2 > 0: ... optimizer_D2.step()`): scaler.update()
        right after each step, in its branch, runs once per step that ran, after the gradients it
        unscaled were made with the scale it unscaled them by. The step statements, in order; None
        when the iteration is not so made (a backward outside those branches, two steps in one)."""
        s = self.structure
        where = self._where
        if len({id(a) for a in anchors}) != len(anchors) or not all(isinstance(a, cst.If) for a in anchors):
            return None
        found = []
        for step, anchor in zip(steps, anchors):
            statement = s.statement_of(step.call)
            block = s.block_of(statement) if isinstance(statement, cst.SimpleStatementLine) else None
            if block is None or s.parent(block) is not anchor or statements.find_jump(anchor) is not None:
                return None
            inside = [b for b in unit.backwards if s.contains(anchor, b.call)]
            if not inside or any(where(b.call) > where(step.call) for b in inside):
                return None
            found.append(statement)
        if any(not any(s.contains(anchor, b.call) for anchor in anchors) for b in unit.backwards):
            return None
        return found

    def _updates_between_steps_of_one_optimizer(
        self, unit: TrainingUnit, steps: Sequence[StepCall], paths, common_depth: int
    ) -> List[cst.CSTNode]:
        """`scaler.step(opt)` may run once per optimizer between two `update()` calls (GradScaler
        raises "step() has already been called since the last update()"). An optimizer stepped
        again later in the same iteration (SAGAN's critic: its loss, then the gradient penalty
        alone) gets `scaler.update()` right after its earlier step, when that is exact: every step
        after it steps gradients made after it (a zero_grad of that optimizer, then a backward,
        in between), and a step that always runs follows it, so the iteration's last update()
        has an inf check to read. Otherwise refused with the reason."""
        s = self.structure
        where = self._where
        found: List[cst.CSTNode] = []
        for index, first in enumerate(steps):
            again = next((later for later in steps[index + 1:] if later.receiver == first.receiver
                          and not self._exclusive(first.call, later.call)), None)
            if again is None:
                continue
            statement = s.statement_of(first.call)
            lines = f"lines {s.line(first.call)} and {s.line(again.call)}"

            def refuse(why: str) -> None:
                raise Unconvertible(
                    f"{first.receiver} is stepped twice in one iteration ({lines}), and a GradScaler steps an "
                    f"optimizer once between update() calls; an update() after the first step would {why}; "
                    "convert by hand, or use --dtype bfloat16", again.call)

            if not isinstance(statement, cst.SimpleStatementLine) or statements.find_jump(statement) is not None:
                refuse("need a statement of its own")
            start = where(first.call)
            for later in steps[index + 1:]:
                end = where(later.call)
                backwards = [where(b.call) for b in unit.backwards if start < where(b.call) < end]
                zeroed = [where(call) for call in self.zero_grads_of(unit, later.receiver) if start < where(call) < end]
                if not backwards or not any(z < max(backwards) for z in zeroed):
                    refuse(f"rescale the gradients {later.receiver} holds from before it (no "
                           f"{later.receiver}.zero_grad() and backward() between line {s.line(first.call)} and its "
                           f"step at line {s.line(later.call)})")
            always = [k for k in range(index + 1, len(steps)) if len(paths[k]) == common_depth
                      and isinstance(paths[k][-1][1], cst.SimpleStatementLine)]
            if not always:
                last_in_branch = self._lone_conditional_last_step(steps, paths, index, common_depth)
                if last_in_branch is None:
                    refuse("leave the iteration's last update() without a step that always runs after it")
                self.last_update_in_branch[id(unit)] = last_in_branch
            found.append(statement)
        return found

    def _lone_conditional_last_step(self, steps: Sequence[StepCall], paths, index: int,
                                    common_depth: int) -> Optional[cst.CSTNode]:
        """The statement of the iteration's last step when it is the only step after steps[index],
        steps the same optimizer again, and sits directly in the body of a plain `if` (no loop, no
        jump) of the block holding the steps: stylegan2's generator, stepped for its loss, then in
        `if g_regularize:` for the path-length penalty. `scaler.update()` then follows the first
        step, and the iteration's last update() goes right after the conditional one, in its
        branch: every update() has a step since the previous one, and no optimizer is stepped twice
        between two. None otherwise."""
        if index != len(steps) - 2 or steps[-1].receiver != steps[index].receiver or len(paths[index]) != common_depth:
            return None
        path = paths[-1]
        if len(path) != common_depth + 1 or not isinstance(path[-1][1], cst.SimpleStatementLine):
            return None
        holder = path[common_depth - 1][1]
        if not isinstance(holder, cst.If) or holder.orelse is not None or path[-1][0] is not holder.body:
            return None
        statement = path[-1][1]
        if statements.find_jump(holder) is not None:
            return None
        return statement

    def _exclusive(self, node: cst.CSTNode, other: cst.CSTNode) -> bool:
        """Do the two calls never both run in one iteration? They sit in different branches of
        one if/elif/else, or `node` is followed in its block by a continue/break/return
        (ESRGAN's warm-up: `optimizer_G.step(); continue`) before the blocks reach `other`."""
        s = self.structure
        holder = s.statement_of(node)
        while holder is not None:
            block = s.block_of(holder)
            if block is None or s.contains(block, other):
                break
            body = list(block.body)
            following = body[index_of(body, holder) + 1:]
            if any(isinstance(statement, cst.SimpleStatementLine) and any(
                    isinstance(small, (cst.Continue, cst.Break, cst.Return)) for small in statement.body)
                   for statement in following):
                return True
            holder = s.statement_of(s.parent(block))
        for ancestor in s.ancestors(node):
            if s.contains(ancestor, other):
                if isinstance(ancestor, cst.If) and ancestor.orelse is not None:
                    return s.contains(ancestor.body, node) != s.contains(ancestor.body, other)
                return False
        return False

    def zero_grads_of(self, unit: TrainingUnit, optimizer: Optional[str]) -> List[cst.Call]:
        """Calls in the unit that zero `optimizer`'s gradients: `optimizer.zero_grad()`, a
        zero_grad() of a model it trains, or a helper of the module whose body calls
        `optimizer.zero_grad()` (SAGAN's `self.reset_grad()`)."""
        s = self.structure
        models = set(unit_models_of(s, unit, optimizer)) if optimizer else set()
        helpers = self._helpers_zeroing(optimizer) if optimizer else set()
        found = []
        for call in statements.calls_within(unit.body):
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "zero_grad":
                receiver = statements.code_of(func.value).strip()
                if receiver == optimizer or receiver in models:
                    found.append(call)
            elif statements.code_of(func).strip() in helpers:
                found.append(call)
        return found

    def _helpers_zeroing(self, optimizer: str) -> set:
        names_ = set()
        for statement in self.structure.module.body:
            members = statement.body.body if isinstance(statement, cst.ClassDef) else [statement]
            for member in members:
                if not isinstance(member, cst.FunctionDef):
                    continue
                if any(isinstance(c.func, cst.Attribute) and c.func.attr.value == "zero_grad"
                       and statements.code_of(c.func.value).strip() == optimizer
                       for c in statements.calls_within(member.body)):
                    names_.add(("self." if isinstance(statement, cst.ClassDef) else "") + member.name.value)
        return names_

    def _steps_in_every_branch(self, anchors: Sequence[cst.CSTNode], steps: Sequence[StepCall], unit: TrainingUnit) -> bool:
        """Every step sits in one `if/elif/else` (an `else` included) each branch of which runs a
        step unconditionally after a backward of its own, with no loop or jump in it (DeepRL's
        PPO: `if shared: opt.step()`
        / `else: [if kl_ok: actor_opt.step()]; critic_opt.step()`): every pass through the `if`
        steps, so `scaler.update()` goes right after it, once."""
        s = self.structure
        statement = anchors[0]
        if not isinstance(statement, cst.If) or any(anchor is not statement for anchor in anchors):
            return False
        if statements.find_jump(statement) is not None:
            return False
        branches = []
        current: Optional[cst.CSTNode] = statement
        while isinstance(current, cst.If):
            branches.append(current.body)
            current = current.orelse
        if not isinstance(current, cst.Else):
            return False
        branches.append(current.body)
        for step in steps:
            if any(isinstance(holder, (cst.For, cst.While)) for _, holder in s.block_path(step.call, stop=None)
                   if s.contains(statement, holder) and holder is not statement):
                return False
        for branch in branches:
            # each branch computes the gradients it steps (`zero_grad(); loss.backward(); step()`):
            # gradients of a backward before the `if` would wait, scaled, for a later step of
            # the other branch, under a scale that update() may have changed meanwhile
            if not any(s.contains(branch, backward.call) for backward in unit.backwards):
                return False
            if not any(
                isinstance(s.statement_of(step.call), cst.SimpleStatementLine)
                and any(block is branch for block in self._blocks_running_with(step, unit))
                for step in steps
            ):
                return False
        return True

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
        helpers = self._gradient_helper_calls(unit)
        reductions = [call for call in helpers if names.reduces_gradients(statements.called_name(call) or "")]
        for call in reductions:
            called = statements.called_name(call) or ""
            if "clip" in called.lower():
                # `sync_and_clip_grads(model, max_norm)`: its clipping needs unscaled gradients, and its
                # reduction the scaled ones (unscale_ after it): no place for the unscale_ is right
                raise Unconvertible(
                    f"{called}() (line {self.structure.line(call)}) both reduces the gradients across ranks and clips "
                    "them: the clipping needs them unscaled, and GradScaler's inf check must come after the reduction; "
                    "split it (reduce, then scaler.unscale_(optimizer), then clip) by hand", call, code="AMP215")
        needs += [(self._where(call), "helper", call) for call in helpers if call not in reductions]
        self._check_reductions_before_readers(unit, reductions, needs)
        for where, kind, node in sorted(needs, key=lambda item: item[0]):
            following = [st for st in steps if self._where(st.call) > where]
            if not following:
                if kind == "grad":
                    continue
                raise Unconvertible("gradient clipping after the last optimizer step", node)
            step = following[0]
            if kind != "grad" and len(unit.optimizers) > 1:
                step = self._step_of_clipped_gradients(unit, node, kind == "clip", following)
            if kind != "grad":
                later = [b for b in unit.backwards if where < self._where(b.call) < self._where(step.call)]
                if later:
                    # locuslab/TCN's poly_music: `clip_grad_norm_(...)` before `loss.backward()`: it clips
                    # what the last zero_grad() left; an unscale_ there would mark the optimizer unscaled,
                    # and the step would then apply the scaled gradients the backward makes
                    raise Unconvertible(
                        f"the gradient clipping at line {s.line(node)} runs before backward() (line "
                        f"{s.line(later[0].call)}), so it clips the gradients the last zero_grad() left, and "
                        "scaler.unscale_() there would let the step apply the scaled gradients the backward "
                        "makes; move the clipping after backward() and rerun ampify", node)
            step_block = s.block_of(s.statement_of(step.call))
            if kind != "grad":
                statement = s.statement_of(node)
                loop = next((a for a in s.ancestors(step.call) if isinstance(a, cst.For)
                             and _loops_over_the_optimizers(s, a, steps) and not s.contains(a, node)), None)
                if loop is not None:
                    why = self._unscale_loop_obstacle(unit, loop, node)
                    if why is not None:
                        raise Unconvertible(
                            f"the gradient clipping at line {s.line(node)} runs before the loop over "
                            f"{statements.code_of(loop.iter)} that steps them (line {s.line(loop)}), and ampify "
                            f"does not write the loop of scaler.unscale_() calls it needs here ({why}): add `for "
                            f"{loop.target.value} in {statements.code_of(loop.iter)}: scaler.unscale_("
                            f"{loop.target.value})` before it by hand", node)
                    if step.receiver not in unscaled:
                        self.unscale_loops[id(statement)] = statements.code_of(loop.iter)
                        unscaled[step.receiver] = statement
                        planned.append((statement, step.receiver))
                    continue
                if not isinstance(statement, cst.SimpleStatementLine):
                    raise Unconvertible("gradient clipping inside a one-line compound statement", node)
                clip_blocks = [block for block, _ in s.block_path(node, stop=unit.body)]
                if not any(any(block is c for c in clip_blocks) for block in self._blocks_running_with(step, unit)) and not (
                    self._clip_implies_step(unit, node, step)
                ):
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

    def _unscale_loop_obstacle(self, unit: TrainingUnit, loop: cst.For, clip: cst.CSTNode) -> Optional[str]:
        """Why `for <target> in <iterable>: scaler.unscale_(<target>)` cannot go right before the clip
        that precedes the loop stepping the optimizers (None: it can). The clip must run at most once
        before the loop in the same block (directly, or under `if`s), the iterable be a name (read
        again, it is the same optimizers) and the loop's variable be no other name of the function."""
        s = self.structure
        iterable = loop.iter
        if not (isinstance(iterable, (cst.Name, cst.Attribute)) and dotted_name(iterable) is not None) and not (
                isinstance(iterable, (cst.Tuple, cst.List))
                and all(isinstance(e.value, cst.Name) for e in iterable.elements)):
            return f"{statements.code_of(iterable)} is not a plain name, so reading it again may give other optimizers"
        block = s.block_of(loop)
        holder = next((a for a in s.ancestors(clip) if s.block_of(a) is block and isinstance(
            a, (cst.SimpleStatementLine, cst.If, cst.With))), None) if block is not None else None
        inner = block.body if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        if holder is None or index_of(inner, holder) > index_of(inner, loop):
            return "the clipping is not in the loop's block, before it"
        if any(isinstance(a, (cst.For, cst.While)) for a in s.ancestors(clip) if s.contains(holder, a)):
            return "the clipping is inside a loop of its own"
        target = loop.target.value
        same_loop = statements.code_of(iterable)

        def bound_alike(name: cst.Name) -> bool:
            # inside another `for optimizer in optimizers:` (the zero_grad loop): the same optimizers
            enclosing = next((a for a in s.ancestors(name) if isinstance(a, cst.For)
                              and isinstance(a.target, cst.Name) and a.target.value == target), None)
            return enclosing is not None and statements.code_of(enclosing.iter) == same_loop

        if any(s.contains(unit.owner, name) and not s.contains(loop, name) and not bound_alike(name)
               for name in s.name_nodes.get(target, [])):
            return f"{target} names something else in this function too"
        return None

    def _blocks_running_with(self, step: StepCall, unit: TrainingUnit) -> List[cst.CSTNode]:
        """The step's block, and the blocks around it whose every pass runs it exactly once: a
        `with` body always runs (`with config.lock: self.optimizer.step()`, ShangtongZhang's
        DeepRL), so the block holding the `with` counts as the step's too."""
        s = self.structure
        blocks = []
        for block, _ in s.block_path(step.call, stop=unit.body):
            blocks.append(block)
            if not isinstance(s.parent(block), cst.With):
                break
        return blocks

    def _clip_implies_step(self, unit: TrainingUnit, node: cst.CSTNode, step: StepCall) -> bool:
        """The clip and the step sit under `if` tests of their own, and every test guarding the
        step (`if encoder_optimizer is not None:`) also guards the clip, with nothing in the
        iteration rebinding what it tests: whenever the clip runs, the step runs once after it,
        so an unscale_ right before the clip is once per step (image captioning's
        `if grad_clip is not None: ... if encoder_optimizer is not None: clip_gradient(...)`)."""
        s = self.structure
        clip_path = s.block_path(node, stop=unit.body)
        step_path = s.block_path(step.call, stop=unit.body)
        step_blocks = [block for block, _ in step_path]
        common = next((i for i, (block, _) in enumerate(clip_path) if any(block is b for b in step_blocks)), None)
        if common is None:
            return False
        block = clip_path[common][0]
        j = next(i for i, b in enumerate(step_blocks) if b is block)
        inner = block.body if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        clip_holder, step_holder = clip_path[common][1], step_path[j][1]
        if clip_holder is step_holder or index_of(inner, clip_holder) > index_of(inner, step_holder):
            return False
        clip_tests = self._if_tests(clip_path[:common])
        step_tests = self._if_tests(step_path[:j])
        if clip_tests is None or step_tests is None or not step_tests:
            return False
        clip_codes = {statements.code_of(test) for test in clip_tests}
        if any(statements.code_of(test) not in clip_codes for test in step_tests):
            return False
        tested = {n.value for test in step_tests for n in nodes_within(test, cst.Name)}
        return not any(b.name in tested and b.statement is not None and s.contains(unit.owner, b.statement)
                       for b in s.bindings)

    def _if_tests(self, path) -> Optional[List[cst.BaseExpression]]:
        """The tests of the `if` statements whose bodies form `path` (innermost first); None when
        a level is anything else (a loop, an `else` branch, a `with`)."""
        tests = []
        for block, _ in path:
            holder = self.structure.statement_of(self.structure.parent(block))
            if not isinstance(holder, cst.If) or holder.body is not block:
                return None
            tests.append(holder.test)
        return tests

    def _step_of_clipped_gradients(self, unit: TrainingUnit, node: cst.Call, clip: bool, following) -> StepCall:
        """In an iteration with several optimizers: the next step of the optimizer whose
        gradients the clip (or gradient helper) reads; refuse when that cannot be told."""
        line = self.structure.line(node)
        owner = optimizer_of_gradients(self.structure, unit, node, clip)
        if owner is None:
            # the steps between the clip and the next backward(): when they are all one
            # optimizer's (a GAN's D step after D's backward), the clip can only be for it
            where = self._where(node)
            next_backward = min((self._where(b.call) for b in unit.backwards if self._where(b.call) > where),
                                default=None)
            window = {st.receiver for st in following if next_backward is None or self._where(st.call) < next_backward}
            if len(window) == 1:
                owner = window.pop()
        if owner is None:
            raise Unconvertible(
                f"the gradient clipping at line {line} runs in an iteration with several optimizers "
                f"({', '.join(unit.optimizers)}) and ampify cannot tell whose gradients it clips: call "
                "scaler.unscale_(<optimizer>) before it by hand (scaled gradients would be clipped otherwise)",
                node,
            )
        steps = [st for st in following if st.receiver == owner]
        if not steps:
            raise Unconvertible(f"the gradient clipping at line {line} clips {owner}'s gradients after its step", node)
        return steps[0]

    def _where(self, node: cst.CSTNode) -> Tuple[int, int]:
        position = self.structure.position(node)
        return position.line, position.column

    def _check_reductions_before_readers(self, unit: TrainingUnit, reductions: List[cst.Call], needs) -> None:
        """A helper that reduces the gradients across ranks (`sync_grads(self.actor_network)`,
        `average_gradients(model)`) gets no `scaler.unscale_` before it: the step unscales after it,
        so every rank's inf check sees the reduced gradients (an inf on one rank spreads to all, and
        all skip the step). Unconvertible when something that needs true gradients (clipping, a
        read) comes before it in the same stretch: its unscale_ would run before the reduction."""
        for call in reductions:
            where = self._where(call)
            step = min((self._where(st.call) for st in unit.steps if self._where(st.call) > where), default=None)
            backward = max((self._where(b.call) for b in unit.backwards if self._where(b.call) < where), default=None)
            earlier = [node for at, kind, node in needs if (backward is None or at > backward) and at < where]
            if step is not None and earlier:
                raise Unconvertible(
                    f"{statements.called_name(call)}() (line {self.structure.line(call)}) reduces the gradients across "
                    f"ranks after line {self.structure.line(earlier[0])} needs them unscaled: GradScaler's inf check "
                    "(unscale_) would run before the reduction, and a rank that found no inf would step with the inf "
                    "another rank's gradients spread into its own; reduce before clipping, or convert by hand",
                    call, code="AMP215")

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
            called = statements.called_name(call)
            if called is None:
                continue
            lowered = called.lower()
            if lowered in names.NOT_GRADIENT_HELPERS:
                continue
            if not ("clip" in lowered or "grad" in lowered) and called not in self._functions_touching_grad() \
                    and not self.touches_grad_elsewhere(dotted_name(call.func) or ""):
                continue
            where = self._where(call)
            next_step = min((self._where(st.call) for st in unit.steps if self._where(st.call) > where), default=None)
            if next_step is None or any(where < self._where(b.call) < next_step for b in unit.backwards):
                continue  # a backward() follows before the step (a gradient penalty, say): not a gradient reader
            found.append(call)
        return found

    def _functions_touching_grad(self) -> Set[str]:
        """Names of this module's functions and methods whose body reads or changes `.grad`
        (network-slimming's `updateBN()`: `m.weight.grad.data.add_(args.s * torch.sign(m.weight.data))`,
        an L1 subgradient added to the true gradients): called between backward() and the step,
        they need the gradients unscaled, whatever they are called."""
        if self._grad_functions is None:
            # the analysis recorded every `.grad` access with the function holding it: no walk here
            self._grad_functions = {read.scope.name.value for read in self.structure.grad_reads
                                    if isinstance(read.scope, cst.FunctionDef)}
        return self._grad_functions

    def _grad_reads_before_step(self, unit: TrainingUnit):
        """`.grad` accesses after the iteration's first backward() and before its last step():
        with float16 loss scaling they would see scaled gradients."""
        if not unit.backwards or not unit.steps:
            return []
        first_backward = min(self._where(b.call) for b in unit.backwards)
        last_step = max(self._where(st.call) for st in unit.steps)
        return [r for r in unit.grad_reads if first_backward < self._where(r.node) < last_step
                and not self._scales_the_gradient(r.node)]

    def _scales_the_gradient(self, node: cst.CSTNode) -> bool:
        """Is this `.grad` access only an in-place scaling of that gradient (`p.grad.data *= 1. /
        weight`, `p.grad.mul_(c)`, `p.grad.div_(n)`, `p.grad.zero_()`)? Multiplying commutes with the
        loss scale, so the scaled gradient may be scaled as it is: reid-strong-baseline's center loss
        rescales its parameters' gradients between backward() and the steps of two optimizers."""
        s = self.structure
        target = node
        parent = s.parent(node)
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "data":
            target, parent = parent, s.parent(parent)
        if isinstance(parent, cst.AugAssign) and parent.target is target:
            return isinstance(parent.operator, (cst.MultiplyAssign, cst.DivideAssign)) and not _reads_grad(parent.value)
        if isinstance(parent, cst.Attribute) and parent.value is target and parent.attr.value in ("mul_", "div_", "zero_"):
            call = s.parent(parent)
            return (isinstance(call, cst.Call) and call.func is parent and isinstance(s.parent(call), cst.Expr)
                    and not any(_reads_grad(arg.value) for arg in call.args))
        return False

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


def check_no_gradients_unscaled_twice(s: TrainingStructure, unit: TrainingUnit, steps: Sequence[StepCall],
                                      zero_grads_of, apex: bool = False) -> None:
    """Two optimizers of one iteration over the same model (infoGAN's `info_optimizer` over the
    generator's and the discriminator's parameters): the first step unscales that model's
    gradients in place (a GradScaler unscales per optimizer, apex per scale_loss block); when the
    second optimizer's backward adds to them without a zero_grad in between, its unscale divides
    the first part again, and the second step loses it (the fp32 step sums both). Refused with
    the reason; `zero_grads_of(unit, optimizer)` are the calls that zero an optimizer's gradients.
    apex (`apex=True`) adds the gradients a scale_loss block finds to the ones it unscales, but
    takes them for unscaled: those a backward left there for a model that block's optimizers do
    not train are not (infoGAN's generator loss, backpropagated through the discriminator)."""
    where = lambda node: (s.line(node), s.position(node).column)  # noqa: E731
    ordered = sorted(steps, key=lambda st: where(st.call))
    for index, first in enumerate(ordered):
        first_models = set(unit_models_of(s, unit, first.receiver)) if first.receiver else set()
        for later in ordered[index + 1:]:
            if not later.receiver or later.receiver == first.receiver:
                continue
            shared = first_models & set(unit_models_of(s, unit, later.receiver))
            if not shared:
                continue
            start, end = where(first.call), where(later.call)
            backwards = [where(b.call) for b in unit.backwards if start < where(b.call) < end]
            zeroed = [where(call) for receiver in (later.receiver, first.receiver)
                      for call in zero_grads_of(unit, receiver) if start < where(call) < end]
            if backwards and any(z < max(backwards) for z in zeroed):
                continue
            models = ", ".join(sorted(shared))
            what = ("amp.scale_loss blocks unscale only the gradients of the optimizers they name, and the second "
                    "step would take what other backward passes left there for unscaled" if apex else
                    "the first step unscales them in place, and the second would unscale them again, losing what "
                    "was there before its backward")
            raise Unconvertible(
                f"{first.receiver} (line {s.line(first.call)}) and {later.receiver} (line {s.line(later.call)}) both "
                f"train {models}, whose gradients are not zeroed between the two steps: {what}; zero "
                f"{later.receiver}'s gradients before its backward if that is meant, or convert by hand",
                later.call)


def _loops_over_the_optimizers(s: TrainingStructure, loop: cst.CSTNode, steps: Sequence[StepCall]) -> bool:
    """`for optimizer in optimizers:` whose target is the receiver of every step inside it and whose
    body runs no backward(): one step per optimizer, which GradScaler allows between two update()
    calls (CSAILVision's semantic-segmentation: `for optimizer in optimizers: optimizer.step()`)."""
    if not (isinstance(loop, cst.For) and isinstance(loop.target, cst.Name)):
        return False
    inside = [step for step in steps if s.contains(loop, step.call)]
    if not inside or any(step.receiver != loop.target.value for step in inside):
        return False
    return not any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"
                   for call in statements.calls_within(loop.body))


def _reads_grad(node: cst.CSTNode) -> bool:
    """Does the expression access a `.grad`?"""
    return any(isinstance(n, cst.Attribute) and n.attr.value == "grad" for n in statements.nodes_of_type(node, cst.Attribute))
