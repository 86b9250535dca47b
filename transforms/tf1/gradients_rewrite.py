"""Route `tf.gradients` through the wrapped optimizer so the loss is scaled.

`grads = tf.gradients(loss, tvars)` followed by `opt.apply_gradients(zip(grads, tvars))` runs
fine under enable_mixed_precision_graph_rewrite, but only `opt.compute_gradients` scales the
loss: float16 gradients then underflow silently (google-research/bert's optimization.py does
exactly this). Within one function body, follow where each tf.gradients result flows (plain
assignments, tuple unpacking, `.append/.extend`, comprehensions, `tf.clip_by_global_norm`,
`zip`) and, when it reaches `O.apply_gradients(...)` for an optimizer O bound before it, replace
the call with `[g for g, _ in O.compute_gradients(loss, var_list=tvars, ...)]`. Everything that
happens to the gradients in between (clipping, averaging, summaries) is kept. Forms too unusual
to rewrite safely get a warning with the line instead.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.kit.calls import calls_within
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.arguments import with_keyword
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.kit.parameters import with_parameter
from ampify.transforms.kit.positions import Positions
from ampify.transforms.tf1.names import (
    GRADIENTS_TO_COMPUTE_GRADIENTS_KWARGS,
    TF_GRADIENTS,
    TF_GRADIENTS_POSITIONAL,
)
from ampify.transforms.tf1.optimizer_classes import Resolver
from ampify.transforms.tf1.optimizer_hoist import StatementMove, plan_hoist, scope_reads_what_changes

#: label for gradients that come from some optimizer's compute_gradients (already scaled)
FROM_COMPUTE_GRADIENTS = "compute_gradients"
_CONTAINER_MUTATORS = {"append", "extend", "insert", "add", "update"}

CODE_REWROTE = "AMP103"
CODE_NOT_REWRITABLE = "AMP110"
CODE_UNTRACEABLE_APPLY = "AMP115"
CODE_GRADIENTS_OUTSIDE_OPTIMIZER = "AMP124"


@dataclass
class GradientsPlan:
    """What to replace (keyed by id of the original tf.gradients Call) and what to report."""

    replacements: Dict[int, cst.BaseExpression] = field(default_factory=dict)
    findings: List[Finding] = field(default_factory=list)
    #: optimizer constructions to move above their tf.gradients, keyed by id of the statement
    moves: Dict[int, StatementMove] = field(default_factory=dict)
    #: helper functions that get the optimizer as a new `optimizer=None` parameter, by id of
    #: their FunctionDef (see _plan_helper_gradients)
    new_parameters: Dict[int, str] = field(default_factory=dict)
    #: edits of other project modules whose helpers take the optimizer (one change set)
    companions: List[CompanionChange] = field(default_factory=list)


@dataclass
class _GradientsCall:
    call: cst.Call
    statement_line: int
    line: int
    column: int


@dataclass
class _ApplyCall:
    receiver: cst.BaseExpression
    receiver_name: Optional[str]
    grads: Optional[cst.BaseExpression]
    line: int
    column: int
    #: `acc.apply_gradients()` with no arguments is some wrapper's own method, not
    #: tf.train.Optimizer.apply_gradients (which needs grads_and_vars)
    has_args: bool = True


@dataclass
class _ScopeFlow:
    """Data flow facts of one function body (or the module body)."""

    params: Set[str] = field(default_factory=set)
    #: the enclosing function's name ("" for the module body)
    function_name: str = ""
    edges: List[Tuple[Set[str], Set[str], Set[object]]] = field(default_factory=list)
    assignment_lines: Dict[str, List[int]] = field(default_factory=dict)
    gradients_calls: List[_GradientsCall] = field(default_factory=list)
    apply_calls: List[_ApplyCall] = field(default_factory=list)
    #: name -> line of its last `global` / `nonlocal` declaration in this body
    declared_lines: Dict[str, int] = field(default_factory=dict)
    #: name -> the statements that assign it with `=`
    assignment_statements: Dict[str, List[cst.CSTNode]] = field(default_factory=dict)
    #: other calls, with the dotted names of their plain arguments: code that may apply
    #: gradients it is handed (`variable_mgr.append_apply_gradients_ops(state, opt, grads)`)
    handoffs: List[Tuple[cst.Call, List[Tuple[str, cst.BaseExpression]], int, int]] = field(default_factory=list)
    #: the values the body returns
    return_values: List[cst.BaseExpression] = field(default_factory=list)
    #: the FunctionDef, when this body is a module-level function (a helper callers may reach)
    helper: Optional[cst.FunctionDef] = None
    #: the losses handed to an optimizer's minimize() / compute_gradients() in this body
    minimized: List[cst.BaseExpression] = field(default_factory=list)


class _References(cst.CSTVisitor):
    """Dotted names an expression reads, and the gradient sources (labels) it contains."""

    def __init__(self, resolve: Resolver) -> None:
        self.resolve_name = resolve
        self.names: Set[str] = set()
        self.labels: Set[object] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = dotted_name(node)
        if name:
            self.names.add(name)

    def visit_Call(self, node: cst.Call) -> None:
        if self.resolve_name(node.func) in TF_GRADIENTS:
            self.labels.add(id(node))
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "compute_gradients":
            self.labels.add(FROM_COMPUTE_GRADIENTS)
            receiver = dotted_name(node.func.value)
            if receiver:
                self.labels.add(_computed_by(receiver))
        elif _is_other_gradients(node.func):
            self.labels.add(_other_gradients(node))
        else:
            if _may_be_a_helper(node, self.resolve_name):
                # `grads = tower_grads(images, labels)`: what a function of this file (or of
                # another project module) returns (see _HelperRewrite)
                self.labels.add(_helper_call(node))
            # `model_deploy.optimize_clones(clones, optimizer)`: a helper handed the optimizer
            # computes the gradients with it (see _from_helper_given).
            for arg in node.args:
                name = dotted_name(arg.value)
                if name:
                    self.labels.add(_from_helper_given(name))


def _is_other_gradients(func: cst.BaseExpression) -> bool:
    """`memory_saving_gradients.gradients(...)`, `tape.gradient(...)`: gradients computed by
    something other than tf.gradients or compute_gradients, so never loss-scaled."""
    if isinstance(func, cst.Attribute):
        return func.attr.value in _OTHER_GRADIENT_FUNCTIONS
    return isinstance(func, cst.Name) and func.value in _OTHER_GRADIENT_FUNCTIONS


_OTHER_GRADIENT_FUNCTIONS = frozenset({"gradients", "gradient"})


def _other_gradients(call: cst.Call) -> Tuple[str, int]:
    """Label of the gradients one such call computes."""
    return ("other gradients", id(call))


def _computed_by(optimizer_name: str) -> Tuple[str, str]:
    """Label of gradients that `optimizer_name.compute_gradients(...)` computed (and loss-scaled)."""
    return ("computed by", optimizer_name)


def _from_helper_given(optimizer_name: str) -> Tuple[str, str]:
    """Label of values computed by a call that was handed `optimizer_name`."""
    return ("helper given", optimizer_name)


def _helper_call(call: cst.Call) -> Tuple[str, str, int]:
    """Label of the value a call of a function (by its dotted name) returns."""
    return ("helper call", dotted_name(call.func) or "", id(call))


def _may_be_a_helper(call: cst.Call, resolve: Resolver) -> bool:
    """A call of a function by its (dotted) name that is not TensorFlow's or numpy's."""
    if not dotted_name(call.func):
        return False
    qualified = resolve(call.func) or ""
    return qualified.split(".")[0] not in ("tensorflow", "numpy", "tf", "np")


def _target_names(target: cst.BaseExpression) -> Set[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        names: Set[str] = set()
        for element in target.elements:
            names |= _target_names(element.value)
        return names
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    if isinstance(target, cst.Subscript):
        # `grads[i] = ...` changes what `grads` holds.
        return _target_names(target.value)
    name = dotted_name(target)
    return {name} if name else set()


class _FlowCollector(cst.CSTVisitor):
    def __init__(self, positions: Positions, resolve: Resolver) -> None:
        self.positions = positions
        self.resolve_name = resolve
        self.finished: List[_ScopeFlow] = []
        self._stack: List[_ScopeFlow] = [_ScopeFlow()]
        #: id of an other-gradients call -> (callee as written, line, column)
        self.other_gradients: Dict[int, Tuple[str, int, int]] = {}
        self._statement_lines: List[int] = [0]
        #: statements enclosing the node being visited, outermost first
        self._statements: List[cst.CSTNode] = []
        #: id of a statement -> (id of its block, index in it); id of a block -> its statements
        self.statement_places: Dict[int, Tuple[int, int]] = {}
        self.blocks: Dict[int, Sequence[cst.CSTNode]] = {}
        #: id of an indented block -> the compound statement whose body it is
        self.block_owners: Dict[int, cst.CSTNode] = {}
        #: id of a tf.gradients call -> the statements enclosing it, outermost first
        self.enclosing: Dict[int, Tuple[cst.CSTNode, ...]] = {}
        #: id of a call of a function by its plain name -> (the call, its line)
        self.helper_calls: Dict[int, Tuple[cst.Call, int]] = {}
        #: ids of tf.gradients calls kept as the fallback of a rewritten helper
        #: (`[...optimizer.compute_gradients(...)] if optimizer is not None else tf.gradients(...)`)
        self.fallbacks: Set[int] = set()
        self._class_depth = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Module, cst.IndentedBlock)):
            self.blocks[id(node)] = node.body
            if isinstance(node, cst.IndentedBlock) and self._statements:
                self.block_owners[id(node)] = self._statements[-1]
            for index, statement in enumerate(node.body):
                self.statement_places[id(statement)] = (id(node), index)
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._statements.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._statements.pop()

    @property
    def _flow(self) -> _ScopeFlow:
        return self._stack[-1]

    def _line(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def _references(self, *nodes: Optional[cst.CSTNode]) -> _References:
        refs = _References(self.resolve_name)
        for node in nodes:
            if node is not None:
                walk(node, refs)
        return refs

    def _edge(self, targets: Set[str], *sources: Optional[cst.CSTNode]) -> None:
        if not targets:
            return
        refs = self._references(*sources)
        self._flow.edges.append((targets, refs.names, refs.labels))
        for target in targets:
            self._flow.assignment_lines.setdefault(target, []).append(self._statement_lines[-1])

    # scopes
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._class_depth += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._class_depth -= 1

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self._flow.return_values.append(node.value)

    def visit_IfExp(self, node: cst.IfExp) -> None:
        if _is_helper_fallback(node):
            for call in calls_within(node.orelse):
                self.fallbacks.add(id(call))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        flow = _ScopeFlow(function_name=node.name.value)
        if len(self._stack) == 1 and not self._class_depth:
            flow.helper = node
        params = node.params
        for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
            flow.params.add(param.name.value)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                flow.params.add(star.name.value)
        self._stack.append(flow)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.finished.append(self._stack.pop())

    def leave_Module(self, original_node: cst.Module) -> None:
        self.finished.append(self._stack.pop())

    def _declare(self, name: str, line: int) -> None:
        # the last declaration counts: a name used before any of them does not compile
        self._flow.declared_lines[name] = max(line, self._flow.declared_lines.get(name, 0))

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._declare(item.name.value, self._line(node))

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self._declare(item.name.value, self._line(node))

    # statement lines
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statement_lines.append(self._line(node))

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statement_lines.pop()

    # flows
    def visit_Assign(self, node: cst.Assign) -> None:
        targets: Set[str] = set()
        for target in node.targets:
            targets |= _target_names(target.target)
        self._edge(targets, node.value)
        if self._statements:
            for target in targets:
                self._flow.assignment_statements.setdefault(target, []).append(self._statements[-1])

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._edge(_target_names(node.target), node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._edge(_target_names(node.target), node.value)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._edge(_target_names(node.target), node.value)

    def visit_For(self, node: cst.For) -> None:
        self._statement_lines.append(self._line(node))
        self._edge(_target_names(node.target), node.iter)
        self._statement_lines.pop()

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._edge(_target_names(node.asname.name), node.item)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if _may_be_a_helper(node, self.resolve_name):
            self.helper_calls[id(node)] = (node, self.positions[node].start.line)
        if self.resolve_name(func) in TF_GRADIENTS and id(node) not in self.fallbacks:
            position = self.positions[node].start
            self._flow.gradients_calls.append(
                _GradientsCall(node, self._statement_lines[-1], position.line, position.column)
            )
            self.enclosing[id(node)] = tuple(self._statements)
            return
        if _is_other_gradients(func):
            position = self.positions[node].start
            shown = cst.Module(body=[]).code_for_node(func)
            self.other_gradients[id(node)] = (shown, position.line, position.column)
        arguments = [(dotted_name(arg.value), arg.value) for arg in node.args]
        if len(arguments) >= 2 and any(name for name, _ in arguments):
            position = self.positions[node].start
            self._flow.handoffs.append(
                (node, [(name, value) for name, value in arguments if name], position.line, position.column)
            )
        if not isinstance(func, cst.Attribute):
            return
        method = func.attr.value
        if method in _CONTAINER_MUTATORS:
            container = dotted_name(func.value)
            if container:
                self._edge({container}, *[arg.value for arg in node.args])
        elif method in ("minimize", "compute_gradients"):
            loss = _argument(node, 0, "loss")
            if loss is not None:
                self._flow.minimized.append(loss)
        if method == "apply_gradients":
            grads = None
            for index, arg in enumerate(node.args):
                if (arg.keyword is None and index == 0 and not arg.star) or (
                    arg.keyword is not None and arg.keyword.value == "grads_and_vars"
                ):
                    grads = arg.value
            position = self.positions[node].start
            self._flow.apply_calls.append(
                _ApplyCall(
                    func.value,
                    dotted_name(func.value),
                    grads,
                    position.line,
                    position.column,
                    has_args=bool(node.args),
                )
            )


def _taint(flow: _ScopeFlow) -> Dict[str, Set[object]]:
    """Which gradient sources each name may hold (order-insensitive, so loops are covered)."""
    taint: Dict[str, Set[object]] = {}
    for _ in range(len(flow.edges) + 1):
        changed = False
        for targets, names, labels in flow.edges:
            incoming = set(labels)
            for name in names:
                incoming |= taint.get(name, set())
            if not incoming:
                continue
            for target in targets:
                known = taint.setdefault(target, set())
                if not incoming <= known:
                    known |= incoming
                    changed = True
        if not changed:
            break
    return taint


def _labels_of(expr: Optional[cst.BaseExpression], taint, resolve: Resolver) -> Set[object]:
    if expr is None:
        return set()
    refs = _References(resolve)
    walk(expr, refs)
    labels = set(refs.labels)
    for name in refs.names:
        labels |= taint.get(name, set())
    return labels


def _unsupported_form(call: cst.Call) -> Optional[str]:
    """Why this tf.gradients call cannot become compute_gradients, or None if it can."""
    positional = 0
    for arg in call.args:
        if arg.star:
            return "it passes *args or **kwargs"
        if arg.keyword is None:
            positional += 1
            continue
        keyword = arg.keyword.value
        if keyword not in ("ys", "xs") and keyword not in GRADIENTS_TO_COMPUTE_GRADIENTS_KWARGS:
            return f"it uses {keyword}=, which compute_gradients does not support"
    if positional > len(TF_GRADIENTS_POSITIONAL):
        return "it passes more than three positional arguments"
    ys = _argument(call, 0, "ys")
    xs = _argument(call, 1, "xs")
    if ys is None or xs is None:
        return "its loss or variables could not be found"
    if isinstance(ys, (cst.List, cst.Tuple)):
        return "it differentiates a list of losses; compute_gradients takes one loss (sum them)"
    return None


def _argument(call: cst.Call, index: int, keyword: str) -> Optional[cst.BaseExpression]:
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    if index < len(positional):
        return positional[index].value
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    return None


def _compute_gradients_expression(call: cst.Call, receiver: cst.BaseExpression) -> cst.BaseExpression:
    """`[g for g, _ in O.compute_gradients(loss, var_list=xs, ...)]` for a plain tf.gradients call.

    The original arguments are reused, renamed where compute_gradients names them differently,
    so their layout and comments (`loss,  # the total loss` on a line of its own) survive."""
    positional_names = ("ys", "xs", "grad_ys")
    new_keywords = {"xs": "var_list", **GRADIENTS_TO_COMPUTE_GRADIENTS_KWARGS}
    loss_args: List[cst.Arg] = []
    other_args: List[cst.Arg] = []
    positional_index = 0
    for arg in call.args:
        if arg.keyword is None:
            name = positional_names[positional_index]
            positional_index += 1
        else:
            name = arg.keyword.value
        if name == "ys":
            loss_args.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT))
        else:
            other_args.append(arg.with_changes(keyword=cst.Name(new_keywords[name]), equal=_EQUAL))
    args = loss_args + other_args  # the loss goes first: it is compute_gradients' one positional
    last_comma = call.args[-1].comma
    for index, arg in enumerate(args):
        if index < len(args) - 1 and not isinstance(arg.comma, cst.Comma):
            args[index] = arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        elif index == len(args) - 1 and arg.comma is not last_comma:
            args[index] = arg.with_changes(comma=last_comma)  # moved last: the call's own ending
    compute = cst.Call(
        func=cst.Attribute(value=receiver.deep_clone(), attr=cst.Name("compute_gradients")),
        args=args,
        whitespace_before_args=call.whitespace_before_args,
    )
    return cst.ListComp(
        elt=cst.Name("g"),
        for_in=cst.CompFor(
            target=cst.Tuple([cst.Element(cst.Name("g")), cst.Element(cst.Name("_"))], lpar=[], rpar=[]),
            iter=compute,
        ),
    )


_EQUAL = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)


def _bound_before(flow: _ScopeFlow, receiver_name: str, line: int) -> bool:
    """Is the optimizer name bound before `line` in this body (or bound outside it)?"""
    lines = flow.assignment_lines.get(receiver_name)
    if not lines:
        return True  # a parameter, a global, or an attribute set elsewhere (e.g. in __init__)
    return any(assigned < line for assigned in lines)


def plan_gradients_rewrites(
    module: cst.Module,
    positions: Positions,
    resolve: Resolver,
    *,
    rewrite: bool,
    why_not_rewritten: str = "",
    keras_optimizer_names: frozenset = frozenset(),
    wrapped_calls: frozenset = frozenset(),
    optimizer_names: frozenset = frozenset(),
    project=None,
    display: str = "",
) -> GradientsPlan:
    """Find tf.gradients results that reach apply_gradients; plan rewrites or warnings.

    With `rewrite=False` (the file is left alone, e.g. it already uses mixed precision)
    every such flow gets a warning giving `why_not_rewritten`. `wrapped_calls` holds the ids
    of the optimizer constructions being wrapped: only those may be moved above tf.gradients.
    """
    collector = _FlowCollector(positions, resolve)
    walk(module, collector)
    plan = GradientsPlan()
    helpers = _helpers_returning_gradients(collector, resolve)
    helper_rewrite = _HelperRewrite(collector, helpers, plan, rewrite, why_not_rewritten, project, display)
    for flow in collector.finished:
        hoister = _Hoister(collector, flow, plan, wrapped_calls, positions)
        _plan_scope(flow, resolve, plan, rewrite, why_not_rewritten, keras_optimizer_names, hoister, helper_rewrite)
        _warn_other_gradients(flow, resolve, collector.other_gradients, plan, keras_optimizer_names)
        _warn_gradients_handed_on(flow, resolve, plan, optimizer_names)
        _warn_foreign_gradients_used_by_hand(flow, resolve, plan, helper_rewrite)
        _warn_parameter_gradients_used_by_hand(flow, resolve, plan)
    helper_rewrite.write_companions()
    plan.findings.sort(key=lambda f: (f.line, f.column, f.code))
    return plan


def _warn_foreign_gradients_used_by_hand(flow: _ScopeFlow, resolve: Resolver, plan: GradientsPlan,
                                         helper_rewrite: "_HelperRewrite") -> None:
    """Gradients a helper of another project module computes with tf.gradients (spinningup's TRPO:
    `gradient = core.flat_grad(pi_loss, pi_params)`, fetched by sess.run for a conjugate-gradient
    step) that this body neither applies with an optimizer nor adds to a loss it minimizes (a
    gradient penalty): under the graph rewrite they are float16 and no optimizer scales their loss,
    so they can underflow silently. The file is not converted (graph_rewrite reads the code)."""
    taint = _taint(flow)
    held: Set[object] = set()
    for labels in taint.values():
        held |= labels
    applied: Set[object] = set()
    for apply in flow.apply_calls:
        applied |= _labels_of(apply.grads, taint, resolve)
    for loss in flow.minimized:
        applied |= _labels_of(loss, taint, resolve)
    reported: Set[str] = set()
    for label in sorted((label for label in held if isinstance(label, tuple) and label[0] == "helper call"),
                        key=lambda label: (label[1], label[2])):
        if label in applied or label[1] in reported:
            continue
        ask = getattr(helper_rewrite.project, "gradients_function", None)
        foreign = ask(label[1]) if ask is not None and label[1] not in helper_rewrite.helpers else None
        if foreign is None:
            continue
        reported.add(label[1])
        call, line = helper_rewrite.collector.helper_calls[label[2]]
        position = helper_rewrite.collector.positions[call].start
        plan.findings.append(
            Finding(
                CODE_GRADIENTS_OUTSIDE_OPTIMIZER,
                f"{label[1]}() ({foreign[1]}) computes gradients with tf.gradients that this code uses without an "
                "optimizer (neither applied with apply_gradients nor part of a loss it minimizes: a natural-gradient "
                "or TRPO step, a saliency map); under the mixed precision graph rewrite they are float16 and no "
                "loss scaling reaches them, so they can underflow silently; the file was left unconverted: compute "
                "them in float32 (outside the rewrite) by hand, or keep this script in float32",
                position.line,
                position.column,
                Severity.WARNING,
            )
        )


#: calls that return variables (`tf.trainable_variables()`, spinningup's `get_vars('pi')`)
_VARIABLE_GETTERS = frozenset({"trainable_variables", "global_variables", "local_variables", "model_variables",
                               "get_collection", "get_variable", "Variable", "get_variables", "get_vars",
                               "get_trainable_variables"})
#: Python's builtins (`zip(params, grads)` hands the gradients to no one)
_BUILTIN_NAMES = frozenset(dir(builtins))
#: names that hold the variables of a model by convention
_VARIABLE_NAMES = frozenset({"tvars", "var_list", "params", "variables", "trainable_vars", "train_vars",
                             "trainable_variables", "t_vars"})


def _warn_parameter_gradients_used_by_hand(flow: _ScopeFlow, resolve: Resolver, plan: GradientsPlan) -> None:
    """`tf.gradients(loss, params)` with respect to variables, whose result this body neither applies
    with an optimizer nor adds to a loss it minimizes: a parameter update written by hand (TRPO's
    conjugate-gradient step, `tf.assign_sub(w, lr * g)`); under the graph rewrite those gradients are
    float16 and unscaled. Gradients with respect to inputs (a gradient penalty's interpolates, a
    saliency map) are not flagged. The file is not converted (graph_rewrite reads the code)."""
    if not flow.gradients_calls:
        return
    taint = _taint(flow)
    used: Set[object] = set()
    for apply in flow.apply_calls:
        used |= _labels_of(apply.grads, taint, resolve)
    for loss in flow.minimized:
        used |= _labels_of(loss, taint, resolve)
    # returned to a caller (a tower helper, see _HelperRewrite) or handed to other code: judged there
    for value in flow.return_values:
        used |= _labels_of(value, taint, resolve)
    for call, _, _, _ in flow.handoffs:
        callee = resolve(call.func) or dotted_name(call.func) or ""
        if not callee.startswith(("tensorflow", "numpy")) and callee not in _BUILTIN_NAMES \
                and callee.rsplit(".", 1)[-1] not in ("run", "eval"):  # a Session fetch applies nothing
            for arg in call.args:
                used |= _labels_of(arg.value, taint, resolve)
    for gradients in flow.gradients_calls:
        if id(gradients.call) in used:
            continue
        xs = _argument(gradients.call, 1, "xs")
        if xs is None or not _holds_variables(xs, flow, resolve, 0):
            continue
        plan.findings.append(
            Finding(
                CODE_GRADIENTS_OUTSIDE_OPTIMIZER,
                f"tf.gradients here differentiates with respect to variables ({cst.Module(body=[]).code_for_node(xs)}) "
                "and its result is used without an optimizer (neither applied with apply_gradients nor part of a loss "
                "minimized here: a parameter update written by hand, a TRPO or natural-gradient step); under the mixed "
                "precision graph rewrite these gradients are float16 and no loss scaling reaches them, so they can "
                "underflow silently; the file was left unconverted: apply them with an optimizer's "
                "compute_gradients/apply_gradients, or keep this script in float32",
                gradients.line,
                gradients.column,
                Severity.WARNING,
            )
        )


def _holds_variables(node: cst.CSTNode, flow: _ScopeFlow, resolve: Resolver, depth: int) -> bool:
    """Does the expression (or the statements binding the names it reads, a few levels back) get
    variables: a variable getter, `.trainable_variables` / `.trainable_weights`, or a name that
    holds them by convention (`tvars`, `var_list`, `params`)?"""

    class _Finder(cst.CSTVisitor):
        found = False
        names: Set[str] = set()

        def visit_Call(self, call: cst.Call) -> None:
            name = dotted_name(call.func) or ""
            if name.rsplit(".", 1)[-1] in _VARIABLE_GETTERS:
                self.found = True

        def visit_Attribute(self, attribute: cst.Attribute) -> None:
            if attribute.attr.value in ("trainable_variables", "trainable_weights"):
                self.found = True

        def visit_Name(self, name: cst.Name) -> None:
            self.names = self.names | {name.value}

    finder = _Finder()
    walk(node, finder)
    if finder.found or finder.names & _VARIABLE_NAMES:
        return True
    if depth >= 3:
        return False
    return any(_holds_variables(statement, flow, resolve, depth + 1)
               for name in finder.names for statement in flow.assignment_statements.get(name, [])
               if statement is not node)


def _warn_gradients_handed_on(flow: _ScopeFlow, resolve: Resolver, plan: GradientsPlan, optimizer_names) -> None:
    """tf.gradients results handed to other code together with an optimizer of this file
    (`variable_mgr.append_apply_gradients_ops(state, opt, grads)`): if that code applies them
    with the wrapped optimizer, only its compute_gradients would have scaled the loss."""
    if not flow.gradients_calls or not flow.handoffs or not optimizer_names:
        return
    taint = _taint(flow)
    applied_here = set()
    for apply in flow.apply_calls:
        applied_here |= _labels_of(apply.grads, taint, resolve)
    for call, arguments, line, column in flow.handoffs:
        optimizers = [name for name, _ in arguments if name in optimizer_names]
        if not optimizers:
            continue
        handed = set()
        for name, value in arguments:
            if name not in optimizers:
                handed |= _labels_of(value, taint, resolve)
        gradients = [g for g in flow.gradients_calls if id(g.call) in handed and id(g.call) not in applied_here]
        if not gradients:
            continue
        callee = cst.Module(body=[]).code_for_node(call.func)
        plan.findings.append(
            Finding(
                CODE_NOT_REWRITABLE,
                f"tf.gradients result (line {gradients[0].line}) is handed to {callee}() together with the "
                f"optimizer {optimizers[0]}: if that code applies them with it, they are not loss-scaled (only "
                f"{optimizers[0]}.compute_gradients scales the loss under the mixed precision wrapper) and float16 "
                f"gradients can underflow silently; compute them with {optimizers[0]}.compute_gradients(loss, "
                "var_list=...) and hand those on",
                line,
                column,
                Severity.WARNING,
            )
        )


def _plan_scope(
    flow, resolve, plan, rewrite, why_not_rewritten, keras_optimizer_names, hoister, helper_rewrite=None
) -> None:
    if not flow.apply_calls:
        return
    taint = _taint(flow)
    apply_labels = [(apply, _labels_of(apply.grads, taint, resolve)) for apply in flow.apply_calls]
    for apply, labels in apply_labels:
        computed_by = sorted(label[1] for label in labels if isinstance(label, tuple) and label[0] == "computed by")
        if apply.receiver_name and computed_by and apply.receiver_name not in computed_by:
            # A3C-style: a local optimizer computes, a global one applies. Under the mixed
            # precision wrapper each has its own loss scale: one scales, the other unscales.
            plan.findings.append(
                Finding(
                    CODE_UNTRACEABLE_APPLY,
                    f"{_shown(apply)}.apply_gradients receives gradients computed by "
                    f"{computed_by[0]}.compute_gradients: under the mixed precision wrapper each optimizer has its own "
                    f"loss scale, so {computed_by[0]}'s scales the loss, {_shown(apply)}'s unscales the gradients and "
                    f"only {_shown(apply)}'s is ever updated; compute and apply the gradients with one optimizer",
                    apply.line,
                    apply.column,
                    Severity.WARNING,
                )
            )

    for apply, labels in apply_labels:
        traced = {
            label
            for label in labels
            if not isinstance(label, tuple) or label == _from_helper_given(apply.receiver_name or "")
        }
        if _other_labels(labels) or not apply.has_args or _passes_through(flow, apply, resolve):
            continue  # reported by _warn_other_gradients / not an Optimizer's apply_gradients
        if not traced and apply.receiver_name not in keras_optimizer_names and helper_rewrite is not None:
            if helper_rewrite.plan_for(flow, apply, labels):
                continue
        if not traced and apply.receiver_name not in keras_optimizer_names:
            plan.findings.append(
                Finding(
                    CODE_UNTRACEABLE_APPLY,
                    f"{_shown(apply)}.apply_gradients receives gradients that do not come from "
                    "compute_gradients or tf.gradients in this function: if they come from "
                    "tf.gradients or a GradientTape the loss is not scaled and float16 gradients "
                    f"can underflow; compute them with {_shown(apply)}.compute_gradients(loss)",
                    apply.line,
                    apply.column,
                    Severity.WARNING,
                )
            )

    for gradients in flow.gradients_calls:
        reached = [apply for apply, labels in apply_labels if id(gradients.call) in labels]
        if not reached:
            continue  # e.g. a gradient penalty: never applied, nothing to scale
        receivers = sorted({apply.receiver_name or _shown(apply) for apply in reached})
        if all(apply.receiver_name in keras_optimizer_names for apply in reached):
            continue  # a Keras optimizer: reported where it is built (AMP112)
        reason = (
            why_not_rewritten if not rewrite else _why_not(gradients, reached, receivers, flow, hoister)
        )
        if reason:
            plan.findings.append(
                Finding(
                    CODE_NOT_REWRITABLE,
                    f"tf.gradients result reaches {receivers[0]}.apply_gradients without loss "
                    f"scaling (float16 gradients can underflow silently); not rewritten: {reason}. "
                    f"Compute them with {receivers[0]}.compute_gradients(loss, var_list=...) "
                    "instead",
                    gradients.line,
                    gradients.column,
                    Severity.WARNING,
                )
            )
            continue
        plan.replacements[id(gradients.call)] = _compute_gradients_expression(
            gradients.call, reached[0].receiver
        )
        move = hoister.move_of(receivers[0])
        moved = (
            f" (moved the construction of {receivers[0]} from line {move.from_line} up to line "
            f"{move.to_line}, so it exists first)"
            if move is not None
            else ""
        )
        plan.findings.append(
            Finding(
                CODE_REWROTE,
                f"rewrote tf.gradients to {receivers[0]}.compute_gradients so the loss is scaled "
                f"before the gradients reach apply_gradients{moved}",
                gradients.line,
                gradients.column,
                Severity.INFO,
            )
        )


def _passes_through(flow: _ScopeFlow, apply: _ApplyCall, resolve: Resolver) -> bool:
    """`def apply_gradients(self, grads_and_vars, ...): return self._opt.apply_gradients(
    grads_and_vars, ...)`: a wrapper handing its caller's gradients on; the caller's own
    apply_gradients call is the one that is checked."""
    if flow.function_name != "apply_gradients" or apply.grads is None:
        return False
    refs = _References(resolve)
    walk(apply.grads, refs)
    return bool(refs.names) and refs.names <= flow.params


def _other_labels(labels: Set[object]) -> Set[object]:
    return {label for label in labels if isinstance(label, tuple) and label[0] == "other gradients"}


def _warn_other_gradients(flow, resolve, other_gradients, plan, keras_optimizer_names) -> None:
    """Gradients from `memory_saving_gradients.gradients` or a tape that reach apply_gradients
    are never loss-scaled, even when another branch's tf.gradients is rewritten."""
    if not flow.apply_calls:
        return
    taint = _taint(flow)
    warned: Set[object] = set()
    for apply in flow.apply_calls:
        if apply.receiver_name in keras_optimizer_names:
            continue
        for label in sorted(_other_labels(_labels_of(apply.grads, taint, resolve)) - warned, key=str):
            warned.add(label)
            shown, line, column = other_gradients.get(label[1], ("gradients", apply.line, apply.column))
            plan.findings.append(
                Finding(
                    CODE_UNTRACEABLE_APPLY,
                    f"gradients from {shown}(...) reach {_shown(apply)}.apply_gradients (line "
                    f"{apply.line}) without loss scaling, so float16 gradients can underflow "
                    f"silently; not rewritten: compute them with {_shown(apply)}."
                    "compute_gradients(loss, var_list=...) when mixed precision is on",
                    line,
                    column,
                    Severity.WARNING,
                )
            )


@dataclass
class _Helper:
    """A module-level function of the file that returns tf.gradients results
    (`def tower_grads(...): ...; grads = tf.gradients(loss, tvars); return grads, loss`)."""

    flow: _ScopeFlow
    gradients: List[_GradientsCall]
    #: why it cannot be rewritten (empty when it can)
    reason: str = ""


#: the parameter a helper gets to compute its gradients with the caller's optimizer
HELPER_OPTIMIZER = "optimizer"


def _helpers_returning_gradients(collector: _FlowCollector, resolve: Resolver) -> Dict[str, _Helper]:
    """Module-level functions whose returned values hold tf.gradients results they do not apply
    themselves, by name (a name defined twice is left out: which one runs is not known)."""
    found: Dict[str, _Helper] = {}
    defined: Dict[str, int] = {}
    for flow in collector.finished:
        if flow.helper is not None:
            defined[flow.function_name] = defined.get(flow.function_name, 0) + 1
    for flow in collector.finished:
        if flow.helper is None or not flow.gradients_calls or defined[flow.function_name] > 1:
            continue
        taint = _taint(flow)
        returned: Set[object] = set()
        for value in flow.return_values:
            returned |= _labels_of(value, taint, resolve)
        applied: Set[object] = set()
        for apply in flow.apply_calls:
            applied |= _labels_of(apply.grads, taint, resolve)
        gradients = [g for g in flow.gradients_calls if id(g.call) in returned and id(g.call) not in applied]
        if not gradients:
            continue
        reason = next((f"its tf.gradients (line {g.line}) cannot become compute_gradients: {form}"
                       for g in gradients for form in [_unsupported_form(g.call)] if form), "")
        if not reason and (HELPER_OPTIMIZER in flow.params or HELPER_OPTIMIZER in flow.assignment_lines):
            reason = f"{flow.function_name}() has a parameter or variable named {HELPER_OPTIMIZER} already"
        found[flow.function_name] = _Helper(flow, gradients, reason)
    return found


class _HelperRewrite:
    """Gradients that a helper of this file returns (`tower_grads()`, called per GPU tower) and the
    caller applies: the helper gets an `optimizer=None` parameter and computes them with
    `optimizer.compute_gradients` when given one (tf.gradients otherwise, as before, for any other
    caller); the caller passes the optimizer that applies them, so the wrapper scales the loss."""

    def __init__(self, collector: _FlowCollector, helpers: Dict[str, _Helper], plan: GradientsPlan,
                 rewrite: bool, why_not_rewritten: str, project=None, display: str = "") -> None:
        self.collector = collector
        self.helpers = helpers
        self.plan = plan
        self.rewrite = rewrite
        self.why_not_rewritten = why_not_rewritten
        self.project = project
        self.display = display
        #: dotted name -> (key, display, function name) of a helper of another module, or None
        self._foreign: Dict[str, Optional[Tuple[str, str, str]]] = {}
        #: key of another module -> (its display, its helpers to rewrite there)
        self._foreign_edits: Dict[str, Tuple[str, Set[str]]] = {}

    def foreign(self, dotted: str) -> Optional[Tuple[str, str, str]]:
        if dotted not in self._foreign:
            ask = getattr(self.project, "tf_gradients_function", None)
            self._foreign[dotted] = ask(dotted) if ask is not None and dotted not in self.helpers else None
        return self._foreign[dotted]

    def plan_for(self, flow: _ScopeFlow, apply: _ApplyCall, labels: Set[object]) -> bool:
        """Plan the rewrite (or warn why not) when `apply` receives what helpers return; False
        when it receives nothing from one."""
        calls = sorted({label[2]: label[1] for label in labels if isinstance(label, tuple)
                        and label[0] == "helper call" and (label[1] in self.helpers or self.foreign(label[1]))}.items())
        if not calls:
            return False
        receiver = apply.receiver_name
        for call_id, name in calls:
            call, line = self.collector.helper_calls[call_id]
            helper = self.helpers.get(name)
            if helper is None:
                self._plan_foreign(flow, apply, name, call, line)
                continue
            reason = self._why_not(flow, helper, call, line, receiver)
            if reason:
                first = helper.gradients[0]
                self.plan.findings.append(Finding(
                    CODE_NOT_REWRITABLE,
                    f"tf.gradients result returned by {name}() reaches {_shown(apply)}.apply_gradients (line "
                    f"{apply.line}) through its call at line {line}, without loss scaling (float16 gradients can "
                    f"underflow silently); not rewritten: {reason}. Compute them with {_shown(apply)}."
                    "compute_gradients(loss, var_list=...) instead",
                    first.line, first.column, Severity.WARNING))
                continue
            self._rewrite(helper, name, call, line, apply)
        return True

    def _plan_foreign(self, flow: _ScopeFlow, apply: _ApplyCall, dotted: str, call: cst.Call, line: int) -> None:
        """The helper is a function of another project module (`model.tower_grads(...)`): it is
        rewritten there, in the same change set, and this call passes the optimizer."""
        key, display, function_name = self.foreign(dotted)  # type: ignore[misc]
        reason = self._why_not(flow, None, call, line, apply.receiver_name, function_name)
        if not reason and not self.project.in_this_run(key):
            reason = f"{display} is not in this run: run ampify on both files or on the repository"
        source = None if reason else self.project.source_of(key)
        if not reason and source is None:
            reason = f"{display} cannot be read"
        if not reason:
            checked = rewrite_helpers_of_module(source, [function_name])
            reason = checked if isinstance(checked, str) else ""
        position = self.collector.positions[call].start
        if reason:
            self.plan.findings.append(Finding(
                CODE_NOT_REWRITABLE,
                f"{dotted}() ({display}) returns tf.gradients results that reach {_shown(apply)}.apply_gradients "
                f"(line {apply.line}) without loss scaling (float16 gradients can underflow silently); not rewritten: "
                f"{reason}. Compute them there with {_shown(apply)}.compute_gradients(loss, var_list=...) instead",
                line, position.column, Severity.WARNING))
            return
        self._foreign_edits.setdefault(key, (display, set()))[1].add(function_name)
        if id(call) in self.plan.replacements:
            return
        self.plan.replacements[id(call)] = with_keyword(call, HELPER_OPTIMIZER, apply.receiver.deep_clone())
        self.plan.findings.append(Finding(
            CODE_REWROTE,
            f"{dotted}() is passed {HELPER_OPTIMIZER}={_shown(apply)}: {function_name}() in {display} computes the "
            f"gradients it returns with {HELPER_OPTIMIZER}.compute_gradients when given one (written together with "
            f"this file, as one change set), so {_shown(apply)}.apply_gradients (line {apply.line}) gets loss-scaled "
            "gradients",
            line, position.column, Severity.INFO))

    def write_companions(self) -> None:
        """One edit per other module, holding every helper of it that the calls here reach."""
        for key, (display, functions) in sorted(self._foreign_edits.items()):
            source = self.project.source_of(key)
            rewritten = rewrite_helpers_of_module(source, sorted(functions)) if source is not None else "unreadable"
            if isinstance(rewritten, str) or rewritten[0] is None:
                continue  # checked before: only "rewritten already" (another change set of this run) lands here
            new, notes = rewritten
            self.plan.companions.append(CompanionChange(
                key=key, display=display, old=source, new=new,
                findings=[Finding(CODE_REWROTE, message, line, column, Severity.INFO) for line, column, message in notes],
                reason=f"changed with {self.display}: its gradients helpers compute with the optimizer they are passed"))

    def _why_not(self, flow: _ScopeFlow, helper: Optional[_Helper], call: cst.Call, line: int,
                 receiver: Optional[str], name: str = "") -> str:
        if not self.rewrite:
            return self.why_not_rewritten
        if helper is not None and helper.reason:
            return helper.reason
        name = name or (helper.flow.function_name if helper is not None else "")
        if receiver is None:
            return "the optimizer that applies them is not a plain name"
        if "." not in receiver and not _bound_before(flow, receiver, line):
            return f"the optimizer {receiver} is created after the call of {name}() (line {line})"
        if any(arg.keyword is not None and arg.keyword.value == HELPER_OPTIMIZER or arg.star for arg in call.args):
            return f"its call at line {line} passes {HELPER_OPTIMIZER}= or **kwargs already"
        return ""

    def _rewrite(self, helper: _Helper, name: str, call: cst.Call, line: int, apply: _ApplyCall) -> None:
        plan = self.plan
        if id(helper.flow.helper) not in plan.new_parameters:
            plan.findings.extend(
                Finding(CODE_REWROTE, message, line_, column, Severity.INFO)
                for line_, column, message in _rewrite_helper(plan, helper, name))
        if id(call) in plan.replacements:
            return
        position = self.collector.positions[call].start
        plan.replacements[id(call)] = with_keyword(call, HELPER_OPTIMIZER, apply.receiver.deep_clone())
        plan.findings.append(Finding(
            CODE_REWROTE,
            f"{name}() is passed {HELPER_OPTIMIZER}={_shown(apply)}: the gradients it returns, applied by "
            f"{_shown(apply)}.apply_gradients (line {apply.line}), come from {_shown(apply)}.compute_gradients",
            line, position.column, Severity.INFO))


def _rewrite_helper(plan: GradientsPlan, helper: _Helper, name: str) -> List[Tuple[int, int, str]]:
    """Plan `optimizer=None` for the helper and `[... optimizer.compute_gradients(...)] if optimizer
    is not None else tf.gradients(...)` for its gradients; (line, column, message) of each rewrite."""
    plan.new_parameters[id(helper.flow.helper)] = HELPER_OPTIMIZER
    notes = []
    for gradients in helper.gradients:
        computed = _compute_gradients_expression(gradients.call, cst.Name(HELPER_OPTIMIZER))
        plan.replacements[id(gradients.call)] = cst.IfExp(
            test=cst.parse_expression(f"{HELPER_OPTIMIZER} is not None"), body=computed,
            orelse=gradients.call, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        notes.append((gradients.line, gradients.column,
                      f"rewrote tf.gradients in {name}() to {HELPER_OPTIMIZER}.compute_gradients when it is given the "
                      f"optimizer (a new `{HELPER_OPTIMIZER}=None` parameter; a caller passing none still gets "
                      "tf.gradients), so the loss is scaled before its callers apply the gradients"))
    return notes


def rewrite_helpers_of_module(source: bytes, names: Sequence[str]
                              ) -> Union[str, Tuple[Optional[bytes], List[Tuple[int, int, str]]]]:
    """The other half of a helper of another module (`model.tower_grads(...)` called by a TF1
    training file): each named module-level function takes `optimizer=None` and computes the
    gradients it returns with it when given one. (new source, notes), (None, []) when every one
    takes it already (another change set of this run wrote it), or the reason it cannot be done."""
    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.tf1.names import normalise_tf_name

    try:
        module = cst.parse_module(source)
    except Exception as error:  # the other module does not parse
        return f"it does not parse ({type(error).__name__})"
    imports = ImportMap.from_module(module)

    def resolve(node: cst.CSTNode) -> Optional[str]:
        return normalise_tf_name(imports.resolve(node))

    collector = _FlowCollector(Positions(module), resolve)
    walk(module, collector)
    helpers = _helpers_returning_gradients(collector, resolve)
    plan = GradientsPlan()
    notes: List[Tuple[int, int, str]] = []
    for name in names:
        helper = helpers.get(name)
        if helper is None:
            if any(flow.helper is not None and flow.function_name == name and HELPER_OPTIMIZER in flow.params
                   and not flow.gradients_calls for flow in collector.finished):
                continue  # rewritten already: its tf.gradients is the fallback of compute_gradients
            return f"{name}() does not return the tf.gradients results it computes in a form ampify follows"
        if helper.reason:
            return helper.reason
        notes += _rewrite_helper(plan, helper, name)
    if not plan.new_parameters:
        return None, []
    new = module.visit(_HelperEdits(plan.replacements, plan.new_parameters))
    return new.bytes, notes


class _HelperEdits(cst.CSTTransformer):
    """The planned helper rewrites of another module (no optimizer to wrap there)."""

    def __init__(self, replacements: Dict[int, cst.BaseExpression], new_parameters: Dict[int, str]) -> None:
        self.replacements = replacements
        self.new_parameters = new_parameters

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return self.replacements.get(id(original_node), updated_node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        name = self.new_parameters.get(id(original_node))
        if name is None:
            return updated_node
        return updated_node.with_changes(params=with_parameter(updated_node.params, name, "None"))


def _is_helper_fallback(node: cst.IfExp) -> bool:
    """`[...] if optimizer is not None else tf.gradients(...)`, as _HelperRewrite writes it."""
    test = node.test
    return (isinstance(test, cst.Comparison) and isinstance(test.left, cst.Name)
            and test.left.value == HELPER_OPTIMIZER and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.IsNot)
            and isinstance(test.comparisons[0].comparator, cst.Name) and test.comparisons[0].comparator.value == "None"
            and "compute_gradients" in cst.Module(body=[]).code_for_node(node.body))


class _Hoister:
    """Plans moving an optimizer's construction above a tf.gradients call (see tf1/optimizer_hoist.py)."""

    def __init__(self, collector: _FlowCollector, flow: _ScopeFlow, plan: GradientsPlan, wrapped_calls, positions):
        self.positions = positions
        self.collector = collector
        self.flow = flow
        self.plan = plan
        self.wrapped_calls = wrapped_calls
        #: id of an optimizer's construction -> id of the statement moved for it (itself, or the
        #: `with tf.name_scope(...)` whose whole body it is)
        self.moved_with: Dict[int, int] = {}

    def try_hoist(self, gradients: _GradientsCall, receiver: str) -> Optional[str]:
        """Plan the move and return None, or say why the optimizer cannot move up."""
        statements = self.flow.assignment_statements.get(receiver, [])
        if len(statements) != 1 or len(self.flow.assignment_lines.get(receiver, [])) != 1:
            return f"{receiver} is assigned more than once"
        statement = statements[0]
        value = statement.body[0].value if isinstance(statement, cst.SimpleStatementLine) and isinstance(
            statement.body[0], cst.Assign
        ) else None
        if value is None or id(value) not in self.wrapped_calls:
            return f"{receiver} is not an optimizer this file builds and wraps"
        place = self.collector.statement_places.get(id(statement))
        if place is None:
            return "its construction is not a statement of its own"
        block_id, index = place
        anchor = self._anchor_in(gradients, block_id)
        moved = statement
        if anchor is not None and self.collector.statement_places[id(anchor)][1] < index:
            anchor_index = self.collector.statement_places[id(anchor)][1]
            between = self.collector.blocks[block_id][anchor_index:index]
        else:
            out_of_scope = self._out_of_scope_block(gradients, statement, block_id, index)
            if isinstance(out_of_scope, str):
                return out_of_scope
            anchor, between, moved = out_of_scope
        reason = plan_hoist(statement, receiver, anchor, between)
        if reason is not None:
            return reason
        previous = self.plan.moves.get(id(moved))
        if previous is None or previous.to_line > gradients.statement_line:
            self.plan.moves[id(moved)] = StatementMove(
                id(moved), id(anchor), self._line_of(statement), self._line_of(anchor)
            )
            self.moved_with[id(statement)] = id(moved)
        return None

    def _anchor_in(self, gradients: _GradientsCall, block_id: int) -> Optional[cst.CSTNode]:
        """The statement of block `block_id` that holds the tf.gradients call."""
        return next(
            (
                enclosing
                for enclosing in self.collector.enclosing.get(id(gradients.call), ())
                if self.collector.statement_places.get(id(enclosing), (None,))[0] == block_id
            ),
            None,
        )

    def _out_of_scope_block(self, gradients: _GradientsCall, statement: cst.CSTNode, block_id: int, index: int):
        """(anchor, statements between, statement to move) when the optimizer is built first thing it
        can be in the body of a `with tf.variable_scope(...)` / `tf.name_scope(...)` after the block
        holding tf.gradients (DDPG's actor: `with tf.variable_scope('policy_grads'): grads =
        tf.gradients(...)`, then `with tf.variable_scope('A_train'): opt = tf.train.AdamOptimizer(...)`):
        a scope names ops and variables, and building an optimizer creates neither (the wrapper's loss
        scale variables only move to the enclosing scope), so the construction moves above the
        earlier block; when it is the whole body, the whole `with` moves. Else why not."""
        different = "tf.gradients and the optimizer are in different blocks"
        owner = self.collector.block_owners.get(block_id)
        if not isinstance(owner, cst.With) or not all(_is_scope(item) for item in owner.items):
            return different
        place = self.collector.statement_places.get(id(owner))
        if place is None:
            return different
        outer_id, owner_index = place
        anchor = self._anchor_in(gradients, outer_id)
        if anchor is None or self.collector.statement_places[id(anchor)][1] >= owner_index:
            return different
        inner = self.collector.blocks[block_id]
        anchor_index = self.collector.statement_places[id(anchor)][1]
        if len(inner) < 2:
            # the construction is the whole body (char-rnn-tensorflow: `with tf.name_scope('optimizer'):
            # optimizer = tf.train.AdamOptimizer(self.lr)`): the whole `with` moves up, scope and all
            between = self.collector.blocks[outer_id][anchor_index:owner_index]
            reason = scope_reads_what_changes(owner, between)
            if reason is not None:
                return reason
            return anchor, between, owner
        scoped = {item.asname.name.value for item in owner.items
                  if item.asname is not None and isinstance(item.asname.name, cst.Name)}
        if scoped and any(isinstance(n, cst.Name) and n.value in scoped for n in _names_in(statement)):
            return f"building it reads {sorted(scoped)[0]}, bound by the `with` at line {self._line_of(owner)}"
        between = [*self.collector.blocks[outer_id][anchor_index:owner_index], *inner[:index]]
        return anchor, between, statement

    def _line_of(self, statement: cst.CSTNode) -> int:
        return self.positions[statement].start.line

    def move_of(self, receiver: str) -> Optional[StatementMove]:
        """The planned move of this optimizer's construction, if any."""
        statements = self.flow.assignment_statements.get(receiver, [])
        if len(statements) != 1:
            return None
        return self.plan.moves.get(self.moved_with.get(id(statements[0]), id(statements[0])))


def _is_scope(item: cst.WithItem) -> bool:
    """`tf.variable_scope(...)`, `tf.name_scope(...)` (any spelling)."""
    call = item.item
    if not isinstance(call, cst.Call):
        return False
    name = dotted_name(call.func) or ""
    return name.rsplit(".", 1)[-1] in ("variable_scope", "name_scope")


def _names_in(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _names_in(child)


def _why_not(gradients: _GradientsCall, reached, receivers, flow: _ScopeFlow, hoister) -> str:
    form = _unsupported_form(gradients.call)
    if form:
        return form
    if len(receivers) > 1:
        return "its gradients reach the apply_gradients of several optimizers (" + ", ".join(
            receivers
        ) + ")"
    receiver_name = reached[0].receiver_name
    if receiver_name is None:
        return "the optimizer that applies them is not a plain name"
    if flow.declared_lines.get(receiver_name, 0) > gradients.statement_line:
        # using the name before its `global` declaration would not even compile
        return f"{receiver_name} is declared global/nonlocal only after tf.gradients"
    if not _bound_before(flow, receiver_name, gradients.statement_line):
        cannot_move = hoister.try_hoist(gradients, receiver_name)
        if cannot_move is not None:
            return (
                f"the optimizer {receiver_name} is created after tf.gradients and cannot be "
                f"moved up ({cannot_move}); create it first"
            )
    return ""


def _shown(apply: _ApplyCall) -> str:
    return apply.receiver_name or cst.Module(body=[]).code_for_node(apply.receiver)
