"""Resolve the names a module imports, once per file, for every transform to share.

`import tensorflow.compat.v1 as tf` makes `tf.train.AdamOptimizer` resolve to
`tensorflow.compat.v1.train.AdamOptimizer`; `from torch import optim` makes `optim.SGD`
resolve to `torch.optim.SGD`. Shadowing by later assignments is ignored on purpose: training
scripts do not rebind `tf` or `torch`, and a full scope analysis would cost more than the parse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, Optional, Set

import libcst as cst
from libcst.helpers import get_full_name_for_node


def dotted_name(node: cst.CSTNode) -> Optional[str]:
    """`a.b.c` for a pure Name/Attribute chain, else None.

    Not a name: `f(x).backward` or `xs[0].step` (LibCST's get_full_name_for_node would call them
    `f.backward` and `xs.step`, which resolves a method of a call's result as if it were a
    module attribute)."""
    current = node
    while isinstance(current, cst.Attribute):
        current = current.value
    if not isinstance(current, cst.Name):
        return None
    return get_full_name_for_node(node)


@dataclass
class ImportMap:
    """Local name -> fully qualified name, for every import anywhere in a module."""

    aliases: Dict[str, str] = field(default_factory=dict)
    #: every module path imported (`torch.nn`, `tensorflow.compat.v1`, `apex.amp` ...)
    modules: Set[str] = field(default_factory=set)
    #: modules imported with `from X import *`
    star_modules: Set[str] = field(default_factory=set)
    #: some `from X import *` (relative ones too) may bind names no import here shows
    has_star_import: bool = False

    @classmethod
    def from_module(cls, module: cst.Module) -> "ImportMap":
        collector = _ImportCollector()
        # Imports are statements: walk statement bodies only, never into expressions. A full
        # `module.visit` costs about as much as the parse itself; this walk is ~50x cheaper.
        for statement in _small_statements(module.body):
            if isinstance(statement, cst.Import):
                collector.visit_Import(statement)
            elif isinstance(statement, cst.ImportFrom):
                collector.visit_ImportFrom(statement)
        return collector.result

    def with_alias(self, local: str, qualified: str) -> "ImportMap":
        """A copy in which `local` is bound to `qualified` (an assumption the caller reports)."""
        top = qualified.split(".")[0]
        return ImportMap({**self.aliases, local: qualified}, {*self.modules, top, qualified},
                         set(self.star_modules), self.has_star_import)

    def uses(self, top_level: str) -> bool:
        """Does the module import `top_level` (e.g. "torch") or anything under it?"""
        return any(m == top_level or m.startswith(top_level + ".") for m in self.modules)

    def resolve(self, node: cst.CSTNode) -> Optional[str]:
        """The fully qualified name of a Name/Attribute chain, or None when not imported."""
        head = node
        while isinstance(head, cst.Attribute):
            head = head.value
        if not isinstance(head, cst.Name) or head.value not in self.aliases:
            return None  # decided without building the dotted name: most names are not imports
        return self.resolve_dotted(get_full_name_for_node(node))

    def resolve_dotted(self, name: str) -> Optional[str]:
        head, _, rest = name.partition(".")
        target = self.aliases.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    def local_names_for(self, qualified: str) -> Set[str]:
        """Local names bound to exactly `qualified` (e.g. {"tf"} for "tensorflow")."""
        return {local for local, target in self.aliases.items() if target == qualified}


#: the fields of compound statements that hold statements, in source order
_STATEMENT_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")


def _small_statements(statements) -> Iterator[cst.BaseSmallStatement]:
    """Every small statement (import, assignment, ...) in a statement list, nested ones too,
    in source order."""
    for statement in statements:
        if isinstance(statement, cst.SimpleStatementLine):
            yield from statement.body
        else:
            yield from _small_statements_of_block(statement)


def _small_statements_of_block(node: cst.CSTNode) -> Iterator[cst.BaseSmallStatement]:
    for name in _STATEMENT_FIELDS:
        part = getattr(node, name, None)
        if part is None:
            continue
        if isinstance(part, cst.SimpleStatementSuite):
            yield from part.body
        elif isinstance(part, cst.IndentedBlock):
            yield from _small_statements(part.body)
        elif isinstance(part, (list, tuple)):  # except handlers, match cases
            for item in part:
                yield from _small_statements_of_block(item)
        elif isinstance(part, cst.CSTNode):  # elif / else / finally
            yield from _small_statements_of_block(part)


class _ImportCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.result = ImportMap()

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = get_full_name_for_node(alias.name)
            if not full:
                continue
            self.result.modules.add(full)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.result.aliases[alias.asname.name.value] = full
            else:
                head = full.split(".")[0]
                self.result.aliases.setdefault(head, head)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            self.result.has_star_import = True
        if node.relative or node.module is None:
            return
        module = get_full_name_for_node(node.module)
        if not module:
            return
        self.result.modules.add(module)
        if isinstance(node.names, cst.ImportStar):
            self.result.star_modules.add(module)
            return
        for alias in node.names:
            name = get_full_name_for_node(alias.name)
            if not name:
                continue
            full = f"{module}.{name}"
            # `from torch import nn` imports a module too, as far as `uses()` is concerned.
            self.result.modules.add(full)
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.result.aliases[local] = full
