"""What the TF1 rewrite reports about the optimizers it wraps and the Sessions around them.

Wrapped optimizers (AMP101), optimizers built in a loop, and every Session that exists before an
optimizer is wrapped, is handed out by a helper, or is passed in from elsewhere: such a Session
never gets the graph rewrite, so nothing would run in float16 while the file says "changed".
"""

from __future__ import annotations

from typing import Dict, List

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.kit.positions import Positions
from ampify.transforms.tf1.optimizer_classes import KERAS, MIXED
from ampify.transforms.tf1.own_session import OwnSessionFallback, own_session_fallback
from ampify.transforms.tf1.session_config import rewrite_turned_on, session_config_name
from ampify.transforms.tf1.survey import ModuleSurvey, OptimizerSite, SessionSite


class SiteReports:
    """Appends the findings on optimizer sites and Sessions of one module to `findings`."""

    def __init__(self, module: cst.Module, positions: Positions, survey: ModuleSurvey, findings: List[Finding]) -> None:
        self.module = module
        self.positions = positions
        self.survey = survey
        self.findings = findings
        #: (optimizer site, index of its AMP113 finding) for optimizers built in a function that
        #: runs a Session created elsewhere (session_config.py may give that Session the rewrite)
        self.sessions_elsewhere: List[tuple] = []
        #: (Session constructed in this module before an optimizer, index of its AMP113 finding):
        #: its config may be given the rewrite (session_config.turn_on_in_module)
        self.sessions_here: List[tuple] = []
        #: index of an AMP113 finding -> the class's own Session, created after the optimizer when
        #: no Session is handed in (own_session.py): the finding holds only for callers that pass one
        self.own_session_fallbacks: Dict[int, OwnSessionFallback] = {}

    def optimizer_sites(self, to_wrap: List[OptimizerSite]) -> None:
        for site in to_wrap:
            self.findings.append(
                Finding(
                    "AMP101",
                    f"wrapped {site.display} with the mixed precision graph rewrite "
                    "(float16 graph rewrite and dynamic loss scaling)",
                    site.line,
                    site.column,
                    Severity.INFO,
                )
            )
            if site.in_loop:
                self.findings.append(
                    _warning(
                        "AMP111",
                        f"{site.display} is built inside a loop: each instance gets its own loss "
                        "scale; build one optimizer outside the loop and share it (e.g. across "
                        "GPU towers)",
                        site.line,
                        site.column,
                    )
                )
        for site in self.survey.optimizers:
            if site.kind in (KERAS, MIXED):
                what = (
                    "some of the optimizers it chooses are Keras optimizers"
                    if site.kind == MIXED
                    else "it is a Keras optimizer"
                )
                self.findings.append(
                    _warning(
                        "AMP112",
                        f"{site.display} not wrapped: {what}, which "
                        "enable_mixed_precision_graph_rewrite refuses in current TensorFlow; use "
                        "a tf.compat.v1.train optimizer, or Keras mixed precision "
                        "(tf.keras.mixed_precision) with a LossScaleOptimizer",
                        site.line,
                        site.column,
                    )
                )
        for call in self.survey.foreign_optimizer_calls:
            if call.wraps is not None:
                self.findings.append(
                    _warning(
                        "AMP116",
                        f"{call.display} (from another module, which ampify cannot see) wraps "
                        f"{call.wraps}, which is wrapped with the mixed precision graph rewrite "
                        f"here: the loss is scaled only if {call.display} computes its gradients "
                        f"with the inner optimizer's compute_gradients or minimize; if it calls "
                        "tf.gradients itself, make it call compute_gradients",
                        call.line,
                        call.column,
                    )
                )
                continue
            self.findings.append(
                _warning(
                    "AMP116",
                    f"{call.display} looks like an optimizer class from another module, which "
                    "ampify cannot see: not wrapped; if it is a tf.train.Optimizer, convert the "
                    "module that builds it or wrap it with "
                    "tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite",
                    call.line,
                    call.column,
                )
            )
        for display, line, column in self.survey.built_inside_tf:
            self.findings.append(
                _warning(
                    "AMP117",
                    f"{display} builds its optimizer inside TensorFlow, so it cannot be wrapped "
                    "here: pass an optimizer instance (optimizer=tf.compat.v1.train.AdamOptimizer"
                    "(...)) and run ampify again",
                    line,
                    column,
                )
            )

        for value, line, column in self.survey.optimizer_class_strings:
            self.findings.append(
                _warning(
                    "AMP118",
                    f"the string {value!r} names an optimizer class that is looked up and built "
                    "at run time, where ampify cannot see it: that optimizer is not wrapped; "
                    "wrap the instance with tf.compat.v1.train.experimental."
                    "enable_mixed_precision_graph_rewrite where it is built",
                    line,
                    column,
                )
            )
        for shown, callee, line, column in self.survey.classes_handed_off:
            self.findings.append(
                _warning(
                    "AMP118",
                    f"optimizer class {shown} is passed to {callee}, which builds the optimizer "
                    "where ampify cannot see: it is not wrapped; build the optimizer here and pass "
                    "the instance, or wrap it where it is built",
                    line,
                    column,
                )
            )

    def sessions_before(self, to_wrap: List[OptimizerSite]) -> None:
        warned_scopes = set()
        for session in self.survey.sessions:
            for site in to_wrap:
                if session.encloses is not None:
                    before = session.scope == site.scope and (
                        session.encloses[0] <= site.line <= session.encloses[1]
                    )
                else:
                    before = session.line < site.line and session.scope in (0, site.scope)
                if before and self._has_the_rewrite(session):
                    warned_scopes.add(site.scope)
                    break
                if before:
                    warned_scopes.add(site.scope)
                    if not session.obtained:
                        self.sessions_here.append((session, len(self.findings)))
                    self.findings.append(
                        _warning("AMP113", _session_before_message(session, site), session.line, session.column)
                    )
                    break
        self._report_sessions_from_elsewhere(to_wrap, warned_scopes)
        self._report_sessions_before_builders(to_wrap, warned_scopes)

    def _has_the_rewrite(self, session: SessionSite) -> bool:
        """A Session whose config variable this module turns the graph rewrite on for."""
        config = session_config_name(session.node)
        return config is not None and rewrite_turned_on(self.module.code, config)

    def _report_sessions_before_builders(self, to_wrap: List[OptimizerSite], warned_scopes) -> None:
        """`with tf.Session() as sess: train_op = build_model()`, or `sess = tf.Session()` and then
        `actor = Actor(sess, ...)` (MorvanZhou's AC_CartPole): the optimizer is built (and wrapped)
        by a function or class of this file called after the Session exists."""
        builders: Dict[str, OptimizerSite] = {}
        for site in to_wrap:
            if site.scope in warned_scopes:
                continue
            name = self.builder_name(site)
            if name:
                builders.setdefault(name, site)
        for session in self.survey.sessions:
            for name, site in builders.items():
                line = self._called_after(session, name)
                if line is None:
                    continue
                if self._has_the_rewrite(session):
                    break
                what = f"{session.display}()" if session.obtained else session.display
                if not session.obtained:
                    self.sessions_here.append((session, len(self.findings)))
                self.findings.append(
                    _warning(
                        "AMP113",
                        f"{what} (line {session.line}) exists before {name}(...) at line {line} "
                        f"builds the optimizer at line {site.line}: that Session does not get "
                        "the mixed precision graph rewrite (nothing runs in float16); build the "
                        "model and optimizer first, then create the Session",
                        session.line,
                        session.column,
                    )
                )
                break

    def builder_name(self, site: OptimizerSite) -> str:
        """The function or class of this file whose call builds `site`; "" when it builds its own
        Session (after the optimizer, presumably) or is not one."""
        scopes_with_sessions = {session.scope for session in self.survey.sessions}
        if site.scope in scopes_with_sessions:
            return ""
        function, owner = self.survey.function_names.get(site.scope, ("", ""))
        if owner:
            classes_with_sessions = {self.survey.function_names.get(scope, ("", ""))[1] for scope in scopes_with_sessions}
            return "" if owner in classes_with_sessions else owner
        return function

    def _called_after(self, session: SessionSite, name: str):
        """The line of the first call of `name` in the Session's block after the Session exists."""
        for call in self.survey.name_calls:
            if call.name != name or call.scope != session.scope:
                continue
            if session.encloses is not None:
                after = session.encloses[0] <= call.line <= session.encloses[1]
            else:
                after = call.line > session.line
            if after:
                return call.line
        return None

    def _session_of_this_file_before_call(self, site: OptimizerSite) -> bool:
        name = self.builder_name(site)
        return bool(name) and any(self._called_after(session, name) is not None for session in self.survey.sessions)

    def _report_sessions_from_elsewhere(self, to_wrap: List[OptimizerSite], warned_scopes) -> None:
        """A function that builds an optimizer and runs a Session it did not create (DCGAN's
        `self.sess`): if that Session was created first, it never gets the rewrite."""
        scopes_with_sessions = {session.scope for session in self.survey.sessions}
        for site in to_wrap:
            run = self.survey.session_runs.get(site.scope)
            param = self.survey.session_params.get(site.scope) or self.survey.session_params.get(
                site.enclosing_class
            )
            if site.scope == 0 or (run is None and param is None):
                continue
            if site.scope in scopes_with_sessions or site.scope in warned_scopes:
                continue
            if self._session_of_this_file_before_call(site):
                continue  # reported (and turned on) with that Session, below
            warned_scopes.add(site.scope)
            if run is None:
                method, owner = self.survey.function_names.get(site.scope, ("", ""))
                fallback = own_session_fallback(self.module, owner, method, param.name) if owner else None
                if fallback is not None:
                    self.own_session_fallbacks[len(self.findings)] = fallback
                self.sessions_elsewhere.append((site, len(self.findings)))
                self.findings.append(
                    _warning(
                        "AMP113",
                        f"{site.display} is built in a function that is handed a Session "
                        f"(parameter {param.name}, line {param.line}): the caller created that "
                        "Session before this optimizer is wrapped, so it does not get the mixed "
                        "precision graph rewrite (nothing runs in float16); build the model and "
                        "optimizer first, then create the Session",
                        site.line,
                        site.column,
                    )
                )
                continue
            shown, receiver = run
            line = self.positions[receiver].start.line
            self.sessions_elsewhere.append((site, len(self.findings)))
            self.findings.append(
                _warning(
                    "AMP113",
                    f"{site.display} is built in a function that runs a Session created elsewhere "
                    f"({shown}, line {line}): if that Session was created before this line, it "
                    "does not get the mixed precision graph rewrite (nothing runs in float16); "
                    "create the Session after building the optimizer",
                    site.line,
                    site.column,
                )
            )


def _session_before_message(session: SessionSite, site: OptimizerSite) -> str:
    if session.obtained:
        return (
            f"{session.display}() hands out a Session before the optimizer at line {site.line} "
            "is wrapped: if it creates that Session there (or returns one created earlier), the "
            "Session does not get the mixed precision graph rewrite (nothing runs in float16); "
            "obtain the Session after building the optimizer"
        )
    return (
        f"{session.display} is created before the optimizer at line {site.line} is wrapped: "
        "that Session does not get the mixed precision graph rewrite (nothing runs in "
        "float16); create the Session after building the optimizer"
    )


def _warning(code: str, message: str, line: int, column: int) -> Finding:
    return Finding(code, message, line, column, Severity.WARNING)
