"""Add torch.autocast and torch.amp.GradScaler to PyTorch training steps.

The analysis (what is an optimizer, which loop is a training iteration, where the loss is
computed) lives in `torch/training_loop.py`; this module decides, per training unit, whether it
can be converted safely, and then writes:

- `scaler = torch.amp.GradScaler(<device>)` once per training setup, after the optimizer(s);
- `with torch.autocast(device_type=<device>, dtype=<dtype>):` around forward pass + loss;
- `scaler.scale(loss).backward(...)`, `scaler.step(optimizer)`, one `scaler.update()` after
  the last step of the iteration, `scaler.unscale_(optimizer)` before gradient clipping;
- the scaler's state next to the optimizer's in checkpoints.

With `--dtype bfloat16` only the autocast regions are written: bfloat16 needs no loss scaling.
Whatever cannot be placed safely is left unconverted with a WARNING finding.
"""

from __future__ import annotations

from dataclasses import replace

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.kit.line_map import LineMap
from ampify.transforms.base import CompanionChange, Transform, TransformResult, UnitContext, Verdict
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.torch import screen as torch_screen
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.inplace_matmuls import MARKERS as INPLACE_MARKERS
from ampify.transforms.torch.checkpoints import CheckpointWriter
from ampify.transforms.torch.device_choice import DeviceChoice
from ampify.transforms.torch.driver import BackendRules, HazardRule, TorchConversion
from ampify.transforms.torch.edits import StatementEdits, apply_edits
from ampify.transforms.torch.framework_switches import (
    CONSTRUCTOR_NAMES,
    describe,
    framework_switch_sites,
    may_use_a_framework_switch,
    switch_keyword,
)
from ampify.transforms.torch.gradient_penalty import (
    PenaltySite,
    penalties_of_other_modules,
    state_fed_back,
    state_kept_across_steps,
    penalty_sites,
    sites_of_unit,
    unreached_penalties,
    where_penalty,
    write_penalty,
)
from ampify.transforms.torch.helper_backwards import (
    StepFedElsewhere, backward_for_its_hooks, call_of_unfollowed_backward, describe_step_fed_elsewhere,
    steps_fed_elsewhere, unknown_step_after_backward, pair_helper_backwards,
)
from ampify.transforms.torch.autocast_regions import AutocastPlanner
from ampify.transforms.torch.loss_objects import (
    BackwardToScale, LossObjectUse, backward_to_scale, find_loss_object, is_this_module, loss_class_of_backward,
    loss_receiver,
    scale_loss_object_backward, write_scaled_backward,
)
from ampify.transforms.torch.manual_updates import (
    backwards_of, gradients_reduced_by_hand, manual_update_beside_steps, manual_update_units,
)
from ampify.transforms.torch.normalize import converted_in_shape
from ampify.transforms.torch.wrapper_steps import (
    WrapperEditRefused,
    plan_wrapper_edit,
    project_wrapper_steps,
    refusal_for_ambiguous_step,
    wrapper_call,
)
from ampify.transforms.torch.scaler_calls import ScalerCallPlanner
from ampify.transforms.torch.torch_import import add_import_torch, last_leading_import, module_level_aliases
from ampify.transforms.torch.float32_losses import float32_only_loss_calls
from ampify.transforms.torch.scaler_placement import DISABLED_SCALER, NO_OPTIMIZER, ScalerHome, ScalerPlacement, UnitPlan
from ampify.transforms.torch.training_loop import (
    flat_parameter_fsdp_wraps,
    HazardKind,
    Scope,
    StepCall,
    TrainingStructure,
    TrainingUnit,
    Unconvertible,
    analyze_training,
    concerns_torch,
    is_main_guard,
    may_concern_torch_training,
)

# The codes this transform emits and what each means: ampify/rules.py (AMP2xx).

NATIVE_RULES = BackendRules(
    no_torch_import="AMP221",
    mixed_precision_outside_step=(
        "AMP218",
        "this file uses mixed precision (line {line}) but not around this training step: its forward pass may "
        "still run in float32; nothing converted because the file already uses torch.amp: put the training "
        "step under torch.autocast (and GradScaler) by hand",
    ),
    steps_without_backward=(
        "AMP219",
        "{receiver}.step() but no backward() in this file: the backward pass runs elsewhere (a helper in "
        "another module?); nothing converted here, convert that training step by hand",
    ),
    unpaired_backward=(
        "AMP220",
        "backward() here has no optimizer step in the same loop or function that ampify can identify "
        "(wrapped or hidden optimizer?){followed}; this backward is not converted: add autocast, "
        "scaler.scale(loss).backward() and scaler.step()/update() by hand",
    ),
    unit_refused=("AMP215", "{problem}; this training step was left unconverted"),
    training_elsewhere=(
        "AMP237",
        "{function}() ({where}) runs the training step with {optimizer}, created here at line {line}, and {module} "
        "is not in this run: the GradScaler is created here and passed to the step there, one change set for both "
        "files; run ampify on both files or on the repository",
        "{function}() ({where}) runs the training step with {optimizer}, created here at line {line}, and {module} "
        "is not in this run: that class's step is where the conversion goes (this file needs no change); run ampify "
        "on {module} or on the repository",
    ),
    library_loop=(
        "AMP255",
        "{callee}() runs the training loop with {optimizer}: the forward pass, backward() and the optimizer step "
        "are in {package}, which ampify does not rewrite; nothing converted: turn on {package}'s own mixed "
        "precision option if it has one, or write the loop out in this file and run ampify again",
    ),
    penalty_method=(
        "AMP257",
        "this step builds a class of another module that takes a gradient penalty in a method ({found}): under "
        "float16 autocast its torch.autograd.grad runs on unscaled float16 gradients, and small ones flush to zero; "
        "ampify threads the GradScaler into penalty functions, not into methods of another module's classes; the "
        "training steps of this file were left unconverted: scale the penalty's outputs by hand "
        "(torch.autograd.grad(scaler.scale(out), ...), then divide by scaler.get_scale()), or use --dtype bfloat16",
    ),
    blocked_reason="mixed precision would break this file; see the warnings",
    float32_probability_clamp="AMP246",
    float32_sigmoid="AMP256",
    inplace_products="AMP249",
    inplace_products_left="AMP250",
    imported_bce="AMP251",
    imported_bce_left="AMP252",
    trains_when_called="AMP253",
    float32_autograd_function="AMP247",
    float32_gram_matrix="AMP245",
    hazards={
        HazardKind.BCE: HazardRule(
            "AMP210",
            "{last_name} raises under CUDA autocast: use nn.BCEWithLogitsLoss "
            "(F.binary_cross_entropy_with_logits) on logits{sigmoid_hint}; the training steps of this file "
            "were left unconverted, rerun ampify after the change",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.CLOSURE: HazardRule(
            "AMP211",
            "{detail}.step(closure): GradScaler does not support closures (LBFGS and friends); this training "
            "step was left unconverted: scale the loss inside the closure by hand or keep fp32",
            in_training_only=True,
        ),
        HazardKind.CREATE_GRAPH: HazardRule(
            "AMP212",
            "torch.autograd.grad(..., create_graph=True) (gradient penalty) needs manual scaling with float16: "
            "compute it from scaler.scale(outputs) and divide the gradients by scaler.get_scale() (see the "
            "PyTorch AMP examples); this file was left unconverted (or use --dtype bfloat16)",
            blocks_file=True, float16_only=True, in_training_only=True,
        ),
        HazardKind.AUTOGRAD_GRAD: HazardRule(
            "AMP212",
            "torch.autograd.grad here differentiates a loss of the training step (a MAML inner loop, adversarial "
            "examples) that the GradScaler never scales: its float16 gradients can underflow; ampify scales it when "
            "the gradients are assigned (`g = torch.autograd.grad(loss, x)[0]`, `grads = torch.autograd.grad(loss, "
            "params)`), which it could not follow here: compute it from scaler.scale(loss) and divide the gradients "
            "by scaler.get_scale() by hand; this file was left unconverted (or use --dtype bfloat16)",
            blocks_file=True, float16_only=True, in_training_only=True,
        ),
        HazardKind.MASKED_FILL: HazardRule(
            "AMP213",
            "masked_fill with {detail} overflows float16 under autocast: use torch.finfo(scores.dtype).min "
            "instead{left_unconverted}",
            blocks_file=True, float16_only=True,
        ),
        HazardKind.GRAM_MATRIX: HazardRule(
            "AMP238",
            "{detail}: a Gram matrix (features times their own transpose) sums h*w products, beyond float16's 65504 "
            "under autocast: the loss is inf and GradScaler skips every step; compute it in float32 (under "
            "`torch.autocast(..., enabled=False)`, on `.float()` features){left_unconverted} (or use --dtype bfloat16)",
            blocks_file=True, float16_only=True, in_training_only=True,
        ),
        HazardKind.AUTOGRAD_FUNCTION: HazardRule(
            "AMP241",
            "{detail}: autocast casts the ops a custom autograd Function's forward() runs, but not its backward() "
            "nor compiled code; decorate its forward() with `@torch.amp.custom_fwd(device_type=\"cuda\", "
            "cast_inputs=torch.float32)` and its backward() with `@torch.amp.custom_bwd(device_type=\"cuda\")` "
            "(it then runs in float32){refused}; the training steps of this file were left unconverted",
            blocks_file=True, in_training_only=True,
            file_reason="a custom autograd Function breaks under autocast; see the warning",
        ),
        HazardKind.GRADIENT_DROPPED: HazardRule(
            "AMP242",
            "{detail}; GradScaler scales the loss and needs every backward() to multiply by the gradient it "
            "receives: multiply the returned gradient by it (`return ctx.grads * grad_output, None, ...`), or "
            "use --dtype bfloat16 (no loss scaling); the training steps of this file were left unconverted",
            blocks_file=True, float16_only=True, in_training_only=True,
            file_reason="a custom autograd Function drops the loss scale; see the warning",
        ),
        HazardKind.GRADIENT_DROPPING_BINDING: HazardRule(
            "AMP243",
            "{detail}: GradScaler scales the loss and needs every backward() to multiply by the gradient it "
            "receives; a build whose backward() returns the gradient its forward() computed leaves the model's "
            "gradients unscaled, and the scaler then divides them by the scale, silently: check that yours "
            "multiplies by grad_output, or use torch.nn.CTCLoss (on log_softmax outputs) or --dtype bfloat16",
            float16_only=True, in_training_only=True,
        ),
        HazardKind.PROBABILITY_CLAMP: HazardRule(
            "AMP244",
            "{detail}: under autocast the probability arrives in {dtype} and the clamp keeps that dtype, where "
            "its upper bound rounds to 1: a confident output stays 1, `log(1 - p)` is -inf and `0 * -inf` NaN, "
            "so the loss is inf or NaN ({consequence}); clamp a float32 copy (`torch.clamp(p.float(), ...)`) "
            "there{refused}; the training steps of this file were left unconverted",
            blocks_file=True, in_training_only=True,
            file_reason="a probability clamp rounds to 1 in reduced precision; see the warning",
        ),
        HazardKind.LOG_OF_PROBABILITY: HazardRule(
            "AMP229",
            "{detail}: the log of a sigmoid's probability, written out; under autocast the sigmoid runs in "
            "{dtype}, where the probability rounds to 1 (1 - p is 0) once the logit passes {saturates}: the log "
            "is -inf (or the log of a tiny epsilon), {consequence}, silently; end the model on logits and use "
            "F.logsigmoid (log(1 - p) is F.logsigmoid(-logits)) or BCEWithLogitsLoss, or add an epsilon of 1e-4 "
            "or more{left_unconverted}",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.WRAPPER_CLASS: HazardRule(
            "AMP214",
            "class {detail} wraps an optimizer in its own step(): ampify does not convert steps through it; "
            "call scaler.step(inner_optimizer) and scaler.update() inside its step() by hand",
            in_training_only=True,
        ),
        HazardKind.UNSEEN_WRAPPER: HazardRule(
            "AMP239",
            "{detail}: the name stepped may be a wrapper rather than the optimizer it was given (a class with a "
            "step() of its own, horovod's DistributedOptimizer); scaler.step() needs the optimizer itself, and would "
            "skip what a wrapper's step() does or race horovod's allreduce; its steps were left unconverted: run "
            "ampify where that code can be read, or convert by hand",
            in_training_only=True,
        ),
        HazardKind.HOROVOD: HazardRule(
            "AMP240",
            "{detail}: horovod averages the gradients asynchronously until its step(), so the GradScaler may unscale "
            "them only after optimizer.synchronize(), which a plain optimizer does not have; ampify writes horovod's "
            "recipe only for an optimizer it sees wrapped on every path to the step; its steps were left unconverted: "
            "write the recipe by hand (optimizer.synchronize(), then `with optimizer.skip_synchronize(): "
            "scaler.step(optimizer)`)",
            float16_only=True, in_training_only=True,
        ),
        HazardKind.MANUAL_HALF: HazardRule(
            "AMP217",
            "{detail}: this script casts to half precision by hand; autocast and GradScaler expect float32 "
            "weights (GradScaler refuses float16 gradients). Remove the manual casts and rerun ampify; the "
            "training steps of this file were left unconverted",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.FSDP: HazardRule(
            "AMP222",
            "the model is wrapped in FullyShardedDataParallel: float16 loss scaling needs "
            "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler (a plain GradScaler lets ranks "
            "disagree on skipped steps); this file was left unconverted: use --dtype bfloat16, or FSDP's "
            "MixedPrecision policy with a ShardedGradScaler by hand",
            blocks_file=True, float16_only=True, in_training_only=True,
        ),
        HazardKind.DIFFERENTIAL_PRIVACY: HazardRule(
            "AMP227",
            "{detail}: Opacus clips and noises per-sample gradients in its optimizer, and GradScaler would scale "
            "them (the clipping bound and the privacy accounting would be wrong); this file was left "
            "unconverted: convert by hand with Opacus's own mixed precision support (bfloat16, "
            "grad_sample_mode 'hooks' or 'ghost', Opacus 1.5.4 or later)",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.DISTRIBUTED_AUTOGRAD: HazardRule(
            "AMP234",
            "{detail}(...): RPC training, whose gradients stay in a distributed autograd context that a "
            "DistributedOptimizer steps (GradScaler can only unscale a local optimizer's .grad) and whose forward "
            "pass runs partly on remote workers, where a local torch.autocast does not reach; this file was left "
            "unconverted",
            blocks_file=True, in_training_only=True,
            file_reason="RPC training (distributed autograd); see the warning",
        ),
        HazardKind.AUTOGRAD_BACKWARD: HazardRule(
            "AMP223",
            "torch.autograd.backward(...) is not converted: scale the tensors with scaler.scale(...) by hand",
        ),
    },
)


class TorchNativeAmp(Transform):
    name = "torch-native-amp"
    internal_error_code = "AMP200"
    description = "Add torch.autocast and torch.amp.GradScaler to PyTorch training steps."

    def may_apply(self, source: bytes, options: Options) -> bool:
        return options.backend == "native" and (may_concern_torch_training(source) or may_use_a_framework_switch(source))

    screened_out_reason = torch_screen.SCREENED_OUT_REASON

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        return torch_screen.may_concern_torch_training_code(facts) or bool(facts.call_names & CONSTRUCTOR_NAMES)

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return options.backend == "native" and concerns_torch(imports)

    def apply(
        self, module: cst.Module, imports: ImportMap, options: Options, context: UnitContext = UnitContext()
    ) -> TransformResult:
        def convert(shaped: cst.Module) -> TransformResult:
            classes = context.project.project_class if context.project is not None else None
            models = context.project.probability_models if context.project is not None else None
            structure = analyze_training(shaped, imports, project_class=classes, probability_models=models)
            wrappers = project_wrapper_steps(structure, shaped, context.project)
            if wrappers:  # `optimizer.step_and_update_lr()` of the project's ScheduledOptim
                structure = analyze_training(shaped, imports, wrappers, classes, models)
            pair_helper_backwards(structure)
            return NativeConversion(structure, imports, options, context).run()

        # in-place matrix products of the file's own model code: looked for only when its bytes name one
        products = not context.source or any(marker in context.source for marker in INPLACE_MARKERS)
        return converted_in_shape(module, convert, imports, context, "AMP249" if products else "")


class NativeConversion(TorchConversion):
    """One module's native conversion: autocast regions, scaler calls, scaler homes, checkpoints.
    The shared checks are TorchConversion's; where the scaler lives is ScalerPlacement's, which
    device it names is DeviceChoice's."""

    rules = NATIVE_RULES

    def __init__(
        self, structure: TrainingStructure, imports: ImportMap, options: Options, context: UnitContext = UnitContext()
    ) -> None:
        super().__init__(structure, options, context)
        self.imports = imports
        self.module = structure.module
        self.torch = self._torch_name()
        self.edits = StatementEdits()
        self.regions = AutocastPlanner(structure, imports, context.project)
        self.scaler_calls = ScalerCallPlanner(
            structure, imports,
            context.project.touches_gradients if context.project is not None else (lambda dotted: False))
        self.devices = DeviceChoice(structure, self.torch, self, self.project)
        self.scaler_name = "scaler"
        self.placement = ScalerPlacement(structure, self.scaler_name, context.project, context.display)
        #: the device expression each created GradScaler got, by the statement it follows
        self.scaler_devices: Dict[int, str] = {}
        #: gradient penalties that can be scaled, by id of their autograd.grad call (float16 only)
        self.penalties: Optional[Dict[int, PenaltySite]] = None
        #: ids of calls of penalty functions of other modules that get the scaler
        self.foreign_penalty_calls: Set[int] = set()
        #: module key -> the change scaling its penalty functions, all those this file's steps call
        #: (two functions of one module, BasicSR's r1_penalty and g_path_regularize, are one change)
        self.penalty_modules: Dict[str, CompanionChange] = {}
        #: modules of other files already edited for a unit of this module (one edit per module)
        self.companion_keys: Set[str] = set()
        #: the edit of each wrapper class module a step goes through, by module key
        self.wrapper_edits: Dict[str, CompanionChange] = {}
        #: ids of backward() calls already rewritten (a helper's backward is reached from several units)
        self.scaled_backwards: Set[int] = set()
        #: loss classes of this file whose backward() takes the scaler (loss_objects.py), by name
        self.loss_backwards_here: Dict[str, BackwardToScale] = {}
        #: `from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler` planned
        self.sharded_import_added = False

    # ---- the driver's steps -------------------------------------------------------------------

    def framework_switch(self) -> Optional[TransformResult]:
        """Accelerate, Lightning or the Hugging Face Trainer own the loop: set their switch."""
        sites = framework_switch_sites(self.module, self.imports)
        if not sites:
            return None
        private = next((h for h in self.structure.hazards if h.kind is HazardKind.DIFFERENTIAL_PRIVACY), None)
        if private is not None and any(site.action == "set" for site in sites):
            # the framework's own GradScaler would scale Opacus's per-sample gradients just the same
            rule = self.rules.hazards[HazardKind.DIFFERENTIAL_PRIVACY]
            self.warn(rule.code, rule.message.format(detail=private.detail), private.node)
            return self.result(Verdict.UNCONVERTED, "Opacus (DP-SGD) training; see the warning")
        for site in sites:
            if site.action == "set":
                keyword, value = switch_keyword(site, self.options.dtype)
                self.edits.add_keyword(site.call, keyword, value)
                self.info("AMP209", describe(site, keyword, value), site.call)
            elif site.action == "unknown":
                self.warn("AMP225", describe(site), site.call)
        if any(site.action == "set" for site in sites):
            return self.result(Verdict.CONVERTED, module=apply_edits(self.module, self.edits))
        if any(site.action == "unknown" for site in sites):
            return self.result(Verdict.UNCONVERTED, "the framework's precision may be set in **kwargs; see the warning")
        kept = sites[0]
        if _turns_precision_off(kept.existing):
            return self.result(Verdict.NOT_APPLICABLE, describe(kept) + " (float32, by the script's choice)")
        return self.result(Verdict.ALREADY_MIXED_PRECISION, describe(kept))

    def claimed_hazards(self) -> Set[int]:
        """Gradient penalties this backend scales (see gradient_penalty.py), and FSDP wraps (the
        scalers of this file become ShardedGradScaler), with float16 only."""
        if not self.scaling:
            return set()
        if self.penalties is None:
            self.penalties = penalty_sites(self.structure, self.structure.fresh_name("scaler", "grad_scaler", "amp_scaler"),
                                           kinds=(HazardKind.CREATE_GRAPH, HazardKind.AUTOGRAD_GRAD))
        parameter = self.structure.fresh_name("scaler", "grad_scaler", "amp_scaler")
        threaded = set(self.penalties) - unreached_penalties(self.structure, self.penalties, parameter)
        return threaded | {id(wrap.node) for wrap in self._fsdp_wraps()}

    def _fsdp_wraps(self):
        """FullyShardedDataParallel wraps of this file (FSDP1): its GradScalers must be ShardedGradScaler."""
        return flat_parameter_fsdp_wraps(self.structure)

    def plan_manual_updates(self):
        """Parameters updated by hand: autocast only with bfloat16; float16 is refused (AMP226)."""
        units = manual_update_units(self.structure)
        plans = []
        for unit in backwards_of(units):
            node = unit.backwards[0].call
            if self.scaling:
                self.warn(
                    "AMP226",
                    "the parameters are updated by hand after this backward() (no optimizer): GradScaler needs an "
                    "optimizer to step, so float16 loss scaling cannot be added; use --dtype bfloat16 (no loss "
                    "scaling needed: ampify then puts the forward pass under autocast), or use a torch.optim optimizer",
                    node,
                )
                continue
            try:
                plans.append(UnitPlan(unit, self.scaler_name, self.regions.autocast_regions(unit)))
            except Unconvertible as problem:
                self.warn("AMP215", f"{problem}; this training step was left unconverted", problem.node or node)
        return plans, set(units)

    def prepare(self) -> None:
        self.scaler_name = self.structure.fresh_name("scaler", "grad_scaler", "amp_scaler")
        self.placement.scaler_name = self.scaler_name

    def snapshot(self):
        return dict(self.placement.homes), set(self.companion_keys), dict(self.wrapper_edits)

    def restore(self, state) -> None:
        self.placement.homes, self.companion_keys, self.wrapper_edits = state

    def write(self, plans: List[UnitPlan]) -> cst.Module:
        for plan in plans:
            self._write_unit(plan)
        if self.scaling:
            converted = {r for p in plans for r in p.unit.optimizers}
            converted |= {r for home in self.placement.homes.values() for r in home.optimizers}
            CheckpointWriter(
                self.structure, self.imports, self.edits, self.torch,
                lambda scope, line: self._scaler_reference_in(scope, line, plans),
                self.info, self.warn,
            ).write(converted)
        new_module = apply_edits(self.module, self.edits)
        if self.torch_import_needed:
            new_module = add_import_torch(new_module)
            if self.torch_evidence is not None:
                self.info("AMP235", f"added `import torch`: this file trains without importing it, and the objects it "
                                    f"trains come from {self.torch_evidence}, which imports torch", None)
        return new_module

    # ---- torch name and imports -------------------------------------------------------

    def _torch_name(self) -> str:
        """The module-level name bound to `torch`; "torch" (to be imported) when there is none.
        An `import torch` inside a function does not count: the new code may run elsewhere."""
        local = sorted(module_level_aliases(self.module, "torch"))
        self.torch_import_needed = not local
        if "torch" in local or not local:
            return "torch"
        return local[0]

    # ---- planning ---------------------------------------------------------------------

    def plan_unit(self, unit: TrainingUnit) -> UnitPlan:
        if not unit.steps:
            raise Unconvertible("no optimizer step in this training step")
        steps = list(unit.steps)
        try:
            return self._plan_unit(unit)
        except Unconvertible:
            unit.steps[:] = steps  # a step fed elsewhere is left out of a plan only
            raise

    def _plan_unit(self, unit: TrainingUnit) -> UnitPlan:
        fed = steps_fed_elsewhere(self.structure, unit) if self.scaling else []
        if fed:
            unit.steps[:] = [step for step in unit.steps if not any(f.step is step for f in fed)]
            if not unit.steps:
                raise Unconvertible(describe_step_fed_elsewhere(self.structure, fed[0]) + ": GradScaler would unscale "
                                    "them by the loss scale, and no step of this training step is fed by its "
                                    "backward(); convert by hand", fed[0].step.call, code="AMP215")
        loss_objects = self._loss_objects_of(unit)
        unfollowed = (call_of_unfollowed_backward(self.structure, unit) or backward_for_its_hooks(self.structure, unit)
                      or unknown_step_after_backward(self.structure, unit)
                      or self.loss_object_backward(unit) or gradients_reduced_by_hand(self.structure, unit))
        if unfollowed is not None:
            raise Unconvertible(*unfollowed)
        for step in unit.steps:
            if step.has_closure:
                raise Unconvertible(f"{step.receiver}.step(closure) cannot go through GradScaler", step.call)
            if self.scaling and self._horovod_wrap(step) is not None and not isinstance(step.statement, cst.SimpleStatementLine):
                raise Unconvertible(f"{step.receiver}.step() of horovod's DistributedOptimizer is part of a larger "
                                    "statement: it cannot be put under optimizer.skip_synchronize()", step.call)
            if step.wrapper is not None and step.wrapper.ambiguous:
                raise Unconvertible(refusal_for_ambiguous_step(step.wrapper, step.receiver or ""), step.call)
        by_hand = manual_update_beside_steps(self.structure, unit) if self.scaling else None
        if by_hand is not None:
            raise Unconvertible(
                f"the parameters are also updated by hand after this backward() (line {self.structure.line(by_hand)}, "
                "when the optimizer does not step): that update would get scaled gradients, and GradScaler can only "
                "unscale an optimizer's; use --dtype bfloat16 (no loss scaling: ampify then puts the forward pass "
                "under autocast), or step a torch.optim optimizer in every branch",
                unit.backwards[0].call, code="AMP226",
            )
        regions = self.regions.autocast_regions(unit)
        self._leave_steps_fed_elsewhere(fed, regions)
        plan = UnitPlan(unit, self.scaler_name, regions)
        plan.loss_objects = [(use, self._scale_loss_object_elsewhere(use)) for use in loss_objects]
        if not self.scaling:
            return plan
        foreign = penalties_of_other_modules(
            self.project, [statement for block, start, end in regions for statement in list(block.body)[start:end + 1]])
        self._refuse_state_fed_back(unit, [call for call, _, _ in foreign])
        for elsewhere in foreign:
            plan.foreign_penalties.append(self._scale_penalty_elsewhere(*elsewhere))
        plan.update_after = self.scaler_calls.update_anchor(unit)
        plan.early_exit_updates = list(self.scaler_calls.early_exit_updates.get(id(unit), []))
        plan.restep_updates = list(self.scaler_calls.restep_updates.get(id(unit), []))
        plan.unscale_before = self.scaler_calls.unscale_points(unit)
        self._plan_wrapper_edits(plan)
        self.placement.place(plan)
        if plan.companions:
            for caller in plan.companions:
                if caller.change.key in self.companion_keys:
                    raise Unconvertible(
                        f"{caller.change.display} already creates a GradScaler for another step of this module; "
                        "pass one scaler to both by hand", unit.steps[0].call,
                    )
                self.companion_keys.add(caller.change.key)
            self._agree_on_device_across_files(plan)
        wraps = self._fsdp_wraps()
        if wraps and plan.companions:
            raise Unconvertible(
                f"the model is wrapped in FullyShardedDataParallel (line {self.structure.line(wraps[0].node)}) and the "
                f"GradScaler would be created in {plan.companions[0].change.display}: float16 loss scaling needs a "
                "ShardedGradScaler there (a plain GradScaler lets ranks disagree on skipped steps); use --dtype bfloat16, "
                "or create a ShardedGradScaler there by hand",
                unit.steps[0].call, code="AMP222",
            )
        delegated = [b for b in unit.backwards if b.delegation is not None]
        if delegated and not plan.reference.startswith("self."):
            helper = delegated[0].delegation.helpers[-1].name.value
            raise Unconvertible(
                f"backward() runs in the method {helper}(), but the optimizers are not attributes of self, "
                "so the method could not reach the GradScaler",
                delegated[0].call,
            )
        return plan

    def _plan_wrapper_edits(self, plan: UnitPlan) -> None:
        """Steps through a wrapper class of the project: its stepping method takes the scaler, in
        its own module (one change set with this file); clipping here unscales the optimizer
        inside the wrapper."""
        wrapped = {step.receiver: step.wrapper for step in plan.unit.steps if step.wrapper is not None}
        if not wrapped:
            return
        for receiver, use in wrapped.items():
            if use.key in self.wrapper_edits or use.step.takes_scaler:
                continue  # planned for another step, or converted before: it takes the scaler already
            if self.project is None or self.project.is_this_module(use.key):
                raise Unconvertible(f"{use.described} is defined in this file: ampify threads the scaler into wrapper "
                                    "classes of other modules only; convert by hand")
            if not self.project.in_this_run(use.key):
                raise Unconvertible(f"{use.described} must take the GradScaler, and {use.display} is not in this run: "
                                    "run ampify on both files or on the repository")
            if use.key in self.companion_keys:
                raise Unconvertible(f"{use.display} is already changed for another step of this module; convert by hand")
            source = self.project.source_of(use.key)
            if source is None:
                raise Unconvertible(f"{use.display} cannot be read")
            try:
                edit = plan_wrapper_edit(use, source, self.display)
            except WrapperEditRefused as refused:
                raise Unconvertible(str(refused)) from None
            if edit is not None:
                self.wrapper_edits[use.key] = edit
                self.companion_keys.add(use.key)
        unscaled = []
        for clip_statement, receiver in plan.unscale_before:
            use = wrapped.get(receiver)
            if use is None:
                unscaled.append((clip_statement, receiver))
            elif use.step.reads_gradients:
                raise Unconvertible(f"gradients are read here and in {use.described} before its step: GradScaler "
                                    "unscales once per step; convert by hand", clip_statement)
            else:
                unscaled.append((clip_statement, f"{receiver}.{use.step.inner}"))
        plan.unscale_before = unscaled

    # ---- writing ----------------------------------------------------------------------

    def _agree_on_device_across_files(self, plan: UnitPlan) -> None:
        """The scaler created in another module names a device there; autocast here names one
        here. When one side sees the script's device and the other none, both use "cuda" (as
        `_one_device_for_unit` does within a file), so they switch on and off together."""
        s = self.structure
        here = [self.devices.expression(self.regions.scope_of_region(block, plan.unit.scope), s.line(block.body[start]))
                for block, start, _ in plan.regions]
        there = [caller.device for caller in plan.companions]
        expressions = here + there
        if all(e is not None for e in expressions) or all(e is None for e in expressions):
            return
        plan.companions = [replan('"cuda"') for replan in plan.replan_companions]
        plan.forced_device = '"cuda"'
        named = sorted({e for e in expressions if e is not None})
        self.warn(
            "AMP216",
            f"the script's device ({named[0]}) is not visible both here and where the GradScaler is created in "
            f"{plan.companions[0].change.display}: \"cuda\" used for both, so they switch on and off together; pass "
            "the device in to train elsewhere",
            plan.unit.steps[0].call,
        )

    def _one_device_for_unit(self, plan: UnitPlan) -> Optional[str]:
        """Autocast and the GradScaler must take the same device: a scaler on the script's device
        with autocast hard-coded to "cuda" keeps scaling on a CPU run while autocast has switched
        itself off. None when every place sees the same expression (each then computes it);
        when one place sees the script's device and another sees none, "cuda" for all of them, with
        a warning naming the expression that was not visible."""
        if plan.forced_device is not None:
            return plan.forced_device
        s = self.structure
        seen = []
        for block, start, _ in plan.regions:
            scope = self.regions.scope_of_region(block, plan.unit.scope)
            seen.append((self.devices.expression(scope, s.line(block.body[start])), block.body[start]))
        if self.scaling:
            homes = [plan.home] if plan.home is not None else plan.caller_homes
            for home in homes:
                created = self.scaler_devices.get(id(home.after))
                seen.append((created or self.devices.expression(home.device_scope, home.line + 1), home.after))
        expressions = {expression for expression, _ in seen}
        if None not in expressions or len(expressions) == 1:
            # Every place names the script's device (`device.type` here, `torch.device(device).type`
            # where it was passed in as a parameter), or none does (all get "cuda").
            return None
        named = sorted(e for e in expressions if e is not None and e != '"cuda"')
        node = next((where for expression, where in seen if expression is None), seen[0][1])
        self.warn(
            "AMP216",
            f"the script's device ({named[0] if named else 'its device expression'}) is not visible everywhere this training step "
            'needs it (autocast and the GradScaler): "cuda" used for both, so they switch on and off together; '
            "pass the device in to train elsewhere",
            node,
        )
        return '"cuda"'

    def _write_unit(self, plan: UnitPlan) -> None:
        s = self.structure
        unit = plan.unit
        dtype = f"{self.torch}.{self.options.dtype}"
        shared_device = self._one_device_for_unit(plan)
        self._cast_float32_only_loss_inputs()
        for block, start, end in plan.regions:
            body = list(block.body)
            first = body[start]
            scope = self.regions.scope_of_region(block, unit.scope)
            device = shared_device or self.devices.device_for(scope, s.line(first), first)
            header = f"with {self.torch}.autocast(device_type={device}, dtype={dtype}):"
            self.edits.wrap(body[start], body[end], header)
            for index in range(start, end + 1):
                self._cast_index_assignments(body[index], unit)
                if self.scaling:
                    self._warn_penalty_helpers(body[index])
            first_line, last_line = s.line(first), s.line(body[end])
            lines = f"line {first_line}" if first_line == last_line else f"lines {first_line}-{last_line}"
            saved = self.regions.saved_forwards.get(id(block))
            if saved is not None:
                self.info(
                    "AMP201",
                    f"forward pass in {saved.scope.name.value}() ({lines}) runs under torch.autocast({device}, "
                    f"{self.options.dtype}): its outputs, kept in {saved.container} (line {s.line(saved.call)}), "
                    f"are what the loss of line {s.line(unit.backwards[0].call)} is computed from",
                    first,
                )
                continue
            caller = self.regions.caller_regions.get(id(block))
            if caller is not None:
                self.info("AMP201", f"forward pass and loss ({lines}) run under torch.autocast({device}, "
                                    f"{self.options.dtype}): the loss is handed to {caller[1].name.value}() (line "
                                    f"{s.line(caller[1])}), which runs its backward() and step", first)
                continue
            fills = any(use.block is block and start <= use.index <= end for use, _ in plan.loss_objects)
            if fills or self._holds_a_loss(unit, body[start:end + 1]):
                self.info("AMP201", f"forward pass and loss ({lines}) run under "
                                    f"torch.autocast({device}, {self.options.dtype})", first)
            else:
                # a block of its own before the one that computes the loss (a model call before an `if`)
                self.info("AMP201", f"forward pass ({lines}) runs under torch.autocast({device}, "
                                    f"{self.options.dtype}); the loss is computed from its outputs further on", first)
        if not self.scaling:
            return
        reference = plan.reference
        for call, change, line in plan.foreign_penalties:
            self.edits.add_keyword(call, "scaler", reference)
            if change is None:
                self.info("AMP230", f"gradient penalty {statements.code_of(call.func)}() (line {line} of its module) "
                                    f"gets scaler={reference}: it scales the outputs it differentiates already", call)
                continue
            change = self.penalty_modules.get(change.key, change)  # every penalty function of that module
            self.companions[:] = [other for other in self.companions if other.key != change.key]
            self.companions.append(change)
            self.info("AMP230", f"gradient penalty {statements.code_of(call.func)}() of {change.display} (line {line}) "
                                f"gets scaler={reference}: it scales the outputs it differentiates and unscales the "
                                "gradients there (written together with this file, as one change set)", call)
        for site in sites_of_unit(s, unit, self.penalties or {}, self.scaler_name):
            write_penalty(self.edits, site, unit, s, reference, self.scaler_name, self.module.config_for_parsing.default_indent)
            where = where_penalty(s, unit, site, self.scaler_name)
            self.info(
                "AMP230",
                f"{'gradient penalty' if site.penalty else 'gradients of a loss of the step'}{where}: "
                f"torch.autograd.grad now differentiates {reference}.scale(...) and "
                f"{site.target} is divided by {reference}.get_scale() (the PyTorch AMP recipe)",
                site.call,
            )
        for use, change in plan.loss_objects:
            self.scaled_backwards.add(id(use.backward.call))
            self.edits.add_keyword(use.backward.call, "scaler", reference)
            here = self.loss_backwards_here.get(use.class_name) if is_this_module(self.project, use.key) else None
            if here is not None and not here.done and id(here.call) not in self.scaled_backwards:
                self.scaled_backwards.add(id(here.call))
                # the method's own parameter, named as the keyword the steps pass
                write_scaled_backward(self.edits, here.method, here.call, "scaler")
                self.info("AMP202", f"{use.class_name}.backward() now backpropagates scaler.scale({use.inner}) when "
                                    "given a scaler (a new `scaler=None` parameter; float32 behaviour for callers that "
                                    "pass none)", here.call)
            if change is not None and all(change.key != other.key for other in self.companions):
                self.companions.append(change)
            self.info("AMP202", f"{use.receiver}.backward(scaler={reference}): {use.class_name}.backward() "
                                f"({use.where}) backpropagates scaler.scale({use.inner}) when given the scaler"
                                + (" (written together with this file, as one change set)" if change is not None else ""),
                      use.backward.call)
        for backward in unit.backwards:
            if backward.delegation is not None:
                # the real backward() runs in a helper method, maybe reached by several calls
                backward = backward.delegation.inner
                if id(backward.call) in self.scaled_backwards:
                    continue
            elif any(use.backward is backward for use, _ in plan.loss_objects):
                continue
            self.scaled_backwards.add(id(backward.call))
            self.edits.replace_call(backward.call, _scaled_backward(backward.call, reference))
            self.info("AMP202", f"{reference}.scale({statements.code_of(backward.loss)}).backward(...)", backward.call)
        for step in unit.steps:
            if step.wrapper is not None:
                method = step.wrapper.step.method
                self.edits.replace_call(step.call, wrapper_call(step.call, reference))
                self.info("AMP203", f"{step.receiver}.{method}() now {step.receiver}.{method}(scaler={reference}): "
                                    f"{step.wrapper.described} steps the optimizer it wraps through the GradScaler",
                          step.call)
                edit = self.wrapper_edits.get(step.wrapper.key)
                if edit is not None and edit not in self.companions:
                    self.companions.append(edit)
                continue
            self.edits.replace_call(step.call, _scaler_call(reference, "step", step.receiver))
            if self._horovod_wrap(step) is not None:
                self._step_under_horovod(step, reference, plan)
                continue
            self.info("AMP203", f"{step.receiver}.step() now {reference}.step({step.receiver})", step.call)
        assert plan.update_after is not None
        self.edits.insert_after(plan.update_after, f"{reference}.update()")
        for exit_statement, where in plan.early_exit_updates:
            if where == "after":
                self.edits.insert_after(exit_statement, f"{reference}.update()")
            else:
                self.edits.insert_before(exit_statement, f"{reference}.update()")
            self.info(
                "AMP203",
                f"{reference}.update() also added {where} line {s.line(exit_statement)}: this branch leaves the "
                "iteration after an optimizer step",
                exit_statement,
            )
        own_branches = id(plan.unit) in self.scaler_calls.own_branch_updates
        for step_statement in plan.restep_updates:
            self.edits.insert_after(step_statement, f"{reference}.update()")
            self.info(
                "AMP203",
                f"{reference}.update() also added after line {s.line(step_statement)}: "
                + ("each optimizer step is conditional, in an `if` of its own with the backward() it steps, so "
                   "each is followed by its update() (one after every step that runs)" if own_branches else
                   "that optimizer is stepped again later in the iteration, and a GradScaler steps an optimizer "
                   "once between update() calls"),
                step_statement,
            )
        for clip_statement, receiver in plan.unscale_before:
            iterable = self.scaler_calls.unscale_loops.get(id(clip_statement))
            if iterable is not None:
                # the optimizers are stepped by a later loop over them: each is unscaled first
                self.edits.insert_before(clip_statement, f"for {receiver} in {iterable}:\n    "
                                                         f"{reference}.unscale_({receiver})")
                self.info(
                    "AMP205",
                    f"`for {receiver} in {iterable}: {reference}.unscale_({receiver})` added before line "
                    f"{s.line(clip_statement)}, the gradient clipping before the loop that steps them: each "
                    "optimizer is unscaled once, before the clipping",
                    clip_statement,
                )
                continue
            self.edits.insert_before(clip_statement, f"{reference}.unscale_({receiver})")
            self.info(
                "AMP205",
                f"{reference}.unscale_({receiver}) added before line {s.line(clip_statement)}, which needs "
                "true gradients (gradient clipping or a .grad read)",
                clip_statement,
            )
        homes = [plan.home] if plan.home is not None else plan.caller_homes
        for home in homes:
            self._create_scaler(home, shared_device)
        if plan.threaded_function is not None:
            self.edits.add_parameter(plan.threaded_function, self.scaler_name)
            for relay in plan.relay_functions:
                self.edits.add_parameter(relay, self.scaler_name)
                self.info(
                    "AMP204",
                    f"{relay.name.value}() passes the optimizer on to {plan.threaded_function.name.value}() and now "
                    f"takes the GradScaler too (new required parameter '{self.scaler_name}'), passing it along",
                    relay,
                )
            for call, caller_reference in plan.threaded_calls:
                if caller_reference == DISABLED_SCALER:
                    caller_reference = f"{self.torch}.amp.GradScaler(enabled=False)"
                    idle = next(klass for c, klass in self.placement.idle_optimizers if c is call)
                    what = ("None for the optimizer (it trains nothing)" if idle == NO_OPTIMIZER
                            else f"a {idle}, whose step() does nothing")
                    self.info(
                        "AMP204",
                        f"this call passes {what}: it gets {caller_reference}, which leaves its backward and step "
                        "exactly as they were",
                        call,
                    )
                self.edits.add_keyword(call, self.scaler_name, caller_reference)
            if plan.companions:
                self.companions.extend(caller.change for caller in plan.companions)
                callers = ", ".join(caller.change.display for caller in plan.companions)
                self.info(
                    "AMP208",
                    f"{plan.threaded_function.name.value}() takes the GradScaler as a new required parameter "
                    f"'{self.scaler_name}'; {callers} creates it after the optimizer and passes it in (written "
                    "together with this file, as one change set)",
                    plan.threaded_function,
                )
                return
            name = plan.threaded_function.name.value
            direct = [(c, reference) for c, reference in plan.threaded_calls
                      if reference != DISABLED_SCALER and dotted_name(c.func) in (name, f"self.{name}")]
            passed = ", ".join(sorted({f"{self.scaler_name}={reference}" for _, reference in direct})) \
                or f"{self.scaler_name}={self.scaler_name}"
            self.info(
                "AMP204",
                f"{plan.threaded_function.name.value}() takes the GradScaler as a new required parameter "
                f"'{self.scaler_name}'; its {len(direct)} call(s) in this file pass it by keyword "
                f"({passed}); calls from other files must pass it too",
                plan.threaded_function,
            )

    @staticmethod
    def _holds_a_loss(unit: TrainingUnit, region: Sequence[cst.CSTNode]) -> bool:
        """Does one of the region's statements bind a name a backward() of the unit is called on?"""
        loss_names: Set[str] = set()
        for backward in unit.backwards:
            real = backward.delegation.inner if backward.delegation is not None else backward
            if real.loss is not None:
                loss_names |= statements.used_names(real.loss) - {"self"}
        return not loss_names or any(statements.assigned_names(statement) & loss_names for statement in region)

    def _leave_steps_fed_elsewhere(self, fed: List[StepFedElsewhere], regions) -> None:
        """Each optimizer step whose gradients another call computes (steps_fed_elsewhere) stays a
        plain step, said (AMP254), when the calls before it run outside the autocast regions (float32,
        as before); Unconvertible (AMP215) when one would run under autocast (an unscaled float16
        backward)."""
        s = self.structure
        inside = [statement for block, start, end in regions for statement in list(block.body)[start:end + 1]]
        for found in fed:
            if any(s.contains(statement, call) for statement in inside for call in found.between):
                raise Unconvertible(describe_step_fed_elsewhere(s, found) + ", and what computes them would run under "
                                    "autocast with no loss scaling; convert by hand", found.step.call, code="AMP215")
            self.warn("AMP254", describe_step_fed_elsewhere(s, found) + ": left a plain step, outside the GradScaler "
                      "(its gradients were never scaled), and what computes them stays float32, outside autocast; "
                      "convert that by hand where it is", found.step.call)

    def _refuse_state_fed_back(self, unit: TrainingUnit, foreign_calls: List[cst.Call]) -> None:
        """Unconvertible (AMP212) when a penalty helper this unit calls (of this file or another
        module) is handed back what it returned: a running statistic of the gradients (StyleGAN2's
        mean path length), which the overflowing first steps of a GradScaler leave non-finite."""
        s = self.structure
        calls = list(foreign_calls)
        for site in sites_of_unit(s, unit, self.penalties or {}, self.scaler_name):
            calls += [call for call in site.helper_calls if s.contains(unit.owner, call)]
            kept = state_kept_across_steps(s, site) if site.penalty else None
            if kept is not None:
                where = f"{site.helper.name.value}()" if site.helper is not None else "this step"
                raise Unconvertible(
                    f"{where} runs a gradient penalty and keeps a running statistic of its gradients in {kept}, "
                    "which it computes with again. With float16 GradScaler overflows its first steps on purpose (it "
                    "skips them), and that statistic would stay non-finite for every later step; use --dtype "
                    "bfloat16 (no loss scaling), or keep a skipped step from updating it and scale the penalty by hand",
                    site.call, code="AMP212")
        for call in calls:
            state = state_fed_back(s, call)
            if state is not None:
                raise Unconvertible(
                    f"{statements.code_of(call.func)}() runs a gradient penalty and hands back {state}, which this step "
                    "passes to it again: a running statistic of the gradients. With float16 GradScaler overflows its "
                    "first steps on purpose (it skips them), and that statistic would stay non-finite for every "
                    "later step; use --dtype bfloat16 (no loss scaling), or keep a skipped step from updating it "
                    "and scale the penalty by hand", call, code="AMP212")

    def _scale_penalty_elsewhere(self, call: cst.Call, called: str, where: str
                                 ) -> Tuple[cst.Call, Optional[CompanionChange], int]:
        """The penalty function of another module the step calls (`gan.gradient_penalty(D, x_real,
        x_fake)`) gets `scaler=None` there (gradient_penalty.scale_penalty_of_module), and the call
        passes the scaler: one change set. Unconvertible (AMP212) with the reason otherwise."""
        from ampify.transforms.torch.gradient_penalty import scale_penalty_of_module

        def refuse(why: str):
            raise Unconvertible(
                f"{called}() runs torch.autograd.grad(..., create_graph=True) ({where}), a gradient penalty, on "
                "outputs computed under autocast: with float16 its gradients need the loss scale (autograd.grad of "
                f"scaler.scale(outputs), divided by scaler.get_scale()), and ampify did not write it there: {why}; "
                "use --dtype bfloat16, or scale it there by hand",
                call, code="AMP212",
            )

        found = self.project.gradient_penalty_function(called)
        if found is None:
            refuse("its function was not found again")
        key, display, function_name = found
        if not self.project.in_this_run(key):
            refuse(f"{display} is not in this run: run ampify on both files or on the repository")
        if any(arg.keyword is not None and arg.keyword.value == "scaler" for arg in call.args):
            refuse("the call already passes scaler=")
        # another edit of that module in this change set (a Gram matrix computed in float32 there,
        # another penalty function): this one is made on top of it
        earlier = self.penalty_modules.get(key) or next((c for c in self.companions if c.key == key), None)
        source = earlier.new if earlier is not None else self.project.source_of(key)
        if source is None:
            refuse(f"{display} cannot be read")
        scaled = scale_penalty_of_module(source, function_name, "scaler")
        if isinstance(scaled, str):
            refuse(scaled)
        new, line = scaled
        self.foreign_penalty_calls.add(id(call))
        if new is None:
            return call, None, line  # scaled already: the call only passes the scaler
        finding = Finding(
            "AMP230",
            f"gradient penalty in {function_name}(): torch.autograd.grad now differentiates scaler.scale(...) when "
            f"given a scaler (a new `scaler=None` parameter; float32 behaviour for callers that pass none), and the "
            f"gradients are divided by scaler.get_scale(); {self.display} passes its scaler",
            line, 0, Severity.INFO)
        if earlier is not None:  # another edit of the same module: one change for both
            # the line of this edit in the module as it is, not in the earlier edit's result
            line = LineMap(earlier.old.decode("utf-8", "replace"), source.decode("utf-8", "replace")).original_line(line)
            finding = replace(finding, line=line)
            change = CompanionChange(
                key=key, display=display, old=earlier.old, new=new,
                findings=sorted([*earlier.findings, finding], key=lambda f: (f.line, f.column, f.code)),
                reason=f"{earlier.reason}; and the gradient penalty {function_name}() scales with the GradScaler it "
                       "is passed")
        else:
            change = CompanionChange(
                key=key, display=display, old=source, new=new, findings=[finding],
                reason=f"changed with {self.display}: the gradient penalty {function_name}() scales with the "
                       "GradScaler it is passed")
        self.penalty_modules[key] = change
        return call, change, line

    def _loss_objects_of(self, unit: TrainingUnit) -> List[LossObjectUse]:
        """The unit's `loss.backward()` calls on loss objects of the project (loss_objects.py):
        their autocast region ends at the last call that fills the object. Unconvertible when the
        step fills an object whose class cannot be told, or whose class is defined in this file."""
        found: List[LossObjectUse] = []
        for backward in unit.backwards:
            if backward.delegation is not None:
                continue
            use = find_loss_object(self.structure, self.project, backward, unit.body)
            if use is None:
                continue
            if isinstance(use, str):
                raise Unconvertible(
                    f"{loss_receiver(backward)}.backward() runs the backward() of a loss class of the project, which "
                    f"ampify cannot convert here: {use}; scale the tensor it backpropagates there by hand (scaler.scale())",
                    backward.call, code="AMP215",
                )
            self.regions.loss_objects[id(backward.call)] = use
            self.converted_loss_objects.add(id(backward.call))
            found.append(use)
        return found

    def _scale_loss_object_elsewhere(self, use: LossObjectUse) -> Optional[CompanionChange]:
        """float16: the loss class's backward() takes the scaler (loss_objects.py), in its own
        module: one change set with this file. None when bfloat16 or when it takes one already."""
        if not self.scaling:
            return None

        def refuse(why: str):
            raise Unconvertible(
                f"{use.receiver}.backward() runs {use.class_name}.backward() ({use.where}), which backpropagates "
                f"{use.inner}: with float16 it must backpropagate scaler.scale({use.inner}), and ampify did not write "
                f"it there: {why}; use --dtype bfloat16, or scale it there by hand",
                use.backward.call, code="AMP215",
            )

        if is_this_module(self.project, use.key):
            found = backward_to_scale(self.module, use.class_name, "scaler")
            if isinstance(found, str):
                refuse(found)
            self.loss_backwards_here[use.class_name] = found
            return None
        if not self.project.in_this_run(use.key):
            refuse(f"{use.display} is not in this run: run ampify on both files or on the repository")
        if any(arg.keyword is not None and arg.keyword.value == "scaler" for arg in use.backward.call.args):
            refuse("the call already passes scaler=")
        source = self.project.source_of(use.key)
        if source is None:
            refuse(f"{use.display} cannot be read")
        scaled = scale_loss_object_backward(source, use.class_name, "scaler")
        if isinstance(scaled, str):
            refuse(scaled)
        new, line = scaled
        if new is None:
            return None
        inner = use.inner
        finding = Finding(
            "AMP202",
            f"{use.class_name}.backward() now backpropagates scaler.scale({inner}) when given a scaler (a new "
            f"`scaler=None` parameter; float32 behaviour for callers that pass none); {self.display} passes its scaler",
            line, 0, Severity.INFO)
        return CompanionChange(
            key=use.key, display=use.display, old=source, new=new, findings=[finding],
            reason=f"changed with {self.display}: the loss class {use.class_name} backpropagates {inner} through the "
                   "GradScaler it is passed")

    def loss_classes_converted_by_callers(self) -> Dict[int, str]:
        found = {}
        for backward in self.structure.unpaired_backwards:
            klass = loss_class_of_backward(self.structure, backward)
            if klass is not None:
                found[id(backward.call)] = klass
        return found

    def loss_object_limit(self) -> str:
        return ("ampify converts such a step only when it fills the object through a method of that class "
                "(`loss.eval_batch(outputs, target)`), which was not seen here")

    def _warn_penalty_helpers(self, statement: cst.CSTNode) -> None:
        """A helper named like a gradient penalty (`compute_gradient_penalty(D, real, fake)`),
        defined elsewhere: if it calls torch.autograd.grad(create_graph=True), float16 loss
        scaling needs it to scale its outputs by hand, which ampify cannot see from here."""
        converted_helpers = {id(c) for site in (self.penalties or {}).values() for c in site.helper_calls}
        converted_helpers |= self.foreign_penalty_calls
        for call in statements.calls_within(statement):
            if id(call) in converted_helpers:
                continue
            func = call.func
            called = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
            if "penalty" in called.lower():
                self.warn(
                    "AMP212",
                    f"{called}() looks like a gradient penalty computed elsewhere: if it uses "
                    "torch.autograd.grad(..., create_graph=True), compute it from scaler.scale(outputs) and divide "
                    "the gradients by scaler.get_scale() (PyTorch AMP examples), or use --dtype bfloat16",
                    call,
                )

    def _cast_float32_only_loss_inputs(self) -> None:
        """A loss of a compiled extension that takes float32 only (float32_losses.py): its
        activations are cast to float32 wherever this file calls it (under autocast, in a helper
        that a step calls, or outside any, where the cast changes nothing)."""
        for call, constructor in float32_only_loss_calls(self.structure, self.structure.module):
            if id(call) in self.edits.float_first_arguments:
                continue
            self.edits.cast_first_argument_to_float(call)
            self.info(
                "AMP201",
                f"the activations passed to {dotted_name(call.func)} are cast to float32: it is (or may be) the "
                f"{constructor}, whose compiled kernel takes float32 only, and under autocast they are "
                f"{self.options.dtype} (a no-op on float32 activations)",
                call,
            )

    def _cast_index_assignments(self, statement: cst.CSTNode, unit: TrainingUnit) -> None:
        """Index assignments of a model output into a float32 tensor, cast back to its dtype
        (see AutocastPlanner.index_assignments_to_cast)."""
        for node, target in self.regions.index_assignments_to_cast(statement, unit.scope):
            self.edits.cast_assigned_value(node, f"{target}.dtype")
            self.info(
                "AMP201",
                f"the value assigned into {target}[...] is cast to {target}.dtype: under autocast it is "
                f"{self.options.dtype}, and index assignment into a float32 tensor needs equal dtypes",
                node,
            )

    def _horovod_wrap(self, step: StepCall) -> Optional[str]:
        """`optimizer = hvd.DistributedOptimizer(...)` when the stepped optimizer is one."""
        optimizer = self.structure.optimizers.get(step.receiver or "")
        return optimizer.horovod if optimizer is not None else None

    def _step_under_horovod(self, step: StepCall, reference: str, plan: UnitPlan) -> None:
        """Horovod's AMP recipe: the allreduce of the gradients runs asynchronously until the
        optimizer's step(), so `optimizer.synchronize()` waits for it before the scaler unscales
        (before the clipping that unscales first, if any), and the step, which would synchronize
        again, runs under `optimizer.skip_synchronize()`. A step already under skip_synchronize()
        follows a synchronize() the script makes itself."""
        s = self.structure
        receiver = step.receiver or ""
        if any(isinstance(a, cst.With) and any(_calls_method(item.item, receiver, "skip_synchronize") for item in a.items)
               for a in s.ancestors(step.call)):
            self.info("AMP203", f"{receiver}.step() now {reference}.step({receiver}), under the script's own "
                                f"{receiver}.skip_synchronize() (horovod's recipe)", step.call)
            return
        unscaled_at = next((clip for clip, clipped in plan.unscale_before if clipped == receiver), None)
        waits_before = unscaled_at if unscaled_at is not None else step.statement
        self.edits.insert_before(waits_before, f"{receiver}.synchronize()")
        self.edits.wrap(step.statement, step.statement, f"with {receiver}.skip_synchronize():")
        self.info("AMP203", f"{receiver}.step() now {reference}.step({receiver}) under {receiver}.skip_synchronize(), "
                            f"after a new {receiver}.synchronize() before line {s.line(waits_before)}: {self._horovod_wrap(step)} "
                            "averages the gradients asynchronously, and the scaler must unscale them once they are "
                            "averaged (horovod's AMP recipe)", step.call)

    def _create_scaler(self, home: ScalerHome, device: Optional[str] = None) -> None:
        key = id(home.after)
        if key in self.edits.created_scalers:
            return
        self.edits.created_scalers.add(key)
        device = device or self.devices.device_for(home.device_scope, home.line + 1, home.after)
        self.scaler_devices[key] = device
        scaler_class = self._scaler_class()
        insert = self.edits.insert_before if home.before else self.edits.insert_after
        insert(home.after, f"{home.reference} = {scaler_class}({device})")
        for earlier in home.also_after:
            if id(earlier) in self.edits.created_scalers:
                continue
            self.edits.created_scalers.add(id(earlier))
            earlier_device = self.devices.device_for(home.device_scope, self.structure.line(earlier) + 1, earlier)
            self.edits.insert_after(earlier, f"{home.reference} = {scaler_class}({earlier_device})")
            self.info("AMP204", f"created {home.reference} = {scaler_class}({earlier_device}) after this "
                                f"construction of {', '.join(home.optimizers)} too (the optimizer is created again at line "
                                f"{home.line}; the step uses whichever exists)", earlier)
        if home.inherited:
            self._report_inherited(home, f"{scaler_class}({device})")
            return
        if home.factory is not None:
            factory, step = home.factory
            self.info("AMP204", f"created {home.reference} = {scaler_class}({device}) in {factory}(), before the "
                                f"training step {step}() it builds: {', '.join(home.optimizers)} "
                                f"{'is its parameter' if len(home.optimizers) == 1 else 'are its parameters'}, it runs "
                                f"once per trainer it builds, and {step}() reads the scaler from the closure",
                      home.after)
            return
        self.info(
            "AMP204",
            f"created {home.reference} = {scaler_class}({device}) after the optimizer(s) "
            f"{', '.join(o for o in home.optimizers if o not in home.created_later)}"
            + (f" (it steps {', '.join(home.created_later)} too, created later)" if home.created_later else "")
            + (f"; {home.recreated_per_call}() creates its optimizer on every call (it is called in a loop), and so "
               "its GradScaler too: each call starts again at the initial loss scale (65536), which may skip a step "
               "or two while it settles; create both once outside to keep the scale"
               if home.recreated_per_call else ""),
            home.after,
        )

    def _report_inherited(self, home: ScalerHome, creation: str) -> None:
        """AMP204 for a scaler created after the base class's __init__ that sets the optimizers;
        AMP224 where that base saves an optimizer's state, which this module cannot extend."""
        for receiver, base, where, saves in home.inherited:
            self.info("AMP204", f"created {home.reference} = {creation} after the base class's __init__: {receiver} "
                                f"is set by {base}.__init__ ({where}), which this class inherits", home.after)
            for saved_at in saves:
                self.warn("AMP224", f"{base} saves {receiver}.state_dict() ({saved_at}) in another module, without the "
                                    f"GradScaler's: a resumed run starts again at the initial loss scale (65536) and "
                                    f"may skip a step or two while it settles; save {home.reference}.state_dict() there "
                                    "and load it on resume by hand", home.after)

    def _scaler_class(self) -> str:
        """`torch.amp.GradScaler`; `ShardedGradScaler` (imported once) in a file that wraps its
        model in FullyShardedDataParallel: its unscale_ reduces the inf/NaN check over the ranks,
        so every rank skips the same steps."""
        wraps = self._fsdp_wraps()
        if not wraps:
            return f"{self.torch}.amp.GradScaler"
        name = self.structure.fresh_name("ShardedGradScaler", "AmpShardedGradScaler")
        if not self.sharded_import_added:
            self.sharded_import_added = True
            anchor = last_leading_import(self.module)
            statement = "from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler" + (
                f" as {name}" if name != "ShardedGradScaler" else "")
            if anchor is not None:
                self.edits.insert_after(anchor, statement)
            else:
                self.edits.insert_before(self.module.body[0], statement)
            self.info(
                "AMP236",
                f"the model is wrapped in FullyShardedDataParallel (line {self.structure.line(wraps[0].node)}): the "
                f"GradScaler is torch.distributed.fsdp's {name}, whose inf/NaN check is reduced over the ranks (a plain "
                "GradScaler lets ranks disagree on skipped steps); added its import",
                anchor if anchor is not None else self.module.body[0],
            )
        return name

    # ---- checkpoints ------------------------------------------------------------------

    def _scaler_reference_in(self, scope: Scope, line: int, plans: List[UnitPlan]) -> Optional[str]:
        """How code at `line` in `scope` can reach a scaler, if it can."""
        s = self.structure
        klass = s.class_of(scope)
        if klass is not None and id(klass) in self.placement.homes:
            return self.placement.homes[id(klass)].reference
        for plan in plans:
            if plan.threaded_function is scope or any(relay is scope for relay in plan.relay_functions):
                return self.scaler_name
        for candidate in s.enclosing_scopes(scope):
            home = self.placement.homes.get(id(candidate))
            if home is None:
                continue
            if candidate is scope and (home.line >= line or (not home.before and s.end_line(home.after) >= line)):
                # not yet created there: before the statement it follows, or inside it (Towards-
                # Realtime-MOT loads the optimizer's state in `if resume:`, and the scaler is
                # created after that if/else, each branch of which builds the optimizer)
                return None
            if candidate is not scope and scope is not s.module and s.bindings_visible(self.scaler_name, scope):
                return None
            if candidate is s.module and scope is not s.module and not _runs_with_the_module(s, home):
                # knowledge-distillation-pytorch: the scaler is created in the `else:` of the
                # script's mode switch, and the other mode's function would read an unbound global
                return None
            return home.reference
        return None


# ---- small helpers --------------------------------------------------------------------------


def _runs_with_the_module(s: TrainingStructure, home: ScalerHome) -> bool:
    """Is a module-level scaler created whenever the script runs: no `if` (but the script's
    `if __name__ == "__main__":`), `else`, loop or `except` around its creation? Only then may
    a function read it as a global."""
    for after in (home.after, *home.also_after):
        for ancestor in s.ancestors(after):
            if isinstance(ancestor, (cst.Else, cst.For, cst.While, cst.ExceptHandler)):
                return False
            if isinstance(ancestor, cst.If) and not is_main_guard(ancestor):
                return False
    return True


def _turns_precision_off(existing: str) -> bool:
    """`mixed_precision="no"`, `precision=32`, `fp16=False`: the script chose float32."""
    values = [part.split("=", 1)[1].strip().strip("'\"") for part in existing.split(", ") if "=" in part]
    return bool(values) and all(value in ("no", "32", "32-true", "64", "64-true", "False", "None") for value in values)


def _scaled_backward(call: cst.Call, reference: str) -> cst.Call:
    """`loss.backward(args)` -> `scaler.scale(loss).backward(args)`."""
    assert isinstance(call.func, cst.Attribute)
    loss = call.func.value.with_changes(lpar=[], rpar=[]) if call.func.value.lpar else call.func.value
    scaled = cst.Call(func=cst.parse_expression(f"{reference}.scale"), args=[cst.Arg(loss)])
    return call.with_changes(func=call.func.with_changes(value=scaled))


def _scaler_call(reference: str, method: str, receiver: Optional[str]) -> cst.Call:
    return cst.parse_expression(f"{reference}.{method}({receiver})")  # type: ignore[return-value]


def _calls_method(node: cst.BaseExpression, receiver: str, method: str) -> bool:
    """`<receiver>.<method>(...)`"""
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == method
            and dotted_name(node.func.value) == receiver)
