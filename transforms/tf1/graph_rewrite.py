"""Wrap TF1 optimizers with enable_mixed_precision_graph_rewrite.

The rule is applied where optimizers are BUILT: `X(...)` where X is a TF1 optimizer class
(directly, through a name, dict, partial or getattr, or a class the file derives from one)
becomes `WRAPPER(X(...))`. That one rule covers assignments, `.minimize()` one-liners, factory
returns, if-chains and dict values. Around it: the env var that keeps pre-Volta GPUs from
skipping the rewrite, tf.gradients rewritten to compute_gradients so the loss is scaled, and
warnings for every pattern that cannot be converted safely.

Its rule codes (AMP1xx) and what each means: ampify/rules.py (`ampify rules`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.tf1 import screen as tf1_screen
from ampify.transforms.base import Transform, TransformResult, UnitContext, Verdict
from ampify.transforms.kit.fast_walk import iter_tree, walk
from ampify.transforms.kit.calls import calls_within
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.parsed_modules import parsed_module
from ampify.transforms.kit.line_map import LineMap
from ampify.transforms.kit.log_of_sigmoid import TENSORFLOW, log_of_probability_calls
from ampify.transforms.tf1.cpu_placement import cpu_pinned_graph
from ampify.transforms.tf1.gram_matrices import gram_matrix_calls
from ampify.transforms.kit.positions import Positions
from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.kit.parameters import with_parameter
from ampify.transforms.tf1.gradients_rewrite import (
    CODE_GRADIENTS_OUTSIDE_OPTIMIZER,
    CODE_UNTRACEABLE_APPLY,
    GradientsPlan,
    plan_gradients_rewrites,
)
from ampify.transforms.tf1.module_header import (
    add_header_statements,
    choose_wrapper_spelling,
    wrapper_callee_for,
)
from ampify.transforms.tf1.names import (
    IGNORE_PERFORMANCE_ENV,
    MATMUL_IN_FLOAT32_ENV,
    UNSCALED_OPTIMIZERS,
    SIGMOID_IN_FLOAT32_ENV,
    MAY_APPLY_MARKERS,
    NGC_AUTO_MIXED_PRECISION_STRINGS,
    normalise_tf_name,
)
from ampify.transforms.tf1.inline_optimizers import name_inline_optimizers
from ampify.transforms.tf1.ngc_switch import ngc_switches, past_ngc_switches
from ampify.transforms.tf1.optimizer_classes import KERAS, MIXED, TF1, OptimizerClassifier
from ampify.transforms.tf1.optimizer_hoist import StatementMove, move_statements
from ampify.transforms.tf1.optimizer_names import NamedOptimizer, named_optimizers, spelled_out
from ampify.transforms.tf1.own_session import call_at, calls_of_class, passes_session
from ampify.transforms.tf1.session_config import (
    SessionConfigRefused,
    plan_session_config,
    session_config_name,
    turn_on_in_module,
)
from ampify.transforms.tf1.site_reports import SiteReports
from ampify.transforms.tf1.survey import ModuleSurvey, OptimizerSite, survey_module

NOT_APPLICABLE_REASON = (
    "no TF1 graph training code (no Session, graph, Estimator or tf.train / tf.compat.v1 "
    "optimizer): the TF1 mixed precision graph rewrite does not apply; for TensorFlow 2 / "
    "Keras code use tf.keras.mixed_precision.set_global_policy('mixed_float16') (and a "
    "tf.keras.mixed_precision.LossScaleOptimizer in custom training loops)"
)


class TF1GraphRewrite(Transform):
    name = "tf1-graph-rewrite"
    description = "Wrap TF1 optimizers with enable_mixed_precision_graph_rewrite."
    internal_error_code = "AMP100"

    def may_apply(self, source: bytes, options: Options) -> bool:
        # Every file this transform changes or reports on imports tensorflow and names an
        # optimizer, the `train` module, apply_gradients, a Session or a mixed precision API
        # (see MAY_APPLY_MARKERS); TF2 training files name their Keras optimizer, so they are
        # still parsed and reported as not applicable with the reason why.
        # `from ops import *` may bring `tf` itself: then `tf.train.` is what shows TF1 code.
        tensorflow = b"tensorflow" in source or (b"import *" in source and b"tf." in source and b".train" in source)
        return tensorflow and any(marker in source for marker in MAY_APPLY_MARKERS)

    screened_out_reason = tf1_screen.SCREENED_OUT_REASON

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        return tf1_screen.may_concern_tf1_graph_rewrite(facts)

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return imports.uses("tensorflow") or _tf_from_star_import(imports)

    def apply(
        self, module: cst.Module, imports: ImportMap, options: Options, context: UnitContext = UnitContext()
    ) -> TransformResult:
        named = named_optimizers(module, imports)
        if named:
            # `optimize_loss(..., optimizer="Adam")`: convert the module with the optimizer spelled
            # out; when that does not convert, the module as written says why (AMP117 among others)
            spelled = spelled_out(module, named)
            result = self._apply(spelled, imports, options, replace(context, source=spelled.bytes))
            if result.verdict is Verdict.CONVERTED:
                return _with_named_optimizers(result, module, named)
        return self._apply(module, imports, options, context)

    def _apply(
        self, module: cst.Module, imports: ImportMap, options: Options, context: UnitContext
    ) -> TransformResult:
        if not imports.uses("tensorflow") and _tf_from_star_import(imports):
            rewrite = _GraphRewrite(module, imports.with_alias("tf", "tensorflow"), options)
            return _with_star_import_assumption(rewrite.run(), module)
        switches = ngc_switches(module, imports, context.source)
        if switches:
            return past_ngc_switches(
                module, switches,
                lambda: _GraphRewrite(module, imports, options, NGC_AUTO_MIXED_PRECISION_STRINGS, context).run(),
                lambda: _GraphRewrite(module, imports, options, context=context).run(),
            )
        return _GraphRewrite(module, imports, options, context=context).run()


def _with_named_optimizers(result: TransformResult, module: cst.Module, named: List[NamedOptimizer]) -> TransformResult:
    """The result, saying where each named optimizer was spelled out (AMP126)."""
    positions = Positions(module)
    notes = []
    for item in named:
        start = positions[item.argument].start
        notes.append(Finding(
            "AMP126",
            f"optimize_loss(optimizer={item.name}) builds its optimizer inside TensorFlow, out of reach of the "
            f"wrapper: spelled as `{item.replacement}`, which optimize_loss calls with the same learning rate "
            "(after its decay function) to build the same optimizer, now wrapped",
            start.line, start.column, Severity.INFO,
        ))
    return TransformResult(result.module, result.verdict, notes + list(result.findings), result.reason,
                           companions=result.companions)


def _tf_from_star_import(imports: ImportMap) -> bool:
    """`tf` bound by no import of this file, while a `from X import *` may bind it."""
    return imports.has_star_import and "tf" not in imports.aliases


def _with_star_import_assumption(result: TransformResult, module: cst.Module) -> TransformResult:
    """Say that `tf` was taken as TensorFlow's TF1 API, when anything was done or warned about (not
    for a module with nothing to do: UGATIT's main.py, read alone, only creates the Session)."""
    if result.verdict is not Verdict.CONVERTED and not any(f.severity is not Severity.INFO for f in result.findings):
        return result
    line = next(
        (index + 1 for index, line in enumerate(module.code.splitlines()) if "import *" in line), 0
    )
    note = Finding(
        "AMP121",
        "`tf` is bound by no import of this file, only by a star import: taken as TensorFlow's TF1 API "
        "(tf.train.*Optimizer is used); the wrapper is reached through an import of tensorflow added above it",
        line, 0,
    )
    return TransformResult(result.module, result.verdict, [note, *result.findings], result.reason)




class _WrapAndReplace(cst.CSTTransformer):
    """Wrap the planned optimizer constructions, swap the planned tf.gradients calls."""

    def __init__(
        self,
        callees: Dict[int, str],
        replacements: Dict[int, cst.BaseExpression],
        moves: Dict[int, StatementMove],
        new_parameters: Optional[Dict[int, str]] = None,
    ):
        #: id of an optimizer construction -> the wrapper's spelling there
        self.callees = callees
        self.replacements = replacements
        #: optimizer constructions moved above their tf.gradients (see tf1/optimizer_hoist.py)
        self.moves = moves
        #: helper functions that take the optimizer (`optimizer=None`), by id
        self.new_parameters = new_parameters or {}
        #: moved statements on their way out of an inner block (see move_statements)
        self.carried: Dict[int, cst.BaseStatement] = {}

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        name = self.new_parameters.get(id(original_node))
        if name is None:
            return updated_node
        return updated_node.with_changes(params=with_parameter(updated_node.params, name, "None"))

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        if not self.moves:
            return updated_node
        return updated_node.with_changes(
            body=move_statements(original_node.body, updated_node.body, self.moves, self.carried)
        )

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.moves:
            return updated_node
        return updated_node.with_changes(
            body=move_statements(original_node.body, updated_node.body, self.moves, self.carried)
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) in self.replacements:
            return self.replacements[id(original_node)]
        callee = self.callees.get(id(original_node))
        if callee is not None:
            return cst.Call(func=cst.parse_expression(callee), args=[cst.Arg(updated_node)])
        return updated_node


#: the gradients rewrite's reason for an optimizer built inline where it applies the gradients
_NOT_A_PLAIN_NAME = "the optimizer that applies them is not a plain name"


def _mapped(findings: List[Finding], lines: LineMap) -> List[Finding]:
    """Findings of a pass over a module with lines added, at the lines of the module given (their
    messages' "line N" too)."""
    return [replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message)) for f in findings]


def _code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


#: what a TF1 model reaches to train on TPUs (normalised names)
_TPU_MODULES = ("tensorflow.contrib.tpu.", "tensorflow.tpu.", "tensorflow.compat.v1.tpu.", "tensorflow.compat.v1.estimator.tpu.",
                "tensorflow.estimator.tpu.")


def _warning(code: str, message: str, line: int, column: int) -> Finding:
    return Finding(code, message, line, column, Severity.WARNING)


class _GraphRewrite:
    """One apply() of the transform on one module."""

    def __init__(self, module: cst.Module, imports: ImportMap, options: Options,
                 ignored_markers: frozenset = frozenset(), context: UnitContext = UnitContext(),
                 sessions_turned_on: bool = False, inline_named: bool = False):
        self.options = options
        #: this module's inline optimizers were named already (a second pass, inline_optimizers.py)
        self.inline_named = inline_named
        self.ignored_markers = ignored_markers
        self.context = context
        #: this module's own Session configs were given the rewrite already (a second pass)
        self.sessions_turned_on = sessions_turned_on
        #: the rest of the project (a caller that creates the Session), and this module's name
        self.project = context.project
        self._classes_by_id: Optional[Dict[int, str]] = None
        self.display = context.display
        self.imports = imports
        self.module = module
        self.original = module
        # computed on first use: a module with nothing to report never pays for it
        self.positions = Positions(module)
        #: optimizer classes of other project modules this module instantiates, by the name it uses
        self.project_optimizer_classes = dict(self.project.tf1_optimizer_classes()) if self.project is not None else {}
        self.classifier = OptimizerClassifier(self.module, self.resolve, self.project_optimizer_classes)
        self.survey: ModuleSurvey = survey_module(
            self.module, self.positions, self.resolve, self.classifier, ignored_markers)
        self.findings: List[Finding] = []

    def resolve(self, node: cst.CSTNode):
        return normalise_tf_name(self.imports.resolve(node))

    def run(self) -> TransformResult:
        if self.survey.mixed_precision_marker is not None:
            return self._already_mixed_precision(self.survey.mixed_precision_marker, hand_written=False)
        if self.survey.hand_written_marker is not None and self.survey.tf1_style:
            return self._already_mixed_precision(self.survey.hand_written_marker, hand_written=True)
        if not self.survey.tf1_style:
            return self._through_project_builder() or TransformResult(
                self.original, Verdict.NOT_APPLICABLE, [], NOT_APPLICABLE_REASON)
        return self._convert()

    def _through_project_builder(self) -> Optional[TransformResult]:
        """A file that builds no optimizer but calls a project function that does (BERT's
        run_classifier.py: `train_op = optimization.create_optimizer(loss, ...)`): the optimizer is
        wrapped where that function builds it, and this file needs no change. Nothing to do when
        that module is in this run (its own result says what was done there); not converted, with
        the file to run ampify on, when it is not."""
        if self.project is None or self._tf1_sites():
            return None
        builders = self.project.tf1_optimizer_builders()
        if not builders:
            return None
        calls = ", ".join(f"{dotted}() ({where})" for _, where, dotted in builders)
        outside = [(key, where, dotted) for key, where, dotted in builders if not self.project.in_this_run(key)]
        if not outside:
            return TransformResult(
                self.original, Verdict.NOTHING_TO_DO, list(self.findings),
                f"trains through {calls}, which builds the optimizer: its mixed precision wrapper goes there "
                "(see that file's result)",
            )
        key, where, dotted = outside[0]
        line, column = self._first_call_position(dotted)
        self.findings.append(_warning(
            "AMP123",
            f"the optimizer is built by {dotted}() at {where}, which is not in this run: its mixed precision "
            f"wrapper goes there; run ampify on {where.rsplit(':', 1)[0]} or on the repository (this file needs "
            "no change)",
            line, column,
        ))
        return TransformResult(self.original, Verdict.UNCONVERTED, self.findings,
                               f"the optimizer is built in {where.rsplit(':', 1)[0]}, not in this run; see the warning")

    def _first_call_position(self, dotted: str) -> Tuple[int, int]:
        found: List[cst.Call] = []

        class _FirstCall(cst.CSTVisitor):
            def visit_Call(self, node: cst.Call) -> Optional[bool]:
                if not found and dotted_name(node.func) == dotted:
                    found.append(node)
                return not found

        self.module.visit(_FirstCall())
        if not found:
            return 1, 0
        start = self.positions[found[0]].start
        return start.line, start.column

    # -- files that already use mixed precision ----------------------------------------------
    def _already_mixed_precision(self, found, hand_written: bool) -> TransformResult:
        what, marker = found
        line = self.positions[marker].start.line
        # NGC's TensorFlow wraps optimizers itself; hand-written mixed precision scales its own loss:
        # in both an unwrapped optimizer is intended, and wrapping it would stack a second loss scale.
        if not self.survey.ngc_auto_mixed_precision and not hand_written:
            for site in self._tf1_sites():
                if site.already_wrapped or set(site.assigned_to) & self.survey.wrapped_names:
                    continue
                self.findings.append(
                    _warning(
                        "AMP114",
                        f"{site.display} is not wrapped, in a file that already uses mixed "
                        f"precision ({what} at line {line}): its loss is not scaled; wrap it with "
                        "enable_mixed_precision_graph_rewrite by hand (ampify leaves this file "
                        "unchanged)",
                        site.line,
                        site.column,
                    )
                )
        if self.survey.tf1_style:
            plan = self._plan_gradients(
                rewrite=False,
                why_not_rewritten="the file already uses mixed precision, so ampify leaves it unchanged",
                keras_optimizer_names=self._keras_names(),
            )
            self.findings.extend(plan.findings)
        return TransformResult(
            self.original,
            Verdict.ALREADY_MIXED_PRECISION,
            self.findings,
            f"already uses mixed precision ({what} at line {line})",
        )

    def _plan_gradients(self, **kwargs) -> GradientsPlan:
        if not self.survey.has_apply_gradients and not self.survey.has_tf_gradients and not (
                self.project is not None and self.project.calls_gradients_functions()):
            return GradientsPlan()  # nothing is applied or handed on, so nothing can bypass loss scaling
        optimizer_names = frozenset(name for site in self._tf1_sites() for name in site.assigned_to)
        return plan_gradients_rewrites(
            self.module, self.positions, self.resolve, optimizer_names=optimizer_names,
            project=self.project, display=self.display, **kwargs
        )

    # -- TF1 graph code ------------------------------------------------------------------------
    def _tf1_sites(self) -> List[OptimizerSite]:
        return [s for s in self.survey.optimizers if s.kind == TF1]

    def _keras_names(self) -> frozenset:
        return frozenset(
            name for s in self.survey.optimizers if s.kind in (KERAS, MIXED) for name in s.assigned_to
        )

    def _convert(self) -> TransformResult:
        to_wrap = [
            s for s in self._tf1_sites()
            if not s.already_wrapped and not self._reads_unforwarded(s) and not self._applied_from_elsewhere(s)
        ]
        reports = SiteReports(self.module, self.positions, self.survey, self.findings)
        reports.optimizer_sites(to_wrap)
        reports.sessions_before(to_wrap)
        if reports.sessions_here and not self.sessions_turned_on:
            turned_on = self._sessions_here(reports.sessions_here)
            if turned_on is not None:
                return turned_on
        companions = self._sessions_elsewhere(reports.sessions_elsewhere, reports.own_session_fallbacks)
        self._sessions_of_callers(to_wrap, reports)
        plan = self._plan_gradients(
            rewrite=bool(to_wrap),
            why_not_rewritten=(
                "the optimizer is not built in this file, so ampify cannot tell whether it is "
                "wrapped"
            ),
            keras_optimizer_names=self._keras_names(),
            wrapped_calls=frozenset(id(site.call) for site in to_wrap),
        )
        self.findings.extend(plan.findings)
        named = self._with_inline_optimizers_named(to_wrap, plan)
        if named is not None:
            return named
        if to_wrap and any(f.code == CODE_GRADIENTS_OUTSIDE_OPTIMIZER for f in plan.findings):
            # nothing is written: the wraps and rewrites it would have made are not reported as made
            self.findings = [f for f in self.findings if f.severity is not Severity.INFO]
            return self._unconverted()
        if not to_wrap:
            return self._unconverted()

        callees, added_import = self._wrapper_callees(to_wrap)
        new_module = self.module.visit(_WrapAndReplace(callees, plan.replacements, plan.moves, plan.new_parameters))
        set_env = self.options.tf_ignore_performance and not self.survey.mentions_ignore_performance_env
        sigmoid_env = self._sigmoid_in_float32()
        matmul_env = self._matmul_in_float32()
        new_module, index = add_header_statements(
            new_module, set_env_var=set_env, added_import=added_import, environment=sigmoid_env + matmul_env
        )
        if set_env:
            line = self._line_of_statement(index)
            self.findings.append(
                Finding(
                    "AMP102",
                    f"set {IGNORE_PERFORMANCE_ENV}=1 before TensorFlow is imported, so GPUs "
                    "older than Volta do not silently skip the graph rewrite",
                    line,
                    0,
                    Severity.INFO,
                )
            )
        if sigmoid_env:
            line = self._line_of_statement(index)
            self.findings.append(Finding("AMP106", f"{sigmoid_env[0][0]}=Sigmoid (and its TF 1.x name, GRAYLIST) set before "
                                         "TensorFlow is imported: " + self._sigmoid_reason, line, 0, Severity.INFO))
        if matmul_env:
            line = self._line_of_statement(index)
            self.findings.append(Finding("AMP107", f"{matmul_env[0][0]}={matmul_env[0][1]} (and its TF 1.x name, "
                                         "WHITELIST) set before TensorFlow is imported: " + self._matmul_reason,
                                         line, 0, Severity.INFO))
        self._report_eager_execution()
        self._report_cpu_pinned_graph(to_wrap)
        self._report_tpu_training()
        self._report_checkpoint_restores()
        wrapped = len(to_wrap)
        return TransformResult(
            new_module,
            Verdict.CONVERTED,
            self.findings,
            f"wrapped {wrapped} optimizer{'s' if wrapped != 1 else ''} with the mixed precision "
            "graph rewrite",
            companions=companions + plan.companions,
        )

    def _sigmoid_in_float32(self) -> list:
        """The variables keeping every Sigmoid in float32 when the loss takes the log of a sigmoid's
        probability (kit/log_of_sigmoid.py), in this file or a project module it imports (the rewrite
        runs over the whole graph: hwalsuklee/tensorflow-mnist-VAE's vae.py): in float16 that
        probability rounds to 1 once the logit passes about 8.4, `1 - D_fake + 1e-8` is 0 and the log
        -inf, and the loss-scale optimizer skips every step while the discriminator is confident. None
        set where the script names them itself."""
        if any(name in self.module.code for name, _ in SIGMOID_IN_FLOAT32_ENV):
            return []
        shown = self._graph_wide_places(
            lambda module, imports: [call for call, _ in log_of_probability_calls(module, imports, TENSORFLOW)],
            b"igmoid", b"log")
        if not shown:
            return []
        self._sigmoid_reason = (
            f"the loss takes the log of a sigmoid's probability ({shown}); the rewrite would run the "
            "sigmoid in float16, where that probability rounds to 1 once the logit passes about 8.4 and the log "
            "is -inf (every step skipped while the discriminator is confident); off the rewrite's lists every "
            "Sigmoid stays float32")
        return list(SIGMOID_IN_FLOAT32_ENV)

    def _matmul_in_float32(self) -> list:
        """The variables keeping every matrix product in float32 when the graph computes a Gram
        matrix (tf1/gram_matrices.py), in this file or a project module it imports: in float16 its
        sum of h*w products passes 65504, the style loss is inf, and the loss-scale optimizer skips
        every step. None set where the script names them itself."""
        if any(name in self.module.code for name, _ in MATMUL_IN_FLOAT32_ENV):
            return []
        shown = self._graph_wide_places(gram_matrix_calls, b"transpose", (b"matmul", b"einsum"))
        if not shown:
            return []
        self._matmul_reason = (
            f"the graph computes a Gram matrix ({shown}), a sum of height*width products of feature maps; "
            "the rewrite would run it in float16, where it passes 65504 before its division by the size, the loss "
            "is inf and every step is skipped; off the allow list every matrix product stays float32, the "
            "convolutions still convert")
        return list(MATMUL_IN_FLOAT32_ENV)

    def _graph_wide_places(self, find, *markers) -> str:
        """"tf.log(1 - y) (line 12), ... (vae.py:81)": the calls `find(module, imports)` returns in this
        file and in the project modules it imports whose source holds the markers (the rewrite runs
        over the whole graph); "" when there is none."""
        places = [f"{_code_of(call)} (line {self.positions[call].start.line})" for call in find(self.module, self.imports)]
        for display, module, imports, positions in self._imported_modules_with(*markers):
            places += [f"{_code_of(call)} ({display}:{positions[call].start.line})" for call in find(module, imports)]
        return ", ".join(places[:3]) + (f" and {len(places) - 3} more" if len(places) > 3 else "")

    def _imported_modules_with(self, *markers) -> list:
        """(display, module, imports, positions) for the project modules this file imports (directly
        or through each other) whose source holds every marker (a tuple of bytes: any of them)."""
        if self.project is None:
            return []
        found = []
        for _, display, source in self.project.imported_module_sources():
            if not all(any(m in source for m in (marker if isinstance(marker, tuple) else (marker,)))
                       for marker in markers):
                continue
            parsed = parsed_module(source)
            if parsed is not None:
                found.append((display, *parsed))
        return found

    def _sessions_here(self, sessions_here) -> Optional[TransformResult]:
        """Sessions this module creates before it builds the optimizer (cnn-text-classification-tf's
        `sess = tf.Session(config=session_conf)`): their configs turn the graph rewrite on, as TF
        would have for a Session created after the wrap, and the module is converted again from
        there. None (the AMP113 warnings say why) when a config cannot be given it."""
        unscaled = self._unscaled_optimizer_calls()
        if unscaled:
            reason = (f"the module also minimizes with {unscaled}, which has no loss scaling: a Session config asking "
                      "for the rewrite would run that path in float16 without it")
            for _, index in sessions_here:
                old = self.findings[index]
                self.findings[index] = replace(old, message=f"{old.message}; ampify did not set it in its config: {reason}")
            return None
        try:
            turned, configs = turn_on_in_module(self.module, [session.node for session, _ in sessions_here], self.display)
        except SessionConfigRefused as refused:
            for _, index in sessions_here:
                old = self.findings[index]
                self.findings[index] = replace(old, message=f"{old.message}; ampify did not set it in its config: {refused}")
            return None
        result = _GraphRewrite(turned, ImportMap.from_module(turned), self.options,
                               self.ignored_markers | {"auto_mixed_precision"}, self.context, sessions_turned_on=True).run()
        # the second pass saw the module with the config lines in it; findings name original lines
        result.findings[:] = _mapped(result.findings, LineMap(self.module.code, turned.code))
        for session, _ in sessions_here:
            config = session_config_name(session.node) or "the Session's config"
            result.findings.append(Finding(
                "AMP105", f"{session.display} is created before the optimizer is built and wrapped: "
                          f"{config}.graph_options.rewrite_options.auto_mixed_precision is turned on before it, so the "
                          "Session asks for the graph rewrite itself", session.line, session.column, Severity.INFO))
        result.findings.sort(key=lambda f: (f.line, f.column, f.code))
        return result

    def _with_inline_optimizers_named(self, to_wrap: List[OptimizerSite], plan) -> Optional[TransformResult]:
        """tf.gradients applied by an optimizer built inline (`tf.train.AdamOptimizer(lr).apply_gradients(
        zip(grads, params))`, pemami4911's DDPG actor), which the gradients rewrite cannot name: the
        optimizer gets a name on the line before (inline_optimizers.py) and the module is converted
        from there, when that lets the rewrite scale those gradients. None otherwise."""
        if self.inline_named or not any(_NOT_A_PLAIN_NAME in f.message for f in plan.findings):
            return None
        inline = {id(site.call) for site in to_wrap if not site.assigned_to}
        if not inline:
            return None
        named = name_inline_optimizers(self.module, inline)
        if named.code == self.module.code:
            return None
        result = _GraphRewrite(named, ImportMap.from_module(named), self.options, self.ignored_markers, self.context,
                               sessions_turned_on=self.sessions_turned_on, inline_named=True).run()
        if any(_NOT_A_PLAIN_NAME in f.message for f in result.findings):
            return None
        result.findings[:] = _mapped(result.findings, LineMap(self.module.code, named.code))
        return result

    def _unscaled_optimizer_calls(self) -> str:
        """"tf.contrib.opt.ScipyOptimizerInterface (line 624)" when this module builds an optimizer
        that the graph rewrite's loss scaling cannot wrap (L-BFGS through SciPy, TFP's BFGS), else ""."""
        if not any(name.encode() in self.module.code.encode() for name in UNSCALED_OPTIMIZERS):
            return ""
        for node in calls_within(self.module):
            name = self.imports.resolve(node.func) or dotted_name(node.func) or ""
            if name.rsplit(".", 1)[-1] in UNSCALED_OPTIMIZERS:
                return f"{_code_of(node.func)} (line {self.positions[node].start.line})"
        return ""

    def _sessions_elsewhere(self, sessions_elsewhere, own_session_fallbacks) -> list:
        """An optimizer built in a method or function that runs a Session created in another
        module (DCGAN-tensorflow's main.py): that Session's config gets the rewrite, in the same
        change set (session_config.py). Where that cannot be done, the AMP113 warning says why.
        A class that creates its own Session after the optimizer when none is handed in
        (own_session.py), called by no one who hands one in, needs nothing: its warning goes."""
        companions = []
        dropped = {index for site, index in sessions_elsewhere
                   if index in own_session_fallbacks and self._no_caller_hands_a_session(own_session_fallbacks[index])}
        if dropped:
            self.findings[:] = [f for i, f in enumerate(self.findings) if i not in dropped]
            sessions_elsewhere = [(site, index - sum(1 for d in dropped if d < index))
                                  for site, index in sessions_elsewhere if index not in dropped]
        if self.project is None:
            return companions
        for site, index in sessions_elsewhere:
            function, owner = self.survey.function_names.get(site.scope, ("", ""))
            callee = owner or function
            if not callee:
                continue
            built_in = f"{owner}.{function}()" if owner else f"{function}()"
            sites = list(self.project.call_sites_elsewhere(callee, through_registries=True))
            keys = sorted({s.key for s in sites})
            here = f"{self.display}:{site.line}"
            reason = None
            if not sites:
                reason = f"no other module of the project calls {callee}()"
            elif len(keys) > 1:
                reason = f"{callee}() is called from several modules ({', '.join(sorted({s.display for s in sites}))})"
            elif not self.project.in_this_run(keys[0]):
                reason = (f"the Session is created in {sites[0].display}, which this run does not cover: run ampify on "
                          "both files or on the repository")
            else:
                source = self.project.source_of(keys[0])
                try:
                    if source is None:
                        raise SessionConfigRefused(f"{sites[0].display} cannot be read")
                    companions.append(plan_session_config(source, sites, callee, here,
                                                          self.project.star_bound_imports(keys[0])))
                except SessionConfigRefused as refused:
                    reason = str(refused)
            old = self.findings[index]
            if reason is not None:
                self.findings[index] = replace(old, message=f"{old.message}; ampify did not set it in the caller: {reason}")
                continue
            where = f"{sites[0].display}:{sites[0].line}"
            self.findings[index] = Finding(
                "AMP105",
                f"{site.display} is built in {built_in}, which runs the Session its caller {where} created "
                f"first: that Session's config turns the graph rewrite on (auto_mixed_precision), written in "
                f"{sites[0].display} together with this file, as one change set",
                old.line, old.column, Severity.INFO,
            )
        return companions

    def _sessions_of_callers(self, to_wrap: List[OptimizerSite], reports: SiteReports) -> None:
        """An optimizer built by a class or function of this module that names no Session, used
        by another project module inside a Session it opened first (openai/maddpg: `with
        U.single_threaded_session():` in experiments/train.py, then `MADDPGAgentTrainer(...)`):
        that Session never gets the graph rewrite, so the conversion is said to be incomplete
        (AMP113), with the caller's file and lines (caller_sessions.py)."""
        if self.project is None or self.survey.sessions:
            return
        handled = {id(site) for site, _ in reports.sessions_elsewhere}
        asked: Dict[str, list] = {}
        for site in to_wrap:
            if site.scope == 0 or id(site) in handled or site.scope in self.survey.session_runs \
                    or site.scope in self.survey.session_params or site.enclosing_class in self.survey.session_params:
                continue
            builder = reports.builder_name(site)
            if not builder:
                continue
            if builder not in asked:
                asked[builder] = self.project.sessions_open_at_uses(builder)
            if not asked[builder]:
                continue
            display, hit = asked[builder][0]
            through = f" in {hit.chain[0]}(), which runs" if hit.chain else ""
            self.findings.append(_warning(
                "AMP113",
                f"{site.display} is built by {builder}(), used at {display}:{hit.use_line}{through} inside the "
                f"Session opened at line {hit.session_line} there ({hit.session_code}): that Session was "
                "created before this optimizer is wrapped, so it does not get the mixed precision graph rewrite "
                "(nothing runs in float16); create the Session after building the model and optimizer there, "
                "or turn auto_mixed_precision on in that Session's config",
                site.line, site.column))

    def _no_caller_hands_a_session(self, fallback) -> bool:
        """Is the class called (in this module or another of the project), and never with a Session?"""
        calls = [call for call in calls_of_class(self.module, fallback.klass) if call.func is not None]
        if any(passes_session(call, fallback) for call in calls):
            return False
        sites = list(self.project.call_sites_elsewhere(fallback.klass, through_registries=True)) if self.project else []
        for site in sites:
            source = self.project.source_of(site.key)
            call = call_at(source, site.line, site.column) if source is not None else None
            if call is None or passes_session(call, fallback):
                return False
        return bool(calls or sites)

    def _report_eager_execution(self) -> None:
        """Eager execution on, and no tf.function, Session, tf.Graph or Estimator: the wrapper
        scales the loss, but no op runs in float16. Say so instead of reporting success."""
        enabler = self.survey.eager_enabled_by
        if enabler is None or self.survey.builds_graph or self.survey.sessions:
            return
        position = self.positions[enabler].start
        self.findings.append(
            _warning(
                "AMP120",
                f"{_code_of(enabler.func)}() turns eager execution on, and nothing in this file "
                "builds a graph (no tf.function, Session, tf.Graph or Estimator): the mixed "
                "precision graph rewrite only changes graphs, so the optimizer is wrapped (its "
                "loss is scaled) but every op still runs in float32; run the training step "
                "inside tf.function (or use tf.keras.mixed_precision for eager code)",
                position.line,
                position.column,
            )
        )

    def _report_checkpoint_restores(self) -> None:
        """`saver.restore(sess, path)` of a `tf.train.Saver()`: the wrapped optimizer adds the loss
        scale's variables (current_loss_scale, good_steps) and moves Adam's beta powers under a
        cond scope, so a checkpoint the float32 script wrote fails to restore (NotFoundError, checked
        on TensorFlow 2.21's compat.v1); its own new checkpoints restore. Said once, at the first
        such restore."""
        savers = {"tensorflow.train.Saver", "tensorflow.compat.v1.train.Saver"}
        calls = [node for node in iter_tree(self.module) if isinstance(node, cst.Call)]
        if not any(self.resolve(call.func) in savers for call in calls):
            return
        for node in calls:
            if (isinstance(node.func, cst.Attribute) and node.func.attr.value == "restore"
                    and len(node.args) >= 2 and self.resolve(node.func) is None):
                position = self.positions[node].start
                self.findings.append(_warning(
                    "AMP127",
                    f"{_code_of(node.func)}(...) restores a tf.train.Saver checkpoint: the wrapped optimizer adds the "
                    "loss scale's variables (current_loss_scale, good_steps) and renames Adam's beta powers, so a "
                    "checkpoint written before this conversion fails to restore (NotFoundError); checkpoints the "
                    "converted script writes restore. To resume from an older one, restore it with a Saver over the "
                    "model's variables (`tf.train.Saver(var_list=tf.trainable_variables())`) and initialize the rest",
                    position.line, position.column))
                return

    def _report_cpu_pinned_graph(self, to_wrap: List[OptimizerSite]) -> None:
        """The whole training graph is built under `tf.device("/cpu:0")` (A3C's thread workers):
        the rewrite converts GPU ops only, so the wrapped optimizer scales its loss and every op
        stays float32. Say so instead of reporting success (cpu_placement.py)."""
        scope = cpu_pinned_graph(self.module, self.resolve, {id(site.call) for site in to_wrap})
        if scope is None:
            return
        position = self.positions[scope].start
        self.findings.append(
            _warning(
                "AMP125",
                f"the training graph is built under {_code_of(scope)}: the mixed precision "
                "graph rewrite converts only ops placed on a GPU, so the optimizer is wrapped (its loss is "
                "scaled) but every op still runs in float32; build the model and its training ops outside the "
                "CPU device scope (on the GPU) for mixed precision",
                position.line,
                position.column,
            )
        )

    def _report_tpu_training(self) -> None:
        """The file trains on TPUs too (compare_gan's `tf.contrib.tpu.CrossShardOptimizer(opt)`, a
        TPUEstimatorSpec): the graph rewrite converts ops placed on a GPU, so TPU runs keep their
        float32 graph (with a loss scale that does nothing there). Said, and incomplete."""
        found = None

        class _Tpu(cst.CSTVisitor):
            def on_visit(inner, node: cst.CSTNode) -> bool:
                nonlocal found
                if found is not None:
                    return False
                if isinstance(node, (cst.Attribute, cst.Name)):
                    name = self.resolve(node) or ""
                    if name.startswith(_TPU_MODULES):
                        found = node
                        return False
                return True

        self.module.visit(_Tpu())
        if found is None:
            return
        position = self.positions[found].start
        self.findings.append(_warning(
            "AMP128",
            f"this model also trains on TPUs ({_code_of(found)}): the mixed precision graph rewrite converts ops "
            "placed on a GPU (float16, loss scaling), and a TPU run keeps its float32 graph; for TPUs compute in "
            "bfloat16 by hand (tf.contrib.tpu.bfloat16_scope(), the TPU's own mixed precision)",
            position.line, position.column))

    def _reads_unforwarded(self, site: OptimizerSite) -> bool:
        """Does the code read an attribute of this optimizer that the wrapper lacks?

        MixedPrecisionLossScaleOptimizer forwards nothing but the Optimizer API, so wrapping
        an optimizer whose `_lr` (or K-FAC's `cov_update_op`) is read later would raise
        AttributeError: such a site is left alone and reported (AMP119).
        """
        for name in site.assigned_to:
            if name in self.survey.bound_to_other_calls:
                continue  # the name also holds another object: the attribute may be its own
            for read in self.survey.reads_of(name):
                # A plain local name only means this optimizer in its own function; an
                # attribute (`self.opt`) is shared by the class's methods.
                if "." not in name and read.scope != site.scope:
                    continue
                self.findings.append(
                    _warning(
                        "AMP119",
                        f"{site.display} not wrapped: the code reads {name}.{read.attr} (line "
                        f"{read.line}), which the mixed precision wrapper does not forward (it "
                        "only has compute_gradients, apply_gradients, minimize, get_slot, "
                        "get_slot_names, variables and get_name), so wrapping it would raise "
                        "AttributeError; keep a reference to the inner optimizer for that "
                        "attribute and wrap it with tf.compat.v1.train.experimental."
                        "enable_mixed_precision_graph_rewrite by hand",
                        site.line,
                        site.column,
                    )
                )
                return True
        return False

    def _applied_from_elsewhere(self, site: OptimizerSite) -> bool:
        """Does another project module apply gradients through this optimizer, kept on an object of
        this file's class (`self.optimizer`), without computing them with it? dennybritz's A3C:
        worker.py runs `global_estimator.optimizer.apply_gradients(zip(local_grads, global_vars))`
        with a local estimator's gradients. Wrapped, each estimator's optimizer would have its own
        loss scale: the gradients come scaled and unscaled by the local one, which nothing ever
        updates, while the global one checks them and skips; after an overflow every step would be
        skipped. The site is left alone and reported (AMP115), naming the other module's line."""
        if self.project is None or not site.enclosing_class:
            return False
        ask = getattr(self.project, "attribute_calls_elsewhere", None)
        klass = self._class_names().get(site.enclosing_class)
        if ask is None or klass is None:
            return False
        for name in site.assigned_to:
            if not name.startswith("self.") or name.count(".") != 1:
                continue
            attribute = name.split(".", 1)[1]
            applied = ask(klass, attribute, "apply_gradients")
            computing = {where.rsplit(":", 1)[0] for method in ("compute_gradients", "minimize")
                         for where in ask(klass, attribute, method)}
            foreign = [where for where in applied if where.rsplit(":", 1)[0] not in computing]
            if not foreign:
                continue
            self.findings.append(_warning(
                CODE_UNTRACEABLE_APPLY,
                f"{site.display} not wrapped: {', '.join(foreign)} applies gradients through {klass}'s "
                f".{attribute} (`.{attribute}.apply_gradients(...)`) with gradients computed elsewhere (an A3C "
                "worker applying a local network's gradients with the global optimizer?); wrapped, the loss "
                "scale that computed them would not be the one that checks them, and after an overflow every "
                "step would be skipped: compute them with that optimizer's compute_gradients, or convert by hand",
                site.line, site.column))
            return True
        return False

    def _class_names(self) -> Dict[int, str]:
        """Names of the module's classes, by id of their ClassDef (any depth; read-only walk, once)."""
        if self._classes_by_id is None:
            names: Dict[int, str] = {}

            class _Classes(cst.CSTVisitor):
                def visit_ClassDef(self, node: cst.ClassDef) -> None:
                    names[id(node)] = node.name.value

            walk(self.module, _Classes())
            self._classes_by_id = names
        return self._classes_by_id

    def _wrapper_callees(self, to_wrap: List[OptimizerSite]):
        """The wrapper's spelling for each site, and the module-level import to add, if any.

        A site inside a function that imports TensorFlow itself uses that import, so a
        deliberately lazy import stays lazy; every other site uses the module's own alias.
        """
        callees: Dict[int, str] = {}
        needs_module_spelling = []
        for site in to_wrap:
            local = wrapper_callee_for(site.function_imports)
            if local is not None:
                callees[id(site.call)] = local
            else:
                needs_module_spelling.append(site)
        added_import = None
        if needs_module_spelling:
            spelling = choose_wrapper_spelling(self.module)
            added_import = spelling.added_import
            for site in needs_module_spelling:
                callees[id(site.call)] = spelling.callee
        return callees, added_import

    def _unconverted(self) -> TransformResult:
        warnings = [f for f in self.findings if f.severity is not Severity.INFO]
        if not warnings:
            through = self._through_project_builder()
            if through is not None:
                return through
        if warnings:
            return TransformResult(
                self.original,
                Verdict.UNCONVERTED,
                self.findings,
                "TF1 training code found, but nothing could be converted safely: see the warnings",
            )
        return TransformResult(
            self.original,
            Verdict.NOTHING_TO_DO,
            self.findings,
            "TF1 code, but no optimizer is built in this file",
        )

    def _line_of_statement(self, index: int) -> int:
        if index < len(self.module.body):
            return self.positions[self.module.body[index]].start.line
        return 1
