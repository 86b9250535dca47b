"""Module-level edits for the TF1 graph rewrite: the wrapper's spelling, its import, the env var.

The wrapper must resolve for the script's own import style on the TF version it runs on:
`tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite` exists on TF 1.14/1.15
and 2.x, while `tf.train.experimental...` is gone from TF2's v2 API. So the spelling goes
through whatever module-level alias the script binds to `tensorflow` or `tensorflow.compat.v1`
(see WRAPPER_PATH_FROM_MODULE), and adds `import tensorflow as tf` only when it binds neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.helpers import get_full_name_for_node

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.tf1.names import IGNORE_PERFORMANCE_ENV, WRAPPER_PATH_FROM_MODULE

_ADDED_ALIAS_CANDIDATES = ("tf", "tensorflow", "_tf", "_ampify_tf")


@dataclass
class WrapperSpelling:
    """How to call the wrapper, and the import to add for it (None: the script has one)."""

    callee: str
    added_import: Optional[str] = None


class _ModuleLevelImports(cst.CSTVisitor):
    """Imports bound at module level (also inside top-level if/try/with), not in defs/classes."""

    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Import(self, node: cst.Import) -> None:
        self.aliases.update(import_aliases(node))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.aliases.update(import_aliases(node))


def import_aliases(node) -> Dict[str, str]:
    """Local name -> module path bound by one `import` / `from ... import` statement."""
    aliases: Dict[str, str] = {}
    if isinstance(node, cst.Import):
        for alias in node.names:
            full = get_full_name_for_node(alias.name)
            if not full:
                continue
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                aliases[alias.asname.name.value] = full
            else:
                head = full.split(".")[0]
                aliases.setdefault(head, head)
        return aliases
    if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
        return aliases
    module = get_full_name_for_node(node.module)
    for alias in node.names:
        name = get_full_name_for_node(alias.name)
        if not (module and name):
            continue
        local = name
        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
            local = alias.asname.name.value
        aliases[local] = f"{module}.{name}"
    return aliases


def wrapper_callee_for(aliases: Dict[str, str]) -> Optional[str]:
    """The wrapper spelled through one of these aliases, or None when none reaches it."""
    for target, path in WRAPPER_PATH_FROM_MODULE:
        for local in sorted(aliases):
            if aliases[local] == target:
                return f"{local}.{path}"
    return None


class _BoundNames(cst.CSTVisitor):
    """Every name the module binds anywhere (assignments, imports, defs, params, loops)."""

    def __init__(self) -> None:
        self.names: Set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        # Reading or binding, a name already in use is not free for an added import.
        self.names.add(node.value)


def module_level_aliases(module: cst.Module) -> Dict[str, str]:
    """Local name -> module path, for imports bound at module level."""
    collector = _ModuleLevelImports()
    walk(module, collector)
    return collector.aliases


def choose_wrapper_spelling(module: cst.Module) -> WrapperSpelling:
    """The wrapper's callee text for this module, adding `import tensorflow as X` if needed."""
    callee = wrapper_callee_for(module_level_aliases(module))
    if callee is not None:
        return WrapperSpelling(callee)
    used = _BoundNames()
    walk(module, used)
    for candidate in _ADDED_ALIAS_CANDIDATES:
        if candidate not in used.names:
            break
    path = WRAPPER_PATH_FROM_MODULE[0][1]
    if candidate == "tensorflow":
        return WrapperSpelling(f"tensorflow.{path}", "import tensorflow")
    return WrapperSpelling(f"{candidate}.{path}", f"import tensorflow as {candidate}")


def _imports_tensorflow(statement: cst.CSTNode) -> bool:
    """Does this module-level statement (or a block directly in it) import tensorflow?"""
    finder = _TensorFlowImportFinder()
    walk(statement, finder)
    return finder.found


class _TensorFlowImportFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = get_full_name_for_node(alias.name) or ""
            if name == "tensorflow" or name.startswith("tensorflow."):
                self.found = True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            return
        name = get_full_name_for_node(node.module) or ""
        if name == "tensorflow" or name.startswith("tensorflow."):
            self.found = True


def _is_docstring_or_future(statement: cst.CSTNode, index: int) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if (
            isinstance(small, cst.ImportFrom)
            and small.module is not None
            and get_full_name_for_node(small.module) == "__future__"
        ):
            continue
        if index == 0 and isinstance(small, cst.Expr) and isinstance(small.value, cst.BaseString):
            continue
        return False
    return True


def _imports_os_module(statement: cst.CSTNode) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        if isinstance(small, cst.Import):
            for alias in small.names:
                if get_full_name_for_node(alias.name) == "os" and alias.asname is None:
                    return True
    return False


def insertion_index(body: Sequence[cst.CSTNode]) -> Tuple[int, bool]:
    """Where the env var goes: before the first statement importing tensorflow.

    Returns (index, found): found is False when TF is only imported inside functions, and the
    index is then just after the module docstring and `from __future__` imports.
    """
    for index, statement in enumerate(body):
        if _imports_tensorflow(statement):
            return index, True
    index = 0
    while index < len(body) and _is_docstring_or_future(body[index], index):
        index += 1
    return index, False


def add_header_statements(
    module: cst.Module, *, set_env_var: bool, added_import: Optional[str],
    environment: Sequence[Tuple[str, str]] = (),
) -> Tuple[cst.Module, int]:
    """Insert `import os`, the env var (and the `environment` ones) and the wrapper's import before
    the first TF import.

    Returns the new module and the index where the statements went. Comments and blank lines
    above the first TF import move above the inserted statements, so a header block stays put;
    without a module-level TF import they go right after the docstring / __future__ imports.
    """
    body = list(module.body)
    index, before_tf_import = insertion_index(body)
    new_lines: List[str] = []
    variables = ([(IGNORE_PERFORMANCE_ENV, "1")] if set_env_var else []) + list(environment)
    if variables:
        if not any(_imports_os_module(statement) for statement in body[:index]):
            new_lines.append("import os")
        new_lines += [f'os.environ.setdefault("{name}", "{value}")' for name, value in variables]
    if added_import:
        new_lines.append(added_import)
    if not new_lines:
        return module, index
    statements = [cst.parse_statement(line + "\n") for line in new_lines]
    if index < len(body) and before_tf_import:
        anchor = body[index]
        leading = getattr(anchor, "leading_lines", ())
        if leading:
            statements[0] = statements[0].with_changes(leading_lines=leading)
            body[index] = anchor.with_changes(leading_lines=())
    body[index:index] = statements
    return module.with_changes(body=body), index
