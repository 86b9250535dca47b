"""The return statements of one function (not those of the functions, classes and lambdas inside it)."""

from __future__ import annotations

from typing import List

import libcst as cst


def returns_of(function: cst.FunctionDef) -> List[cst.Return]:
    found: List[cst.Return] = []

    class _Find(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

    function.visit(_Find())
    return found
