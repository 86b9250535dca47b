"""Run a LibCST transformer over only the part of a tree it changes.

`module.visit(transformer)` rebuilds and re-validates every node of the module on the way back
up, whatever the transformer changes: about the cost of a parse. A transformer that changes a
few known nodes (the statements an edit plan names) needs only those nodes and their ancestors
visited; every other subtree is handed back as it is, the same objects. `visit_only` finds the
ancestors with a read-only walk (a small fraction of a parse) and runs the transformer with its
hooks called on those nodes alone, so the result is the one a full visit gives whenever the
transformer leaves every other node as it found it (the contract of its callers).
"""

from __future__ import annotations

from typing import Iterable, List, Set, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import code_children


def visit_only(module: cst.Module, transformer: cst.CSTTransformer, targets: Iterable[int]) -> cst.Module:
    """`module.visit(transformer)`, for a transformer whose hooks change nothing but the nodes
    whose ids are in `targets`: those nodes and their ancestors get the transformer's hooks
    (a block's leave hook may rebuild its statement list), everything else is kept as it is."""
    on_the_way = _targets_and_ancestors(module, set(targets))
    if len(on_the_way) <= 1:
        return module  # no target in this tree
    return module.visit(_Pruned(transformer, on_the_way))


def _targets_and_ancestors(root: cst.CSTNode, targets: Set[int]) -> Set[int]:
    """ids of the nodes under `root` that are targets or hold one, the root always included."""
    found: Set[int] = {id(root)}
    if not targets:
        return found
    path: List[int] = []
    stack: List[Tuple[cst.CSTNode, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        del path[depth:]
        key = id(node)
        path.append(key)
        if key in targets:
            found.update(path)
        for child in code_children(node):
            stack.append((child, depth + 1))
    return found


class _Pruned(cst.CSTTransformer):
    """Delegates to the inner transformer inside the kept nodes; hands every other node back
    untouched without descending into it."""

    def __init__(self, inner: cst.CSTTransformer, keep: Set[int]) -> None:
        super().__init__()
        self.inner = inner
        self.keep = keep

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) not in self.keep:
            return False
        return self.inner.on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        if id(original_node) not in self.keep:
            return updated_node
        return self.inner.on_leave(original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if id(node) in self.keep:
            self.inner.on_visit_attribute(node, attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        if id(original_node) in self.keep:
            self.inner.on_leave_attribute(original_node, attribute)
