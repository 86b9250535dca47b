"""The check sequence both PyTorch backends (native torch.amp and NVIDIA apex) run on a module.

The order of the checks is the same for both, and is decided here once:

1. the file never imports torch (or apex): report training code, never rewrite it;
2. already in mixed precision (by hand, or through torch.amp / apex amp), or mixed precision
   used somewhere that is not the training step;
3. a framework owns the loop (Lightning, Accelerate, the Hugging Face Trainer);
4. hazards (HazardKind), each mapped to a backend's rule code by its `BackendRules`;
5. optimizer steps without a backward, or no training at all;
6. every training unit planned on its own: a unit that cannot be converted is rolled back and
   refused with its reason, the others are converted.

A backend supplies its rule codes and messages (`BackendRules`) and three steps: `plan_unit`,
`snapshot`/`restore` of its planned edits, and `write`.
"""

from __future__ import annotations

import abc
import ast
from dataclasses import dataclass, replace
from typing import Any, List, Mapping, Optional, Set, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.base import CompanionChange, TransformResult, UnitContext, Verdict
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.kit.line_map import LineMap
from ampify.transforms.kit.log_of_sigmoid import log_of_probability_calls
from ampify.transforms.kit.parsed_modules import parsed_module
from ampify.transforms.torch.autograd_functions import (
    GRADIENT_DROPPING_PACKAGES,
    gradient_dropping_functions,
    gradient_dropping_imports,
    unsafe_autograd_functions,
)
from ampify.transforms.torch.probability_clamps import (
    LOG_OF_COMPLEMENT as _LOG_OF_COMPLEMENT,
    ROUNDS_TO_ONE,
    probability_clamps,
)
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.bce_logits import criterion_never_applied
from ampify.transforms.torch.helper_backwards import helper_refusal_note
from ampify.transforms.torch.library_loops import library_loop
from ampify.transforms.torch.autograd_functions_float32 import autocast_devices, plan_float32_functions
from ampify.transforms.torch.gram_matrix_float32 import plan_float32_grams
from ampify.transforms.torch.probability_clamps_float32 import plan_float32_clamps
from ampify.transforms.torch.sigmoid_float32 import plan_float32_sigmoids
from ampify.transforms.torch.inplace_matmuls import plan_imported_inplace_products
from ampify.transforms.torch.bce_imported import plan_imported_bce
from ampify.transforms.torch.masked_fill_limits import plan_imported_fill_limits
from ampify.transforms.torch.statements import short_text
from ampify.transforms.torch.wrapper_steps import steps_of_wrapper_methods
from ampify.transforms.torch.training_loop import (
    Hazard,
    HazardKind,
    LossNotFound,
    MixedPrecisionElsewhere,
    TrainingStructure,
    TrainingUnit,
    Unconvertible,
    describe_mixed_precision_use,
    names_called_in,
    receiver_of,
    training_without_torch_import,
    units_outside_mixed_precision,
)


@dataclass(frozen=True)
class HazardRule:
    """How one backend reports one hazard kind.

    `message` may use {detail}, {short_detail} (at most 60 characters, "this call" when empty),
    {last_name} (the detail's last dotted part), {sigmoid_hint} and {left_unconverted}.
    """

    code: str
    message: str
    #: the whole file is left unconverted when this hazard is present
    blocks_file: bool = False
    #: only a hazard with float16 loss scaling (bfloat16 needs none)
    float16_only: bool = False
    #: reported only in a file that trains (a model or library file is not warned)
    in_training_only: bool = False
    #: the file's reason when this hazard blocks it (default: the backend's blocked_reason)
    file_reason: str = ""


@dataclass(frozen=True)
class BackendRules:
    """A backend's rule codes and messages for the shared checks."""

    no_torch_import: str
    mixed_precision_outside_step: Tuple[str, str]  # message uses {line}
    steps_without_backward: Tuple[str, str]  # message uses {receiver}
    unpaired_backward: Tuple[str, str]  # message uses {followed}
    unit_refused: Tuple[str, str]  # "{problem}; <suffix>"
    #: a driver hands its optimizer to the training function of a module not in this run; the
    #: message uses {function}, {where}, {optimizer}, {line}, {module}; a second message for a
    #: trainer class, whose own module gets the whole conversion
    training_elsewhere: Tuple[str, str, str]
    #: the optimizer is handed to a third-party library's training loop; the message uses
    #: {callee}, {optimizer}, {package}
    library_loop: Tuple[str, str]
    #: a gradient penalty in a method of a class of another module this step builds (blocks with
    #: float16 scaling); the message uses {found}
    penalty_method: Tuple[str, str]
    hazards: Mapping[HazardKind, HazardRule]
    blocked_reason: str
    #: the code reporting a Gram matrix function of another module rewritten to float32
    #: (gram_matrix_float32.py); "" where the backend does not rewrite them
    float32_gram_matrix: str = ""
    #: the code reporting probability clamps of another module rewritten to clamp float32 copies
    #: (probability_clamps_float32.py); "" where the backend does not rewrite them
    float32_probability_clamp: str = ""
    #: the code reporting sigmoids of another module rewritten to take float32 copies before the
    #: log their loss takes (sigmoid_float32.py)
    float32_sigmoid: str = ""
    #: the code reporting custom autograd Functions of another module decorated to run in float32
    #: (autograd_functions_float32.py); "" where the backend does not decorate them
    float32_autograd_function: str = ""
    #: the code reporting in-place matrix products of another module given matrices of their
    #: receiver's dtype (inplace_matmuls.py); "" where the backend does not rewrite them
    inplace_products: str = ""
    #: the code saying such a module could not be rewritten (the conversion is incomplete)
    inplace_products_left: str = ""
    #: the code reporting BCEs of a sigmoid in another module fused to BCE with logits
    #: (bce_imported.py), and the code saying they could not be (the conversion is incomplete)
    imported_bce: str = ""
    imported_bce_left: str = ""
    #: the code saying a class of a module not in this run trains each time it is called (its
    #: forward() runs a backward() and a step): if this step calls it, that inner step is unscaled
    trains_when_called: str = ""


_NO_TORCH_IMPORT = (
    "this file trains (backward() and an optimizer step) but never imports torch by name (the "
    "model and optimizer come from elsewhere, or torch through `from ... import *`); nothing "
    "converted: add `import torch` to this file and rerun ampify, or convert by hand"
)


class TorchConversion(abc.ABC):
    """One module's conversion by one backend: the shared checks, then the backend's plan and edits."""

    rules: BackendRules

    def __init__(self, structure: TrainingStructure, options: Options, context: UnitContext = UnitContext()) -> None:
        self.structure = structure
        self.options = options
        #: the rest of the project (model code this module imports, callers in other files)
        self.project = context.project
        self.display = context.display
        #: the module's own bytes (for checks that read it when no project is known)
        self.source = context.source
        self._tree = context.tree
        self.scaling = options.dtype == "float16"
        self.findings: List[Finding] = []
        #: edits of other modules that belong to this module's change (one change set)
        self.companions: List[CompanionChange] = []
        #: what the companions change, reported here only when this module is converted
        self.companion_notes: List[Tuple[str, str, Optional[cst.CSTNode]]] = []
        #: the file's reason when a hazard blocks it and its rule names one
        self.blocked_reason = ""
        #: the project module that imports torch, when this file does not (see _torch_through_the_project)
        self.torch_evidence: Optional[str] = None
        #: ids of `loss.backward()` calls on loss objects this backend converts (loss_objects.py)
        self.converted_loss_objects: Set[int] = set()

    # ---- what a backend supplies ------------------------------------------------------------

    def imports_torch(self) -> bool:
        """Does the module name torch (so that new code can be spelled)?"""
        return self.structure.imports.uses("torch")

    def framework_switch(self) -> Optional[TransformResult]:
        """A framework that owns the training loop, handled by the backend (its own switch set);
        None: no such framework here, or the backend leaves it (reported as not applicable)."""
        return None

    def plan_manual_updates(self) -> Tuple[List[Any], Set[int]]:
        """Plans for backward() calls whose parameters are updated by hand (no optimizer), and
        the ids of the backward calls the backend has dealt with (planned or reported)."""
        return [], set()

    def claimed_hazards(self) -> Set[int]:
        """Ids of hazard nodes the backend converts itself (not reported, not blocking)."""
        return set()

    def prepare(self) -> None:
        """Called once before the first unit is planned (fresh names, say)."""

    @abc.abstractmethod
    def plan_unit(self, unit: TrainingUnit) -> Any:
        """Plan the conversion of one unit, or raise Unconvertible; the plan goes to `write`."""

    @abc.abstractmethod
    def snapshot(self) -> Any:
        """The planned state, taken before a unit is planned."""

    @abc.abstractmethod
    def restore(self, state: Any) -> None:
        """Forget what a refused unit planned."""

    @abc.abstractmethod
    def write(self, plans: List[Any]) -> cst.Module:
        """The converted module."""

    # ---- companions ---------------------------------------------------------------------------

    def pending_edits(self) -> "_PendingEdits":
        """The project as the rewrites of this change set see it (each made on top of the last)."""
        return _PendingEdits(self.project, self.companions)

    def written_together(self, code: str, companions: List[CompanionChange], notes: List[str],
                         node: Optional[cst.CSTNode]) -> None:
        """Rewrites of other modules planned for this file's hazards: into the change set, each said
        on this file's report (`code`) as written with it."""
        self.add_companions(companions)
        self.companion_notes += [(code, note + "; written together with this file, as one change set", node)
                                 for note in notes]

    def add_companions(self, companions: List[CompanionChange]) -> None:
        """Add edits of other modules to this change set; an edit of a module edited already, made
        on top of that edit (pending_edits), becomes one change with it (sigmoid_focal_loss.py: its
        Function decorated, its sigmoid taking a float32 copy)."""
        for change in companions:
            index = next((i for i, c in enumerate(self.companions) if c.key == change.key), None)
            if index is None or change.old != self.companions[index].new:
                self.companions.append(change)  # a clash is refused whole (convert._check_one_edit_per_module)
                continue
            earlier = self.companions[index]
            lines = LineMap(earlier.old.decode("utf-8", "replace"), earlier.new.decode("utf-8", "replace"))
            findings = sorted([*earlier.findings, *(replace(f, line=lines.original_line(f.line)) for f in change.findings)],
                              key=lambda f: (f.line, f.column, f.code))
            purpose = change.reason.split(": ", 1)[-1]
            self.companions[index] = CompanionChange(change.key, change.display, earlier.old, change.new, findings,
                                                     f"{earlier.reason}; {purpose}")

    # ---- findings ---------------------------------------------------------------------------

    def position(self, node: Optional[cst.CSTNode]) -> Tuple[int, int]:
        if node is None:
            return 0, 0
        position = self.structure.position(node)
        return position.line, position.column

    def add_finding(self, code: str, message: str, node: Optional[cst.CSTNode], severity: Severity) -> None:
        line, column = self.position(node)
        finding = Finding(code, message, line, column, severity)
        if finding not in self.findings:
            self.findings.append(finding)

    def warn(self, code: str, message: str, node: Optional[cst.CSTNode]) -> None:
        self.add_finding(code, message, node, Severity.WARNING)

    def info(self, code: str, message: str, node: Optional[cst.CSTNode]) -> None:
        self.add_finding(code, message, node, Severity.INFO)

    def result(self, verdict: Verdict, reason: str = "", module: Optional[cst.Module] = None) -> TransformResult:
        if verdict is Verdict.CONVERTED:
            for code, message, node in self.companion_notes:
                self.info(code, message, node)
        findings = sorted(self.findings, key=lambda f: (f.line, f.column, f.code))
        companions = self.companions if verdict is Verdict.CONVERTED else []
        return TransformResult(module or self.structure.module, verdict, findings, reason, companions)

    # ---- the check sequence -----------------------------------------------------------------

    def run(self) -> TransformResult:
        s = self.structure
        switched = self.framework_switch()
        if switched is not None:
            return switched
        if not self.imports_torch():
            if self._torch_through_the_project() is None:
                return self._without_torch_import()
        if s.hand_written_mixed_precision is not None and (s.backwards or s.steps):
            what, node = s.hand_written_mixed_precision
            return self.result(
                Verdict.ALREADY_MIXED_PRECISION,
                f"already in mixed precision by hand ({what}, line {s.line(node)}); adding AMP would stack a "
                "second loss scale on it",
            )
        if s.mixed_precision_uses:
            return self._already_mixed_precision()
        if s.loop_owning_framework:
            return self.result(Verdict.NOT_APPLICABLE, names.LOOP_OWNING_FRAMEWORKS[s.loop_owning_framework])
        has_training = bool(s.backwards) or any(
            h.kind in (HazardKind.AUTOGRAD_BACKWARD, HazardKind.DISTRIBUTED_AUTOGRAD) for h in s.hazards)
        blocked = self._report_hazards(has_training)
        if not has_training and s.steps and steps_of_wrapper_methods(s, self.project):
            return self.result(Verdict.NOTHING_TO_DO, "optimizer wrapper classes: the training files that step them "
                                                      "pass them the GradScaler")
        if not has_training and s.steps and all(_in_optimizer_class(s, step.scope) for step in s.steps):
            return self.result(Verdict.NOTHING_TO_DO, "optimizer classes: their step() steps the optimizer they wrap, "
                                                      "and the training files step them like any optimizer")
        if not has_training and s.steps:
            code, message = self.rules.steps_without_backward
            self.warn(code, message.format(receiver=s.steps[0].receiver), s.steps[0].call)
            return self.result(Verdict.UNCONVERTED, "optimizer steps without a backward() call in this file")
        if not has_training:
            elsewhere = self._training_elsewhere_not_in_run() or self._loop_of_a_library()
            if elsewhere is not None:
                return elsewhere
            return self.result(Verdict.NOTHING_TO_DO, "no backward() call: no training step here (inference or model code)")
        if blocked:
            return self.result(Verdict.UNCONVERTED, self.blocked_reason or self.rules.blocked_reason)
        self.prepare()
        plans, claimed = self.plan_manual_updates()
        code, message = self.rules.unpaired_backward
        left_out: List[cst.CSTNode] = []
        if len(s.unpaired_backwards) > 2:
            s.compute_all_positions()  # one code generation for warnings spread over the file
        by_callers = self.loss_classes_converted_by_callers()
        if by_callers and not s.units and not s.steps and len(by_callers) == len(s.unpaired_backwards):
            return self.result(Verdict.NOTHING_TO_DO, self.loss_classes_reason(by_callers))
        closures = _closures_passed_to_step(s)
        for backward in s.unpaired_backwards:
            if id(backward.call) in by_callers:
                continue
            if _runs_in(s, backward.call, closures):
                # LBFGS's `def closure(): ... loss.backward()` passed to optimizer.step(closure): the
                # closure warning (AMP211 / AMP311) already says why, and it is no hidden optimizer
                left_out.append(backward.call)
                continue
            if id(backward.call) not in claimed:
                self.warn(code, message.format(followed=helper_refusal_note(s, backward)), backward.call)
                left_out.append(backward.call)
        code, message = self.rules.unit_refused
        refusals: List[Tuple[Unconvertible, cst.CSTNode]] = []
        for unit in s.units:
            state = self.snapshot()
            findings_before = len(self.findings)
            try:
                plans.append(self.plan_unit(unit))
            except Unconvertible as problem:
                self.restore(state)
                del self.findings[findings_before:]
                refusals.append((problem, problem.node or (unit.backwards[0].call if unit.backwards else unit.owner)))
        if not plans and refusals and all(isinstance(problem, MixedPrecisionElsewhere) for problem, _ in refusals):
            return self.result(Verdict.ALREADY_MIXED_PRECISION, f"already in mixed precision: {refusals[0][0]}")
        for problem, node in refusals:
            if isinstance(problem, LossNotFound):
                problem = self._loss_object_note(problem)
            self.warn(problem.code or code, message.format(problem=problem), node)
        if not plans:
            return self.result(Verdict.UNCONVERTED, "training code found, but no training step could be converted safely")
        left_out += [node for _, node in refusals]
        partial = self.partial_conversion_refused(left_out) if left_out else None
        if partial is not None:
            self.findings[:] = [f for f in self.findings if f.severity is not Severity.INFO]
            self.warn(partial[0], partial[1], partial[2])
            return self.result(Verdict.UNCONVERTED, partial[1])
        return self.result(Verdict.CONVERTED, module=self.write(plans))

    def partial_conversion_refused(self, left_out: List[cst.CSTNode]) -> Optional[Tuple[str, str, cst.CSTNode]]:
        """(code, reason, node) when converting some training steps of this file while `left_out`
        (backward calls or refused steps) stay unconverted would make those wrong rather than
        float32; None (the default) keeps the partial conversion, reported as incomplete."""
        return None

    def loss_object_backward(self, unit: TrainingUnit) -> Optional[Tuple[str, cst.Call]]:
        """A `loss.backward()` of the unit whose `loss` looks like an instance of a loss class of
        the project with a backward() of its own (see `_loss_object_note`) rather than a tensor:
        bound here only as a parameter, an alias (`loss = self.loss`) or an instance of such a
        class. With the message; None otherwise. Scaling it (`amp.scale_loss(loss, ...)`,
        `scaler.scale(loss)`) would fail on the object."""
        from ampify.transforms.torch.loss_objects import find_loss_object, loss_receiver

        for backward in unit.backwards:
            receiver = loss_receiver(backward)
            if backward.delegation is not None or not receiver or id(backward.call) in self.converted_loss_objects:
                continue
            use = find_loss_object(self.structure, self.project, backward, unit.body)
            if use is not None:
                what = use if isinstance(use, str) else (
                    f"{receiver} is an instance of {use.class_name} ({use.where}), a loss class whose own backward() "
                    f"runs {use.inner}.backward(): {self.loss_object_limit()}")
                return what, backward.call
        if self.project is None:
            return None
        classes = None
        for backward in unit.backwards:
            if backward.delegation is not None:
                continue
            receiver = receiver_of(backward)
            if not receiver or id(backward.call) in self.converted_loss_objects:
                continue
            if classes is None:
                classes = list(self.project.loss_classes_with_backward())
                if not classes:
                    return None
            bindings = self.structure.bindings_visible(receiver, backward.scope)
            names = {name for _, name, _ in classes}
            if bindings and all(_alias_or_instance(b, names) for b in bindings):
                note = self._loss_object_note(LossNotFound("", backward.call, receiver))
                return str(note).rsplit("; besides, ", 1)[0], backward.call
        return None

    def loss_classes_converted_by_callers(self) -> Mapping[int, str]:
        """id of the backward() in a loss class's own backward() method -> the class, for those
        this backend converts from the training steps that call them (none by default)."""
        return {}

    def loss_classes_reason(self, classes: Mapping[int, str]) -> str:
        names_ = ", ".join(sorted(set(classes.values())))
        return (f"loss class {names_}: its backward() takes the GradScaler from the training files that call it "
                "(converted with them, as one change set)")

    def loss_object_limit(self) -> str:
        """Why a possible loss object is refused, as this backend says it."""
        return "ampify does not convert a loss class's backward() on this backend"

    def _loss_object_note(self, problem: "LossNotFound") -> Unconvertible:
        """The loss of `loss.backward()` was not found: when the project has a loss class with a
        backward() of its own (pytorch-seq2seq's `Loss.backward()` runs `self.acc_loss.backward()`),
        `loss` may well be one of its instances, and that is the reason to give first."""
        if not problem.receiver or self.project is None:
            return problem
        classes = list(self.project.loss_classes_with_backward())
        if not classes:
            return problem
        bound = {_called_name(b.value) for b in self.structure.bindings_visible(problem.receiver, problem.node and
                                                                               self.structure.scope_of(problem.node))}
        chosen = [c for c in classes if c[1] in bound] or classes
        where, name, inner = chosen[0]
        more = f" (or another of the {len(chosen)} such classes)" if len(chosen) > 1 else ""
        return Unconvertible(
            f"{problem.receiver} may be an instance of {name} ({where}){more}, a loss class whose own backward() runs "
            f"{inner}.backward(): {self.loss_object_limit()} (by hand: scale {inner} there, "
            "with scaler.scale() or amp.scale_loss(), and for autocast put the forward pass and the calls that "
            f"accumulate the loss under it); besides, {problem}",
            problem.node, problem.code,
        )

    def _training_elsewhere_not_in_run(self) -> Optional[TransformResult]:
        """A driver (DETR's main.py) builds the optimizer and hands it to the training function of
        another module (`train_one_epoch(model, criterion, loader, optimizer, ...)`): when that module
        is in this run, its conversion edits this file too (one change set); when it is not, this
        file is not converted and the warning names the module to add. None when neither holds."""
        s = self.structure
        if self.project is None:
            return None
        optimizers = {b.name: b for b in s.bindings
                      if b.qualified_call and names.is_optimizer_qualname(b.qualified_call) and b.kind == "assign"}
        if not optimizers:
            return self._trains_through_a_module_not_in_run()
        for key, where, dotted, is_class in self.project.training_functions_called():
            if self.project.in_this_run(key):
                continue
            for call in statements.calls_within(s.module):
                if dotted_name(call.func) != dotted:
                    continue
                passed = [name for arg in call.args for name in sorted(statements.used_names(arg.value) & set(optimizers))]
                if not passed:
                    continue
                binding = optimizers[passed[0]]
                code, message, class_message = self.rules.training_elsewhere
                message = class_message if is_class else message
                module = where.rsplit(":", 1)[0]
                self.warn(code, message.format(function=dotted, where=where, optimizer=passed[0], module=module,
                                               line=s.line(binding.statement) if binding.statement else s.line(call)),
                          call)
                return self.result(Verdict.UNCONVERTED, f"the training step is in {module}, not in this run; see the warning")
        return None

    def _loop_of_a_library(self) -> Optional[TransformResult]:
        """The optimizer built here is handed to the training loop of a third-party library (torchnet's
        `Engine().train(...)`, homura's `SupervisedTrainer(...)`): the step runs there, where ampify
        writes nothing; refused with that reason, not called inference code. None when no such call."""
        if self.project is None:
            return None
        s = self.structure
        found = library_loop(s.module, s.imports, self.project.is_project_package)
        if found is None:
            return None
        code, message = self.rules.library_loop
        package = found.qualified.split(".", 1)[0]
        self.warn(code, message.format(callee=found.qualified, optimizer=found.optimizer, package=package), found.call)
        return self.result(Verdict.UNCONVERTED, f"the training loop runs in {package}, which ampify does not rewrite; "
                                                "see the warning")

    def _trains_through_a_module_not_in_run(self) -> Optional[TransformResult]:
        """A script that builds no optimizer and trains through a training function or class of
        another module (minGPT's chargpt.py: `Trainer(config.trainer, model, dataset).run()`), named
        without that module: the step stays float32, so the file is not reported as having no
        training code; the warning names the module to add. None when there is no such call."""
        s = self.structure
        for key, where, dotted, is_class in self.project.training_functions_called():
            if self.project.in_this_run(key):
                continue
            call = next((c for c in statements.calls_within(s.module) if dotted_name(c.func) == dotted), None)
            if call is None:
                continue
            code = self.rules.training_elsewhere[0]
            module = where.rsplit(":", 1)[0]
            what = "the class" if is_class else "the function"
            self.warn(code, f"{dotted}() ({where}) runs this script's training step, and {module} is not in this run: "
                            f"the conversion goes into {what} there (and into this file if the step needs something "
                            f"from it); run ampify on {module} too, or on the repository", call)
            return self.result(Verdict.UNCONVERTED, f"the training step is in {module}, not in this run; see the warning")
        return None

    def _torch_through_the_project(self) -> Optional[str]:
        """A file that trains (backward() and a step) without importing torch, whose project
        modules it imports do (SPADE's trainer: `from models.pix2pix_model import Pix2PixModel`):
        the module that shows the objects are PyTorch's; the conversion adds `import torch`."""
        if self.project is None or training_without_torch_import(self.structure) is None:
            return None
        if self.torch_evidence is None:
            self.torch_evidence = self.project.torch_module_imported()
        return self.torch_evidence

    def _without_torch_import(self) -> TransformResult:
        """The file does not import torch: report training code, never rewrite it (ampify cannot
        tell which names are torch's)."""
        backward = training_without_torch_import(self.structure)
        if backward is None:
            return self.result(Verdict.NOT_APPLICABLE, "does not import torch")
        self.warn(self.rules.no_torch_import, _NO_TORCH_IMPORT, backward)
        return self.result(Verdict.UNCONVERTED, "trains without importing torch; see the warning")

    def _already_mixed_precision(self) -> TransformResult:
        s = self.structure
        outside = units_outside_mixed_precision(s)
        code, message = self.rules.mixed_precision_outside_step
        for unit, use in outside:
            self.warn(code, message.format(line=s.line(use)), unit.backwards[0].call)
        if outside:
            return self.result(Verdict.UNCONVERTED, "mixed precision is used, but not around the training step")
        return self.result(Verdict.ALREADY_MIXED_PRECISION,
                           f"already uses {describe_mixed_precision_use(s, s.mixed_precision_uses[0])}")

    def _report_hazards(self, has_training: bool) -> bool:
        """Warn about every hazard this backend maps; True when one of them blocks the file."""
        s = self.structure
        sigmoids = [h for h in s.hazards if h.kind is HazardKind.SIGMOID]
        blocked = False
        claimed = self.claimed_hazards()
        if len(s.hazards) > 2:
            s.compute_all_positions()
        for hazard in s.hazards:
            if id(hazard.node) in claimed:
                continue
            if hazard.detail in names.BCE_LOSS_CLASSES and criterion_never_applied(s, hazard.node):
                continue  # built, moved to the GPU, never used: no BCE runs
            if hazard.kind is HazardKind.MASKED_FILL and not has_training and not _in_model_code(s, hazard.node):
                continue  # a data utility of a module that does not train (DETR's masks_to_boxes)
            if hazard.kind is HazardKind.MANUAL_HALF and not s.steps:
                continue  # backward() with no optimizer step (a profiler timing it): no training step to cast
            rule = self.rules.hazards.get(hazard.kind)
            if rule is None or (rule.float16_only and not self.scaling) or (rule.in_training_only and not has_training):
                continue
            self.warn(rule.code, rule.message.format(**_message_fields(s, hazard, sigmoids, has_training, self.scaling)),
                      hazard.node)
            if rule.blocks_file and not blocked and rule.file_reason:
                self.blocked_reason = rule.file_reason
            blocked = blocked or rule.blocks_file
        dropped = self._report_gradient_dropping(has_training)
        grams = self._report_imported_gram_matrices(has_training, blocked)
        clamps = self._report_probability_clamps(has_training)
        logs = self._report_imported_logs_of_sigmoid(has_training)
        products = self._report_imported_inplace_products(has_training)
        bce = self._report_imported_bce(has_training)
        penalties = self._report_penalty_methods(has_training)
        self._report_training_when_called(has_training)
        return self._report_unsafe_autograd_functions(has_training) or self._report_imported_overflows(has_training) \
            or dropped or grams or clamps or logs or products or bce or penalties or blocked

    def _report_penalty_methods(self, has_training: bool) -> bool:
        """A method of a class of another project module that this step builds takes a gradient
        penalty (StyleGAN.pytorch's `LogisticGAN.R1Penalty()`, run through `self.loss.dis_loss(...)`):
        under float16 its torch.autograd.grad is unscaled and small input gradients flush to zero.
        A penalty function is threaded the GradScaler; a method of a class is not: blocked (True)
        with float16 scaling, said nowhere with bfloat16 (float32's range)."""
        code, message = self.rules.penalty_method
        if not has_training or not code or self.project is None or not self.scaling_is_float16():
            return False
        found = self.project.penalty_methods_used()
        if not found:
            return False
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        node = self.structure.backwards[0].call if self.structure.backwards else None
        self.warn(code, message.format(found=shown), node)
        if not self.blocked_reason:
            self.blocked_reason = "a gradient penalty of another module's class would run unscaled in float16; see the warning"
        return True

    def _report_imported_bce(self, has_training: bool) -> bool:
        """A BCE on probabilities in the code this file imports (MUNIT's discriminator computing its
        own `F.binary_cross_entropy(F.sigmoid(out), target)` in networks.py) raises once the step
        runs under autocast: fused there to BCE with logits, in this file's change set
        (bce_imported.py), in the modules it imports directly or whose function, class or method
        holding the BCE it calls by name. When it cannot be: blocked (True) when this file calls
        that name; else the conversion says so and is incomplete (the module may be imported and
        that loss never run by this step)."""
        code = self.rules.imported_bce
        if not has_training or not code or self.project is None:
            return False
        if not self.project.imports_a_bce():
            return False
        called = names_called_in(self.structure.module)
        if not self.project.bce_modules(called):
            return False
        node = self.structure.backwards[0].call if self.structure.backwards else None
        companions, notes, refused = plan_imported_bce(self.pending_edits(), self.display, code, called)
        if refused is None:
            self.written_together(code, companions, notes, node)
            return False
        found = self.project.bce_imported(called)
        run = [where for where, owners in found if called & set(owners)]
        shown = ", ".join((run or [where for where, _ in found])[:3])
        shown += f" and {len(run or found) - 3} more" if len(run or found) > 3 else ""
        if run:
            self.warn(self.rules.hazards[HazardKind.BCE].code,
                      f"this file calls code of another module that computes BCE on probabilities ({shown}), which "
                      f"raises under autocast; ampify did not fuse it with its sigmoid there: {refused}; the training "
                      "steps of this file were left unconverted: compute it with binary_cross_entropy_with_logits on "
                      "the logits there, then rerun ampify", node)
            return True
        self.warn(self.rules.imported_bce_left, f"the code this file imports, or that the script running it hands it, "
                                                f"computes BCE on probabilities ({shown}), "
                  "which raises under autocast if this step runs it; ampify did not fuse it with its sigmoid there: "
                  f"{refused}", node)
        return False

    def _report_training_when_called(self, has_training: bool) -> None:
        """A class of another project module trains a part each time it is called (EDSR's
        `Adversarial.forward()` updates its discriminator: backward() and step() inside the loss):
        if this file's step computes its loss through it, that inner step runs under autocast
        (apex O1: everywhere) with no loss scaling. Converted in its own module when that module is
        in this run; when it is not, this conversion says so and is incomplete. Never blocks."""
        code = self.rules.trains_when_called
        if not has_training or not code or self.project is None:
            return
        node = self.structure.backwards[0].call if self.structure.backwards else None
        self._report_trainers_used(code, node)
        outside = self._outside_this_run(self.project.training_when_called_elsewhere())
        if outside is None:
            return
        shown, modules = outside
        self.warn(code, f"{shown} runs a backward() and an optimizer step of its own each time it is called (a loss "
                        "that updates a discriminator, a module that trains a part): if this file's step calls it, "
                        "that inner step runs in mixed precision with no loss scaling (float16 gradients can "
                        f"underflow); {', '.join(modules)} is not in this run: run ampify on it too, or on the "
                        "repository", node)

    def _report_trainers_used(self, code: str, node) -> None:
        """A class of another project module that this file builds trains through a method of its
        own (DARTS' `architect.step(...)`: a backward() and the architecture optimizer's step in
        architect.py): that training is this file's too, and it is converted only in its own module.
        When that module is not in this run, the conversion says so and is incomplete."""
        ask = getattr(self.project, "trainers_used_from_elsewhere", None)
        outside = self._outside_this_run(ask() if ask is not None else [])
        if outside is None:
            return
        shown, modules = outside
        self.warn(code, f"this file builds a trainer of another module: {shown} runs a backward() and an optimizer step "
                        "of its own, which ampify converts only in its module, and "
                        f"{', '.join(modules)} is not in this run: that training stays float32, or runs in mixed precision "
                        "without loss scaling where this file's conversion reaches it; run ampify on it too, or on "
                        "the repository", node)

    def _outside_this_run(self, found) -> Optional[Tuple[str, List[str]]]:
        """("Architect.step() (cnn/architect.py:47) and 2 more", its modules) for the (key, where,
        method) of `found` whose module is not in this run; None when every one is."""
        outside = [(where, method) for key, where, method in found if not self.project.in_this_run(key)]
        if not outside:
            return None
        shown = ", ".join(f"{method}() ({where})" for where, method in outside[:3])
        shown += f" and {len(outside) - 3} more" if len(outside) > 3 else ""
        return shown, sorted({where.rsplit(":", 1)[0] for where, _ in outside})

    def _report_imported_inplace_products(self, has_training: bool) -> bool:
        """In-place matrix products in the model code of a project module this file imports
        (deep-person-reid's triplet loss: `dist.addmm_(inputs, inputs.t())` on a float32 `dist`)
        raise under autocast: their matrices are cast to the receiver's dtype there, in this file's
        change set; when that module cannot be rewritten, the conversion says so and is incomplete
        (AMP250). Never blocks."""
        code = self.rules.inplace_products
        if not has_training or not code or self.project is None:
            return False
        modules = list(self.project.inplace_product_modules())
        if not modules:
            return False
        node = self.structure.backwards[0].call if self.structure.backwards else None
        companions, notes, refused = plan_imported_inplace_products(self.pending_edits(), self.display, code)
        if refused is None:
            self.written_together(code, companions, notes, node)
            return False
        shown = ", ".join(display for _, display, _ in modules[:3])
        # not blocking: the module may be imported and never run by this step (a package importing
        # every loss); if it runs, the product raises loudly on the first float16 batch
        self.warn(self.rules.inplace_products_left, f"the model code this file imports ({shown}) runs an in-place matrix product "
                            "(`x.addmm_(a, b)`) that raises under autocast when its receiver is float32 and its "
                            f"matrices float16, if this step runs it; ampify did not cast them there: {refused}", node)
        return False

    def _report_imported_logs_of_sigmoid(self, has_training: bool) -> bool:
        """The model or loss code this file imports takes the log of a sigmoid's probability
        (kuangliu/pytorch-retinanet's `pt = (2*xt+1).sigmoid(); loss = -w*pt.log()` in loss.py): under
        autocast it is -inf once the logit is confident, as in this file (AMP229). The file is left
        unconverted, naming each log. True when blocked."""
        rule = self.rules.hazards.get(HazardKind.LOG_OF_PROBABILITY)
        if not has_training or rule is None or self.project is None:
            return False
        found = []
        modules = []
        for key, display, source in self.project.sigmoid_log_sources():
            parsed = parsed_module(source)
            if parsed is None:
                continue
            module, imports, positions = parsed
            logs = [f"{display}:{positions[call].start.line} {statements.code_of(call)}"
                    for call, _ in log_of_probability_calls(module, imports)]
            if logs:
                found += logs
                modules.append((key, display, self.project.module_trains(key)))
        if not found:
            return False
        node = self.structure.backwards[0].call if self.structure.backwards else None
        if self.rules.float32_sigmoid:
            companions, notes, why = plan_float32_sigmoids(self.pending_edits(), self.display, self.rules.float32_sigmoid,
                                                           modules)
            if why is None:
                self.written_together(self.rules.float32_sigmoid, companions, notes, node)
                return False
            refused = f"; ampify did not rewrite it: {why}"
        else:
            refused = ""
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        hazard = Hazard(HazardKind.LOG_OF_PROBABILITY, node, f"{shown} (in the code this file imports{refused})")
        self.warn(rule.code, rule.message.format(**_message_fields(self.structure, hazard, [], has_training,
                                                                   self.scaling)), node)
        if not self.blocked_reason and rule.file_reason:
            self.blocked_reason = rule.file_reason
        return rule.blocks_file

    def _report_probability_clamps(self, has_training: bool) -> bool:
        """`p = torch.clamp(p, 1e-4, 1.0 - 1e-4)` before `log(1 - p)` in this file or the model code it
        imports (yhenon/pytorch-retinanet's focal loss): the bound rounds to 1 in the converted dtype,
        the loss turns inf or NaN. The imported modules are rewritten to clamp float32 copies, as
        companions of this file's change (probability_clamps_float32.py); this file's own clamps
        block it here and are rewritten by normalize.py, which converts it again. True when blocked."""
        rule = self.rules.hazards.get(HazardKind.PROBABILITY_CLAMP)
        if not has_training or rule is None:
            return False
        dtype = "float16" if self.scaling_is_float16() else "bfloat16"
        clamps = []
        if (b"clamp" in self.source or b"clip" in self.source) and _LOG_OF_COMPLEMENT.search(self.source):
            tree = self._converted_tree(probability_clamps)
            if tree is not None:
                clamps = [(f"line {line}", text, eps) for line, text, eps in probability_clamps(tree)]
        clamps = [c for c in clamps if c[2] <= ROUNDS_TO_ONE[dtype]]
        imported = [c for c in (self.project.probability_clamps_imported() if self.project is not None else [])
                    if c[2] <= ROUNDS_TO_ONE[dtype]]
        node = self.structure.backwards[0].call if self.structure.backwards else None
        refused = ""
        if imported and self.rules.float32_probability_clamp:
            companions, notes, why = plan_float32_clamps(self.pending_edits(), self.display, self.rules.float32_probability_clamp,
                                                         ROUNDS_TO_ONE[dtype])
            if why is None:
                self.written_together(self.rules.float32_probability_clamp, companions, notes, node)
                imported = []
            else:
                refused = f"; ampify did not rewrite it: {why}"
        clamps += imported
        if not clamps:
            return False
        shown = "; ".join(f"{where} {text}" for where, text, _ in clamps[:3]) + (
            f"; and {len(clamps) - 3} more" if len(clamps) > 3 else "")
        consequence = ("GradScaler skips every such step" if self.scaling_is_float16()
                       else "with no loss scaling the NaN reaches the weights")
        self.warn(rule.code, rule.message.format(detail=shown, dtype=dtype, consequence=consequence, refused=refused),
                  node)
        if not self.blocked_reason and rule.file_reason:
            self.blocked_reason = rule.file_reason
        return True

    def _report_imported_gram_matrices(self, has_training: bool, reported_here: bool) -> bool:
        """A function of another project module that this file calls computes a Gram matrix of a
        flattened feature map (fast_neural_style's `utils.gram_matrix`): in float16 it overflows,
        as one in this file does. That module is rewritten to compute it in float32, as a companion
        of this file's change (gram_matrix_float32.py); when it cannot be, the file is left
        unconverted (float16 only). True when blocked."""
        project = self.project
        rule = self.rules.hazards.get(HazardKind.GRAM_MATRIX)
        if not has_training or project is None or rule is None or not self.scaling_is_float16():
            return False
        found = list(project.gram_matrix_functions_called())
        if not found:
            return False
        node = self.structure.backwards[0].call if self.structure.backwards else None
        refused = ""
        if self.rules.float32_gram_matrix:
            companions, notes, why = plan_float32_grams(self.pending_edits(), self.display, self.rules.float32_gram_matrix)
            if why is None:
                self.written_together(self.rules.float32_gram_matrix, companions, notes, node)
                return False
            refused = f"; ampify did not rewrite it: {why}"
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        self.warn(rule.code, rule.message.format(detail=shown, left_unconverted=f"{refused}; the training steps of "
                                                 "this file were left unconverted"), node)
        if not reported_here and rule.file_reason and not self.blocked_reason:
            self.blocked_reason = rule.file_reason
        return rule.blocks_file

    def _report_gradient_dropping(self, has_training: bool) -> bool:
        """With loss scaling: a custom autograd Function (here or in the model code this file
        imports) whose backward() never reads the incoming gradient leaves the file unconverted; an
        import of a binding that did so in some releases (warpctc_pytorch) is named for the user to
        check. True when the file is blocked."""
        if not has_training or not self.scaling_is_float16():
            return False
        if self.project is not None:
            functions = list(self.project.gradient_dropping_functions())
            imports = [f"{package}, imported at {where}: {GRADIENT_DROPPING_PACKAGES[package]}"
                       for where, package in self.project.gradient_dropping_imports()]
        elif b"Function" in self.source or b"warpctc_pytorch" in self.source or b"warprnnt_pytorch" in self.source:
            tree = self._stdlib_tree()
            if tree is None:
                return False
            functions = [f"line {line} {name}: {why}" for line, name, why in gradient_dropping_functions(tree)]
            imports = [f"{package}, imported at line {line}: {GRADIENT_DROPPING_PACKAGES[package]}"
                       for line, package in gradient_dropping_imports(tree)]
        else:
            return False
        node = self.structure.backwards[0].call if self.structure.backwards else None
        if imports:
            rule = self.rules.hazards[HazardKind.GRADIENT_DROPPING_BINDING]
            self.warn(rule.code, rule.message.format(detail="; ".join(imports)), node)
        if not functions:
            return False
        rule = self.rules.hazards[HazardKind.GRADIENT_DROPPED]
        shown = "; ".join(functions[:3]) + (f"; and {len(functions) - 3} more" if len(functions) > 3 else "")
        self.warn(rule.code, rule.message.format(detail=shown), node)
        if not self.blocked_reason and rule.file_reason:
            self.blocked_reason = rule.file_reason
        return True

    def _report_unsafe_autograd_functions(self, has_training: bool) -> bool:
        """A custom autograd Function in this module or the model code it imports that breaks under
        autocast / apex O1 (its backward() mixes the float16 gradient with float32 tensors, or it
        runs a compiled extension). On the native backend the imported modules' Functions are
        decorated to run in float32, as companions of this file's change
        (autograd_functions_float32.py); this file's own block it here and are decorated by
        normalize.py, which converts it again. Otherwise the file's training is left unconverted,
        naming each Function. True when blocked."""
        if not has_training:
            return False
        found = []
        if b"Function" in self.source:
            tree = self._converted_tree(unsafe_autograd_functions)
            if tree is not None:
                found = [f"line {line} {name}: {why}" for line, name, why in unsafe_autograd_functions(tree)]
        imported = list(self.project.unsafe_autograd_functions()) if self.project is not None else []
        node = self.structure.backwards[0].call if self.structure.backwards else None
        refused = ""
        if imported and self.rules.float32_autograd_function:
            devices = autocast_devices(self.source.decode("utf-8", "replace"))
            companions, notes, why = plan_float32_functions(self.pending_edits(), self.display,
                                                            self.rules.float32_autograd_function, devices)
            if why is None:
                self.written_together(self.rules.float32_autograd_function, companions, notes, node)
                imported = []
            else:
                refused = f"; ampify did not decorate them: {why}"
        found += imported
        if not found and self.project is not None and not self._builds_an_optimizer():
            # the optimizer, and so the model, is handed in (a trainer given both by main.py): the
            # Functions of the model code the scripts running this file import
            found = list(self.project.unsafe_autograd_functions_run_beside())
            if found:
                refused = "; ampify did not decorate them: they are not in the modules this file imports"
        if not found:
            return False
        rule = self.rules.hazards[HazardKind.AUTOGRAD_FUNCTION]
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        self.warn(rule.code, rule.message.format(detail=shown, refused=refused), node)
        if not self.blocked_reason and rule.file_reason:
            self.blocked_reason = rule.file_reason
        return True

    def _builds_an_optimizer(self) -> bool:
        """Does this file construct an optimizer it steps (`torch.optim.Adam(...)`, not one handed in)?"""
        return any(binding.qualified_call and names.is_optimizer_qualname(binding.qualified_call)
                   for optimizer in self.structure.optimizers.values() for binding in optimizer.bindings)

    def _report_imported_overflows(self, has_training: bool) -> bool:
        """masked_fill(..., -1e9) in the model code of a project module this file imports raises
        on float16 tensors once the forward pass runs under autocast (or apex O1): the file's
        training is left unconverted, naming where to fix it."""
        project = self.project
        if not has_training or project is None or not self.scaling_is_float16():
            return False
        overflows = list(project.float16_overflows_imported())
        if not overflows:
            return False
        node = self.structure.backwards[0].call if self.structure.backwards else None
        companions, notes, refused = plan_imported_fill_limits(self.pending_edits(), self.display)
        if refused is None:
            self.written_together("AMP232", companions, notes, node)
            return False
        rule = self.rules.hazards[HazardKind.MASKED_FILL]
        shown = ", ".join(overflows[:3]) + (f" and {len(overflows) - 3} more" if len(overflows) > 3 else "")
        self.warn(
            rule.code,
            f"the model code this file imports has {shown}: the constant overflows float16 and masked_fill raises "
            f"once the forward pass runs in float16; ampify did not rewrite it: {refused}; the training steps of "
            "this file were left unconverted",
            node,
        )
        return True

    def _stdlib_tree(self):
        """The stdlib `ast` tree of this file's source: the screen's (UnitContext.tree), else parsed
        once here; None when it does not parse."""
        if self._tree is None:
            try:
                self._tree = ast.parse(self.source)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self._tree = False
        return self._tree or None

    def _converted_tree(self, finds) -> Optional[ast.Module]:
        """The stdlib tree of the module being converted, for a check `finds(tree)`: the file's own
        (the screen's) when the check finds nothing there; else the converted module's, which
        normalize.py may have fixed (float32 clamps, decorated Functions), parsed again only then."""
        tree = self._stdlib_tree()
        if tree is None or not finds(tree):
            return tree
        try:
            return ast.parse(self.structure.module.code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None

    def scaling_is_float16(self) -> bool:
        """Does the converted forward pass run in float16 (native float16, or apex)?"""
        return self.scaling


def _in_model_code(s: TrainingStructure, node: cst.CSTNode) -> bool:
    """Is `node` in a method of a class, or in a module-level function that a method of this
    module calls (code a model's forward may run)? The same test repository.py applies to the
    modules a training file imports."""
    scope = s.scope_of(node)
    if not isinstance(scope, cst.FunctionDef):
        return False
    if s.class_of(scope) is not None:
        return True
    name = scope.name.value
    for other in s.name_nodes.get(name, []):
        call = s.parent(other)
        if isinstance(call, cst.Call) and call.func is other:
            caller = s.scope_of(call)
            if isinstance(caller, cst.FunctionDef) and s.class_of(caller) is not None:
                return True
    return False


def _in_optimizer_class(s: TrainingStructure, scope) -> bool:
    """Is `scope` a method of a class of this module with an optimizer base (SAM, Lookahead)?"""
    klass = s.class_of(scope)
    if klass is None:
        return False
    return any("Optimizer" in (s.imports.resolve(base.value) or dotted_name(base.value) or "") for base in klass.bases)


def _message_fields(s: TrainingStructure, hazard: Hazard, sigmoids: List[Hazard], has_training: bool,
                    float16: bool = True) -> dict:
    detail = hazard.detail
    short = short_text(detail)
    hint = ""
    if len(sigmoids) == 1:
        hint = f" (the model ends in nn.Sigmoid at line {s.line(sigmoids[0].node)}: drop it and feed logits)"
    elif sigmoids:
        lines = sorted({s.line(sigmoid.node) for sigmoid in sigmoids})
        shown = ", ".join(map(str, lines[:-1])) + f" and {lines[-1]}" if len(lines) > 1 else str(lines[0])
        hint = (f" (nn.Sigmoid at lines {shown}: drop the one that ends the model feeding this loss and feed it "
                "logits)" if len(lines) > 1 else f" (the model ends in nn.Sigmoid at line {shown}: drop it and feed logits)")
    return {
        "detail": detail,
        "short_detail": short or "this call",
        "last_name": detail.rsplit(".", 1)[-1],
        "sigmoid_hint": hint,
        "left_unconverted": "; the training steps of this file were left unconverted" if has_training else "",
        # a sigmoid's output under autocast (log_of_sigmoid.py): float16 has 11 bits next to 1 and
        # underflows below 6e-8; bfloat16 has 8 bits next to 1 and float32's range
        "dtype": "float16" if float16 else "bfloat16",
        "saturates": "about 8.4 (and to 0 below about -17.4)" if float16 else "about 6.3",
        "consequence": ("the loss is inf and GradScaler skips every step while the model is confident" if float16
                        else "the loss and its gradients are far off while the model is confident"),
    }


def _called_name(value: Optional[cst.BaseExpression]) -> Optional[str]:
    """`NLLLoss` of `NLLLoss(...)` / `losses.NLLLoss(...)`."""
    if isinstance(value, cst.Call):
        func = value.func
        return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
    return None


def _alias_or_instance(binding, loss_classes) -> bool:
    """A binding that gives a name no computed tensor: a parameter, `loss = self.loss` /
    `loss = criterion`, or an instance of one of `loss_classes`."""
    if binding.kind == "parameter":
        return True
    if binding.kind != "assign":
        return False
    value = binding.value
    if isinstance(value, (cst.Name, cst.Attribute)):
        return True
    return _called_name(value) in loss_classes


def _closures_passed_to_step(structure) -> Set[str]:
    """Names of the functions handed to `optimizer.step(closure)` in the file."""
    found: Set[str] = set()
    for hazard in structure.hazards:
        if hazard.kind is HazardKind.CLOSURE and isinstance(hazard.node, cst.Call):
            for arg in hazard.node.args:
                if isinstance(arg.value, cst.Name) and (arg.keyword is None or arg.keyword.value == "closure"):
                    found.add(arg.value.value)
    return found


def _runs_in(structure, node: cst.CSTNode, functions: Set[str]) -> bool:
    """Is node inside a function named in `functions`?"""
    scope = structure.scope_of(node)
    return isinstance(scope, cst.FunctionDef) and scope.name.value in functions


class _PendingEdits:
    """The project whose modules read as this change set has edited them so far: a second rewrite
    of one module is made on top of the first."""

    def __init__(self, project, companions: List[CompanionChange]) -> None:
        self._project = project
        self._companions = companions

    def source_of(self, key: str) -> Optional[bytes]:
        edited = next((c.new for c in reversed(self._companions) if c.key == key), None)
        return edited if edited is not None else self._project.source_of(key)

    def __getattr__(self, name: str):
        return getattr(self._project, name)
