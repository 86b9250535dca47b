"""Where `import torch` goes in a module that needs it, and which module-level names are torch.

An `import torch` inside a function does not count: new code may run elsewhere. A new import
goes before the first `from torch import ...`, else after the docstring and any
`from __future__` imports (which must stay first).
"""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import dotted_name


class _ModuleLevelImports(cst.CSTVisitor):
    """Local names bound by imports at module level (also under module-level if/try/with)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.found: Set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted_name(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                if full == self.target:
                    self.found.add(alias.asname.name.value)
            elif full.split(".")[0] == self.target:
                self.found.add(self.target)  # `import torch.nn` binds `torch`


def module_level_aliases(module: cst.Module, target: str) -> Set[str]:
    visitor = _ModuleLevelImports(target)
    walk(module, visitor)
    return visitor.found


def add_import_torch(module: cst.Module) -> cst.Module:
    """Insert `import torch` before the first module-level import from torch."""
    body = list(module.body)
    for index, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and any(
            isinstance(small, cst.ImportFrom) and small.module is not None
            and (dotted_name(small.module) or "").split(".")[0] == "torch"
            for small in statement.body
        ):
            new = cst.parse_statement("import torch\n", config=module.config_for_parsing)
            new = new.with_changes(leading_lines=statement.leading_lines)
            body[index] = statement.with_changes(leading_lines=[])
            body.insert(index, new)
            return module.with_changes(body=body)
    new = cst.parse_statement("import torch\n", config=module.config_for_parsing)
    index = _after_docstring_and_future_imports(body)
    if index == 0:
        return module.with_changes(body=[new] + body)
    return module.with_changes(body=body[:index] + [new] + body[index:])


def _after_docstring_and_future_imports(body) -> int:
    """`from __future__ import ...` must stay first (after the docstring): the index after them."""
    index = 0
    for position, statement in enumerate(body):
        if not isinstance(statement, cst.SimpleStatementLine):
            break
        small = statement.body[0]
        if position == 0 and isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
            index = 1
            continue
        if isinstance(small, cst.ImportFrom) and isinstance(small.module, cst.Name) and small.module.value == "__future__":
            index = position + 1
            continue
        break
    return index


def last_leading_import(module: cst.Module) -> Optional[cst.CSTNode]:
    """The last import statement of the module's opening run of imports."""
    last = None
    for index, statement in enumerate(module.body):
        if isinstance(statement, cst.SimpleStatementLine):
            if all(isinstance(item, (cst.Import, cst.ImportFrom)) for item in statement.body):
                last = statement
                continue
            if index == 0 and isinstance(statement.body[0], cst.Expr) and isinstance(
                statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)
            ):
                continue  # the module docstring
        if isinstance(statement, cst.Try) and last is not None:
            continue  # try: import x / except ImportError: ... among the imports
        if last is not None:
            break
    return last
