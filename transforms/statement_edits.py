"""Apply planned statement-level edits to a module in one pass.

A transform first decides what to change (insert before/after a statement, replace a
statement by several, remove one, rebuild an expression node), keyed by the ORIGINAL node
objects, then `apply_edits` rewrites the module once. Keeping "decide" apart from "rewrite"
means a transform can refuse a whole training unit after planning half of it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Set

import libcst as cst

NodeRebuilder = Callable[[cst.CSTNode], cst.CSTNode]


@dataclass
class EditPlan:
    """Edits keyed by the identity of nodes of the module they will be applied to."""

    before: Dict[int, List[cst.BaseStatement]] = field(default_factory=lambda: defaultdict(list))
    after: Dict[int, List[cst.BaseStatement]] = field(default_factory=lambda: defaultdict(list))
    replace: Dict[int, List[cst.BaseStatement]] = field(default_factory=dict)
    remove: Set[int] = field(default_factory=set)
    rebuild: Dict[int, List[NodeRebuilder]] = field(default_factory=lambda: defaultdict(list))

    def insert_before(self, statement: cst.CSTNode, new: Sequence[cst.BaseStatement]) -> None:
        self.before[id(statement)].extend(new)

    def insert_after(self, statement: cst.CSTNode, new: Sequence[cst.BaseStatement]) -> None:
        self.after[id(statement)].extend(new)

    def replace_statement(self, statement: cst.CSTNode, new: Sequence[cst.BaseStatement]) -> None:
        self.replace[id(statement)] = list(new)

    def remove_statement(self, statement: cst.CSTNode) -> None:
        self.remove.add(id(statement))

    def rebuild_node(self, node: cst.CSTNode, rebuilder: NodeRebuilder) -> None:
        """Call `rebuilder(updated_node)` when leaving `node`; several rebuilders chain."""
        self.rebuild[id(node)].append(rebuilder)

    def is_empty(self) -> bool:
        return not (self.before or self.after or self.replace or self.remove or self.rebuild)

    def copy(self) -> "EditPlan":
        clone = EditPlan()
        for key, value in self.before.items():
            clone.before[key] = list(value)
        for key, value in self.after.items():
            clone.after[key] = list(value)
        clone.replace = dict(self.replace)
        clone.remove = set(self.remove)
        for key, value in self.rebuild.items():
            clone.rebuild[key] = list(value)
        return clone


def apply_edits(module: cst.Module, plan: EditPlan) -> cst.Module:
    """The module with every planned edit applied; the module itself when the plan is empty."""
    if plan.is_empty():
        return module
    return module.visit(_EditApplier(plan))


class _EditApplier(cst.CSTTransformer):
    def __init__(self, plan: EditPlan) -> None:
        super().__init__()
        self.plan = plan

    def on_leave(self, original_node, updated_node):
        key = id(original_node)
        for rebuilder in self.plan.rebuild.get(key, ()):
            updated_node = rebuilder(updated_node)
        if not isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return updated_node
        before = self.plan.before.get(key, [])
        after = self.plan.after.get(key, [])
        if key in self.plan.remove:
            middle: List[cst.BaseStatement] = []
        elif key in self.plan.replace:
            middle = self.plan.replace[key]
        else:
            middle = [updated_node]
        if not before and not after and middle == [updated_node]:
            return updated_node
        statements = [*before, *middle, *after]
        if not statements:
            return cst.RemovalSentinel.REMOVE
        return cst.FlattenSentinel(statements)
