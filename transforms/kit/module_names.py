"""Names a rewrite may add without clashing, and where module-level statements go after the imports."""

from __future__ import annotations

from typing import Iterator, Set, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap


def names_in(node: cst.CSTNode) -> Set[str]:
    """Every Name in `node` (for fresh names and to follow a value by name)."""
    found: Set[str] = set()

    class _Names(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            found.add(name.value)

    walk(node, _Names())
    return found


def fresh_name(taken: Set[str], base: str) -> str:
    """`base`, or `base_2`, `base_3`... the first not in `taken`."""
    name, counter = base, 2
    while name in taken:
        name, counter = f"{base}_{counter}", counter + 1
    return name


def is_import_line(statement: cst.CSTNode) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body)


def top_level_imports(module: cst.Module) -> Iterator[Tuple[int, ImportMap]]:
    """(body index, ImportMap of that statement) for every module-level import statement."""
    for index, statement in enumerate(module.body):
        if isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body):
            yield index, ImportMap.from_module(cst.Module(body=[statement]))


def after_imports(module: cst.Module, binding_index: int) -> int:
    """Index in the module body after its leading docstring, `from __future__` and imports, and
    after the import at `binding_index` (the one that binds the framework's name)."""
    index = 0
    for position, statement in enumerate(module.body):
        if is_import_line(statement):
            index = position + 1
            continue
        if position == 0 and isinstance(statement, cst.SimpleStatementLine) and isinstance(
                statement.body[0], cst.Expr) and isinstance(statement.body[0].value, cst.SimpleString):
            index = 1
            continue
        break
    if binding_index >= index:
        # the framework is imported after some code: go after that import and the imports that follow it
        index = binding_index + 1
        while index < len(module.body) and is_import_line(module.body[index]):
            index += 1
    return index
