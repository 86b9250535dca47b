"""Every call inside a node: the question most transforms ask first (and every node of another kind)."""

from __future__ import annotations

from typing import List, Type, TypeVar

import libcst as cst

from ampify.transforms.kit.fast_walk import walk


class _Calls(cst.CSTVisitor):
    """One class for every call: fast_walk looks its hooks up once per visitor class."""

    def __init__(self) -> None:
        super().__init__()
        self.found: List[cst.Call] = []

    def visit_Call(self, call: cst.Call) -> None:
        self.found.append(call)


def calls_within(node: cst.CSTNode) -> List[cst.Call]:
    """Every call inside node (itself included), outermost first."""
    finder = _Calls()
    walk(node, finder)
    return finder.found


_Node = TypeVar("_Node", bound=cst.CSTNode)


class _OfKind(cst.CSTVisitor):
    def __init__(self, kind: Type[_Node]) -> None:
        super().__init__()
        self.kind = kind
        self.found: List[_Node] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.found.append(node)
        return True


def nodes_within(node: cst.CSTNode, kind: Type[_Node]) -> List[_Node]:
    """Every node of `kind` inside node (itself included), in source order: the names a test
    reads, the strings of `'clip_grad_%s_' % mode`."""
    finder = _OfKind(kind)
    node.visit(finder)
    return finder.found
