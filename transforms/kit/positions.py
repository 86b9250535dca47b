"""Line and column of every node, the same as LibCST's `PositionProvider`, for a third of the cost.

`PositionProvider` generates the module's code once and records a range per node, but it
splits every token with a regex, builds two position objects per node and enters a
generator-based context manager for every statement and expression: on big files that costs
three parses. This module runs the same code generation with a cheaper state (newline counts
instead of regex splits, plain tuples, a slotted context manager) and builds `CodeRange`
objects only for the nodes a transform asks about. `tests/test_fast_walk_positions.py` checks
that every node gets exactly what `PositionProvider` gives it.

It is computed on first use, so a transform that finds nothing to report never pays for it, and
the first lookups stop generating code at the node asked for.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

_Range = Tuple[int, int, int, int]  # start line, start column, end line, end column


class Positions:
    """`positions[node]` -> CodeRange, as `MetadataWrapper.resolve(PositionProvider)[node]`."""

    #: code generations stopped at an asked-for node before one runs to the end
    PARTIAL_RUNS = 2

    def __init__(self, module: cst.Module) -> None:
        self._module = module
        self._ranges: Dict[int, _Range] = {}
        self._complete = False
        self._partial_runs = 0

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        key = id(node)
        found = self._ranges.get(key)
        if found is None and not self._complete:
            self._generate(stop_at=key if self._partial_runs < self.PARTIAL_RUNS else None)
            found = self._ranges.get(key)
        if found is None:
            raise KeyError(node)
        start_line, start_column, end_line, end_column = found
        return CodeRange(CodePosition(start_line, start_column), CodePosition(end_line, end_column))

    def get(self, node: cst.CSTNode, default=None):
        try:
            return self[node]
        except KeyError:
            return default

    def compute_all(self) -> "Positions":
        """Generate every range now: one pass, for a caller about to ask about several nodes
        spread over the module (each partial run would regenerate the code before its node)."""
        if not self._complete:
            self._generate(stop_at=None)
        return self

    def _generate(self, stop_at: Optional[int]) -> None:
        """Generate the module's code, recording ranges; with `stop_at`, stop once that node's
        range is known (a file's one finding near the top costs a fraction of the module)."""
        module = self._module
        state = _RangeRecordingState(module.default_indent, module.default_newline, self._ranges, stop_at)
        try:
            module._codegen(state)
        except _Reached:
            self._partial_runs += 1
            return
        self._complete = True


class _Reached(Exception):
    """The asked-for node's range is recorded: stop generating code."""


class _SyntacticRange:
    """What `record_syntactic_position` returns: a context manager without a generator."""

    __slots__ = ("state", "node", "start_node", "end_node", "line", "column")

    def __init__(self, state: "_RangeRecordingState", node, start_node, end_node) -> None:
        self.state = state
        self.node = node
        self.start_node = start_node
        self.end_node = end_node

    def __enter__(self) -> None:
        self.line = self.state.line
        self.column = self.state.column

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if exc_type is not None:
            return  # stopped early: this node's range is not complete
        state = self.state
        ranges = state.ranges
        if self.start_node is not None:
            start_line, start_column = ranges[id(self.start_node)][:2]
        else:
            start_line, start_column = self.line, self.column
        if self.end_node is not None:
            end_line, end_column = ranges[id(self.end_node)][2:]
        else:
            end_line, end_column = state.line, state.column
        ranges[id(self.node)] = (start_line, start_column, end_line, end_column)


class _RangeRecordingState(CodegenState):
    """PositionProvidingCodegenState's bookkeeping, done cheaply."""

    def __init__(self, default_indent: str, default_newline: str, ranges: Dict[int, _Range], stop_at: Optional[int]) -> None:
        super().__init__(default_indent=default_indent, default_newline=default_newline)
        self.line = 1
        self.column = 0
        self.ranges = ranges
        self.stop_at = stop_at
        self._starts: List[Tuple[int, int]] = []

    def add_indent_tokens(self) -> None:
        self.tokens.extend(self.indent_tokens)
        for token in self.indent_tokens:
            self._advance(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self._advance(value)

    def _advance(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        # the newline forms LibCST's NEWLINE_RE knows: \r\n, \n and a lone \r
        lines = value.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        self.line += len(lines) - 1
        self.column = len(lines[-1])

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start_line, start_column = self._starts.pop()
        key = id(node)
        if key not in self.ranges:  # a syntactic range, recorded inside, wins
            self.ranges[key] = (start_line, start_column, self.line, self.column)
        if key == self.stop_at:
            raise _Reached

    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> _SyntacticRange:
        return _SyntacticRange(self, node, start_node, end_node)
