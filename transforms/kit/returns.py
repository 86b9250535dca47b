"""The return statements of one function (not those of the functions, classes and lambdas inside it)."""

from __future__ import annotations

from typing import List

import libcst as cst

from ampify.transforms.kit.fast_walk import walk


class _Returns(cst.CSTVisitor):
    """One class for every call: fast_walk looks its hooks up once per visitor class."""

    def __init__(self, function: cst.FunctionDef) -> None:
        super().__init__()
        self.function = function
        self.found: List[cst.Return] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.function

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        self.found.append(node)


def returns_of(function: cst.FunctionDef) -> List[cst.Return]:
    finder = _Returns(function)
    walk(function, finder)
    return finder.found
