"""The cheap read-only walk and the cheap positions give exactly what LibCST's own give.

Every analysis now walks with `fast_walk.walk` instead of `module.visit`, and asks
`positions.Positions` instead of `PositionProvider`, so any difference would change findings
or rewrites: both are compared node by node on the fixtures and on real installed code.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import List

import libcst as cst
import pytest
from libcst.metadata import PositionProvider

from ampify.transforms.kit.fast_walk import iter_tree, walk
from ampify.transforms.kit.positions import Positions, remembered_sources
from installed_trees import compiles, installed_files

REPO = Path(__file__).resolve().parent.parent

#: nodes that hold only layout (whitespace, comments, punctuation, operator tokens): the fast
#: walk does not enter them, and no analysis looks at them
LAYOUT_TYPES = (
    cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline,
    cst.Comment, cst.LeftParen, cst.RightParen, cst.Comma, cst.Semicolon, cst.Colon, cst.Dot,
    cst.AssignEqual, cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp,
    cst.BaseAugOp, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
    cst.RightCurlyBrace, cst.ImportStar, cst.ParenthesizedWhitespace, cst.SimpleWhitespace,
)


def real_files(package: str, count: int) -> List[Path]:
    return installed_files(package, lambda p: 2_000 < p.stat().st_size < 40_000, count)


#: the fixtures this Python compiles (the PyTorch 0.3 one, `.cuda(async=True)`, is renamed before any walk)
CORPUS = sorted(p for p in (REPO / "fixtures").rglob("*.py") if compiles(p)) + real_files("torch", 12) \
    + real_files("tensorflow", 12)


class _Order(cst.CSTVisitor):
    def __init__(self) -> None:
        self.entered: List[cst.CSTNode] = []
        self.left: List[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if not isinstance(node, LAYOUT_TYPES):
            self.entered.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if not isinstance(original_node, LAYOUT_TYPES):
            self.left.append(original_node)


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_walk_visits_the_code_nodes_in_libcst_order(path):
    module = cst.parse_module(path.read_bytes())
    libcst_order, fast_order = _Order(), _Order()
    module.visit(libcst_order)
    walk(module, fast_order)
    assert [id(n) for n in fast_order.entered] == [id(n) for n in libcst_order.entered]
    assert [id(n) for n in fast_order.left] == [id(n) for n in libcst_order.left]
    assert [id(n) for n in iter_tree(module) if not isinstance(n, LAYOUT_TYPES)] == [
        id(n) for n in libcst_order.entered
    ]


def test_a_false_from_visit_skips_the_children():
    class SkipFunctions(cst.CSTVisitor):
        def __init__(self) -> None:
            self.names: List[str] = []

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_Name(self, node: cst.Name) -> None:
            self.names.append(node.value)

    visitor = SkipFunctions()
    walk(cst.parse_module("a = b\ndef f(x):\n    return y\nc = d\n"), visitor)
    assert visitor.names == ["a", "b", "c", "d"]


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_positions_equal_libcst_position_provider(path):
    module = cst.parse_module(path.read_bytes())
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(module)
    mismatched = [node for node, code_range in expected.items() if positions[node] != code_range]
    assert not mismatched, f"{len(mismatched)} nodes differ, first: {mismatched[0]!r:.200}"


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_positions_count_every_newline_form(newline):
    source = newline.join(["import torch", "", "def f(x,", "      y):", '    s = """a', 'b"""', "    return x  # c", ""])
    module = cst.parse_module(source)
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(module)
    for node, code_range in expected.items():
        assert positions[node] == code_range
    function = module.body[1]
    assert positions[function].start.line == 3
    assert positions[function.body.body[1]].start.line == 7


def test_a_node_from_another_tree_has_no_position():
    positions = Positions(cst.parse_module("x = 1\n"))
    assert positions.get(cst.Name("x")) is None


@pytest.mark.parametrize("path", CORPUS[-6:], ids=lambda p: p.name)
def test_positions_asked_in_any_order_are_right(path):
    """The first lookups stop the code generation early; later ones run it through: every
    answer is still PositionProvider's, whatever the order of the questions."""
    module = cst.parse_module(path.read_bytes())
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes = list(expected)
    order = sorted(range(len(nodes)), key=lambda i: zlib.crc32(str(i).encode()))
    positions = Positions(module)
    for index in order[:50] + order:
        assert positions[nodes[index]] == expected[nodes[index]]


# -- lookups from the statements' lines (the engine hands the stdlib tree it screened with) ------

#: statements of every kind, nested, on one line and over several, in odd layouts
ODD_LAYOUTS = '''\
import os, sys; x = 1
@decorator(
    arg)
# a comment between the decorator and the function
async def f(a,
            b):
    async with a as c, b:
        if a: return b
        elif b:
            pass
        elif c: x = [1,
                     2]; y = 3
        else:
            async for i in c: await i
    try:
        y = """two
lines"""
    except (A,
            B) as e:
        raise
    except C: pass
    else:
        z = \\
            4
    finally:
        del z
class K(object):

\tdef m(self):
\t\twhile True:
\t\t\tbreak
\t\telse: return 1
match x:
    case [1, 2]:
        pass
    case {"a": b, **rest} if b:
        y = b
def g():
    global x
    with (open(a) as f,
          open(b) as h):
        lambda q: q
x: int = 1
'''


def _remembered_lookups_agree(source) -> None:
    module = cst.parse_module(source)
    expected = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes = list(expected)
    order = sorted(range(len(nodes)), key=lambda i: zlib.crc32(str(i).encode()))
    code_nodes = [nodes[i] for i in order if not isinstance(nodes[i], LAYOUT_TYPES + (cst.Module,))]
    with remembered_sources() as remember:
        remember(module, source)
        positions = Positions(module)
        assert positions._shared.knows_statement_lines()
        wrong = [node for node in code_nodes if positions[node] != expected[node]]
        assert not wrong, f"{len(wrong)} nodes differ, first: {wrong[0]!r:.200}"
        # every code node's answer came from its statement's own code, not the module's
        assert not positions._shared.complete and positions._shared.partial_runs == 0
        # layout nodes (which no analysis asks about) fall back to the module's code
        wrong = [nodes[i] for i in order if positions[nodes[i]] != expected[nodes[i]]]
        assert not wrong, f"{len(wrong)} nodes differ, first: {wrong[0]!r:.200}"


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_lookups_from_statement_lines_in_odd_layouts(newline):
    _remembered_lookups_agree(ODD_LAYOUTS.replace("\n", newline).encode())


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_lookups_from_statement_lines_equal_libcst_position_provider(path):
    """Asked in any order, each lookup generating only the statement that holds its node,
    started at the line the stdlib parse gives: PositionProvider's answer for every node."""
    _remembered_lookups_agree(path.read_bytes())


def test_positions_of_one_module_share_their_ranges_while_remembered():
    module = cst.parse_module("a = 1\nb = 2\n")
    with remembered_sources() as remember:
        remember(module, module.code)
        first, second = Positions(module), Positions(module)
        assert first[module.body[1]].start.line == 2
        assert second._shared is first._shared
    assert Positions(module)._shared is not first._shared  # forgotten after the block


def test_source_the_stdlib_parser_cannot_read_falls_back_to_the_module_code():
    module = cst.parse_module("x = 1\ny = 2\n")
    with remembered_sources() as remember:
        remember(module, "this is not python (\n")
        positions = Positions(module)
        assert not positions._shared.knows_statement_lines()
        assert positions[module.body[1]].start.line == 2
