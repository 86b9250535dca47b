"""Line and column of every node, the same as LibCST's `PositionProvider`, for a fraction of the cost.

`PositionProvider` generates the module's code once and records a range per node, but it
splits every token with a regex, builds two position objects per node and enters a
generator-based context manager for every statement and expression: on big files that costs
three parses. This module runs the same code generation with a cheaper state (newline counts
instead of regex splits, plain tuples, a slotted context manager) and builds `CodeRange`
objects only for the nodes a transform asks about. `tests/test_fast_walk_positions.py` checks
that every node gets exactly what `PositionProvider` gives it.

It is computed on first use, so a transform that finds nothing to report never pays for it.
While the engine converts a file it also knows the file's stdlib `ast` tree (the screen parsed
it before LibCST did), which gives the line of every statement: a lookup then generates the
code of the one statement that holds the node, started at that line, instead of the module up
to the node (`remembered_sources`). Without it, the first lookups stop generating code at the
node asked for, and the third runs through the module.
"""

from __future__ import annotations

import ast
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

from ampify.transforms.kit.fast_walk import code_children

_Range = Tuple[int, int, int, int]  # start line, start column, end line, end column


class Positions:
    """`positions[node]` -> CodeRange, as `MetadataWrapper.resolve(PositionProvider)[node]`.

    Every `Positions` of a module remembered by `remembered_sources` shares one table, so the
    transforms of one file pay for each range once."""

    #: code generations stopped at an asked-for node before one runs to the end
    PARTIAL_RUNS = 2

    def __init__(self, module: cst.Module) -> None:
        known = _KNOWN.get(id(module))
        self._shared = known if known is not None and known.module is module else _ModuleRanges(module, None)

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        shared = self._shared
        key = id(node)
        found = shared.ranges.get(key)
        if found is None and not shared.complete:
            if not shared.generate_statement_of(node):
                shared.generate(stop_at=key if shared.partial_runs < self.PARTIAL_RUNS else None)
            found = shared.ranges.get(key)
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
        """Make lookups cheap for a caller about to ask about several nodes spread over the
        module. With the statements' lines known, each lookup already generates only its own
        statement; otherwise every range is generated now, in one pass (each partial run would
        regenerate the code before its node)."""
        shared = self._shared
        if not shared.complete and not shared.knows_statement_lines():
            shared.generate(stop_at=None)
        return self


#: id(module) -> its shared table, for the modules `remembered_sources` holds (the module is
#: kept alive by the entry, so its id cannot be reused while the entry exists)
_KNOWN: Dict[int, "_ModuleRanges"] = {}


@contextmanager
def remembered_sources() -> Iterator[Callable[..., None]]:
    """`with remembered_sources() as remember: remember(module, source, tree)`: inside the
    block, `Positions(module)` shares one table per module and finds a node's line from the
    statement lines of `source`'s stdlib parse (`tree`, or parsed on first need)."""
    remembered: List[int] = []

    def remember(module: cst.Module, source: Union[str, bytes], tree: Optional[ast.Module] = None) -> None:
        _KNOWN[id(module)] = _ModuleRanges(module, source, tree)
        remembered.append(id(module))

    try:
        yield remember
    finally:
        for key in remembered:
            _KNOWN.pop(key, None)


class _ModuleRanges:
    """The ranges known so far of one module, and how to find more."""

    def __init__(self, module: cst.Module, source: Union[str, bytes, None], tree: Optional[ast.Module] = None) -> None:
        self.module = module
        self.ranges: Dict[int, _Range] = {}
        self.complete = False
        self.partial_runs = 0
        self._source = source
        self._tree = tree
        #: id(statement) -> its line, for the statements a lookup can start from; None: unknown
        self._statement_lines: Optional[Dict[int, int]] = None
        #: id(node) -> (the innermost such statement holding it, that statement's indentation, is it an elif)
        self._anchors: Optional[Dict[int, Tuple[cst.CSTNode, Tuple[str, ...], bool]]] = None
        self._indexed = source is None

    def knows_statement_lines(self) -> bool:
        self._index()
        return self._statement_lines is not None

    def generate(self, stop_at: Optional[int]) -> None:
        """Generate the module's code, recording ranges; with `stop_at`, stop once that node's
        range is known (a file's one finding near the top costs a fraction of the module)."""
        module = self.module
        state = _RangeRecordingState(module.default_indent, module.default_newline, self.ranges, stop_at)
        try:
            module._codegen(state)
        except _Reached:
            self.partial_runs += 1
            return
        self.complete = True

    def generate_statement_of(self, node: cst.CSTNode) -> bool:
        """Record the ranges of the statement holding `node` (up to the node), generated from the
        statement's own line; False when that line is not known (then generate the module)."""
        self._index()
        if self._anchors is None:
            return False
        found = self._anchors.get(id(node))
        if found is None:
            return False
        statement, indents, is_elif = found
        module = self.module
        local: Dict[int, _Range] = {}
        state = _RangeRecordingState(module.default_indent, module.default_newline, local, id(node), anchor=id(statement))
        state.indent_tokens = list(indents)
        try:
            if is_elif:
                statement._codegen(state, is_elif=True)
            else:
                statement._codegen(state)
        except _Reached:
            pass
        if state.anchor_line is None:
            return False
        shift = self._statement_lines[id(statement)] - state.anchor_line
        ranges = self.ranges
        for key, (start_line, start_column, end_line, end_column) in local.items():
            if key not in ranges:
                ranges[key] = (start_line + shift, start_column, end_line + shift, end_column)
        return id(node) in ranges

    def _index(self) -> None:
        if self._indexed:
            return
        self._indexed = True
        tree = self._tree
        if tree is None:
            try:
                tree = ast.parse(self._source)
            except Exception:  # noqa: BLE001 - syntax this interpreter does not read: generate the module
                return
        self._source = self._tree = None
        lines = statement_lines(self.module, tree)
        if lines is None:
            return
        self._statement_lines = lines
        self._anchors = _anchors(self.module, lines)


#: LibCST statement class -> the stdlib `ast` classes it may be (by name)
_AST_NAMES = {
    "Del": ("Delete",), "For": ("For", "AsyncFor"), "With": ("With", "AsyncWith"),
    "FunctionDef": ("FunctionDef", "AsyncFunctionDef"),
}


def statement_lines(module: cst.Module, tree: ast.Module) -> Optional[Dict[int, int]]:
    """id(statement) -> its first line, for every statement that sits in a block (a simple
    statement line, a compound statement) and every `elif`; from the stdlib parse of the same
    source, whose statements come in the same order. None when the two trees disagree."""
    ours: List[Tuple[Optional[cst.CSTNode], str]] = []
    _libcst_statements(module.body, ours)
    theirs: List[ast.stmt] = []
    _ast_statements(tree.body, theirs)
    if len(ours) != len(theirs):
        return None
    lines: Dict[int, int] = {}
    for (node, kind), statement in zip(ours, theirs):
        if type(statement).__name__ not in _AST_NAMES.get(kind, (kind,)):
            return None
        if node is not None:
            lines[id(node)] = statement.lineno
    return lines


def _libcst_statements(body, out: List[Tuple[Optional[cst.CSTNode], str]]) -> None:
    """The statements of `body` and of the blocks inside them, in source order: each small
    statement (with the line holding it, for the first of a line), each compound statement."""
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            for index, small in enumerate(statement.body):
                out.append((statement if index == 0 else None, type(small).__name__))
        elif isinstance(statement, cst.BaseSmallStatement):  # in a one-line suite: `if x: return y`
            out.append((None, type(statement).__name__))
        else:
            out.append((statement, type(statement).__name__))
            for block in _blocks_of(statement):
                _libcst_statements(block, out)


def _blocks_of(statement: cst.CSTNode) -> Iterator:
    """The statement lists inside a compound statement, in source order (an `elif` is a
    statement of its own, as in the stdlib tree)."""
    if isinstance(statement, cst.Match):
        for case in statement.cases:
            yield case.body.body
        return
    yield statement.body.body
    for handler in getattr(statement, "handlers", ()):
        yield handler.body.body
    orelse = getattr(statement, "orelse", None)
    if isinstance(orelse, cst.If):
        yield [orelse]
    elif orelse is not None:
        yield orelse.body.body
    finalbody = getattr(statement, "finalbody", None)
    if finalbody is not None:
        yield finalbody.body.body


def _ast_statements(body: List[ast.stmt], out: List[ast.stmt]) -> None:
    for statement in body:
        out.append(statement)
        for name in statement._fields:
            value = getattr(statement, name)
            if not isinstance(value, list):
                continue
            for item in value:
                if isinstance(item, ast.stmt):
                    _ast_statements([item], out)
                elif isinstance(item, (ast.excepthandler, ast.match_case)):
                    _ast_statements(item.body, out)


def _anchors(module: cst.Module, lines: Dict[int, int]) -> Dict[int, Tuple[cst.CSTNode, Tuple[str, ...], bool]]:
    """id(node) -> the innermost statement with a known line that holds it (the node itself
    for such a statement), the indentation its code starts with, and whether it is an elif."""
    anchors: Dict[int, Tuple[cst.CSTNode, Tuple[str, ...], bool]] = {}
    default = module.default_indent
    indenting = (cst.IndentedBlock, cst.Match)
    stack: List[Tuple[cst.CSTNode, Optional[Tuple[cst.CSTNode, Tuple[str, ...], bool]], Tuple[str, ...]]] = [
        (module, None, ())
    ]
    pop, push = stack.pop, stack.append
    while stack:
        node, anchor, indents = pop()
        if isinstance(node, indenting):
            indents = indents + (default if node.indent is None else node.indent,)
        for child in code_children(node):
            key = id(child)
            if key in lines:
                is_elif = child.__class__ is cst.If and node.__class__ is cst.If and node.orelse is child
                child_anchor = (child, indents, is_elif)
            else:
                child_anchor = anchor
            if child_anchor is not None:
                anchors[key] = child_anchor
            push((child, child_anchor, indents))
    return anchors


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
        state = self.state
        self.line = state.line
        self.column = state.column
        if id(self.node) == state.anchor:
            state.anchor_line = state.line

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

    def __init__(
        self, default_indent: str, default_newline: str, ranges: Dict[int, _Range], stop_at: Optional[int],
        anchor: Optional[int] = None,
    ) -> None:
        super().__init__(default_indent=default_indent, default_newline=default_newline)
        self.line = 1
        self.column = 0
        self.ranges = ranges
        self.stop_at = stop_at
        #: a statement generated on its own: its syntactic start line, once generated (its true
        #: line minus that is the shift of every range recorded)
        self.anchor = anchor
        self.anchor_line: Optional[int] = None
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
        if key == self.stop_at and (self.anchor is None or self.anchor_line is not None):
            raise _Reached

    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> _SyntacticRange:
        return _SyntacticRange(self, node, start_node, end_node)
