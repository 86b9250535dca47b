"""Dotted names, and a body's own nodes, in the stdlib `ast` trees the repository outline and the
syntax-tree checks read (the LibCST side has kit/imports.py's `dotted_name`)."""

from __future__ import annotations

import ast
from typing import Iterator, Optional, Sequence


def ast_dotted(node: ast.AST) -> Optional[str]:
    """`torch.autograd.Function` for that Name/Attribute chain; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = ast_dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def own_nodes(statements: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """The nodes of `statements` and below, not those of the functions, classes and lambdas
    defined in them (they run when called, not there)."""
    pending = list(statements)
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                pending.append(child)
