"""What names a module uses, read with the stdlib `ast` parser before any LibCST parse.

The byte tests (`Transform.may_apply`) cannot tell code from comments and docstrings, so in a
big tree most files that pass them hold no training code at all. The stdlib parser is C code,
about five times cheaper than a LibCST parse, and one walk over its tree collects every name a
transform's screen needs: when no transform's screen passes, the file is decided without
LibCST at all (see `Transform.screen`).

Every name LibCST would show as a `Name` node is in `identifiers` (variables, attributes,
definitions, parameters, keyword arguments, import paths split at the dots), so a screen that
asks "is this name used anywhere?" is never narrower than the LibCST analysis behind it.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, field
from typing import Dict, Iterator, Optional, Set, Tuple, Union

#: nodes with identifier fields other than Name.id / Attribute.attr (definitions, parameters,
#: keyword arguments, imports, global/nonlocal, except-as, match patterns)
_IDENTIFIER_FIELDS = {
    ast.FunctionDef: ("name",),
    ast.AsyncFunctionDef: ("name",),
    ast.ClassDef: ("name",),
    ast.arg: ("arg",),
    ast.keyword: ("arg",),
    ast.alias: ("name", "asname"),
    ast.ImportFrom: ("module",),
    ast.Global: ("names",),
    ast.Nonlocal: ("names",),
    ast.ExceptHandler: ("name",),
}
for _name, _fields in (
    ("MatchAs", ("name",)),
    ("MatchStar", ("name",)),
    ("MatchMapping", ("rest",)),
    ("MatchClass", ("kwd_attrs",)),
):
    if hasattr(ast, _name):  # Python 3.10+
        _IDENTIFIER_FIELDS[getattr(ast, _name)] = _fields


#: node class -> the fields that may hold nodes the facts need (not `ctx`: Load / Store)
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _walk(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of the tree but the expression contexts, in no particular order: `ast.walk`
    without its per-field isinstance tests on contexts (about half the time on big files)."""
    stack = [tree]
    pop, push, extend = stack.pop, stack.append, stack.extend
    node_type = ast.AST
    fields_of = _CHILD_FIELDS
    while stack:
        node = pop()
        yield node
        kind = node.__class__
        fields = fields_of.get(kind)
        if fields is None:
            fields = fields_of[kind] = tuple(name for name in kind._fields if name != "ctx")
        for name in fields:
            value = getattr(node, name, None)
            if value.__class__ is list:
                extend(item for item in value if isinstance(item, node_type))
            elif isinstance(value, node_type):
                push(value)


@dataclass
class SourceFacts:
    """Names and literals of one module."""

    #: every identifier, dotted import paths split into their parts
    identifiers: Set[str] = field(default_factory=set)
    #: the last name of every called expression: `backward` for `loss.backward()`, `f` for `f(x)`
    call_names: Set[str] = field(default_factory=set)
    #: every str literal (f-string parts included)
    strings: Set[str] = field(default_factory=set)
    #: every module path imported absolutely (`tensorflow.compat.v1`, `torch`)
    imported_modules: Set[str] = field(default_factory=set)
    #: some `from X import *` may bind names (`tf`) no import here shows
    star_import: bool = False
    #: the stdlib tree the facts were read from (the engine hands it on: statement lines for
    #: `positions.Positions`)
    tree: Optional[ast.Module] = field(default=None, repr=False, compare=False)

    def imports(self, top_level: str) -> bool:
        """Does the module import `top_level` or anything under it?"""
        prefix = top_level + "."
        return any(m == top_level or m.startswith(prefix) for m in self.imported_modules)

    @classmethod
    def from_source(cls, source: Union[str, bytes]) -> Optional["SourceFacts"]:
        """The facts of a module, or None when the stdlib parser cannot read it (syntax this
        interpreter does not know, an odd encoding...): then nothing may be ruled out."""
        return cls.read(source)[0]

    @classmethod
    def read(cls, source: Union[str, bytes]) -> Tuple[Optional["SourceFacts"], Optional[Exception]]:
        """(facts, None), or (None, the error this interpreter's own parser raised)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes etc.: not ours to report
                tree = ast.parse(source)
        except Exception as error:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError...
            return None, error
        facts = cls._collect(tree)
        facts.tree = tree
        return facts, None

    @classmethod
    def _collect(cls, tree: ast.AST) -> "SourceFacts":
        facts = cls()
        identifiers, call_names, strings = facts.identifiers, facts.call_names, facts.strings
        name_type, attribute_type, call_type, constant_type = ast.Name, ast.Attribute, ast.Call, ast.Constant
        for node in _walk(tree):
            kind = node.__class__
            if kind is name_type:
                identifiers.add(node.id)
            elif kind is attribute_type:
                identifiers.add(node.attr)
            elif kind is constant_type:
                if isinstance(node.value, str):
                    strings.add(node.value)
            elif kind is call_type:
                func = node.func
                if func.__class__ is attribute_type:
                    call_names.add(func.attr)
                elif func.__class__ is name_type:
                    call_names.add(func.id)
            elif kind is ast.Import:
                facts.imported_modules.update(alias.name for alias in node.names)
            else:
                fields = _IDENTIFIER_FIELDS.get(kind)
                if fields is None:
                    continue
                for name in fields:
                    value = getattr(node, name, None)
                    for item in value if isinstance(value, list) else (value,):
                        if item:
                            identifiers.update(item.split("."))
                if kind is ast.ImportFrom and any(alias.name == "*" for alias in node.names):
                    facts.star_import = True
                if kind is ast.ImportFrom and not node.level and node.module:
                    facts.imported_modules.add(node.module)
                    facts.imported_modules.update(
                        f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*"
                    )
        return facts
