"""Read-only walks over a LibCST tree, an order of magnitude cheaper than `module.visit()`.

`CSTNode.visit` is built for transformers: it rebuilds every node on the way back up (and
validates it), even for a visitor that changes nothing, so one visit of a module costs about
as much as parsing it. An analysis only reads: `walk` calls the same `on_visit` / `on_leave`
hooks of a `CSTVisitor` (so `visit_Call`, `leave_FunctionDef`... and a False from `visit_*`
mean what they always mean) in the same order, but only follows the children, and never into
whitespace, comments or parentheses, which no analysis here looks at.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Dict, Iterator, Optional, Tuple

import libcst as cst

#: fields that hold only whitespace, comments and punctuation
_LAYOUT_FIELDS = frozenset(
    {
        "lpar", "rpar", "comma", "semicolon", "leading_lines", "lines_after_decorators",
        "trailing_whitespace", "header", "footer", "newline", "empty_lines", "first_line",
        "default_comma", "equal", "colon", "dot", "lbracket", "rbracket", "lbrace", "rbrace",
        "operator", "whitespace", "indent",
    }
)

#: node class -> its code-bearing fields, in the order LibCST visits them (source order)
_FIELD_ORDER: Dict[type, Tuple[str, ...]] = {}


class _FieldRecorder(cst.CSTVisitor):
    """Learns the order in which LibCST visits a node's fields, without going deeper."""

    def __init__(self, node: cst.CSTNode) -> None:
        self.node = node
        self.fields = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        pass

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if node is self.node and attribute not in self.fields:
            self.fields.append(attribute)


def _fields_of(node: cst.CSTNode) -> Tuple[str, ...]:
    kind = node.__class__
    fields = _FIELD_ORDER.get(kind)
    if fields is None:
        recorder = _FieldRecorder(node)
        node._visit_and_replace_children(recorder)  # shallow: the recorder never descends
        # A few fields are visited only when set (a format spec): LibCST visits them last.
        unvisited = [f.name for f in dataclasses.fields(node) if f.name not in recorder.fields]
        fields = tuple(
            name for name in [*recorder.fields, *unvisited]
            if name not in _LAYOUT_FIELDS and not name.startswith("whitespace")
        )
        _FIELD_ORDER[kind] = fields
    return fields


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The code-bearing children of a node, in source order."""
    return iter(code_children(node))


def walk(
    node: cst.CSTNode,
    visitor: cst.CSTVisitor,
    parents: Optional[Dict[cst.CSTNode, cst.CSTNode]] = None,
) -> None:
    """Run a read-only visitor over `node` and everything below it; with `parents`, also record
    each visited node's parent there (the root's is not recorded)."""
    kind = type(visitor)
    if kind.on_visit is cst.CSTVisitor.on_visit and kind.on_leave is cst.CSTVisitor.on_leave:
        # The usual visitor: look its visit_X / leave_X up once per node class, not per node.
        hooks = _HOOKS.setdefault(kind, {})
        _walk_with_hooks(node, visitor, hooks, parents)
    else:
        _walk_generic(node, visitor, parents)


#: visitor class -> node class -> (visit_X or None, leave_X or None)
#: visitor class -> node class -> its (visit, leave) hooks; weak, so that a visitor class defined
#: inside a function (one per call) does not pile up
_HOOKS: "weakref.WeakKeyDictionary[type, Dict[type, Tuple[Optional[Callable], Optional[Callable]]]]" = (
    weakref.WeakKeyDictionary())


def _hooks_for(visitor_kind: type, node_kind: type):
    name = node_kind.__name__
    return getattr(visitor_kind, "visit_" + name, None), getattr(visitor_kind, "leave_" + name, None)


#: value class -> 1 for a CSTNode, 2 for a tuple/list (of nodes), 0 otherwise; a dict lookup is
#: several times cheaper than isinstance() against LibCST's abstract base classes
_VALUE_KIND: Dict[type, int] = {tuple: 2, list: 2}


def _value_kind(kind: type) -> int:
    found = _VALUE_KIND.get(kind)
    if found is None:
        found = _VALUE_KIND[kind] = 1 if issubclass(kind, cst.CSTNode) else 0
    return found


def code_children(node: cst.CSTNode) -> list:
    """The code-bearing children of a node, as a list, in source order (the walks' inner loop)."""
    found = []
    value_kinds = _VALUE_KIND
    for name in _FIELD_ORDER.get(node.__class__) or _fields_of(node):
        value = getattr(node, name)
        kind = value_kinds.get(value.__class__)
        if kind is None:
            kind = _value_kind(value.__class__)
        if kind == 1:
            found.append(value)
        elif kind == 2:
            for item in value:
                item_kind = value_kinds.get(item.__class__)
                if item_kind is None:
                    item_kind = _value_kind(item.__class__)
                if item_kind == 1:
                    found.append(item)
    return found


def _walk_with_hooks(node, visitor, hooks, parents) -> None:
    node_kind = node.__class__
    pair = hooks.get(node_kind)
    if pair is None:
        pair = hooks[node_kind] = _hooks_for(type(visitor), node_kind)
    visit, leave = pair
    if visit is None or visit(visitor, node) is not False:
        for child in code_children(node):
            if parents is not None:
                parents[child] = node
            _walk_with_hooks(child, visitor, hooks, parents)
    if leave is not None:
        leave(visitor, node)


def _walk_generic(node, visitor, parents) -> None:
    """For visitors that override on_visit / on_leave themselves."""
    if visitor.on_visit(node):
        for child in code_children(node):
            if parents is not None:
                parents[child] = node
            _walk_generic(child, visitor, parents)
    visitor.on_leave(node)


def iter_tree(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node` and every code-bearing node below it, parents first, in source order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(list(children(current))))
