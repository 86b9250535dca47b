"""Take NVIDIA apex amp out of a module, leaving the float32 training code it was added to.

`apex.amp` was removed from apex after release 25.05, so apex amp scripts no longer run on a
current apex. The migration to `torch.amp` is done in two steps (migrate/apex_migration.py):
this module removes apex amp exactly, and the native conversion then adds autocast and a
GradScaler to the result with all its own checks. What apex did maps as follows (apex's
sources before the removal):

    model, opt = amp.initialize(model, opt, opt_level="O1")   removed (`a, b = m, o` when renamed)
    with amp.scale_loss(loss, opt) as scaled:                  loss.backward()
        scaled.backward()
    amp.master_params(opt)                                     (p for group in opt.param_groups
                                                                  for p in group["params"])
    {"amp": amp.state_dict(), ...}                             entry removed (the native conversion
    amp.load_state_dict(ckpt["amp"])                           saves and loads the scaler's state)
    from apex import amp                                       removed

O0 (float32 through apex) becomes autocast and a GradScaler with `enabled=False`: still float32, without
apex. A static `loss_scale=N` becomes the GradScaler's `init_scale=N` with a growth interval too long to
ever grow (migrate/apex_migration.py). Anything else stops the migration with the reason
(nothing is half removed): an opt_level chosen at run time or O3 (pure float16, not AMP), O2's options,
an `amp.initialize` that runs only in a branch, and every other apex.amp API. `delay_unscale` (gradient
accumulation) goes with `amp.scale_loss`: a GradScaler keeps the gradients scaled until its step anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name

APEX_AMP = "apex.amp"
#: opt_levels with a torch.amp equivalent (O2: O1's autocast, the model kept float32)
MIGRATABLE_OPT_LEVELS = ("O1", "O2")
#: amp.initialize keywords that change nothing torch.amp must reproduce
_IGNORED_INITIALIZE_KEYWORDS = {"opt_level", "num_losses", "verbosity", "enabled"}


@dataclass
class ApexEdit:
    """One node replaced (`replacement`) or removed (None), with what the finding says."""

    node: cst.CSTNode
    replacement: Optional[cst.CSTNode]
    what: str


@dataclass
class ApexRemoval:
    edits: List[ApexEdit] = field(default_factory=list)
    #: (node, reason) of a use that stops the migration
    obstacles: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    #: opt_level of amp.initialize ("O1" when not given)
    opt_level: str = "O1"
    #: the names of the models amp.initialize took
    models: Set[str] = field(default_factory=set)
    #: `with amp.disable_casts():` blocks stand as AUTOCAST_OFF() calls, to become autocast(enabled=False)
    casts_disabled: bool = False
    #: the flag apex amp is switched by (`if args.fp16: amp.initialize(...)`), None when always on
    flag: Optional[str] = None
    #: (scale_loss call, flag) of every `if flag: scale_loss ... else: backward` made one backward
    guard_flags: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    #: (`args.opt_level`, its argparse default, 0) when opt_level is chosen at run time with a literal default
    runtime_opt_level: Optional[Tuple[str, str, int]] = None
    #: `loss_scale=128.0` of amp.initialize, as written (None: dynamic)
    static_loss_scale: Optional[str] = None
    #: the functions (`train`, `<module>`) the flag was read in: where torch.amp may read it
    flag_scopes: Set[str] = field(default_factory=set)
    #: ids of every node on the way to an edit
    paths: Set[int] = field(default_factory=set)
    initialized: bool = False


def uses_apex_amp(imports: ImportMap) -> bool:
    return any(q == APEX_AMP or q.startswith(APEX_AMP + ".") or q == "apex" for q in imports.aliases.values())


class _Finder(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.stack: List[cst.CSTNode] = []
        self.references: List[Tuple[cst.CSTNode, str, Tuple[cst.CSTNode, ...]]] = []
        self.import_nodes: List[Tuple[cst.CSTNode, Tuple[cst.CSTNode, ...]]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        kind = type(node)
        if kind is cst.Import or kind is cst.ImportFrom:
            self.import_nodes.append((node, tuple(reversed(self.stack))))
            return False
        if kind is cst.Name or kind is cst.Attribute:
            parent = self.stack[-1] if self.stack else None
            if not (isinstance(parent, cst.Attribute) and (parent.value is node or parent.attr is node)):
                qualified = self.imports.resolve(node)
                if qualified is not None and (qualified == APEX_AMP or qualified.startswith(APEX_AMP + ".")):
                    self.references.append((node, qualified, tuple(reversed(self.stack))))
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.stack and self.stack[-1] is original_node:
            self.stack.pop()


#: the start of the obstacle of a file scaling losses with no amp.initialize of its own
NO_INITIALIZE = "no amp.initialize in this file"


def plan_apex_removal(module: cst.Module, imports: ImportMap) -> ApexRemoval:
    finder = _Finder(imports)
    walk(module, finder)
    plan = ApexRemoval()
    if not finder.references:
        return plan  # imported, never used: an fp32 file (the native conversion decides it)
    for node, qualified, ancestors in finder.references:
        member = qualified[len(APEX_AMP) + 1:]
        planner = _MEMBER_PLANNERS.get(member)
        if planner is None or not ancestors or not (isinstance(ancestors[0], cst.Call) and ancestors[0].func is node):
            what = f"amp.{member}" if member else "the apex amp module used as a value"
            if member in _CAST_DECORATORS:
                plan.obstacles.append((node, f"{what}: torch.amp.custom_fwd(cast_inputs=...) is its equivalent only "
                                             "on the forward of a torch.autograd.Function; for a plain function cast "
                                             "the inputs and run it under torch.autocast(..., enabled=False) by hand"))
                continue
            plan.obstacles.append((node, f"{what} has no torch.amp equivalent that ampify writes: migrate it by hand"))
            continue
        edit = planner(plan, ancestors[0], ancestors[1:])
        if edit is not None:
            plan.edits.append(edit)
            plan.paths.update(id(a) for a in ancestors)
            plan.paths.add(id(edit.node))
    for node, ancestors in finder.import_nodes:
        edit = _import_edit(plan, node, ancestors)
        if edit is not None:
            plan.edits.append(edit)
            plan.paths.update(id(a) for a in ancestors)
            plan.paths.add(id(edit.node))
    if not plan.initialized and not plan.obstacles and plan.edits:
        plan.obstacles.append((module, f"{NO_INITIALIZE} (it runs in another module): migrate that one"))
    for node, flag in plan.guard_flags:
        if flag != plan.flag:
            plan.obstacles.append((node, f"amp.scale_loss switched by {flag}, amp.initialize by "
                                         f"{plan.flag or 'nothing'}: migrate by hand"))
    if plan.flag is not None and not plan.obstacles:
        _check_flag_uses(module, plan)
    if plan.opt_level == "O2" and plan.models and not plan.obstacles:
        _plan_o2_half_removal(module, plan)
    return plan


def _plan_o2_half_removal(module: cst.Module, plan: ApexRemoval) -> None:
    """O2 migrates with O1's semantics: the model stays float32 (GradScaler refuses float16
    gradients), so `.half()` on a model amp.initialize took, or on an input passed straight to one
    (apex O2 cast those itself), goes. Any other `.half()` stays, and the native conversion refuses it."""

    class _Halves(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.stack: List[cst.CSTNode] = []

        def on_visit(self, node: cst.CSTNode) -> bool:
            if (isinstance(node, cst.Call) and not node.args and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "half" and self._of_a_model(node)):
                plan.edits.append(ApexEdit(node, node.func.value, "`.half()` removed: apex O2 made the model and "
                                                                  "its inputs float16; with O1's semantics they stay "
                                                                  "float32 and autocast picks each op's precision "
                                                                  "(GradScaler refuses float16 gradients)"))
                plan.paths.update(id(a) for a in self.stack)
                plan.paths.add(id(node))
            self.stack.append(node)
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            self.stack.pop()

        def _of_a_model(self, call: cst.Call) -> bool:
            root = call.func.value
            while isinstance(root, (cst.Call, cst.Attribute)):
                root = root.func if isinstance(root, cst.Call) else root.value
            if isinstance(root, cst.Name) and root.value in plan.models:
                return True  # model.half(), model.cuda().half()
            for ancestor in reversed(self.stack):  # model = Net().cuda().half(); model(x.cuda().half())
                if isinstance(ancestor, cst.Assign):
                    return any(isinstance(t.target, cst.Name) and t.target.value in plan.models for t in ancestor.targets)
                if isinstance(ancestor, cst.Call) and isinstance(ancestor.func, cst.Name):
                    return ancestor.func.value in plan.models
                if isinstance(ancestor, (cst.BaseStatement, cst.BaseSmallStatement)):
                    return False
            return False

    walk(module, _Halves())


def _check_flag_uses(module: cst.Module, plan: ApexRemoval) -> None:
    """The flag may switch nothing but apex amp: every use of it must go with the apex edits (the
    native conversion then switches autocast and the GradScaler by it). `plan.flag_scopes` gets the
    functions it was read in (where torch.amp may read it too)."""
    removed = {id(edit.node) for edit in plan.edits}

    class _Uses(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.stack: List[cst.CSTNode] = []

        def on_visit(self, node: cst.CSTNode) -> bool:
            if id(node) in removed:
                if isinstance(node, cst.If):
                    plan.flag_scopes.add(_scope(self.stack))
                return False
            if isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) == plan.flag:
                if not _only_reported(self.stack):
                    plan.obstacles.append((node, f"{plan.flag} also switches code other than apex amp: migrate by hand"))
                return False
            self.stack.append(node)
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            if self.stack and self.stack[-1] is original_node:
                self.stack.pop()

    walk(module, _Uses())


#: the last name of calls that only report what they are given (the flag printed or logged)
_REPORTING_CALLS = {"print", "info", "warning", "warn", "debug", "error", "log", "write", "add_text"}


def _only_reported(stack) -> bool:
    """Is the flag read inside an f-string or the arguments of a print/logging call
    (`logger.warning(f"16-bits training: {args.amp}")`, kekmodel's FixMatch)? After the migration
    the flag still switches mixed precision (torch.amp's enabled=), so what it reports stays true."""
    for node in reversed(stack):
        if isinstance(node, (cst.FormattedString, cst.FormattedStringExpression)):
            return True
        if isinstance(node, cst.Call):
            called = dotted_name(node.func) or ""
            return called.rsplit(".", 1)[-1] in _REPORTING_CALLS
        if isinstance(node, cst.BaseStatement) or isinstance(node, cst.BaseSmallStatement):
            return False
    return False


def _scope(stack) -> str:
    """`train` / `Trainer.fit` / `<module>`: the functions and classes around a node."""
    names = [node.name.value for node in stack if isinstance(node, (cst.FunctionDef, cst.ClassDef))]
    return ".".join(names) or "<module>"


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    return next((arg for arg in call.args if arg.keyword is not None and arg.keyword.value == name), None)


def _statement_of(ancestors) -> Tuple[Optional[cst.SimpleStatementLine], Tuple[cst.CSTNode, ...]]:
    for index, ancestor in enumerate(ancestors):
        if isinstance(ancestor, cst.SimpleStatementLine):
            return ancestor, ancestors[index + 1:]
    return None, ()


def _in_a_branch(above_statement) -> Optional[str]:
    """"an if" when the statement runs only in some runs (if/try/loop/with), else None."""
    for ancestor in above_statement:
        if isinstance(ancestor, (cst.FunctionDef, cst.Module, cst.ClassDef)):
            return None
        if isinstance(ancestor, (cst.If, cst.Else)):
            return "an if"
        if isinstance(ancestor, (cst.Try, cst.ExceptHandler, cst.Finally)):
            return "a try"
        if isinstance(ancestor, (cst.For, cst.While)):
            return "a loop"
    return None


def _plan_initialize(plan: ApexRemoval, call: cst.Call, ancestors) -> Optional[ApexEdit]:
    if plan.initialized:
        plan.obstacles.append((call, "a second amp.initialize: migrate by hand"))
        return None
    statement, above = _statement_of(ancestors)
    assign = statement.body[0] if statement is not None and len(statement.body) == 1 else None
    if not isinstance(assign, cst.Assign) or assign.value is not call or len(assign.targets) != 1:
        plan.obstacles.append((call, "amp.initialize is not a plain `model, optimizer = amp.initialize(...)` statement"))
        return None
    removed: cst.CSTNode = statement
    branch = _in_a_branch(above)
    if branch is not None:
        flagged = _flag_guard(above, statement)
        if flagged is None:
            plan.obstacles.append((call, f"amp.initialize runs only in {branch} that is not a plain `if <flag>:` "
                                         "holding it alone: migrate by hand"))
            return None
        removed, flag = flagged
        if plan.flag not in (None, flag):
            plan.obstacles.append((call, f"apex amp switched by two flags ({plan.flag}, {flag}): migrate by hand"))
            return None
        plan.flag = flag
    level = _keyword(call, "opt_level")
    opt_level = "O1"
    static_loss_scale: Optional[str] = None
    if level is not None and not isinstance(level.value, cst.SimpleString):
        default = _argparse_default(module_of(ancestors), level.value)
        if default is not None and default[0] in MIGRATABLE_OPT_LEVELS:
            plan.runtime_opt_level = (_code(level.value), default[0], default[1])
            level = None
            opt_level = default[0]
    if level is not None:
        if not isinstance(level.value, cst.SimpleString):
            plan.obstacles.append((call, f"opt_level={_code(level.value)} is chosen at run time: torch.amp has one mixed "
                                         "precision mode (apex's O1); migrate with the level your runs use"))
            return None
        opt_level = level.value.evaluated_value
    if opt_level not in (*MIGRATABLE_OPT_LEVELS, "O0"):
        reason = ("O3 is pure float16 training, not mixed precision" if opt_level == "O3"
                  else f"unknown opt_level {opt_level!r}")
        plan.obstacles.append((call, f"{reason}: no torch.amp migration"))
        return None
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in _IGNORED_INITIALIZE_KEYWORDS:
            continue
        name = arg.keyword.value
        if name == "loss_scale" and isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "dynamic":
            continue
        if name == "loss_scale" and isinstance(arg.value, (cst.Integer, cst.Float)):
            static_loss_scale = arg.value.value  # GradScaler(init_scale=N, growth_interval=<very large>)
            continue
        plan.obstacles.append((call, f"amp.initialize({name}=...) has no exact torch.amp equivalent: migrate by hand"))
        return None
    enabled = _keyword(call, "enabled")
    if enabled is not None:
        plan.obstacles.append((call, "amp.initialize(enabled=...) switches mixed precision by a flag: migrate by hand"))
        return None
    positional = [arg for arg in call.args if arg.keyword is None]
    if not positional or any(arg.star for arg in positional):
        plan.obstacles.append((call, "amp.initialize without its models and optimizers as arguments"))
        return None
    plan.initialized = True
    plan.opt_level = opt_level
    plan.static_loss_scale = static_loss_scale
    first = positional[0].value
    plan.models = {element.value.value for element in first.elements if isinstance(element.value, cst.Name)} \
        if isinstance(first, (cst.List, cst.Tuple)) else ({first.value} if isinstance(first, cst.Name) else set())
    target = assign.targets[0].target
    values = [arg.value for arg in positional]
    value_code = ", ".join(_code(v) for v in values) if len(values) > 1 else _code(values[0])
    target_code = _code(target)
    if removed is not statement:
        if _normalised(target_code) != _normalised(value_code):
            plan.obstacles.append((call, "amp.initialize behind a flag renames the models: migrate by hand"))
            return None
        return ApexEdit(removed, None, f"`if {plan.flag}: amp.initialize(...)` removed; autocast and the GradScaler "
                                       f"take its place, switched by the same flag (enabled={plan.flag})")
    if _normalised(target_code) == _normalised(value_code):
        return ApexEdit(statement, None, "amp.initialize removed (autocast and a GradScaler take its place)")
    new = cst.parse_statement(f"{target_code} = {value_code}\n")
    return ApexEdit(statement, new.with_changes(leading_lines=statement.leading_lines),
                    "amp.initialize replaced by a plain assignment (autocast and a GradScaler take its place)")


def module_of(ancestors) -> Optional[cst.Module]:
    return next((node for node in ancestors if isinstance(node, cst.Module)), None)


def _argparse_default(module: Optional[cst.Module], value: cst.BaseExpression) -> Optional[Tuple[str, int]]:
    """("O1", line) when `value` is `args.fp16_opt_level` and this module declares that option with
    `add_argument("--fp16_opt_level", ..., default="O1")`; else None."""
    dotted = dotted_name(value)
    if module is None or dotted is None or "." not in dotted:
        return None
    attribute = dotted.rsplit(".", 1)[1]
    found: List[Tuple[str, int]] = []

    class _Options(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if not (isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument"):
                return
            flags = [arg.value.evaluated_value for arg in node.args
                     if arg.keyword is None and isinstance(arg.value, cst.SimpleString)]
            if not any(isinstance(f, str) and f.lstrip("-").replace("-", "_") == attribute for f in flags):
                return
            default = _keyword(node, "default")
            if default is not None and isinstance(default.value, cst.SimpleString):
                found.append((default.value.evaluated_value, 0))

    walk(module, _Options())
    return found[0] if len(found) == 1 else None


def _flag_guard(above, statement) -> Optional[Tuple[cst.If, str]]:
    """(the `if <flag>:` around `statement`, the flag) when the statement runs only under a plain
    flag (`if args.fp16:`, `if use_amp:`) that holds nothing else but apex's own import, has no
    else, and itself runs unconditionally; else None."""
    block = above[0] if above else None
    guard = above[1] if len(above) > 1 else None
    if not (isinstance(block, cst.IndentedBlock) and isinstance(guard, cst.If) and guard.body is block
            and guard.orelse is None):
        return None
    flag = dotted_name(guard.test)
    if flag is None or _in_a_branch(above[2:]) is not None:
        return None
    for other in block.body:
        if other is statement or _imports_apex(other):
            continue
        if (isinstance(other, cst.Try) and len(other.body.body) == 1 and _imports_apex(other.body.body[0])
                and not other.orelse and not other.finalbody and _handlers_only_report(other)):
            continue  # `try: from apex import amp / except ImportError: raise ...`
        return None
    return guard, flag


def _imports_apex(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.ImportFrom) and statement.body[0].module is not None
            and dotted_name(statement.body[0].module) == "apex")


def _normalised(code: str) -> str:
    return "".join(code.split()).strip("()").replace("[", "").replace("]", "").replace("(", "").replace(")", "")


def _plan_scale_loss(plan: ApexRemoval, call: cst.Call, ancestors) -> Optional[ApexEdit]:
    # delay_unscale (gradient accumulation: keep the gradients scaled until the step) is what a
    # GradScaler always does, so it goes with the call; the others are apex internals
    for name in ("delay_overflow_check", "model"):
        if _keyword(call, name) is not None:
            plan.obstacles.append((call, f"amp.scale_loss({name}=...) (apex internals): migrate by hand"))
            return None
    item = ancestors[0] if ancestors else None
    with_node = ancestors[1] if len(ancestors) > 1 else None
    loss = next((arg.value for arg in call.args if arg.keyword is None), None)
    if (not isinstance(item, cst.WithItem) or not isinstance(with_node, cst.With) or len(with_node.items) != 1
            or item.asname is None or not isinstance(item.asname.name, cst.Name) or loss is None):
        plan.obstacles.append((call, "amp.scale_loss is not `with amp.scale_loss(loss, optimizer) as scaled:`"))
        return None
    scaled = item.asname.name.value
    body = with_node.body.body
    statement = body[0] if len(body) == 1 else None
    small = (statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
             else statement if isinstance(statement, cst.BaseSmallStatement) else None)
    backward = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(backward, cst.Call) and isinstance(backward.func, cst.Attribute)
            and backward.func.attr.value == "backward" and dotted_name(backward.func.value) == scaled):
        plan.obstacles.append((call, f"the body of `with amp.scale_loss(...) as {scaled}:` is more than "
                                     f"`{scaled}.backward()`: migrate by hand"))
        return None
    loss_code = _code(loss)
    if not isinstance(loss, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
        loss_code = f"({loss_code})"
    new_call = backward.with_changes(func=backward.func.with_changes(value=cst.parse_expression(loss_code)))
    new = cst.SimpleStatementLine(body=[cst.Expr(new_call)], leading_lines=with_node.leading_lines)
    switched = _switched_backward(with_node, ancestors[2:], new_call)
    if switched is not None:
        guard, flag = switched
        plan.guard_flags.append((call, flag))
        return ApexEdit(guard, new.with_changes(leading_lines=guard.leading_lines),
                        f"`if {flag}: amp.scale_loss ... else: loss.backward()` made one backward pass, which the "
                        "GradScaler scales when the flag is on")
    if _keyword(call, "delay_unscale") is not None:
        return ApexEdit(with_node, new, "amp.scale_loss(..., delay_unscale=...) removed: the GradScaler scales the loss "
                                        "and keeps the accumulated gradients scaled until scaler.step")
    return ApexEdit(with_node, new, "amp.scale_loss removed: the loss is scaled by the GradScaler")


def _switched_backward(with_node: cst.With, above, new_call: cst.Call) -> Optional[Tuple[cst.If, str]]:
    """`if flag: with amp.scale_loss(loss, opt) as s: s.backward()` / `else: loss.backward()`: (the if,
    the flag) when the else branch is exactly the same backward pass unscaled."""
    block = above[0] if above else None
    guard = above[1] if len(above) > 1 else None
    if not (isinstance(block, cst.IndentedBlock) and isinstance(guard, cst.If) and guard.body is block
            and len(block.body) == 1 and block.body[0] is with_node and isinstance(guard.orelse, cst.Else)):
        return None
    flag = dotted_name(guard.test)
    other = guard.orelse.body.body if isinstance(guard.orelse.body, cst.IndentedBlock) else []
    if flag is None or len(other) != 1 or not isinstance(other[0], cst.SimpleStatementLine) or len(other[0].body) != 1:
        return None
    small = other[0].body[0]
    if not (isinstance(small, cst.Expr) and _normalised(_code(small.value)) == _normalised(_code(new_call))):
        return None
    return guard, flag


def _plan_master_params(plan: ApexRemoval, call: cst.Call, ancestors) -> Optional[ApexEdit]:
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    if len(call.args) != 1 or len(positional) != 1:
        plan.obstacles.append((call, "amp.master_params with other than one optimizer: migrate by hand"))
        return None
    switched = _switched_clipping(call, ancestors)
    if switched is not None:
        guard, flag, kept = switched
        plan.guard_flags.append((call, flag))
        return ApexEdit(guard, kept.with_changes(leading_lines=guard.leading_lines),
                        f"`if {flag}: clip(amp.master_params(...)) else: clip(...)` made the else branch (at O1 apex's "
                        "master parameters are the model's; the GradScaler unscales them before clipping)")
    optimizer = _code(positional[0].value)
    new = cst.parse_expression(f'(p for group in {optimizer}.param_groups for p in group["params"])')
    return ApexEdit(call, new, "amp.master_params(...) replaced by the optimizer's own parameters (the same "
                               "tensors at O1; the GradScaler unscales them before clipping)")


def _switched_clipping(call: cst.Call, ancestors):
    """`if flag: clip_grad_norm_(amp.master_params(opt), m)` / `else: clip_grad_norm_(model.parameters(), m)`:
    (the if, the flag, the else branch's statement) when both branches are one statement that differ
    only in that argument."""
    clip = ancestors[1] if len(ancestors) > 1 and isinstance(ancestors[0], cst.Arg) else None
    if not isinstance(clip, cst.Call):
        return None
    statement, above = _statement_of(ancestors)
    block = above[0] if above else None
    guard = above[1] if len(above) > 1 else None
    if not (statement is not None and isinstance(block, cst.IndentedBlock) and isinstance(guard, cst.If)
            and guard.body is block and len(block.body) == 1 and isinstance(guard.orelse, cst.Else)
            and isinstance(guard.orelse.body, cst.IndentedBlock) and len(guard.orelse.body.body) == 1):
        return None
    flag = dotted_name(guard.test)
    other = guard.orelse.body.body[0]
    if flag is None or not isinstance(other, cst.SimpleStatementLine):
        return None
    marker = "__ampify_master_params__"
    mine = _code(statement).replace(_code(call), marker)
    theirs = _code(other)
    prefix, _, suffix = mine.partition(marker)
    if not (marker in mine and theirs.startswith(prefix) and theirs.endswith(suffix)
            and len(theirs) > len(prefix) + len(suffix)):
        return None
    return guard, flag, other


def _plan_state_dict(plan: ApexRemoval, call: cst.Call, ancestors) -> Optional[ApexEdit]:
    parent = ancestors[0] if ancestors else None
    if isinstance(parent, cst.DictElement) and parent.value is call:
        return ApexEdit(parent, None, "apex's state removed from the checkpoint (the scaler's is saved instead)")
    statement, _ = _statement_of(ancestors)
    small = statement.body[0] if statement is not None and len(statement.body) == 1 else None
    if isinstance(small, cst.Assign) and small.value is call and isinstance(small.targets[0].target, cst.Subscript):
        return ApexEdit(statement, None, "apex's state removed from the checkpoint (the scaler's is saved instead)")
    plan.obstacles.append((call, "amp.state_dict() used other than as a checkpoint entry: migrate by hand"))
    return None


def _plan_load_state_dict(plan: ApexRemoval, call: cst.Call, ancestors) -> Optional[ApexEdit]:
    statement, above = _statement_of(ancestors)
    small = statement.body[0] if statement is not None and len(statement.body) == 1 else None
    if not (isinstance(small, cst.Expr) and small.value is call):
        plan.obstacles.append((call, "amp.load_state_dict(...) used as a value: migrate by hand"))
        return None
    # `if "amp" in checkpoint: amp.load_state_dict(...)` goes whole when it guards nothing else
    block = above[0] if above else None
    guard = above[1] if len(above) > 1 else None
    if (isinstance(block, cst.IndentedBlock) and len(block.body) == 1 and isinstance(guard, cst.If)
            and guard.orelse is None and not _has_call(guard.test)):
        return ApexEdit(guard, None, "apex's state no longer restored (an old checkpoint's 'amp' entry is ignored; "
                                     "the scaler's is restored instead)")
    return ApexEdit(statement, None, "apex's state no longer restored (an old checkpoint's 'amp' entry is ignored; "
                                     "the scaler's is restored instead)")


class _CallFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def visit_Call(self, node: cst.Call) -> bool:
        self.found = True
        return False


def _has_call(node: cst.CSTNode) -> bool:
    finder = _CallFinder()
    walk(node, finder)
    return finder.found


#: apex's cast decorators and registrations (amp/amp.py): their torch.amp counterpart, custom_fwd,
#: applies to autograd.Function forwards only
_CAST_DECORATORS = {"half_function", "float_function", "promote_function", "bfloat16_function",
                    "register_half_function", "register_float_function", "register_promote_function",
                    "register_bfloat16_function"}

#: stands for `torch.autocast(device_type=<the conversion's device>, enabled=False)` until the native
#: conversion has chosen the device (migrate/apex_migration.py puts the real call in)
AUTOCAST_OFF = "_ampify_autocast_off_"


def _plan_disable_casts(plan: ApexRemoval, call: cst.Call, ancestors) -> Optional[ApexEdit]:
    item = ancestors[0] if ancestors else None
    if call.args or not isinstance(item, cst.WithItem) or item.asname is not None:
        plan.obstacles.append((call, "amp.disable_casts() other than as `with amp.disable_casts():`: migrate by hand"))
        return None
    plan.casts_disabled = True
    return ApexEdit(call, cst.Call(cst.Name(AUTOCAST_OFF)),
                    "`with amp.disable_casts():` -> `with torch.autocast(..., enabled=False):` (no casting inside: ops run "
                                     "in their inputs' dtypes, as under apex)")


_MEMBER_PLANNERS = {
    "disable_casts": _plan_disable_casts,
    "initialize": _plan_initialize,
    "scale_loss": _plan_scale_loss,
    "master_params": _plan_master_params,
    "state_dict": _plan_state_dict,
    "load_state_dict": _plan_load_state_dict,
}


def _import_edit(plan: ApexRemoval, node: cst.CSTNode, ancestors) -> Optional[ApexEdit]:
    statement = ancestors[0] if ancestors and isinstance(ancestors[0], cst.SimpleStatementLine) else None
    if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
        module = dotted_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            if module in ("apex", APEX_AMP):
                plan.obstacles.append((node, f"`from {module} import *`: name the imports, then run ampify again"))
            return None
        if module == APEX_AMP or (module or "").startswith(APEX_AMP + "."):
            plan.obstacles.append((node, f"`from {module} import ...` of apex amp internals: migrate by hand"))
            return None
        if module != "apex":
            return None
        kept = [alias for alias in node.names if dotted_name(alias.name) != "amp"]
        if len(kept) == len(node.names):
            return None
        if kept:
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return ApexEdit(node, node.with_changes(names=kept), "`amp` no longer imported from apex")
        return _removed_import(plan, statement, ancestors[1:], "from apex import amp")
    if isinstance(node, cst.Import):
        names = [dotted_name(alias.name) for alias in node.names]
        if APEX_AMP in names:
            plan.obstacles.append((node, "`import apex.amp`: migrate by hand"))
        return None
    return None


def _removed_import(plan: ApexRemoval, statement, above, what: str) -> Optional[ApexEdit]:
    if statement is None or len(statement.body) != 1:
        plan.obstacles.append((statement, f"`{what}` shares its line with other statements: migrate by hand"))
        return None
    block = above[0] if above else None
    guard = above[1] if len(above) > 1 else None
    if isinstance(guard, cst.Try) and isinstance(block, cst.IndentedBlock) and guard.body is block:
        if len(block.body) == 1 and not guard.orelse and not guard.finalbody and _handlers_only_report(guard):
            # `try: from apex import amp / except ImportError: raise ImportError("install apex")` goes whole
            return ApexEdit(guard, None, f"`{what}` and its ImportError guard removed")
        plan.obstacles.append((statement, f"`{what}` inside a try that does more: migrate by hand"))
        return None
    if (isinstance(guard, cst.If) and isinstance(block, cst.IndentedBlock) and guard.body is block
            and len(block.body) == 1 and guard.orelse is None and plan.flag is not None
            and dotted_name(guard.test) == plan.flag):
        # `if args.amp: from apex import amp` in the training function (kekmodel's FixMatch): the
        # flag switched the import only, and goes with it
        return ApexEdit(guard, None, f"`if {plan.flag}: {what}` removed")
    return ApexEdit(statement, None, f"`{what}` removed")


def _handlers_only_report(guard: cst.Try) -> bool:
    """Every handler only raises, prints, warns, logs or binds `amp` (to None): nothing the rest of the file reads."""
    for handler in guard.handlers:
        for statement in handler.body.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                return False
            for small in statement.body:
                if isinstance(small, (cst.Raise, cst.Pass)):
                    continue
                if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    continue
                if (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and isinstance(small.targets[0].target, cst.Name) and small.targets[0].target.value == "amp"):
                    continue
                return False
    return True


class ApexRemover(cst.CSTTransformer):
    """Applies an ApexRemoval: nodes replaced or removed by identity; blocks left empty get `pass`."""

    def __init__(self, plan: ApexRemoval) -> None:
        super().__init__()
        self.edits: Dict[int, ApexEdit] = {id(edit.node): edit for edit in plan.edits}
        self.paths = plan.paths

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self.paths and super().on_visit(node)

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.Dict:
        # `{"optimizer": ..., "amp": amp.state_dict()}`: the entry left last keeps no comma
        # unless the dict ended with one
        old, new = original_node.elements, updated_node.elements
        if new and len(new) < len(old) and not isinstance(old[-1].comma, cst.Comma):
            return updated_node.with_changes(elements=[*new[:-1], new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
        return updated_node

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        edit = self.edits.get(id(original_node))
        if edit is None:
            if isinstance(updated_node, (cst.IndentedBlock, cst.Module)) and not updated_node.body:
                return updated_node.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
            return updated_node
        if edit.replacement is None:
            return cst.RemovalSentinel.REMOVE
        return edit.replacement
