"""apex: build the optimizer above a DataParallel / DistributedDataParallel wrap that comes first.

`amp.initialize` rejects wrapped models, and the usual distributed layout (the DDP tutorial,
DETR, DeiT, MoCo) wraps the model before the optimizer exists. The parameters of `DDP(model)`
are those of `model`, in the same order, so the optimizer can be built from `model` before the
wrap, as NVIDIA's own apex ImageNet example does:

    model = Net().to(rank)                          model = Net().to(rank)
    ddp_model = DDP(model, device_ids=[rank])       optimizer = optim.SGD(model.parameters(), lr=0.01)
    optimizer = optim.SGD(ddp_model.parameters(),   model, optimizer = amp.initialize(model, optimizer, ...)
                          lr=0.01)                  ddp_model = DDP(model, device_ids=[rank])

The optimizer's construction moves right above the first statement that wraps (an `if/elif` for
distributed, DataParallel and single-GPU runs counts as one statement), together with the
statements between that it reads (DETR's `param_dicts`); amp.initialize follows it; everything
else stays where it was. Only when nothing between depends on the order:

- the moved statements are plain assignments, and nothing left between reads what they bind;
- what they read of the wrap is its parameters (`ddp_model.parameters()` becomes
  `model.parameters()`), or an alias that is the same module either way (`model_without_ddp`,
  bound to `model` before the wrap and to `model.module` after it);
- no device move of the model happens at or after the wrap (apex needs the model on the GPU
  when amp.initialize runs, and the move would then come after it).

Anything else raises Unconvertible with the reason; the caller then refuses the training unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.apex_setup import ApexSetup, index_of
from ampify.transforms.torch.statements import assigned_names, calls_within, code_of
from ampify.transforms.torch.training_loop import CallSite, TrainingStructure, Unconvertible

_DEVICE_METHODS = ("cuda", "to", "half")


@dataclass
class Hoist:
    """The planned move: `code` (the construction statements, then amp.initialize) goes before
    `before`; `moved` leave their places."""

    before: cst.CSTNode
    moved: List[cst.CSTNode]
    code: List[str]
    #: the models amp.initialize gets (a wrap's name replaced by the model it wraps)
    models: List[str]
    wrapped: str
    wraps: List[CallSite]


def plan_hoist(structure: TrainingStructure, setup: ApexSetup) -> Optional[Hoist]:
    """The hoist for `setup`, None when no wrap of its block comes before its optimizers."""
    return _Planner(structure, setup).plan()


class _Planner:
    def __init__(self, structure: TrainingStructure, setup: ApexSetup) -> None:
        self.s = structure
        self.setup = setup

    def plan(self) -> Optional[Hoist]:
        constructions = self.setup.construction_statements
        block = self.s.block_of(constructions[0])
        if block is None or any(self.s.block_of(c) is not block for c in constructions):
            return None
        body = list(block.body)
        first = min(index_of(body, c) for c in constructions)
        last = max(index_of(body, c) for c in constructions)
        holders = []  # statements of this block before the optimizers that hold a wrap
        wraps: List[CallSite] = []
        for wrap in self.s.parallel_wraps:
            holder = next((st for b, st in self.s.block_path(wrap.statement) if b is block), None)
            if holder is not None and index_of(body, holder) < first:
                wraps.append(wrap)
                if holder not in holders:
                    holders.append(holder)
        if not holders:
            return None
        start = min(index_of(body, h) for h in holders)
        every_wrapped = {dotted_name(w.call.args[0].value) for w in wraps if w.call.args} - {None}
        self._no_device_move_after(body, start, last, every_wrapped | _bound_names(wraps), wraps)
        wrapped = self._wrapped_model(wraps)
        wrap_names = self._wrap_names(wraps, wrapped)
        moved = self._construction_group(body, start, last, constructions, holders)
        reads: Set[str] = set()
        for statement in moved:
            reads |= _reads(statement)
        # names the wrapping statements set that the moved statements read must be aliases that
        # hold the unwrapped model on both sides of the wrap (checked, else refused)
        self._aliases(body, start, holders, wraps, wrap_names, wrapped, reads)
        renames = {name: wrapped for name in wrap_names if name != wrapped}
        for statement in moved:
            self._check_reads_of_the_wrap(statement, wrap_names, wrapped)
        code = [_renamed_code(statement, renames).strip("\n") for statement in moved]
        models = []
        for model in self.setup.models:
            model = renames.get(model, model)
            if model not in models:
                models.append(model)
        return Hoist(body[start], moved, code, models, wrapped, wraps)

    # ---- the wrap -----------------------------------------------------------------------------

    def _wrapped_model(self, wraps: Sequence[CallSite]) -> str:
        names = {dotted_name(w.call.args[0].value) if w.call.args else None for w in wraps}
        if len(names) != 1 or None in names:
            raise Unconvertible("the DataParallel/DDP wraps before the optimizer do not all wrap one named model, so "
                                "the optimizer cannot be built above them", wraps[0].call)
        (name,) = names
        return name

    def _wrap_names(self, wraps: Sequence[CallSite], wrapped: str) -> Set[str]:
        """The names the wraps are bound to (`model`, `ddp_model`)."""
        names: Set[str] = set()
        for wrap in wraps:
            statement = wrap.statement
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and small.value is wrap.call):
                raise Unconvertible(
                    f"the DataParallel/DDP wrap of {wrapped} is not a plain assignment (a device move or another call "
                    "on it?), so the optimizer cannot be built above it", wrap.call)
            target = dotted_name(small.targets[0].target)
            if target is None:
                raise Unconvertible(f"the DataParallel/DDP wrap of {wrapped} is not bound to a name", wrap.call)
            names.add(target)
        return names

    def _aliases(self, body, start: int, holders, wraps, wrap_names: Set[str], wrapped: str, reads: Set[str]) -> Set[str]:
        """Names bound in the wrapping statements besides the wraps that the moved statements
        read: each must be an alias that holds the unwrapped model either way
        (`model_without_ddp = model` before the wrap, `model_without_ddp = model.module` after it)."""
        wrap_statements = {id(w.statement) for w in wraps}
        aliases: Set[str] = set()
        for holder in holders:
            for statement in _simple_statements(holder):
                if id(statement) in wrap_statements:
                    continue
                for name in assigned_names(statement):
                    if not any(_overlap(name, read) for read in reads):
                        continue
                    small = statement.body[0] if len(statement.body) == 1 else None
                    value = dotted_name(small.value) if isinstance(small, cst.Assign) else None
                    if value is None or not value.endswith(".module") or value[: -len(".module")] not in wrap_names:
                        raise Unconvertible(
                            f"{name} is set in the statement that wraps {wrapped} in DataParallel/DDP (line "
                            f"{self.s.line(statement)}) and the optimizer's construction reads it, so the construction "
                            "cannot move above the wrap", statement)
                    if not self._bound_to_before(body[:start], name, wrapped):
                        raise Unconvertible(
                            f"{name} = {value} is not also bound to {wrapped} before the wrap, so it cannot be "
                            "followed above it", statement)
                    aliases.add(name)
        return aliases

    def _bound_to_before(self, statements, name: str, value: str) -> bool:
        for statement in reversed(statements):
            if name in assigned_names(statement):
                small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
                return (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and dotted_name(small.targets[0].target) == name and dotted_name(small.value) == value)
        return False

    def _no_device_move_after(self, body, start: int, last: int, models: Set[str], wraps) -> None:
        """No device move of the model from the wrap to the optimizers (amp.initialize would run
        before it, on a model not yet on the GPU)."""
        for statement in body[start : last + 1]:
            for call in calls_within(statement):
                if isinstance(call.func, cst.Attribute) and call.func.attr.value in _DEVICE_METHODS:
                    receiver = dotted_name(call.func.value)
                    wrap = next((w for w in wraps if call.func.value is w.call), None)
                    if receiver in models or wrap is not None:
                        what = (f"{receiver} is moved to a device at or after its DataParallel/DDP wrap" if wrap is None
                                else f"the DataParallel/DDP wrap of {_wrapped_name(wrap)} is moved to a device")
                        raise Unconvertible(
                            f"{what} (line {self.s.line(call)}), and amp.initialize needs the model on the GPU before "
                            "the wrap; move the model to the GPU before wrapping it, then rerun ampify", call)

    # ---- what moves ---------------------------------------------------------------------------

    def _construction_group(self, body, start: int, last: int, constructions, holders) -> List[cst.CSTNode]:
        """The construction statements and the statements between the wrap and them that they
        read, in their order; refuses when the rest between depends on the order."""
        between = body[start : last + 1]
        group = {id(c) for c in constructions}
        changed = True
        while changed:
            changed = False
            needed: Set[str] = set()
            for statement in between:
                if id(statement) in group:
                    needed |= _reads(statement)
            for statement in between:
                if id(statement) in group or statement in holders:
                    continue
                if any(_overlap(b, n) for b in assigned_names(statement) for n in needed):
                    group.add(id(statement))
                    changed = True
        moved = [statement for statement in between if id(statement) in group]
        bound: Set[str] = set()
        for statement in moved:
            if not _is_plain_assignment(statement):
                raise Unconvertible(
                    "the optimizer is built above the DataParallel/DDP wrap only from plain assignments, and this "
                    "statement is not one", statement)
            bound |= assigned_names(statement)
        for statement in between:
            if id(statement) in group:
                continue
            if _freezes_parameters(statement):
                # which parameters the optimizer takes may depend on it (`requires_grad` filters)
                raise Unconvertible(
                    f"line {self.s.line(statement)} freezes or unfreezes parameters between the DataParallel/DDP "
                    "wrap and the optimizer, so the optimizer cannot be built above the wrap", statement)
            clash = sorted(b for b in bound if any(_overlap(b, r) for r in _reads(statement) | assigned_names(statement)))
            if clash:
                raise Unconvertible(
                    f"line {self.s.line(statement)} uses what the optimizer's construction binds ({', '.join(clash)}), "
                    "so the construction cannot move above the DataParallel/DDP wrap", statement)
        return moved

    def _check_reads_of_the_wrap(self, statement, wrap_names: Set[str], wrapped: str) -> None:
        """A wrap name may be read as `<wrap>.parameters()` only: DDP's `named_parameters()` adds
        `module.` to every name, and anything else of the wrap is not the model's."""
        parameter_calls = 0
        for call in calls_within(statement):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "parameters" and not call.args:
                if dotted_name(call.func.value) in wrap_names:
                    parameter_calls += 1
        reads = sum(1 for node in _name_nodes(statement) if node in wrap_names)
        named = any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "named_parameters"
                    and dotted_name(call.func.value) in wrap_names for call in calls_within(statement))
        if named:
            raise Unconvertible(
                f"the optimizer's construction reads the names of the DataParallel/DDP wrap's parameters, which start "
                f"with `module.` (those of {wrapped} do not), so it cannot be built from {wrapped} above the wrap",
                statement)
        if reads > parameter_calls:
            raise Unconvertible(
                f"the optimizer's construction reads the DataParallel/DDP wrap of {wrapped} other than through "
                ".parameters(), so it cannot move above the wrap", statement)


# ---- small helpers ---------------------------------------------------------------------------


def _freezes_parameters(statement: cst.CSTNode) -> bool:
    """`p.requires_grad = False`, `model.backbone.requires_grad_(False)` anywhere in the statement."""
    for target in assigned_names(statement):
        if target.endswith(".requires_grad"):
            return True
    return any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "requires_grad_"
               for call in calls_within(statement))


def _wrapped_name(wrap: CallSite) -> str:
    return (dotted_name(wrap.call.args[0].value) if wrap.call.args else None) or "the model"


def _bound_names(wraps: Sequence[CallSite]) -> Set[str]:
    """The names wraps are bound to, where a wrap is the value of a plain assignment."""
    names: Set[str] = set()
    for wrap in wraps:
        statement = wrap.statement
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                name = dotted_name(small.targets[0].target)
                if name:
                    names.add(name)
    return names


def _simple_statements(statement: cst.CSTNode) -> List[cst.SimpleStatementLine]:
    found: List[cst.SimpleStatementLine] = []

    class _Find(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            found.append(node)
            return False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    statement.visit(_Find())
    return found


def _is_plain_assignment(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], (cst.Assign, cst.AnnAssign))
            and all(isinstance(t.target, cst.Name) for t in getattr(statement.body[0], "targets", []))
            and not any(isinstance(node, cst.NamedExpr) for node in _all_nodes(statement)))


def _reads(statement: cst.CSTNode) -> Set[str]:
    """The variables a statement reads, as dotted chains (`args.lr`, `model`), its own
    assignment targets left out."""
    return set(_read_chains(statement))


def _name_nodes(statement: cst.CSTNode) -> List[str]:
    """The variable each read starts from (`model` for `model.parameters()`), once per read."""
    return [chain.split(".")[0] for chain in _read_chains(statement)]


def _read_chains(statement: cst.CSTNode) -> List[str]:
    """Every read of a variable, as the longest dotted chain it starts (not an attribute's own
    name, not a keyword's name, not a plain assignment target)."""
    found: List[str] = []

    class _Find(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
            if not isinstance(node.target, cst.Name):
                node.target.visit(self)
            return False

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            name = dotted_name(node)
            if name is not None:
                found.append(name)
                return False
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.append(node.value)

    statement.visit(_Find())
    return found


def _overlap(bound: str, read: str) -> bool:
    """Does binding `bound` change what reading `read` sees (`args` vs `args.lr`, `a.b` vs `a`)?"""
    return bound == read or read.startswith(bound + ".") or bound.startswith(read + ".")


def _all_nodes(node: cst.CSTNode) -> List[cst.CSTNode]:
    found: List[cst.CSTNode] = []

    class _Find(cst.CSTVisitor):
        def on_visit(self, inner: cst.CSTNode) -> bool:
            found.append(inner)
            return True

    node.visit(_Find())
    return found


def _renamed_code(statement: cst.CSTNode, renames: Dict[str, str]) -> str:
    """The statement's code with `<wrap>.parameters()` read from the wrapped model instead."""
    if not renames:
        return code_of(statement)

    class _Rename(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
            if isinstance(updated.func, cst.Attribute) and updated.func.attr.value == "parameters":
                receiver = dotted_name(updated.func.value)
                if receiver in renames:
                    return updated.with_changes(func=updated.func.with_changes(value=cst.parse_expression(renames[receiver])))
            return updated

    return code_of(statement.visit(_Rename()))
