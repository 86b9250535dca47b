"""TF1: the Session a caller in another module holds open while this module builds the optimizer.

openai/maddpg's layout: `maddpg/trainer/maddpg.py` builds `tf.train.AdamOptimizer(...)` in
`MADDPGAgentTrainer.__init__` and never names a Session (its `U.function` closures run the
default one); `experiments/train.py` does

    def train(arglist):
        with U.single_threaded_session():         # tf.Session(config=...) in tf_util.py
            ...
            trainers = get_trainers(env, ...)     # trainer = MADDPGAgentTrainer; trainer(...)

TF gives the graph rewrite only to Sessions created after `enable_mixed_precision_graph_rewrite`,
so that Session runs the whole graph in float32 while the wrapped optimizer scales the loss: the
conversion would say "changed" and change nothing. This module finds, in the source of a project
module that uses the builder (a class or function of the converted module), a use reached
inside a Session scope that already exists: a `with <...session...>(...):` block, or the statements
after `sess = <...session...>(...)` in the same body; through the functions of that module that
reach the use (`get_trainers()` called inside the `with`). Read with the standard library's
parser: the caller is read, never rewritten, here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

from ampify.transforms.kit.ast_names import own_nodes

#: how many functions of the caller's module a chain may pass through (use -> ... -> Session)
MAX_CHAIN = 4
#: callables whose name holds "session" but that create none
_NOT_SESSIONS = ("hook", "config", "args", "close", "reset", "creator", "manager", "runhook")


@dataclass(frozen=True)
class SessionBeforeUse:
    """A use of the builder (line `use_line`) reached while the Session created at
    `session_line` (`session_code`) is open; `chain` names the functions in between, innermost
    first (`["get_trainers"]`)."""

    use_line: int
    session_line: int
    session_code: str
    chain: Tuple[str, ...]


def is_session_call(node: ast.AST) -> bool:
    """`tf.Session(...)`, `tf.InteractiveSession()`, `U.single_threaded_session()`,
    `make_session(4)`, `tf.get_default_session()`, `sess.as_default()`..."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    lowered = name.lower()
    if lowered == "as_default":  # `with sess.as_default():`, not `with tf.Graph().as_default():`
        return isinstance(func, ast.Attribute) and "sess" in ast.unparse(func.value).lower()
    return "session" in lowered and not any(word in lowered for word in _NOT_SESSIONS)


def session_before_use(source: bytes, name: str) -> Optional[SessionBeforeUse]:
    """The first use of `name` in `source` reached inside a Session that exists already, or
    None (also when the source does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    functions = _functions(tree)
    for scope, body in [("", tree.body), *((fname, node.body) for fname, node in functions.items())]:
        for line in _uses(body, name):
            found = _open_session_at(body, line)
            if found is not None:
                return SessionBeforeUse(line, found[0], found[1], ())
            if scope:
                reached = _reached_in_session(tree, functions, scope, (), set())
                if reached is not None:
                    return SessionBeforeUse(line, reached[0], reached[1], reached[2])
    return None


def _functions(tree: ast.Module) -> Dict[str, ast.AST]:
    """Module-level functions and methods of module-level classes, by their plain name (the
    first definition wins)."""
    found: Dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.setdefault(item.name, item)
    return found


def _uses(body: Sequence[ast.stmt], name: str) -> Iterator[int]:
    """Lines where `name` (or `<module>.name`) is read in `body`, nested functions and classes
    excluded (they run when called)."""
    for statement in body:
        for node in own_nodes([statement]):
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
                yield node.lineno
            elif isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load):
                yield node.lineno


def _open_session_at(body: Sequence[ast.stmt], line: int) -> Optional[Tuple[int, str]]:
    """(line, code) of a Session open at `line` of this body: a `with` holding a Session call
    whose block holds the line, or `x = <session call>` in the same block before it."""
    for statement in body:
        start, end = statement.lineno, getattr(statement, "end_lineno", statement.lineno)
        if isinstance(statement, (ast.With, ast.AsyncWith)):
            session = next((item.context_expr for item in statement.items if is_session_call(item.context_expr)), None)
            if session is not None and start <= line <= end:
                return session.lineno, ast.unparse(session)
        if isinstance(statement, ast.Assign) and is_session_call(statement.value) and start < line:
            if _in_same_block(body, statement, line):
                return statement.lineno, ast.unparse(statement.value)
        if start <= line <= end and not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for inner in _blocks(statement):
                found = _open_session_at(inner, line)
                if found is not None:
                    return found
    return None


def _in_same_block(body: Sequence[ast.stmt], statement: ast.stmt, line: int) -> bool:
    """Is `line` within a statement of `body` that comes after `statement`?"""
    after = False
    for other in body:
        if other is statement:
            after = True
            continue
        if after and other.lineno <= line <= getattr(other, "end_lineno", other.lineno):
            return True
    return False


def _blocks(statement: ast.stmt) -> List[List[ast.stmt]]:
    blocks = []
    for field in ("body", "orelse", "finalbody"):
        value = getattr(statement, field, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            blocks.append(value)
    for handler in getattr(statement, "handlers", []) or []:
        blocks.append(handler.body)
    for case in getattr(statement, "cases", []) or []:
        blocks.append(case.body)
    return blocks


def _reached_in_session(tree: ast.Module, functions: Dict[str, ast.AST], function: str, chain: Tuple[str, ...],
                        seen: Set[str]) -> Optional[Tuple[int, str, Tuple[str, ...]]]:
    """A call of `function` (plain or `self.`/`obj.` attribute) made inside an open Session,
    in the module body or in a function that is itself reached so (MAX_CHAIN deep)."""
    if function in seen or len(chain) >= MAX_CHAIN:
        return None
    seen.add(function)
    chain = (*chain, function)
    for scope, body in [("", tree.body), *((name, node.body) for name, node in functions.items())]:
        if scope == function:
            continue
        for line in _calls(body, function):
            found = _open_session_at(body, line)
            if found is not None:
                return found[0], found[1], chain
            if scope:
                deeper = _reached_in_session(tree, functions, scope, chain, seen)
                if deeper is not None:
                    return deeper
    return None


def _calls(body: Sequence[ast.stmt], function: str) -> Iterator[int]:
    for statement in body:
        for node in own_nodes([statement]):
            if isinstance(node, ast.Call):
                func = node.func
                if (isinstance(func, ast.Name) and func.id == function) or (
                        isinstance(func, ast.Attribute) and func.attr == function):
                    yield node.lineno
