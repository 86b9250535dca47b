"""One walk over a TF1 module that records every fact the graph rewrite decides on.

Where optimizers are built (and whether inside a loop, or inside a wrapper already), where
Sessions are created, whether the file already uses mixed precision, and whether it is TF1
graph-mode code at all. Nothing is rewritten here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.hand_written_precision import fp16_switch_evidence, loss_scaling_evidence
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.kit.positions import Positions
from ampify.transforms.tf1.module_header import import_aliases
from ampify.transforms.tf1.names import (
    TF_GRADIENTS,
    IGNORE_PERFORMANCE_ENV,
    MIXED_PRECISION_IDENTIFIERS,
    MIXED_PRECISION_POLICY_FUNCTIONS,
    MIXED_PRECISION_STRINGS,
    NGC_AUTO_MIXED_PRECISION_STRINGS,
    NOT_FOREIGN_OPTIMIZER_MODULES,
    NOT_SESSION_GETTER_PREFIXES,
    CLASS_ARGUMENT_IS_LOCAL,
    EAGER_ENABLERS,
    OPTIMIZER_BUILT_INSIDE_TF,
    RUN_ON_DEFAULT_SESSION,
    TF1_OPTIMIZER_CLASS_FACTORIES,
    SESSION_CONSTRUCTORS,
    SESSION_GETTERS,
    TF1_STYLE_MARKERS,
    WRAPPER_FORWARDED_ATTRIBUTES,
    builds_graph,
    is_tf1_optimizer_class,
    is_tf1_style_marker,
)
from ampify.transforms.tf1.optimizer_classes import MIXED, TF1, OptimizerClassifier, Resolver

def _last_name(node: cst.CSTNode) -> str:
    """`loss_scale` for `loss_scale`, `FLAGS.loss_scale` or `self.loss_scale`; "" otherwise."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return ""


#: `tf.float16`, `tf.dtypes.bfloat16`, `tf.half`: tensors in half precision, made by hand
HALF_PRECISION_DTYPES = frozenset({"float16", "bfloat16", "half", "bfloat16_scope"})
#: dtype strings that do the same (`tf.cast(x, "float16")`, `dtype == "fp16"`)
HALF_PRECISION_DTYPE_STRINGS = frozenset({"float16", "fp16", "bfloat16", "bf16"})


@dataclass
class OptimizerSite:
    """A call that builds an optimizer."""

    call: cst.Call
    kind: str  # TF1, KERAS or MIXED
    display: str  # the callee as written, e.g. "tf.train.AdamOptimizer"
    line: int
    column: int
    scope: int  # id of the enclosing function (0: module level)
    in_loop: bool
    already_wrapped: bool  # directly inside a mixed precision wrapper call
    assigned_to: Tuple[str, ...] = ()  # dotted names it is assigned to, if any
    #: imports made inside the enclosing functions (`import tensorflow as tf` in a def)
    function_imports: Dict[str, str] = field(default_factory=dict)
    #: id of the class whose method builds it (0: none)
    enclosing_class: int = 0


@dataclass
class SessionSite:
    """A call that creates (or hands out) a Session; lines looked up only when asked for."""

    node: cst.Call
    positions: Positions
    scope: int
    display: str
    #: for `with tf.Session() ...:`, the body of the `with`; None for a plain call
    with_body: Optional[cst.BaseSuite] = None
    #: True for a call that hands out a Session built elsewhere (`get_session()`), False
    #: for a Session constructor
    obtained: bool = False

    @property
    def line(self) -> int:
        return self.positions[self.node].start.line

    @property
    def column(self) -> int:
        return self.positions[self.node].start.column

    @property
    def encloses(self) -> Optional[Tuple[int, int]]:
        """For `with tf.Session() ...:`, the first and last line of the body it encloses."""
        if self.with_body is None:
            return None
        body = self.positions[self.with_body]
        return body.start.line, body.end.line


@dataclass
class SessionParam:
    """A function parameter named like a Session (`sess`)."""

    name: str
    node: cst.Param
    positions: Positions

    @property
    def line(self) -> int:
        return self.positions[self.node].start.line


@dataclass
class ForeignOptimizerCall:
    """`something.FooOptimizer(...)` from a module ampify cannot see into."""

    display: str
    line: int
    column: int
    #: the optimizer it is handed, when that is a TF1 optimizer this file builds (and wraps):
    #: then it is a wrapper like gpt-2's AccumulatingOptimizer, not an unwrapped optimizer
    wraps: Optional[str] = None
    assigned_to: Tuple[str, ...] = ()


@dataclass
class AttributeRead:
    """`name.attr` where attr is not something the mixed precision wrapper forwards.

    Every such attribute of a module is recorded, but few are ever reported: the line is
    looked up only when asked for (see `positions.Positions`)."""

    attr: str
    node: cst.CSTNode
    scope: int
    positions: Positions

    @property
    def line(self) -> int:
        return self.positions[self.node].start.line


@dataclass
class NameCall:
    """A call of a plain name (`build_model()`, `Model(...)`); its line looked up when asked."""

    scope: int
    name: str
    node: cst.CSTNode
    positions: Positions

    @property
    def line(self) -> int:
        return self.positions[self.node].start.line


@dataclass
class ModuleSurvey:
    """What the TF1 graph rewrite decides on (see `survey_module`)."""

    optimizers: List[OptimizerSite] = field(default_factory=list)
    sessions: List[SessionSite] = field(default_factory=list)
    #: scope id -> (session as written, its node) of the first `sess.run(...)` on a Session the
    #: scope did not create (a parameter, `self.sess`, the default Session)
    session_runs: Dict[int, Tuple[str, cst.CSTNode]] = field(default_factory=dict)
    #: scope id -> the function parameter named like a Session (`sess`):
    #: the caller created that Session before this function runs
    session_params: Dict[int, SessionParam] = field(default_factory=dict)
    #: calls of plain names (`build_model()`, `Model(...)`) that resolve to no import
    name_calls: List[NameCall] = field(default_factory=list)
    #: scope id of a function -> (its name, the name of the class it is a method of, or "")
    function_names: Dict[int, Tuple[str, str]] = field(default_factory=dict)
    foreign_optimizer_calls: List[ForeignOptimizerCall] = field(default_factory=list)
    built_inside_tf: List[Tuple[str, int, int]] = field(default_factory=list)
    #: (class as written, callee as written, line, column): a class handed to code elsewhere
    classes_handed_off: List[Tuple[str, str, int, int]] = field(default_factory=list)
    #: first mixed precision marker: (what, the node that says it)
    mixed_precision_marker: Optional[Tuple[str, cst.CSTNode]] = None
    ngc_auto_mixed_precision: bool = False
    #: first sign of mixed precision written by hand (float16 tensors, manual loss scaling, an
    #: fp16 switch that is read): counts only in TF1 training code, whose optimizers are then
    #: meant to stay unwrapped (a library file using tf.float16 is no training in mixed precision)
    hand_written_marker: Optional[Tuple[str, cst.CSTNode]] = None
    #: dotted names passed to a mixed precision wrapper (`opt` in `enable_...(opt)`)
    wrapped_names: Set[str] = field(default_factory=set)
    tf1_style: bool = False
    #: some `.apply_gradients(...)` is called (else the tf.gradients analysis is skipped)
    has_apply_gradients: bool = False
    #: some `tf.gradients(...)` is called (its result may be applied by code elsewhere)
    has_tf_gradients: bool = False
    #: TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE appears in a string already
    mentions_ignore_performance_env: bool = False
    #: every `X.attr` whose attr the wrapper does not forward (`opt._lr`), with its scope id;
    #: grouped by X only when asked (`reads_of`): few files ever ask
    attribute_reads: List[Tuple[cst.Attribute, int]] = field(default_factory=list)
    _reads_by_owner: Optional[Dict[str, List[AttributeRead]]] = field(default=None, repr=False)
    positions: Optional[Positions] = field(default=None, repr=False)
    #: string literals naming a TF1 optimizer class ("tf.train.AdamOptimizer"), looked up at
    #: run time (StyleGAN's util.get_obj_by_name): (the string, line, column)
    optimizer_class_strings: List[Tuple[str, int, int]] = field(default_factory=list)
    #: dotted names also bound to the result of a call that builds no TF1 optimizer (gpt-2
    #: reuses `opt` for its AccumulatingOptimizer): their attributes may be that object's
    bound_to_other_calls: Set[str] = field(default_factory=set)
    #: the first call that turns eager execution on (`tf.enable_eager_execution()`)
    eager_enabled_by: Optional[cst.Call] = None
    #: something builds a graph the rewrite changes even with eager on: tf.function or defun
    #: (called or as a decorator), tf.Graph, a Session, an Estimator
    builds_graph: bool = False

    def reads_of(self, name: str) -> List[AttributeRead]:
        """Reads of `name.attr` for attributes the mixed precision wrapper does not forward."""
        if self._reads_by_owner is None:
            self._reads_by_owner = {}
            for node, scope in self.attribute_reads:
                owner = dotted_name(node.value)
                if owner is not None:
                    self._reads_by_owner.setdefault(owner, []).append(
                        AttributeRead(node.attr.value, node.attr, scope, self.positions)
                    )
        return self._reads_by_owner.get(name, [])


#: "tf.train.AdamOptimizer", "tensorflow.compat.v1.train.MomentumOptimizer", "tf.contrib.opt.X"
_OPTIMIZER_CLASS_STRING = re.compile(
    r"^(tf|tensorflow)(\.compat\.v1)?\.(train|contrib\.opt)\.[A-Za-z0-9_]*Optimizer$"
)


#: the last name of every TF1 style marker (`Session`, `placeholder`, `estimator`, ...)
_STYLE_MARKER_LAST_NAMES = frozenset(marker.rsplit(".", 1)[-1] for marker in TF1_STYLE_MARKERS)


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


class _Surveyor(cst.CSTVisitor):
    """Fills a ModuleSurvey in one walk of the module.

    Why one class of ~390 lines: every fact depends on the walk's position (the scope stack,
    loop depth, enclosing classes, the `with` item being entered, names bound by function-level
    imports), and the walk is the transform's main cost (see kit/fast_walk.py). Split into
    several visitors, each would rebuild that state and walk the tree again; the visit methods
    here are short and each records one kind of fact.
    """

    def __init__(
        self, positions: Positions, resolve: Resolver, classifier: OptimizerClassifier,
        ignored_strings: FrozenSet[str] = frozenset(),
    ) -> None:
        self.positions = positions
        #: marker strings (and names) to read past: the NGC switch, when it is being migrated; the
        #: Session config's `auto_mixed_precision` that ampify itself has just turned on
        self.ignored_strings = ignored_strings
        self.resolve_name = resolve
        self.classifier = classifier
        self.survey = ModuleSurvey()
        self._scopes: List[int] = [0]
        self._loop_depth: List[int] = [0]
        self._function_imports: List[Dict[str, str]] = [{}]
        self._mixed_precision_arg_ids: Set[int] = set()
        #: id of a `with` item's call -> the body it encloses
        self._with_bodies: Dict[int, cst.BaseSuite] = {}
        self._assigned: Dict[int, Tuple[str, ...]] = {}
        self._classes: List[cst.ClassDef] = []
        #: len(self._scopes) when each enclosing class body was entered (methods sit right in it)
        self._class_scope_depth: List[int] = []

    # -- scopes and loops -------------------------------------------------------------------
    def _enter_scope(self, node: cst.CSTNode) -> None:
        self._scopes.append(id(node))
        self._loop_depth.append(0)
        self._function_imports.append(dict(self._function_imports[-1]))

    def _leave_scope(self) -> None:
        self._scopes.pop()
        self._loop_depth.pop()
        self._function_imports.pop()

    def visit_Import(self, node: cst.Import) -> None:
        if len(self._scopes) > 1:
            self._function_imports[-1].update(import_aliases(node))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if len(self._scopes) > 1:
            self._function_imports[-1].update(import_aliases(node))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        enclosing_class = (
            self._classes[-1].name.value
            if self._classes and self._class_scope_depth and self._class_scope_depth[-1] == len(self._scopes)
            else ""
        )
        self._enter_scope(node)
        self.survey.function_names[id(node)] = (node.name.value, enclosing_class)
        params = node.params
        for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
            lowered = param.name.value.lower()
            if lowered in ("sess", "session") or lowered.endswith(("_sess", "_session")):
                session_param = SessionParam(param.name.value, param, self.positions)
                self.survey.session_params[id(node)] = session_param
                if node.name.value == "__init__" and self._classes and len(self._scopes) == 2:
                    # `Actor(sess, ...)`: every method's optimizer comes after that Session
                    self.survey.session_params[id(self._classes[-1])] = session_param
                break

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._leave_scope()

    def visit_Decorator(self, node: cst.Decorator) -> None:
        # `@tf.function` (a call `@tf.function(...)` is seen by visit_Call)
        if not self.survey.builds_graph and builds_graph(self.resolve_name(node.decorator)):
            self.survey.builds_graph = True

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._enter_scope(node)

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self._leave_scope()

    def _enter_loop(self, node: cst.CSTNode) -> None:
        self._loop_depth[-1] += 1

    def _leave_loop(self, node: cst.CSTNode) -> None:
        self._loop_depth[-1] -= 1

    def visit_For(self, node: cst.For) -> None:
        self._enter_loop(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._leave_loop(original_node)

    def visit_While(self, node: cst.While) -> None:
        self._enter_loop(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._leave_loop(original_node)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._enter_loop(node)

    def leave_ListComp(self, original_node: cst.ListComp) -> None:
        self._leave_loop(original_node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._enter_loop(node)

    def leave_GeneratorExp(self, original_node: cst.GeneratorExp) -> None:
        self._leave_loop(original_node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._enter_loop(node)

    def leave_DictComp(self, original_node: cst.DictComp) -> None:
        self._leave_loop(original_node)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._enter_loop(node)

    def leave_SetComp(self, original_node: cst.SetComp) -> None:
        self._leave_loop(original_node)

    # -- statements -------------------------------------------------------------------------
    def visit_With(self, node: cst.With) -> None:
        for item in node.items:
            if isinstance(item.item, cst.Call):
                self._with_bodies[id(item.item)] = node.body

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call):
            names = tuple(filter(None, (dotted_name(t.target) for t in node.targets)))
            self._assigned[id(node.value)] = names
            if not self._builds_tf1_optimizer(node.value):
                self.survey.bound_to_other_calls.update(names)

    def _builds_tf1_optimizer(self, call: cst.Call) -> bool:
        """`X(...)` for a TF1 optimizer X, also inside a mixed precision wrapper call."""
        if self.classifier.instance_kind(call) == TF1:
            return True
        last = call.func.attr.value if isinstance(call.func, cst.Attribute) else (
            call.func.value if isinstance(call.func, cst.Name) else ""
        )
        return last in MIXED_PRECISION_IDENTIFIERS and any(
            isinstance(arg.value, cst.Call) and self._builds_tf1_optimizer(arg.value)
            for arg in call.args[:1]
        )

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        try:
            value = node.evaluated_value
        except Exception:  # odd prefixes or escapes: not a marker
            return
        if isinstance(value, bytes):
            return
        if IGNORE_PERFORMANCE_ENV in value:
            self.survey.mentions_ignore_performance_env = True
        if _OPTIMIZER_CLASS_STRING.match(value):
            position = self._position(node).start
            self.survey.optimizer_class_strings.append((value, position.line, position.column))
            self.survey.tf1_style = True
        if value in MIXED_PRECISION_STRINGS and value not in self.ignored_strings:
            self._mark_mixed_precision(value, node)
            if value in NGC_AUTO_MIXED_PRECISION_STRINGS:
                self.survey.ngc_auto_mixed_precision = True
        elif value in HALF_PRECISION_DTYPE_STRINGS:
            self._mark_hand_written(f"float16 computation by hand: {value!r}", node)

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in MIXED_PRECISION_IDENTIFIERS and node.value not in self.ignored_strings:
            self._mark_mixed_precision(node.value, node)
        self._note_style(node)

    # Hand-written mixed precision counts where it is used, never on a name alone: a loss scale
    # multiplied into a loss or divided out of gradients, an fp16 switch that is read.
    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if isinstance(node.operator, (cst.Multiply, cst.Divide)):
            for side in (node.left, node.right):
                name = _last_name(side)
                evidence = loss_scaling_evidence(name) if name else None
                if evidence is not None:
                    self._mark_hand_written(evidence, side)
                    return

    def visit_If(self, node: cst.If) -> None:
        name = _last_name(node.test)
        evidence = fp16_switch_evidence(name) if name else None
        if evidence is not None:
            self._mark_hand_written(evidence, node.test)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        name = _last_name(node.test)
        evidence = fp16_switch_evidence(name) if name else None
        if evidence is not None:
            self._mark_hand_written(evidence, node.test)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        attr = node.attr.value
        if attr in _STYLE_MARKER_LAST_NAMES or attr.endswith("Optimizer"):
            # A chain that resolves to a marker (or below one) either has a head that does
            # (checked in visit_Name) or an inner attribute that equals it and ends with the
            # marker's last name; an optimizer class's last name is its own.
            self._note_style(node)
        if attr not in WRAPPER_FORWARDED_ATTRIBUTES:
            self.survey.attribute_reads.append((node, self._scopes[-1]))
        if attr in HALF_PRECISION_DTYPES and self.survey.hand_written_marker is None:
            resolved = self.resolve_name(node) or ""
            if resolved.startswith("tensorflow."):
                self._mark_hand_written(f"float16 computation by hand: {dotted_name(node) or attr}", node)
        if node.attr.value in MIXED_PRECISION_POLICY_FUNCTIONS:
            name = dotted_name(node)
            resolved = self.resolve_name(node) or name or ""
            if "mixed_precision" in resolved:
                self._mark_mixed_precision(node.attr.value, node)

    def _note_style(self, node: cst.CSTNode) -> None:
        if self.survey.tf1_style:
            return
        resolved = self.resolve_name(node)
        if is_tf1_style_marker(resolved) or is_tf1_optimizer_class(resolved):
            self.survey.tf1_style = True

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if node.name.value in self.classifier.local_optimizer_classes:
            self.survey.tf1_style = True
        self._classes.append(node)
        self._class_scope_depth.append(len(self._scopes))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()
        self._class_scope_depth.pop()

    def visit_Call(self, node: cst.Call) -> None:
        resolved = self.resolve_name(node.func)
        last = node.func.attr.value if isinstance(node.func, cst.Attribute) else (
            node.func.value if isinstance(node.func, cst.Name) else ""
        )
        if last in MIXED_PRECISION_IDENTIFIERS:
            for arg in node.args[:1]:
                self._mixed_precision_arg_ids.add(id(arg.value))
                name = dotted_name(arg.value)
                if name:
                    self.survey.wrapped_names.add(name)
        if isinstance(node.func, cst.Name) and resolved is None:
            self.survey.name_calls.append(NameCall(self._scopes[-1], node.func.value, node, self.positions))
        if resolved in EAGER_ENABLERS and self.survey.eager_enabled_by is None:
            self.survey.eager_enabled_by = node
        elif not self.survey.builds_graph and builds_graph(resolved):
            self.survey.builds_graph = True
        if resolved in SESSION_CONSTRUCTORS:
            self._record_session(node)
        elif self._hands_out_session(resolved, last):
            self._record_session(node, obtained=True)
        elif last == "apply_gradients":
            self.survey.has_apply_gradients = True
        elif resolved in TF_GRADIENTS:
            self.survey.has_tf_gradients = True
        elif last == "run" and isinstance(node.func, cst.Attribute):
            self._record_session_run(node.func.value)
        if resolved in OPTIMIZER_BUILT_INSIDE_TF:
            self._check_built_inside(node, resolved)
        elif last not in MIXED_PRECISION_IDENTIFIERS:
            self._check_classes_handed_off(node, resolved)
        kind = self.classifier.instance_kind(node)
        if kind is not None:
            position = self._position(node).start
            self.survey.optimizers.append(
                OptimizerSite(
                    call=node,
                    kind=kind,
                    display=_code(node.func),
                    line=position.line,
                    column=position.column,
                    scope=self._scopes[-1],
                    in_loop=self._loop_depth[-1] > 0,
                    already_wrapped=id(node) in self._mixed_precision_arg_ids,
                    assigned_to=self._assigned.get(id(node), ()),
                    function_imports=self._function_imports[-1],
                    enclosing_class=id(self._classes[-1]) if self._classes else 0,
                )
            )
            if kind in (TF1, MIXED):
                self.survey.tf1_style = True
        elif self._looks_like_foreign_optimizer(node.func, last, resolved):
            position = self._position(node).start
            # `optimization.AdamWeightDecayOptimizer(...)`: defined in a module we cannot see.
            self.survey.foreign_optimizer_calls.append(
                ForeignOptimizerCall(
                    _code(node.func),
                    position.line,
                    position.column,
                    self._wrapped_argument(node),
                    self._assigned.get(id(node), ()),
                )
            )

    def _wrapped_argument(self, node: cst.Call) -> Optional[str]:
        """The TF1 optimizer (built in this file, so wrapped) a call is handed, as written."""
        tf1_names = {
            name for site in self.survey.optimizers if site.kind == TF1 for name in site.assigned_to
        }
        for arg in node.args:
            value = arg.value
            if isinstance(value, cst.Call) and self.classifier.instance_kind(value) == TF1:
                return _code(value.func)
            if dotted_name(value) in tf1_names:
                return _code(value)
        return None

    @staticmethod
    def _hands_out_session(resolved: Optional[str], last: str) -> bool:
        """`get_session()`, `tf.get_default_session()`, `sv.managed_session()`: a Session made
        elsewhere (or earlier) is handed to this code."""
        if resolved in SESSION_GETTERS:
            return True
        if resolved is not None and resolved.startswith("tensorflow"):
            return False  # TensorFlow's other *Session names are classes handled elsewhere
        lowered = last.lower()
        return (
            lowered.endswith("session")
            and lowered != "session"
            and not lowered.startswith(NOT_SESSION_GETTER_PREFIXES)
        )

    def _looks_like_foreign_optimizer(
        self, func: cst.BaseExpression, last: str, resolved: Optional[str]
    ) -> bool:
        if not last.endswith("Optimizer"):
            return False
        if resolved is not None:
            return not resolved.startswith(NOT_FOREIGN_OPTIMIZER_MODULES)
        # A class this file defines (and that is no TF optimizer) is not "foreign".
        return not (isinstance(func, cst.Name) and func.value in self.classifier.defined_classes)

    def _check_classes_handed_off(self, node: cst.Call, resolved: Optional[str]) -> None:
        """An optimizer CLASS passed to code outside this file is instantiated out of reach."""
        callee = resolved or dotted_name(node.func) or ""
        if callee in CLASS_ARGUMENT_IS_LOCAL or callee in TF1_OPTIMIZER_CLASS_FACTORIES:
            return
        last = callee.rsplit(".", 1)[-1]
        if resolved is None and (last in self.classifier.defined_functions or last in self.classifier.defined_classes):
            return  # a function or class of this file: its (or its __init__'s) parameter is bound to the class
        for arg in node.args:
            if self.classifier.class_kind(arg.value) == TF1:
                position = self._position(arg.value).start
                self.survey.classes_handed_off.append(
                    (_code(arg.value), _code(node.func), position.line, position.column)
                )

    def _record_session_run(self, receiver: cst.BaseExpression) -> None:
        """`sess.run(...)`, `self.sess.run(...)`, `tf.global_variables_initializer().run()`."""
        name = dotted_name(receiver)
        if name is not None:
            if self.resolve_name(receiver) is not None or "sess" not in name.lower():
                return
            shown = name
        elif isinstance(receiver, cst.Call) and self.resolve_name(receiver.func) in RUN_ON_DEFAULT_SESSION:
            shown = "the default Session"
        else:
            return
        self.survey.session_runs.setdefault(self._scopes[-1], (shown, receiver))

    def _record_session(self, node: cst.Call, obtained: bool = False) -> None:
        self.survey.sessions.append(
            SessionSite(
                node=node,
                positions=self.positions,
                scope=self._scopes[-1],
                display=_code(node.func),
                with_body=self._with_bodies.get(id(node)),
                obtained=obtained,
            )
        )

    def _check_built_inside(self, node: cst.Call, resolved: str) -> None:
        optimizer_arg = None
        for index, arg in enumerate(node.args):
            if arg.keyword is not None and arg.keyword.value == "optimizer":
                optimizer_arg = arg.value
            elif arg.keyword is None and index == 3 and resolved.endswith("optimize_loss"):
                optimizer_arg = arg.value
        # An optimizer instance built right here is wrapped where it is built; a name may hold
        # one built elsewhere. Strings, classes and the default are built inside TensorFlow.
        if optimizer_arg is not None and not isinstance(optimizer_arg, cst.BaseString):
            if self.classifier.class_kind(optimizer_arg) is None:
                return
        position = self._position(node).start
        self.survey.built_inside_tf.append((_code(node.func), position.line, position.column))

    def _mark_mixed_precision(self, what: str, node: cst.CSTNode) -> None:
        if self.survey.mixed_precision_marker is None:
            self.survey.mixed_precision_marker = (what, node)

    def _mark_hand_written(self, what: str, node: cst.CSTNode) -> None:
        if self.survey.hand_written_marker is None:
            self.survey.hand_written_marker = (what, node)

    def _position(self, node: cst.CSTNode):
        return self.positions[node]


def survey_module(
    module: cst.Module, positions: Positions, resolve: Resolver, classifier: OptimizerClassifier,
    ignored_strings: FrozenSet[str] = frozenset(),
) -> ModuleSurvey:
    """Walk the module once and record what the TF1 graph rewrite needs to decide;
    `ignored_strings` are mixed precision marker strings not to take as markers."""
    surveyor = _Surveyor(positions, resolve, classifier, ignored_strings)
    surveyor.survey.positions = positions
    walk(module, surveyor)
    return surveyor.survey

