"""Training steps that step their optimizer through a wrapper class of the project.

    optimizer = ScheduledOptim(optim.Adam(model.parameters(), ...), 2.0, d_model, 4000)
    ...
    loss.backward()
    optimizer.step_and_update_lr()

GradScaler must step the optimizer inside the wrapper (`scaler.step(optimizer)` on the wrapper
would fail: it has no param_groups). So the wrapper's stepping method takes the scaler, in its
own module (one change set with the training file), and keeps working for callers without one:

    def step_and_update_lr(self, scaler=None):
        self._update_learning_rate()
        if scaler is not None:
            scaler.step(self._optimizer)
        else:
            self._optimizer.step()

and the training step calls `optimizer.step_and_update_lr(scaler=scaler)`, then
`scaler.update()`. A wrapper that reads or clips the gradients before it steps (seq2seq's
`Optimizer.step()` with max_grad_norm) unscales them first, inside the same `if`.

Which classes are wrappers is ampify.optimizer_wrappers' job (the repository model); this module
asks for them only when a file has a backward() with no step ampify knows, or steps an optimizer
it knows by name only, and `plan_wrapper_edit` writes the wrapper's side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.optimizer_wrappers import wrapper_steps
from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.statements import calls_within
from ampify.transforms.torch.training_loop import NAMED_LIKE_AN_OPTIMIZER, HazardKind, TrainingStructure, WrapperUse


#: the parameter a wrapper's stepping method gets (whatever the training file calls its scaler)
SCALER = "scaler"


class WrapperEditRefused(Exception):
    """The wrapper's method cannot take the scaler; the message says why."""


def project_wrapper_steps(structure: TrainingStructure, module: cst.Module, project) -> Dict[str, WrapperUse]:
    """The stepping methods of the project's wrapper classes this module may call, by name;
    empty (and the project not read) when nothing here could be one."""
    if project is None:
        return {}
    # a name stepped that is bound to a wrapper of a class the first analysis could not read (it
    # may be one of the project's): known by its name only too
    name_only = any(o.reason == NAMED_LIKE_AN_OPTIMIZER for o in structure.optimizers.values()) or any(
        h.kind is HazardKind.UNSEEN_WRAPPER for h in structure.hazards)
    if not structure.unpaired_backwards and not name_only:
        return {}
    code = module.code
    # the wrapper classes this module builds tell which one its `optimizer.step()` means when several have a step()
    called = {name.rsplit(".", 1)[-1] for name in (dotted_name(call.func) for call in calls_within(module)) if name}
    found: Dict[str, WrapperUse] = {}
    for method in project.wrapper_step_methods():
        if method == "step" and not name_only:
            continue
        if method != "step" and f".{method}()" not in code:
            continue
        located = project.wrapper_step(method, called)
        if located is not None:
            key, display, step, several = located
            found[method] = WrapperUse(key, display, step, ambiguous=several)
    return found


def plan_wrapper_edit(use: WrapperUse, source: bytes, here: str) -> Optional[CompanionChange]:
    """The wrapper module's edit: every stepping method of its wrapper classes takes
    `scaler=None` and steps through it. The edit is the same whichever training file needs it,
    so that two change sets of one run that both need it write the same bytes (the second finds
    them written). None when the method takes the scaler already (another change set of this
    run, or an earlier run, converted it). The module is read as it is now, not as the
    repository model saw it."""
    module_steps = wrapper_steps(Path(use.key), source)
    now = next((s for s in module_steps if (s.klass, s.method) == (use.step.klass, use.step.method)), None)
    if now is None:
        raise WrapperEditRefused(f"{use.described} could not be found again")
    if now.takes_scaler:
        return None
    if now.obstacle is not None:
        raise WrapperEditRefused(f"{use.described} cannot take the GradScaler: {now.obstacle}")
    try:
        module = cst.parse_module(source)
    except Exception as error:
        raise WrapperEditRefused(f"{use.display} does not parse ({type(error).__name__})") from None
    findings = []
    for step in sorted((s for s in module_steps if s.obstacle is None and not s.takes_scaler), key=lambda s: s.line):
        module = _edit_method(module, step, use.display)
        unscaled = " (unscaled first: it reads the gradients before it steps)" if step.reads_gradients else ""
        findings.append(Finding(
            "AMP233",
            f"{step.klass}.{step.method}() takes {SCALER}=None and steps self.{step.inner} through it{unscaled}; without "
            "one it steps as before (written with the training file that steps it, as one change set)",
            step.line, 4, Severity.INFO))
    return CompanionChange(
        key=use.key, display=use.display, old=source, new=module.bytes, findings=findings,
        reason=f"changed with {here}: {use.step.klass}.{use.step.method}() steps its optimizer through the GradScaler",
    )


def _edit_method(module: cst.Module, step, display: str) -> cst.Module:
    klass = next((s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == step.klass), None)
    if klass is None or not isinstance(klass.body, cst.IndentedBlock):
        raise WrapperEditRefused(f"class {step.klass} could not be found again in {display}")
    methods = [s for s in klass.body.body if isinstance(s, cst.FunctionDef) and s.name.value == step.method]
    if len(methods) != 1:
        raise WrapperEditRefused(f"{step.klass}.{step.method}() is defined {len(methods)} times in {display}")
    method = methods[0]
    new_method = method.visit(_SteppedThroughScaler(step.inner, SCALER))
    if new_method.deep_equals(method):
        raise WrapperEditRefused(f"the step in {display}:{step.line} {step.klass}.{step.method}() could not be found again")
    new_method = _with_scaler_parameter(new_method, SCALER)
    if step.reads_gradients:
        new_method = _unscaled_first(new_method, step.inner, SCALER)
    new_body = klass.body.with_changes(body=[new_method if s is method else s for s in klass.body.body])
    return module.with_changes(body=[klass.with_changes(body=new_body) if s is klass else s for s in module.body])


class _SteppedThroughScaler(cst.CSTTransformer):
    """`self.<inner>.step()` -> `if scaler is not None: scaler.step(self.<inner>) / else: ...`."""

    def __init__(self, inner: str, scaler: str) -> None:
        super().__init__()
        self.inner = inner
        self.scaler = scaler

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if len(updated_node.body) != 1 or not isinstance(updated_node.body[0], cst.Expr):
            return updated_node
        call = updated_node.body[0].value
        if not (isinstance(call, cst.Call) and not call.args and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "step" and isinstance(call.func.value, cst.Attribute)
                and call.func.value.attr.value == self.inner and isinstance(call.func.value.value, cst.Name)
                and call.func.value.value.value == "self"):
            return updated_node
        replacement = cst.parse_statement(
            f"if {self.scaler} is not None:\n"
            f"    {self.scaler}.step(self.{self.inner})\n"
            f"else:\n"
            f"    self.{self.inner}.step()\n"
        )
        return replacement.with_changes(leading_lines=updated_node.leading_lines)


def _with_scaler_parameter(method: cst.FunctionDef, scaler: str) -> cst.FunctionDef:
    params = method.params
    new_param = cst.Param(cst.Name(scaler), default=cst.Name("None"),
                          equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
    if params.kwonly_params or params.star_arg is not cst.MaybeSentinel.DEFAULT:
        return method.with_changes(params=params.with_changes(kwonly_params=[*params.kwonly_params, new_param]))
    existing: List[cst.Param] = list(params.params)
    if existing:
        last = existing[-1]
        existing[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return method.with_changes(params=params.with_changes(params=[*existing, new_param]))


def _unscaled_first(method: cst.FunctionDef, inner: str, scaler: str) -> cst.FunctionDef:
    body = list(method.body.body)
    at = 1 if body and _is_docstring(body[0]) else 0
    guard = cst.parse_statement(f"if {scaler} is not None:\n    {scaler}.unscale_(self.{inner})\n")
    return method.with_changes(body=method.body.with_changes(body=[*body[:at], guard, *body[at:]]))


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr) and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def wrapper_call(call: cst.Call, scaler: str) -> cst.Call:
    """`optimizer.step_and_update_lr()` -> `optimizer.step_and_update_lr(scaler=scaler)`."""
    return call.with_changes(args=[*call.args, cst.Arg(
        cst.parse_expression(scaler), keyword=cst.Name("scaler"),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])


def refusal_for_ambiguous_step(use: WrapperUse, receiver: str) -> Optional[str]:
    if not use.ambiguous:
        return None
    return (f"{receiver} is known by its name only, and the project's wrapper class {use.described} has a step() of its "
            f"own: if {receiver} is one, scaler.step({receiver}) would fail (a wrapper has no param_groups); build the "
            "wrapper where this file can see it, or convert by hand")


def steps_of_wrapper_methods(structure: TrainingStructure, project) -> bool:
    """Is every optimizer step of this module the inner step of a wrapper class's stepping method
    (ScheduledOptim's own module: converted through the training files that step it)?"""
    if project is None or not structure.steps:
        return False
    known = {(step.klass, step.method) for step in project.wrapper_steps_here()}
    if not known:
        return False
    for step in structure.steps:
        function = step.scope
        klass = structure.class_of(function)
        if not (isinstance(function, cst.FunctionDef) and klass is not None
                and (klass.name.value, function.name.value) in known):
            return False
    return True
