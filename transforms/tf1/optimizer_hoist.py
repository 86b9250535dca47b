"""Move an optimizer's construction above the tf.gradients call that its gradients come from.

RL code often computes `grads = tf.gradients(loss, params)` first and builds the optimizer
afterwards (openai/baselines a2c: `trainer = tf.train.RMSPropOptimizer(...)` right before
`trainer.apply_gradients(grads)`). To route those gradients through the wrapped optimizer's
compute_gradients, the optimizer must exist first. Building a TF1 optimizer creates no graph
ops or variables, so its statement can move up, provided nothing in between changes what it
reads or uses the name it binds. This module only decides whether a move is safe; the edit
itself is applied by `move_statements`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Set

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import dotted_name


@dataclass(frozen=True)
class StatementMove:
    """Move `statement` (by id) to just before `anchor` (by id), in the same block or, out of the
    body of a `with tf.variable_scope(...)`, in the block enclosing it."""

    statement: int
    anchor: int
    #: 1-based source lines, for the report
    from_line: int
    to_line: int


class _Bindings(cst.CSTVisitor):
    """Dotted names bound (assigned, imported, defined, loop/with targets) and read."""

    def __init__(self) -> None:
        self.bound: Set[str] = set()
        self.read: Set[str] = set()
        #: `obj` of every `obj.method(...)` call: the call may change obj's attributes
        self.called_on: Set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Attribute):
            name = dotted_name(node.func.value)
            if name:
                self.called_on.add(name.split(".")[0])

    def _bind(self, target: cst.CSTNode) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)
        elif isinstance(target, cst.Subscript):
            self._bind(target.value)
        else:
            name = dotted_name(target)
            if name:
                self.bound.add(name)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        if node.asname is None:
            name = dotted_name(node.name)
            if name:
                self.bound.add(name.split(".")[0])

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.bound.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bound.add(node.name.value)

    def visit_Global(self, node: cst.Global) -> None:
        self.bound.update(item.name.value for item in node.names)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.bound.update(item.name.value for item in node.names)

    def visit_Name(self, node: cst.Name) -> None:
        self.read.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        name = dotted_name(node)
        if name:
            # `self.lr` reads self.lr, not all of self: `self.grads = ...` between does not touch it
            self.read.add(name)
            return False
        return True


def _overlaps(name: str, others: Set[str]) -> bool:
    """Is `name`, an attribute of it, or an object it is an attribute of, among `others`?"""
    for other in others:
        if other == name or other.startswith(name + ".") or name.startswith(other + "."):
            return True
    return False


def plan_hoist(
    statement: cst.CSTNode,
    receiver: str,
    anchor: cst.CSTNode,
    between: Sequence[cst.CSTNode],
) -> Optional[str]:
    """Why `statement` (`receiver = Optimizer(...)`) cannot move above `anchor`, or None.

    `between` is the statements from `anchor` up to (not including) `statement`, all in the
    same block.
    """
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return "its construction is not a statement of its own"
    assign = statement.body[0]
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
        return "its construction is not a plain assignment"
    if dotted_name(assign.targets[0].target) != receiver:
        return "its construction is not a plain assignment"
    needed = _Bindings()
    walk(assign.value, needed)
    changed = _Bindings()
    for node in between:
        walk(node, changed)
    touched = [name for name in needed.read if _overlaps(name, changed.bound)]
    if touched:
        # name the most specific one (`self.lr`, not `self`)
        shown = max(touched, key=lambda name: (name.count("."), name))
        return f"the code between them sets {shown}, which building the optimizer reads"
    uses_receiver = any(
        name == receiver or name.startswith(receiver + ".") for name in changed.read
    )
    if uses_receiver or _overlaps(receiver, changed.bound):
        return f"the code between them already uses {receiver}"
    # `Optimizer(self.lr)` after `self.build_lr()`: a method call may have set what it reads.
    arguments = _Bindings()
    if isinstance(assign.value, cst.Call):
        for arg in assign.value.args:
            walk(arg, arguments)
    objects = sorted({name.split(".")[0] for name in arguments.read if "." in name} & changed.called_on)
    if objects:
        return f"the code between them calls methods of {objects[0]}, whose attributes building the optimizer reads"
    return None


def scope_reads_what_changes(scope: cst.With, between: Sequence[cst.CSTNode]) -> Optional[str]:
    """Why the `with tf.name_scope(...)` header `scope` cannot move above `between`: the code
    between sets a name its items read. None when it can."""
    needed = _Bindings()
    for item in scope.items:
        walk(item.item, needed)
    changed = _Bindings()
    for node in between:
        walk(node, changed)
    touched = [name for name in needed.read if _overlaps(name, changed.bound)]
    if touched:
        return f"the code between them sets {max(touched, key=lambda name: (name.count('.'), name))}, which its scope reads"
    return None


def move_statements(
    original: Sequence[cst.BaseStatement],
    updated: Sequence[cst.BaseStatement],
    moves: Dict[int, StatementMove],
    carried: Optional[Dict[int, cst.BaseStatement]] = None,
):
    """The block body with every planned statement moved before its anchor.

    `original` and `updated` are the block's statements before and after the other edits,
    position by position. A moved statement keeps its own comments (not the blank lines
    above them) and goes right above the anchor's blank lines and comments, which stay with
    the anchor. A statement moved out of this block (from a `with tf.variable_scope(...)` body to
    above an earlier statement of the enclosing block) is left out here and put in `carried`, where
    the enclosing block, left later, finds it.
    """
    carried = {} if carried is None else carried
    here = {id(statement) for statement in original}
    incoming: Dict[int, cst.BaseStatement] = {}
    leaving: Set[int] = set()
    for index, statement in enumerate(original):
        move = moves.get(id(statement))
        if move is None:
            continue
        leaving.add(id(statement))
        if move.anchor in here:
            incoming[move.anchor] = updated[index]
        else:
            carried[id(statement)] = updated[index]
    for statement_id, move in moves.items():
        if move.anchor in here and statement_id not in here and statement_id in carried:
            incoming[move.anchor] = carried.pop(statement_id)
    if not incoming and not leaving:
        return updated
    body = []
    for index, statement in enumerate(original):
        if id(statement) in leaving:
            continue
        hoisted = incoming.get(id(statement))
        if hoisted is not None:
            body.append(hoisted.with_changes(leading_lines=_drop_leading_blanks(hoisted.leading_lines)))
        body.append(updated[index])
    return body


def _drop_leading_blanks(lines: Sequence[cst.EmptyLine]):
    lines = list(lines)
    while lines and lines[0].comment is None:
        lines.pop(0)
    return lines
