"""TF1: the Session is created in another module before this one builds the optimizer.

DCGAN-tensorflow's layout: `main.py` opens `with tf.Session(config=run_config) as sess:` and
builds `DCGAN(sess, ...)`, whose `train()` (in `model.py`) builds and wraps the optimizers. TF turns
the graph rewrite on only for Sessions created after `enable_mixed_precision_graph_rewrite`, so
that Session would run everything in float32 while the loss is scaled. The caller's Session
config gets the rewrite itself, as TF would have set it:

    run_config = tf.ConfigProto()
    run_config.gpu_options.allow_growth = True
  + run_config.graph_options.rewrite_options.auto_mixed_precision = rewriter_config_pb2.RewriterConfig.ON
    with tf.Session(config=run_config) as sess:
        dcgan = DCGAN(sess, ...)

(`from tensorflow.core.protobuf import rewriter_config_pb2` is added with the imports.) The
optimizers stay wrapped in this module (their loss scaling), and both modules are written as one
change set. A config written inline (`tf.Session(config=tf.ConfigProto(allow_soft_placement=True))`,
hwalsuklee's GAN collection) or absent (`tf.Session()`) is first bound to a new variable before
the statement (`session_config = tf.ConfigProto(...)`) and the Session is given it. Only when the
call that hands the work on sits inside that `with` (or after `sess = tf.Session(...)` in the same
block); anything else raises SessionConfigRefused with the reason.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.base import CallSite, CompanionChange
from ampify.transforms.kit.fast_walk import iter_tree, walk
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.positions import Positions
from ampify.transforms.tf1.names import normalise_tf_name

SESSION_CONSTRUCTORS = ("tensorflow.Session", "tensorflow.InteractiveSession")
#: the dotted names `tf.device` resolves to
DEVICE_SCOPES = ("tensorflow.device", "tensorflow.compat.v1.device")
#: module-level functions followed up from the call that builds the model to the Session's block
MAX_HOPS = 2
RULE_IMPORT = "from tensorflow.core.protobuf import rewriter_config_pb2"


class SessionConfigRefused(Exception):
    """The caller's Session cannot be given the rewrite safely; the message says why."""


def plan_session_config(source: bytes, sites: Sequence[CallSite], callee: str, here: str,
                        star_bound: Optional[Dict[str, str]] = None) -> CompanionChange:
    """The calling module's edit: its Session config turns the graph rewrite on. `star_bound`:
    the names its star imports bind (`tf` through UGATIT's `from utils import *`)."""
    display = sites[0].display
    try:
        module = cst.parse_module(source)
    except Exception as error:
        raise SessionConfigRefused(f"{display} does not parse ({type(error).__name__})") from None
    planner = _Planner(module, display)
    for local, qualified in sorted((star_bound or {}).items()):
        if local not in planner.imports.aliases:
            planner.imports = planner.imports.with_alias(local, qualified)
    configs: List[Tuple[cst.CSTNode, str]] = []
    for site in sites:
        found = planner.session_config_for(site.line, site.column, callee)
        if found not in configs:
            configs.append(found)
    if len({id(statement) for statement, _ in configs}) != len(configs):
        raise SessionConfigRefused(f"{display} creates its Sessions in a way ampify cannot follow")
    pending = {id(statement): config for statement, config in configs if not planner.turned_on_before(statement, config)}
    new_module = module.visit(_Insert(pending, planner.hoisted)) if pending else module
    new_module = _with_import(new_module)
    lines = ", ".join(f"{display}:{planner.line(statement)}" for statement, _ in configs)
    findings = [
        Finding("AMP105", f"{config}.graph_options.rewrite_options.auto_mixed_precision turned on before the Session is "
                          f"created: {callee}() in {here} builds the optimizer after it exists (written together with "
                          "that file, as one change set)", planner.line(statement), 0, Severity.INFO)
        for statement, config in configs
    ]
    return CompanionChange(
        key=sites[0].key, display=display, old=source, new=new_module.bytes, findings=findings,
        reason=f"changed with {here}: the Session created at {lines} gets the mixed precision graph rewrite "
               f"through its config ({callee}() builds the optimizer after it exists)",
    )


def turn_on_in_module(module: cst.Module, sessions: Sequence[cst.Call], display: str) -> Tuple[cst.Module, List[str]]:
    """This module creates its Session(s) before the optimizer (cnn-text-classification-tf:
    `sess = tf.Session(config=session_conf)`, then the model and `tf.train.AdamOptimizer`): the
    module with each Session's config turned on (and the rewriter import), and the config names.
    Raises SessionConfigRefused when a Session's config cannot be given the rewrite."""
    planner = _Planner(module, display)
    configs: List[Tuple[cst.CSTNode, str]] = []
    for session in sessions:
        statement = planner.statement_of(session)
        if statement is None:
            raise SessionConfigRefused(f"the Session at line {planner.line(session)} is not created by a statement of its own")
        config = planner._config_variable(session, statement)
        if all(statement is not other for other, _ in configs):
            configs.append((statement, config))
    pending = {id(statement): config for statement, config in configs if not planner.turned_on_before(statement, config)}
    new_module = module.visit(_Insert(pending, planner.hoisted)) if pending else module
    return _with_import(new_module), [config for _, config in configs]


def rewrite_turned_on(module_code: str, config: str) -> bool:
    """Does the module turn the graph rewrite on in the Session config `config`?"""
    return (f"{config}.graph_options.rewrite_options.auto_mixed_precision = "
            "rewriter_config_pb2.RewriterConfig.ON") in module_code


def session_config_name(session: cst.Call) -> Optional[str]:
    """The variable a Session is given as its config (`config=run_config`), if one."""
    config = next((arg.value for arg in session.args if arg.keyword is not None and arg.keyword.value == "config"), None)
    if config is None:
        plain = [arg for arg in session.args if arg.keyword is None]
        config = plain[2].value if len(plain) > 2 else None
    return config.value if isinstance(config, cst.Name) else None


class _Planner:
    def __init__(self, module: cst.Module, display: str) -> None:
        self.module = module
        self.display = display
        self.imports = ImportMap.from_module(module)
        self.positions = Positions(module)
        self.parents: dict = {}
        walk(module, _ParentIndex(self.parents))
        #: id(statement) -> (new variable, its value's code, the Session call to hand it to): configs
        #: written inline (or absent) bound to a variable first
        self.hoisted: dict = {}

    def line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def session_config_for(self, line: int, column: int, callee: str) -> Tuple[cst.CSTNode, str]:
        """(statement the config edit goes before, config variable) for the call at line:column."""
        call = self._call_at(line, column)
        if call is None:
            raise SessionConfigRefused(f"the call of {callee}() at {self.display}:{line} was not found")
        found = self._config_for_call(call, 0)
        if found is None:
            raise SessionConfigRefused(
                f"{callee}() at {self.display}:{line} runs in a Session ampify cannot find there (no `with "
                "tf.Session(...)` around it, no `sess = tf.Session(...)` before it in its block, nor around the "
                "calls of the function holding it)")
        return found

    def _config_for_call(self, call: cst.Call, depth: int) -> Optional[Tuple[cst.CSTNode, str]]:
        """The Session around `call`: a `with` holding it, a `sess = tf.Session(...)` before it in
        its block, or, for a call in a module-level function of this module (NTM's
        `create_ntm(config, sess)` building the model), the one Session around every call of that
        function (MAX_HOPS functions up)."""
        current = self.parents.get(id(call))
        while current is not None:
            if isinstance(current, cst.With):
                session = self._session_of_with(current)
                if session is not None:
                    return current, self._config_variable(session, current)
            if isinstance(current, (cst.IndentedBlock, cst.Module)):
                session = self._session_assigned_before(current, call)
                if session is not None:
                    return session
            if isinstance(current, cst.FunctionDef) and depth < MAX_HOPS and isinstance(
                    self.parents.get(id(current)), cst.Module):
                return self._config_around_calls_of(current, depth)
            if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
                break
            current = self.parents.get(id(current))
        return None

    def _config_around_calls_of(self, function: cst.FunctionDef, depth: int) -> Optional[Tuple[cst.CSTNode, str]]:
        name = function.name.value
        calls = [node for node in iter_tree(self.module)
                 if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == name]
        found = [self._config_for_call(call, depth + 1) for call in calls]
        if not found or any(f is None for f in found) or len({id(statement) for statement, _ in found}) != 1:
            return None
        return found[0]

    def _call_at(self, line: int, column: int) -> Optional[cst.Call]:
        found = []

        class _Find(cst.CSTVisitor):
            def visit_Call(inner, node: cst.Call) -> None:
                position = self.positions[node].start
                if position.line == line and position.column == column:
                    found.append(node)

        walk(self.module, _Find())
        return found[0] if found else None

    def _is_session(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Call) and normalise_tf_name(self.imports.resolve(node.func)) in SESSION_CONSTRUCTORS

    def _session_of_with(self, statement: cst.With) -> Optional[cst.Call]:
        sessions = [item.item for item in statement.items if self._is_session(item.item)]
        if len(sessions) != 1:
            return None
        for item in statement.items:
            device = item.item
            if (isinstance(device, cst.Call) and normalise_tf_name(self.imports.resolve(device.func)) in DEVICE_SCOPES
                    and device.args and isinstance(device.args[0].value, cst.SimpleString)
                    and "cpu" in device.args[0].value.value.lower()):
                # carpedm20/NTM-tensorflow: `with tf.device('/cpu:0'), tf.Session() as sess:`
                raise SessionConfigRefused(
                    f"the `with` opening the Session at {self.display}:{self.line(statement)} also pins the graph to the "
                    f"CPU ({_code(device)}), and the graph rewrite converts GPU ops only: nothing would run in float16")
        return sessions[0]

    def _session_assigned_before(self, block, call: cst.Call) -> Optional[Tuple[cst.CSTNode, str]]:
        body = list(block.body)
        holder = call
        while holder is not None and not any(holder is statement for statement in body):
            holder = self.parents.get(id(holder))
        if holder is None:
            return None
        index = next(i for i, statement in enumerate(body) if statement is holder)
        for statement in reversed(body[:index]):
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
                small = statement.body[0]
                if isinstance(small, cst.Assign) and self._is_session(small.value):
                    return statement, self._config_variable(small.value, statement)
        return None

    def _config_variable(self, session: cst.Call, before: cst.CSTNode) -> str:
        config = next((arg.value for arg in session.args if arg.keyword is not None and arg.keyword.value == "config"), None)
        if config is None:
            plain = [arg for arg in session.args if arg.keyword is None]
            config = plain[2].value if len(plain) > 2 else None
        if config is None or isinstance(config, cst.Call):
            return self._hoisted_config(session, config, before)
        name = dotted_name(config)
        if name is None or "." in name:
            raise SessionConfigRefused(
                f"the Session at {self.display}:{self.line(session)} is created without a config variable "
                "(`config=run_config`) that the rewrite can be set on")
        block = self.parents.get(id(before))
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        index = next((i for i, statement in enumerate(body) if statement is before), None)
        bound = index is not None and any(
            isinstance(statement, cst.SimpleStatementLine) and any(
                isinstance(small, cst.Assign) and any(dotted_name(t.target) == name for t in small.targets)
                for small in statement.body)
            for statement in body[:index]
        )
        if not bound:
            raise SessionConfigRefused(
                f"{name}, the config of the Session at {self.display}:{self.line(session)}, is not created in the "
                "same block before it")
        return name


    def statement_of(self, call: cst.Call) -> Optional[cst.CSTNode]:
        """The `with` whose item creates the Session, or the statement line that holds it."""
        current = self.parents.get(id(call))
        while current is not None:
            if isinstance(current, cst.WithItem):
                holder = self.parents.get(id(current))
                return holder if isinstance(holder, cst.With) and self._session_of_with(holder) is call else None
            if isinstance(current, cst.SimpleStatementLine):
                return current if len(current.body) == 1 else None
            if isinstance(current, (cst.BaseCompoundStatement, cst.FunctionDef, cst.Lambda)):
                return None
            current = self.parents.get(id(current))
        return None

    def turned_on_before(self, statement: cst.CSTNode, config: str) -> bool:
        """Does the statement right before `statement` already turn the rewrite on for `config`
        (written by the change set of another module trained in the same Session)?"""
        block = self.parents.get(id(statement))
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        index = next((i for i, item in enumerate(body) if item is statement), None)
        if not index:
            return False
        previous = body[index - 1]
        return (isinstance(previous, cst.SimpleStatementLine) and self.module.code_for_node(previous).strip()
                == f"{config}.graph_options.rewrite_options.auto_mixed_precision = rewriter_config_pb2.RewriterConfig.ON")

    def _hoisted_config(self, session: cst.Call, config: Optional[cst.Call], before: cst.CSTNode) -> str:
        """A config written inline, or none: bind it to a new variable before `before` (once:
        several calls run in one Session, as RL_brain's two DQNs built under `sess`)."""
        planned = self.hoisted.get(id(before))
        if planned is not None and planned[2] is session:
            return planned[0]
        if config is None:
            spelled = dotted_name(session.func) or ""
            if not spelled.endswith(("Session", "InteractiveSession")) or "." not in spelled:
                raise SessionConfigRefused(
                    f"the Session at {self.display}:{self.line(session)} has no config, and ConfigProto cannot be "
                    f"spelled beside {spelled or 'it'} here")
            value = spelled.rsplit(".", 1)[0] + ".ConfigProto()"
        else:
            value = self.module.code_for_node(config)
        taken = _names_in(self.module) | {hoisted[0] for hoisted in self.hoisted.values()}
        name = next(n for n in ("session_config", "amp_session_config", *(f"session_config_{i}" for i in range(1, 99)))
                    if n not in taken)
        self.hoisted[id(before)] = (name, value, session)
        return name


def _names_in(module: cst.Module) -> set:
    names = set()

    class _Names(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            names.add(node.value)

    walk(module, _Names())
    return names


class _ParentIndex(cst.CSTVisitor):
    def __init__(self, parents: dict) -> None:
        super().__init__()
        self.parents = parents
        self.stack: List[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parents[id(node)] = self.stack[-1]
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


class _Insert(cst.CSTTransformer):
    """`<config>.graph_options.rewrite_options.auto_mixed_precision = ...ON` before each statement."""

    def __init__(self, before: dict, hoisted: dict) -> None:
        super().__init__()
        self.before = before
        self.hoisted = hoisted
        #: id of a Session call -> the variable its config now is
        self.sessions = {id(session): name for name, _value, session in hoisted.values()}

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        name = self.sessions.get(id(original_node))
        if name is None:
            return updated_node
        args = list(updated_node.args)
        for index, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value == "config":
                args[index] = arg.with_changes(value=cst.Name(name))
                return updated_node.with_changes(args=args)
        plain = [index for index, arg in enumerate(args) if arg.keyword is None]
        if len(plain) > 2:
            args[plain[2]] = args[plain[2]].with_changes(value=cst.Name(name))
            return updated_node.with_changes(args=args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        args.append(cst.Arg(keyword=cst.Name("config"), value=cst.Name(name), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
        return updated_node.with_changes(args=args)

    def _rebuild(self, original, updated):
        body = []
        for o, u in zip(original, updated):
            config = self.before.get(id(o))
            if config is not None:
                lines = []
                hoisted = self.hoisted.get(id(o))
                if hoisted is not None:
                    lines.append(cst.parse_statement(f"{hoisted[0]} = {hoisted[1]}\n"))
                lines.append(cst.parse_statement(
                    f"{config}.graph_options.rewrite_options.auto_mixed_precision = rewriter_config_pb2.RewriterConfig.ON\n"))
                lines[0] = lines[0].with_changes(leading_lines=u.leading_lines)
                body.extend(lines)
                u = u.with_changes(leading_lines=[])
            body.append(u)
        return body

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node.with_changes(body=self._rebuild(original_node.body, updated_node.body))

    def leave_Module(self, original_node, updated_node):
        return updated_node.with_changes(body=self._rebuild(original_node.body, updated_node.body))


def _with_import(module: cst.Module) -> cst.Module:
    """`from tensorflow.core.protobuf import rewriter_config_pb2` after the module's last
    top-level import (or at its top)."""
    if RULE_IMPORT in module.code:
        return module
    body = list(module.body)
    last = -1
    for index, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and all(
                isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body):
            last = index
    statement = cst.parse_statement(RULE_IMPORT + "\n")
    if last < 0:
        return module.with_changes(body=[statement, *body])
    return module.with_changes(body=[*body[: last + 1], statement, *body[last + 1:]])


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
