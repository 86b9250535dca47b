"""Every call inside a node: the question most transforms ask first."""

from __future__ import annotations

from typing import List

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
