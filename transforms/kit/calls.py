"""Every call inside a node: the question most transforms ask first."""

from __future__ import annotations

from typing import List

import libcst as cst

from ampify.transforms.kit.fast_walk import walk


def calls_within(node: cst.CSTNode) -> List[cst.Call]:
    """Every call inside node (itself included), outermost first."""
    found: List[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            found.append(call)

    walk(node, _Calls())
    return found
