"""Dotted names in the stdlib `ast` trees the repository outline and the syntax-tree checks read
(the LibCST side has kit/imports.py's `dotted_name`)."""

from __future__ import annotations

import ast
from typing import Optional


def ast_dotted(node: ast.AST) -> Optional[str]:
    """`torch.autograd.Function` for that Name/Attribute chain; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = ast_dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None
