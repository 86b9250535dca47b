"""A class that creates its own Session when none is handed in, after building its graph.

MorvanZhou's DQN agents (and many RL classes like them) take `sess=None`:

    class DuelingDQNPrioritizedReplay:
        def __init__(self, n_actions, ..., sess=None):
            ...
            self._build_net()                 # builds and minimizes the optimizer
            if sess is None:
                self.sess = tf.Session()      # created after the optimizer is wrapped
                self.sess.run(tf.global_variables_initializer())
            else:
                self.sess = sess

A caller that hands no Session in (`RL = DuelingDQNPrioritizedReplay(n_actions=N_A, ...)`)
trains in the class's own Session, created after the optimizer is wrapped: it gets the graph
rewrite, and the "Session created before the optimizer" warning would be a false alarm. Only a
caller that passes one needs its Session's config turned on (session_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Set

import libcst as cst
from libcst.metadata import PositionProvider

from ampify.transforms.kit.calls import calls_within
from ampify.transforms.kit.imports import dotted_name

#: Session constructors, as TF1 code spells them
_SESSION_CONSTRUCTORS = ("Session", "InteractiveSession")


@dataclass(frozen=True)
class OwnSessionFallback:
    """`__init__(..., sess=None)` creating its own Session after the optimizer's method ran."""

    klass: str
    parameter: str
    #: the parameter's position among the positional arguments of a call of the class (self
    #: not counted); None when it is keyword-only
    position: Optional[int]


def own_session_fallback(module: cst.Module, klass_name: str, builder: str, parameter: str) -> Optional[OwnSessionFallback]:
    """The fallback above, for the module-level class `klass_name` whose method `builder` builds
    the optimizer and whose `__init__` takes the Session as `parameter`; None when the shape is
    not exactly that (the parameter has no None default, the own Session is created before the
    builder runs, or under another test)."""
    klass = next((s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == klass_name), None)
    if klass is None or not isinstance(klass.body, cst.IndentedBlock):
        return None
    methods = {s.name.value: s for s in klass.body.body if isinstance(s, cst.FunctionDef)}
    init = methods.get("__init__")
    if init is None or not isinstance(init.body, cst.IndentedBlock):
        return None
    positional = [*init.params.posonly_params, *init.params.params]
    param = next((p for p in [*positional, *init.params.kwonly_params] if p.name.value == parameter), None)
    if param is None or not (isinstance(param.default, cst.Name) and param.default.value == "None"):
        return None
    position = positional.index(param) - 1 if param in positional else None
    builder_ran = False
    for statement in init.body.body:
        if _creates_own_session_when_none(statement, parameter):
            return OwnSessionFallback(klass_name, parameter, position) if builder_ran else None
        if builder in _methods_reached(statement, methods):
            builder_ran = True
    return None


def passes_session(call: cst.Call, fallback: OwnSessionFallback) -> bool:
    """Does this call of the class hand it a Session (or may it: `*args`, `**kwargs`)?"""
    positional = 0
    for arg in call.args:
        if arg.star:
            return True
        if arg.keyword is not None:
            if arg.keyword.value == fallback.parameter:
                return not (isinstance(arg.value, cst.Name) and arg.value.value == "None")
            continue
        positional += 1
    return fallback.position is not None and positional > fallback.position


def calls_of_class(module: cst.Module, klass_name: str) -> List[cst.Call]:
    """Calls of `klass_name` (or `<module>.klass_name`) in a module."""
    found: List[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            name = dotted_name(node.func) or ""
            if name == klass_name or name.endswith("." + klass_name):
                found.append(node)

    module.visit(_Calls())
    return found


def call_at(source: bytes, line: int, column: int) -> Optional[cst.Call]:
    """The call that starts at line:column of a module's source; None when it does not parse or
    no call starts there."""
    try:
        wrapper = cst.MetadataWrapper(cst.parse_module(source))
    except Exception:
        return None
    positions = wrapper.resolve(PositionProvider)
    for node, position in positions.items():
        if isinstance(node, cst.Call) and position.start.line == line and position.start.column == column:
            return node
    return None


def _creates_own_session_when_none(statement: cst.CSTNode, parameter: str) -> bool:
    """`if sess is None: self.sess = tf.Session(...)` (an else may take the one handed in)."""
    if not isinstance(statement, cst.If):
        return False
    test = statement.test
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Is)
            and dotted_name(test.left) == parameter
            and isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"):
        return False
    return any(_is_session_constructor(call) for call in calls_within(statement.body))


def _is_session_constructor(call: cst.Call) -> bool:
    name = dotted_name(call.func) or ""
    return name.rsplit(".", 1)[-1] in _SESSION_CONSTRUCTORS and (name.startswith("tf.") or "." not in name
                                                                 or name.startswith("tensorflow."))


def _methods_reached(statement: cst.CSTNode, methods: dict) -> Set[str]:
    """Methods of the class a statement calls as `self.<m>(...)`, and those they call in turn."""
    reached: Set[str] = set()
    pending = [statement]
    while pending:
        node = pending.pop()
        for call in calls_within(node):
            name = dotted_name(call.func) or ""
            if name.startswith("self.") and name.count(".") == 1:
                method = name.split(".", 1)[1]
                if method in methods and method not in reached:
                    reached.add(method)
                    pending.append(methods[method])
    return reached
