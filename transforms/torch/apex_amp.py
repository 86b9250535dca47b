"""PyTorch with NVIDIA apex amp: `amp.initialize` after the optimizers exist, `amp.scale_loss`
around every backward, `amp.master_params` for clipping, amp state in checkpoints.

Follows NVIDIA's own recipe (apex/examples/imagenet, apex/examples/dcgan): one
`amp.initialize(models, optimizers, opt_level=..., num_losses=N)` placed after the models are on
the GPU and the optimizers exist, and before any DataParallel/DistributedDataParallel wrap;
`loss_id=i` per backward when there are several losses.

apex cannot run here (no CUDA; `apex.amp` exists only up to apex 25.05): the output is checked
by golden files and compilation only.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.base import CallSite as ProjectCallSite, CompanionChange, Transform, TransformResult, UnitContext
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.torch import screen as torch_screen
from ampify.transforms.torch.inplace_matmuls import MARKERS as INPLACE_MARKERS
from ampify.transforms.torch.apex_callers import foreign_call_sites, plan_caller
from ampify.transforms.torch.apex_penalty import loss_index_of_penalty, write_apex_penalty
from ampify.transforms.torch.apex_setup import ApexSetup, ApexSetupFinder, index_of, refuse
from ampify.transforms.torch.apex_wrap_hoist import plan_hoist
from ampify.transforms.torch.driver import BackendRules, HazardRule, TorchConversion, short_text
from ampify.transforms.torch.edits import StatementEdits, apply_edits
from ampify.transforms.torch.gradient_penalty import (
    PenaltySite,
    penalty_of_another_module,
    penalty_sites,
    sites_of_unit,
    state_fed_back,
    state_kept_across_steps,
    unreached_penalties,
    where_penalty,
)
from ampify.transforms.torch.float32_losses import float32_only_loss_calls
from ampify.transforms.torch.manual_updates import gradients_reduced_by_a_helper, gradients_reduced_by_hand, manual_update_beside_steps
from ampify.transforms.torch.loss_objects import (
    AMP_OPTIMIZER, LossObjectUse, find_loss_object, is_this_module, loss_class_of_backward, loss_receiver,
    plan_apex_backward, scale_loss_object_backward_apex,
)
from ampify.transforms.torch.helper_backwards import backward_for_its_hooks, call_of_unfollowed_backward, step_of_gradients_from_elsewhere, unknown_step_after_backward, distinct_losses, pair_helper_backwards
from ampify.transforms.torch.normalize import converted_in_shape
from ampify.transforms.torch.gradient_owners import optimizer_of_gradients
from ampify.transforms.torch.wrapper_steps import project_wrapper_steps
from ampify.transforms.torch.scaler_calls import ScalerCallPlanner, check_no_gradients_unscaled_twice
from ampify.transforms.torch.statements import code_of
from ampify.transforms.torch.torch_import import last_leading_import
from ampify.transforms.torch.autocast_regions import AutocastPlanner
from ampify.transforms.torch.training_loop import (
    BackwardCall,
    HazardKind,
    Scope,
    TrainingStructure,
    TrainingUnit,
    Unconvertible,
    analyze_training,
    concerns_torch,
    may_concern_torch_training,
)

# The codes this transform emits and what each means: ampify/rules.py (AMP3xx).

APEX_RULES = BackendRules(
    no_torch_import="AMP323",
    mixed_precision_outside_step=(
        "AMP322",
        "this file uses mixed precision (line {line}) but not around this training step: it may still train "
        "in float32; nothing converted because the file already uses torch.amp / apex amp: convert this step "
        "by hand",
    ),
    steps_without_backward=(
        "AMP324",
        "{receiver}.step() but no backward() in this file: the backward pass runs elsewhere (a helper in "
        "another module?); nothing converted here: wrap that backward in amp.scale_loss by hand",
    ),
    unpaired_backward=(
        "AMP316",
        "backward() with no optimizer step that ampify can identify in the same loop or function{followed}; "
        "not converted: wrap it in `with amp.scale_loss(loss, optimizer) as scaled_loss:` by hand",
    ),
    unit_refused=("AMP317", "{problem}; this training loop is left unconverted"),
    training_elsewhere=(
        "AMP327",
        "{function}() ({where}) runs the training step with {optimizer}, created here at line {line}, and {module} "
        "is not in this run: amp.initialize goes here and amp.scale_loss there, one change set for both files; "
        "run ampify on both files or on the repository",
        "{function}() ({where}) runs the training step with {optimizer}, created here at line {line}, and {module} "
        "is not in this run: that class's step is where the conversion goes (this file needs no change); run ampify "
        "on {module} or on the repository",
    ),
    library_loop=(
        "AMP345",
        "{callee}() runs the training loop with {optimizer}: the backward() amp.scale_loss would wrap is in "
        "{package}, which ampify does not rewrite; nothing converted: turn on {package}'s own mixed precision "
        "option if it has one, or write the loop out in this file and run ampify again",
    ),
    penalty_method=(
        "AMP347",
        "this step builds a class of another module that takes a gradient penalty in a method ({found}): under O1 "
        "its torch.autograd.grad runs on unscaled float16 gradients, and small ones flush to zero; the training "
        "steps of this file were left unconverted: convert by hand, or use --backend native --dtype bfloat16",
    ),
    blocked_reason="apex amp would raise on this script (see the warnings)",
    float32_probability_clamp="AMP339",
    float32_sigmoid="AMP346",
    inplace_products="AMP340",
    inplace_products_left="AMP341",
    imported_bce="AMP342",
    imported_bce_left="AMP343",
    trains_when_called="AMP344",
    hazards={
        HazardKind.BCE: HazardRule(
            "AMP310",
            "{short_detail} under apex amp raises at run time (apex bans binary_cross_entropy on fp16 inputs); "
            "compute the loss with nn.BCEWithLogitsLoss / F.binary_cross_entropy_with_logits on "
            "logits{sigmoid_hint}, then run ampify again",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.FSDP: HazardRule(
            "AMP320",
            "{short_detail}: apex amp does not support FullyShardedDataParallel; this file is left unconverted "
            "(use the native backend, e.g. --dtype bfloat16, or FSDP's MixedPrecision policy)",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.FULLY_SHARD: HazardRule(
            "AMP320",
            "{short_detail}: apex amp does not support FSDP's fully_shard (its parameters are DTensors); this file "
            "is left unconverted (the native backend converts it: GradScaler reduces its inf check over the mesh)",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.MANUAL_HALF: HazardRule(
            "AMP321",
            "{short_detail}: this script casts to half precision by hand; amp.initialize raises on float16 model "
            "parameters (it expects float32 models and does the casting itself): remove the manual casts and "
            "run ampify again; this file is left unconverted",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.CLOSURE: HazardRule(
            "AMP311",
            "{short_detail}.step(closure): apex amp does not support optimizer closures (LBFGS and friends); "
            "this file is left unconverted",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.CREATE_GRAPH: HazardRule(
            "AMP312",
            "torch.autograd.grad(..., create_graph=True) (a gradient penalty?) is not loss-scaled by "
            "amp.scale_loss, and ampify could not scale it here (it does so for one output assigned as "
            "`g = autograd.grad(...)[0]`, AMP328): differentiate the outputs times "
            "amp.state_dict()[\"loss_scaler0\"][\"loss_scale\"] and divide the gradients by it, by hand",
            in_training_only=True,
        ),
        HazardKind.AUTOGRAD_GRAD: HazardRule(
            "AMP312",
            "torch.autograd.grad here differentiates a loss of the training step (a MAML inner loop, adversarial "
            "examples) that amp.scale_loss never scales: under O1 its float16 gradients can underflow; differentiate "
            "the loss times amp.state_dict()[\"loss_scaler0\"][\"loss_scale\"] and divide the gradients by it, by "
            "hand; this file is left unconverted",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.MASKED_FILL: HazardRule(
            "AMP313",
            "masked_fill with {detail} overflows float16 under apex O1 (apex does not patch masked_fill: it raises "
            "`value cannot be converted to type at::Half without overflow`); use a value within the float16 range "
            "(e.g. -1e4) or torch.finfo(scores.dtype).min{left_unconverted}",
            blocks_file=True,
        ),
        HazardKind.GRAM_MATRIX: HazardRule(
            "AMP330",
            "{detail}: a Gram matrix (features times their own transpose) sums h*w products, beyond float16's 65504 "
            "under apex O1: the loss is inf and every step is skipped; compute it in float32 by hand (O1 casts "
            "torch.mm to float16){left_unconverted}",
            blocks_file=True, in_training_only=True,
            file_reason="a Gram matrix overflows float16 under apex O1; see the warning",
        ),
        HazardKind.AUTOGRAD_FUNCTION: HazardRule(
            "AMP334",
            "{detail}: apex O1 casts the torch functions a custom autograd Function's forward() calls, but not its "
            "backward() nor compiled code; keep it in float32 by hand (apex's `amp.float_function` on the function "
            "that calls its apply) and convert this file by hand, or use the native backend after decorating it "
            "with torch.amp.custom_fwd(cast_inputs=torch.float32){refused}; the training steps of this file were left "
            "unconverted",
            blocks_file=True, in_training_only=True,
            file_reason="a custom autograd Function breaks under apex O1; see the warning",
        ),
        HazardKind.GRADIENT_DROPPED: HazardRule(
            "AMP335",
            "{detail}; amp.scale_loss multiplies the loss and needs every backward() to multiply by the gradient "
            "it receives: multiply the returned gradient by it (`return ctx.grads * grad_output, None, ...`); the "
            "training steps of this file were left unconverted",
            blocks_file=True, in_training_only=True,
            file_reason="a custom autograd Function drops apex's loss scale; see the warning",
        ),
        HazardKind.GRADIENT_DROPPING_BINDING: HazardRule(
            "AMP336",
            "{detail}: amp.scale_loss multiplies the loss and needs every backward() to multiply by the gradient "
            "it receives; a build whose backward() returns the gradient its forward() computed leaves the model's "
            "gradients unscaled, and apex then divides them by the scale, silently: check that yours multiplies "
            "by grad_output, or use torch.nn.CTCLoss (on log_softmax outputs)",
            in_training_only=True,
        ),
        HazardKind.PROBABILITY_CLAMP: HazardRule(
            "AMP337",
            "{detail}: under apex O1 the probability arrives in {dtype} and the clamp keeps that dtype, where its "
            "upper bound rounds to 1: a confident output stays 1, `log(1 - p)` is -inf and `0 * -inf` NaN, so "
            "the loss is inf or NaN (apex skips every such step); clamp a float32 copy (`torch.clamp(p.float(), "
            "...)`) there{refused}; the training steps of this file were left unconverted",
            blocks_file=True, in_training_only=True,
            file_reason="a probability clamp rounds to 1 in float16; see the warning",
        ),
        HazardKind.LOG_OF_PROBABILITY: HazardRule(
            "AMP331",
            "{detail}: the log of a sigmoid's probability, written out; under apex O1 the sigmoid runs in "
            "float16, where the probability rounds to 1 (1 - p is 0) once the logit passes about 8.4 (and to 0 "
            "below about -17.4) and a small epsilon is lost: the log is -inf, the loss inf, and every step is "
            "skipped while the model is confident, silently; end the model on logits and use F.logsigmoid (log(1 - p) is "
            "F.logsigmoid(-logits)) or BCEWithLogitsLoss, or add an epsilon of 1e-4 or more{left_unconverted}",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.WRAPPER_CLASS: HazardRule(
            "AMP314",
            "class {detail} steps an optimizer inside its own step(); ampify cannot follow it: call "
            "amp.initialize on the inner optimizer and wrap its backward in amp.scale_loss by hand",
            in_training_only=True,
        ),
        HazardKind.UNSEEN_WRAPPER: HazardRule(
            "AMP332",
            "{detail}: the name stepped may be a wrapper rather than the optimizer it was given; amp.initialize "
            "accepts torch optimizers only, and horovod's needs its own recipe; its steps were left unconverted: run "
            "ampify where that code can be read, or convert by hand",
            in_training_only=True,
        ),
        HazardKind.HOROVOD: HazardRule(
            "AMP333",
            "{detail}: horovod averages the gradients asynchronously until its step(), and amp.scale_loss unscales "
            "them when its block ends; its steps were left unconverted: call optimizer.synchronize() inside the "
            "amp.scale_loss block after backward(), then `with optimizer.skip_synchronize(): optimizer.step()` "
            "(horovod's apex recipe)",
            in_training_only=True,
        ),
        HazardKind.HOROVOD_STEP: HazardRule(
            "AMP333",
            "{detail}: horovod averages the gradients asynchronously until its step(), and amp.scale_loss unscales "
            "them when its block ends (and amp.initialize must patch the optimizer horovod wraps); file not "
            "converted: use the native backend, which writes horovod's recipe, or call optimizer.synchronize() "
            "inside the amp.scale_loss block after backward(), then `with optimizer.skip_synchronize(): "
            "optimizer.step()` by hand",
            blocks_file=True, in_training_only=True, file_reason="horovod's DistributedOptimizer; see the warning",
        ),
        HazardKind.DIFFERENTIAL_PRIVACY: HazardRule(
            "AMP325",
            "{detail}: Opacus's DPOptimizer clips per-sample gradients, which amp.scale_loss would scale, and "
            "apex cannot patch it; file not converted",
            blocks_file=True, in_training_only=True,
        ),
        HazardKind.DISTRIBUTED_AUTOGRAD: HazardRule(
            "AMP326",
            "{detail}(...): RPC training, whose gradients stay in a distributed autograd context that a "
            "DistributedOptimizer steps: amp.scale_loss and amp.initialize work on a local optimizer only; file not "
            "converted",
            blocks_file=True, in_training_only=True,
            file_reason="RPC training (distributed autograd); see the warning",
        ),
        HazardKind.AUTOGRAD_BACKWARD: HazardRule(
            "AMP315",
            "torch.autograd.backward(...) is not rewritten; use `with amp.scale_loss(loss, optimizer) as "
            "scaled_loss: scaled_loss.backward()` by hand",
        ),
    },
)


class TorchApexAmp(Transform):
    name = "torch-apex-amp"
    internal_error_code = "AMP300"
    description = "Add NVIDIA apex amp.initialize and amp.scale_loss to PyTorch training steps."

    def may_apply(self, source: bytes, options: Options) -> bool:
        return options.backend == "apex" and may_concern_torch_training(source)

    screened_out_reason = torch_screen.SCREENED_OUT_REASON

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        return torch_screen.may_concern_torch_training_code(facts)

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return options.backend == "apex" and (imports.uses("apex") or concerns_torch(imports))

    def apply(
        self, module: cst.Module, imports: ImportMap, options: Options, context: UnitContext = UnitContext()
    ) -> TransformResult:
        def convert(shaped: cst.Module) -> TransformResult:
            classes = context.project.project_class if context.project is not None else None
            models = context.project.probability_models if context.project is not None else None
            structure = analyze_training(shaped, imports, project_class=classes, probability_models=models)
            wrappers = project_wrapper_steps(structure, shaped, context.project)
            if wrappers:  # known only to refuse with the true reason
                structure = analyze_training(shaped, imports, wrappers, classes, models)
            pair_helper_backwards(structure)
            return ApexConversion(structure, options, context).run()

        # in-place matrix products of the file's own model code: looked for only when its bytes name one
        products = not context.source or any(marker in context.source for marker in INPLACE_MARKERS)
        return converted_in_shape(module, convert, imports, context, "AMP340" if products else "")


class ApexConversion(TorchConversion):
    """Plans and applies the apex rewrite of one module (the shared checks are TorchConversion's,
    where amp.initialize goes is ApexSetupFinder's)."""

    rules = APEX_RULES

    def __init__(self, structure: TrainingStructure, options: Options, context: UnitContext = UnitContext()) -> None:
        super().__init__(structure, options, context)
        #: edits of calling modules planned for the units converted so far, and their modules
        self.planned_companions: List[CompanionChange] = []
        self.companion_keys: set = set()
        self.s = structure
        self.plan = StatementEdits()
        self.amp = "amp" if "amp" not in structure.all_names else structure.fresh_name("apex_amp")
        self.setups = ApexSetupFinder(structure, self.amp, context.project)
        self.scaled_loss_name = structure.fresh_name("scaled_loss", "scaled")
        self.parse_config = structure.module.config_for_parsing
        #: (training unit, setup scope) whose amp.initialize is planned: apex allows one call per
        #: process, so a second unit set up in the same scope is refused (other classes/functions
        #: are usually alternative trainers and keep their own)
        self.initialize_planned: Optional[Tuple[TrainingUnit, Scope]] = None
        #: gradient penalties that can be scaled (by id of their autograd.grad call), and the
        #: loss_id each was written with
        self.penalties: Optional[Dict[int, PenaltySite]] = None
        self.penalties_written: Dict[int, int] = {}
        self.penalty_scale_name = structure.fresh_name("penalty_scale", "amp_penalty_scale")
        #: optimizer name -> the attribute of the project's wrapper class it names that holds the real
        #: optimizer (`optimizer = ScheduledOptim(optim.Adam(...), ...)`: "_optimizer"); amp.initialize
        #: and amp.scale_loss get `optimizer._optimizer`, and the wrapper's own step() steps it as patched
        self.wrapped_inner: Dict[str, str] = {}

    # ---- the driver's steps -------------------------------------------------------------------

    def imports_torch(self) -> bool:
        return self.s.imports.uses("torch") or self.s.imports.uses("apex")

    def scaling_is_float16(self) -> bool:
        return True  # apex's opt levels run the forward pass in float16

    def snapshot(self):
        return (self.plan.copy(), self.initialize_planned, list(self.planned_companions), set(self.companion_keys),
                dict(self.penalties_written))

    def restore(self, state) -> None:
        (self.plan, self.initialize_planned, self.planned_companions, self.companion_keys,
         self.penalties_written) = state

    def claimed_hazards(self) -> Set[int]:
        """Gradient penalties scaled with apex's own loss scale (see apex_penalty.py)."""
        if self.penalties is None:
            self.penalties = {
                key: site for key, site in penalty_sites(self.s, self.s.fresh_name("scaler", "grad_scaler")).items()
                if not isinstance(site.outputs.value, (cst.List, cst.Tuple))
            }
        return set(self.penalties) - unreached_penalties(self.s, self.penalties, None)

    def loss_object_limit(self) -> str:
        return ("ampify converts such a step only when it fills the object through a method of that class "
                "(`loss.eval_batch(outputs, target)`), which was not seen here")

    def loss_classes_converted_by_callers(self) -> Dict[int, str]:
        found = {}
        for backward in self.s.unpaired_backwards:
            klass = loss_class_of_backward(self.s, backward)
            if klass is not None:
                found[id(backward.call)] = klass
        return found

    def loss_classes_reason(self, classes) -> str:
        names_ = ", ".join(sorted(set(classes.values())))
        return (f"loss class {names_}: its backward() takes the optimizer for amp.scale_loss from the training files "
                "that call it (converted with them, as one change set)")

    def partial_conversion_refused(self, left_out: List[cst.CSTNode]) -> Optional[Tuple[str, str, cst.CSTNode]]:
        """amp.initialize (O1) patches torch's functions for the whole process: a training step of
        this file left unconverted would run its forward pass in float16 and its backward without
        loss scaling, no longer in float32. So no step of the file is converted."""
        lines = ", ".join(str(self.s.line(node)) for node in left_out[:3])
        return ("AMP329",
                f"the training step{'s' if len(left_out) > 1 else ''} at line{'s' if len(left_out) > 1 else ''} {lines} "
                f"stay{'' if len(left_out) > 1 else 's'} unconverted (see {'their' if len(left_out) > 1 else 'its'} "
                f"warning), and {self.amp}.initialize (O1) casts the forward passes of the whole process: "
                f"{'they' if len(left_out) > 1 else 'it'} would run in float16 without loss scaling; no step of this file "
                "is converted: convert it by hand, or use --backend native",
                left_out[0])

    def plan_unit(self, unit: TrainingUnit) -> TrainingUnit:
        for step in unit.steps:
            if step.wrapper is not None:
                self._reach_into_wrapper(step)
        self._convert_unit(unit)
        return unit

    def _reach_into_wrapper(self, step) -> None:
        """`optimizer.step_and_update_lr()` on the project's wrapper class: apex is given the optimizer it
        holds (`optimizer._optimizer`). amp.initialize patches that object's step() in place (O1 and O2
        return the same optimizer), so the wrapper's own step() skips a step whose gradients overflowed,
        and amp.scale_loss leaves the gradients unscaled before the wrapper reads or clips them, as O1
        keeps no master copy. Refused where that does not hold."""
        use = step.wrapper

        def refuse_with(why: str):
            raise Unconvertible(
                f"{step.receiver} steps through the project's wrapper class {use.described}: {why}; use --backend "
                "native (the wrapper then takes the GradScaler), or convert by hand", step.call)

        if use.ambiguous:
            refuse_with(f"{step.receiver} may hold that wrapper or a plain optimizer, and amp.initialize needs the "
                        "optimizer itself")
        if use.step.reads_gradients and self.options.apex_opt_level != "O1":
            refuse_with(f"{use.step.klass}.{use.step.method}() reads or clips the model's gradients before it steps, "
                        f"and under {self.options.apex_opt_level} apex steps float32 master copies of them")
        inner = self.wrapped_inner.setdefault(step.receiver, use.step.inner)
        if inner != use.step.inner:
            refuse_with(f"{step.receiver} is stepped through wrapper classes holding the optimizer in different "
                        "attributes")

    def amp_optimizer(self, name: str) -> str:
        """How apex is handed optimizer `name`: the optimizer inside it when it is the project's wrapper."""
        inner = self.wrapped_inner.get(name)
        return f"{name}.{inner}" if inner else name

    def write(self, plans: List[TrainingUnit]) -> cst.Module:
        self.companions.extend(self.planned_companions)
        self.add_import()
        return apply_edits(self.s.module, self.plan)

    # ---- one training unit ---------------------------------------------------------------

    def _convert_unit(self, unit: TrainingUnit) -> None:
        """Plan the whole conversion of one training unit, or raise Unconvertible."""
        if not unit.steps:
            refuse(unit.backwards[0].call, "no optimizer step found for this backward()")
        loss_objects = self._loss_objects_of(unit)
        unfollowed = (call_of_unfollowed_backward(self.s, unit) or backward_for_its_hooks(self.s, unit)
                      or unknown_step_after_backward(self.s, unit) or step_of_gradients_from_elsewhere(self.s, unit)
                      or self.loss_object_backward(unit) or gradients_reduced_by_hand(self.s, unit)
                      or gradients_reduced_by_a_helper(self.s, unit))
        if unfollowed is not None:
            refuse(unfollowed[1], unfollowed[0])
        elsewhere = penalty_of_another_module(self.project, [unit.body])
        if elsewhere is not None:
            call, called, where = elsewhere
            refuse(call, f"{called}() runs torch.autograd.grad(..., create_graph=True) ({where}), a gradient penalty, "
                         "on outputs that apex O1 computes in float16: its gradients need the loss scale, which ampify "
                         "writes only for penalties of the file it converts; scale it there by hand, or use --backend "
                         "native --dtype bfloat16")
        by_hand = manual_update_beside_steps(self.s, unit)
        if by_hand is not None:
            refuse(unit.backwards[0].call,
                   f"the parameters are also updated by hand after this backward() (line {self.s.line(by_hand)}, when "
                   "the optimizer does not step): amp.scale_loss needs an optimizer, and that update would get scaled "
                   "gradients; step a torch.optim optimizer in every branch, or use --backend native --dtype bfloat16")
        check_no_gradients_unscaled_twice(self.s, unit, unit.steps, ScalerCallPlanner(self.s, self.s.imports).zero_grads_of,
                                          apex=True)
        self.claimed_hazards()  # the penalty sites
        for site in sites_of_unit(self.s, unit, self.penalties or {}):
            kept = state_kept_across_steps(self.s, site) if site.penalty else None
            if kept is not None:
                where = f"{site.helper.name.value}()" if site.helper is not None else "this step"
                refuse(site.call, f"{where} runs a gradient penalty and keeps a running statistic of its gradients in "
                                  f"{kept}, which it computes with again: a step apex skips for overflow would leave "
                                  "it non-finite for every later step; use --backend native --dtype bfloat16")
            for call in site.helper_calls:
                state = state_fed_back(self.s, call) if self.s.contains(unit.owner, call) else None
                if state is not None:
                    refuse(call, f"{code_of(call.func)}() runs a gradient penalty and hands back {state}, "
                                 "which this step passes to it again: a running statistic of the gradients, which a step "
                                 "apex skips for overflow would leave non-finite for every later step; use --backend "
                                 "native --dtype bfloat16")
        sites = foreign_call_sites(self.s, unit, self.project, len(self.setups._call_sites_of(unit.scope))
                                   if isinstance(unit.scope, cst.FunctionDef) else 0)
        if sites is not None:
            self._convert_unit_called_from_elsewhere(unit, sites)
            return
        setup = self.setups.find(unit)
        if self.initialize_planned is not None and self.initialize_planned[1] is setup.scope:
            refuse(
                unit.backwards[0].call,
                f"apex allows one {self.amp}.initialize per process and the training loop at line "
                f"{self.s.line(self.initialize_planned[0].backwards[0].call)} already gets one from the same setup; "
                f"pass every model and optimizer of both loops to a single {self.amp}.initialize(..., num_losses=N) "
                "by hand",
            )
        self.setups.check_models_reach_the_gpu(setup)
        self.setups.check_models_not_wrapped_by_helpers(setup)
        self.setups.check_defined_for_scale_loss(unit, setup)
        self.setups.check_never_none(unit, setup)
        anchor = self.place_initialize(
            len(distinct_losses(unit)), setup, [unit.owner, *(b.call for b in unit.backwards)], self.setups.note_for(setup))
        self.plan_backwards(unit, loss_objects)
        self._plan_penalties(unit)
        self._plan_index_assignment_casts(unit)
        self._plan_float32_only_loss_casts(unit)
        self._plan_clipping(unit)
        self.plan_checkpoints(setup, anchor)
        self.initialize_planned = (unit, setup.scope)

    def _loss_objects_of(self, unit: TrainingUnit) -> Dict[int, LossObjectUse]:
        """The unit's `loss.backward()` calls on loss objects of the project (loss_objects.py), by
        id of the call: the class's backward() takes the optimizer amp.scale_loss needs, in its
        module (one change set) or here. Refused when the class cannot be told or edited, or when
        the step has more than one loss (the class would need the loss_id too)."""
        found: Dict[int, LossObjectUse] = {}
        for backward in unit.backwards:
            if backward.delegation is not None:
                continue
            use = find_loss_object(self.s, self.project, backward, unit.body)
            if use is None:
                continue
            receiver = loss_receiver(backward)
            if isinstance(use, str):
                refuse(backward.call, f"{receiver}.backward() runs the backward() of a loss class of the project, which "
                                      f"ampify cannot convert here: {use}; wrap the tensor it backpropagates in "
                                      "amp.scale_loss there by hand")
            if len(distinct_losses(unit)) > 1:
                refuse(backward.call, f"{receiver}.backward() runs {use.class_name}.backward() ({use.where}), and this "
                                      "step has several losses: amp.scale_loss there would need each one's loss_id; "
                                      "convert by hand, or use --backend native")
            if any(arg.keyword is not None and arg.keyword.value == AMP_OPTIMIZER for arg in backward.call.args):
                refuse(backward.call, f"{receiver}.backward() already passes {AMP_OPTIMIZER}=")
            self._scale_loss_object(use)
            self.converted_loss_objects.add(id(backward.call))
            found[id(backward.call)] = use
        return found

    def _scale_loss_object(self, use: LossObjectUse) -> None:
        """The class's backward() runs its backward under amp.scale_loss when given the optimizer:
        planned here when the class is in this file, else as a change of its module."""
        def refuse_with(why: str):
            refuse(use.backward.call, f"{use.receiver}.backward() runs {use.class_name}.backward() ({use.where}), which "
                                      f"backpropagates {use.inner}: apex needs it under amp.scale_loss there, and ampify "
                                      f"did not write it: {why}; convert by hand, or use --backend native")

        if is_this_module(self.project, use.key):
            found = plan_apex_backward(self.s.module, use.class_name, self.plan, self.amp)
            if isinstance(found, str):
                refuse_with(found)
            return
        if use.key in self.companion_keys:
            return  # another step of this file planned it already
        if not self.project.in_this_run(use.key):
            refuse_with(f"{use.display} is not in this run: run ampify on both files or on the repository")
        source = self.project.source_of(use.key)
        if source is None:
            refuse_with(f"{use.display} cannot be read")
        scaled = scale_loss_object_backward_apex(source, use.class_name)
        if isinstance(scaled, str):
            refuse_with(scaled)
        new, line = scaled
        if new is None:
            return
        finding = Finding(
            "AMP302",
            f"{use.class_name}.backward() now backpropagates {use.inner} under amp.scale_loss when given the optimizer "
            f"(a new `{AMP_OPTIMIZER}=None` parameter; float32 behaviour for callers that pass none); {self.display} "
            "passes its optimizer", line, 0, Severity.INFO)
        self.planned_companions.append(CompanionChange(
            key=use.key, display=use.display, old=source, new=new, findings=[finding],
            reason=f"changed with {self.display}: the loss class {use.class_name} backpropagates {use.inner} under "
                   "amp.scale_loss with the optimizer it is passed"))
        self.companion_keys.add(use.key)

    def _convert_unit_called_from_elsewhere(self, unit: TrainingUnit, sites: List[ProjectCallSite]) -> None:
        """The unit's function gets its optimizers as parameters and is called from other modules:
        scale_loss and master_params here, amp.initialize there (see apex_callers.py)."""
        function = unit.scope
        node = unit.backwards[0].call
        here = f"{self.display}:{self.s.line(node)}"
        wrapped = [name for name in unit.optimizers if name in self.wrapped_inner]
        if wrapped:
            refuse(node, f"{wrapped[0]} is the project's optimizer wrapper, handed to {function.name.value}() by another "
                         "module: ampify gives apex the optimizer inside a wrapper only where the wrapper is created in "
                         "the file it converts; use --backend native (the wrapper then takes the GradScaler), or convert "
                         "by hand")
        if self.s.optimizer_state_saves or self.s.optimizer_state_loads:
            refuse(node, "this module saves or loads optimizer state, and amp.initialize would be in another module: "
                         "checkpoint amp.state_dict() by hand")
        by_module = {}
        for site in sites:
            by_module.setdefault(site.key, []).append(site)
        already: List[str] = []
        for key, module_sites in by_module.items():
            where = f"{module_sites[0].display}:{module_sites[0].line}"
            if key in self.companion_keys:
                refuse(node, f"{where} already gets amp.initialize for another step of this module; apex allows one per "
                             "process: pass every model and optimizer to a single amp.initialize by hand")
            if not self.project.in_this_run(key):
                refuse(node, f"the step at {here} needs amp.initialize in {where}, which this run does not cover: run "
                             "ampify on both files or on the repository")
            source = self.project.source_of(key)
            if source is None:
                refuse(node, f"the step at {here} needs amp.initialize in {where}, which cannot be read")
            try:
                change = plan_caller(
                    lambda structure, options: ApexConversion(structure, options), self.options, source,
                    module_sites, function, unit.optimizers, len(distinct_losses(unit)), self.display,
                )
            except Unconvertible as problem:
                # the same kind of refusal (MixedPrecisionElsewhere stays one), now naming the caller
                raise type(problem)(f"{function.name.value}() is called from {where}: {problem}", node) from None
            if isinstance(change, int):
                already.append(f"{where.rsplit(':', 1)[0]}:{change}")
                continue
            self.planned_companions.append(change)
            self.companion_keys.add(key)
        self.plan_backwards(unit)
        self._plan_index_assignment_casts(unit)
        self._plan_clipping(unit)
        written = sorted({s.display for s in sites} - {place.rsplit(":", 1)[0] for place in already})
        self.info(
            "AMP307", f"{function.name.value}() is trained under apex amp set up in "
            + "; ".join(([f"{', '.join(written)} (amp.initialize there; written together with this file, as one change "
                          "set)"] if written else [])
                        + ([f"{', '.join(already)} (its amp.initialize already covers the optimizer passed)"]
                           if already else [])),
            function,
        )

    # -- where the optimizers and models are built

    def _plan_float32_only_loss_casts(self, unit: TrainingUnit) -> None:
        """A loss of a compiled extension that takes float32 only (float32_losses.py): under O1
        the model's outputs are float16, so its activations are cast to float32 wherever this file
        calls it."""
        for call, constructor in float32_only_loss_calls(self.s, self.s.module):
            if id(call) in self.plan.float_first_arguments:
                continue
            self.plan.cast_first_argument_to_float(call)
            self.info(
                "AMP302", f"the activations passed to {dotted_name(call.func)} are cast to float32: it is (or may be) the "
                f"{constructor}, whose compiled kernel takes float32 only, and apex O1 makes them float16 (a no-op "
                "on float32 activations)",
                call,
            )

    def _plan_index_assignment_casts(self, unit: TrainingUnit) -> None:
        """Under O1 model outputs are float16: `values[mask] = net(x)` into a float32 tensor
        raises, so the value is cast to the tensor's dtype (a no-op in float32)."""
        planner = AutocastPlanner(self.s, self.s.imports)
        for node, target in planner.index_assignments_to_cast(unit.owner, unit.scope):
            self.plan.cast_assigned_value(node, f"{target}.dtype")
            self.info(
                "AMP302", f"the value assigned into {target}[...] is cast to {target}.dtype: apex O1 makes it float16, and "
                "index assignment into a float32 tensor needs equal dtypes",
                node,
            )

    # -- amp.initialize

    def place_initialize(self, losses: int, setup: ApexSetup, training: Sequence[cst.CSTNode], why: str = "") -> cst.CSTNode:
        """amp.initialize after the optimizers and the models' device moves and before every
        DataParallel/DDP wrap: the wrap moves down when it can (`model = DataParallel(model)` in
        the same block), else the optimizer's construction moves up above it
        (apex_wrap_hoist.py). Returns the statement checkpoint restores are placed after."""
        anchor = self.setups.anchor_before(training, setup)
        state, findings = self.snapshot(), len(self.findings)
        try:
            self.plan_initialize(losses, setup, anchor, why)
            self.plan_parallel_wraps(setup, anchor)
            return anchor
        except Unconvertible as refusal:
            self.restore(state)
            del self.findings[findings:]
            hoist = plan_hoist(self.s, setup)
            if hoist is None:
                raise refusal
        for statement in hoist.moved:
            self.plan.remove_statement(statement)
        for code in hoist.code:
            self.plan.insert_before(hoist.before, code)
        self.plan_initialize(losses, ApexSetup(setup.scope, setup.optimizers, hoist.models, setup.construction_statements),
                             hoist.before, why, before=True)
        self.info(
            "AMP308", f"the optimizer's construction moved above the DataParallel/DDP wrap of {hoist.wrapped} (line "
            f"{self.s.line(hoist.wraps[0].call)}), so that {self.amp}.initialize sees the model unwrapped; DDP's "
            f"parameters are those of {hoist.wrapped}, in the same order",
            hoist.moved[-1],
        )
        return hoist.moved[-1]

    def plan_initialize(self, losses: int, setup: ApexSetup, anchor: cst.CSTNode, why: str = "",
                        before: bool = False) -> None:
        loop = self._loop_around(anchor)
        if loop is not None:
            raise Unconvertible(
                f"the optimizer is created anew in the loop at line {self.s.line(loop)}, so {self.amp}.initialize after it "
                "would run once per pass: apex allows one amp.initialize per process ('should only be called once', "
                "apex/amp/frontend.py); use --backend native", anchor)
        models = setup.models
        inner_by_setup_name = {setup.renames.get(name, name): inner for name, inner in self.wrapped_inner.items()}
        optimizers = [f"{name}.{inner_by_setup_name[name]}" if name in inner_by_setup_name else name
                      for name in setup.optimizers]
        model_text = models[0] if len(models) == 1 else "[" + ", ".join(models) + "]"
        optimizer_text = optimizers[0] if len(optimizers) == 1 else "[" + ", ".join(optimizers) + "]"
        arguments = f'{model_text}, {optimizer_text}, opt_level="{self.options.apex_opt_level}"'
        if losses > 1:
            arguments += f", num_losses={losses}"
        line = f"{model_text}, {optimizer_text} = {self.amp}.initialize({arguments})"
        if before:
            self.plan.insert_before(anchor, line)
        else:
            self.plan.insert_after(anchor, line)
        self.info(
            "AMP301", f"added {self.amp}.initialize({model_text}, {optimizer_text}, opt_level=\"{self.options.apex_opt_level}\") "
            f"after the optimizer is created{why}",
            anchor,
        )

    def _loop_around(self, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The innermost `for`/`while` of the same function around `statement`, if any."""
        for ancestor in self.s.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(ancestor, (cst.For, cst.While)):
                return ancestor
        return None

    def plan_parallel_wraps(self, setup: ApexSetup, anchor: cst.CSTNode) -> None:
        """DataParallel/DDP must wrap the model after amp.initialize: move a wrap that comes
        before it when that is safe, else refuse."""
        anchor_block = self.s.block_of(anchor)
        for wrap in self.s.parallel_wraps:
            if wrap.scope is not setup.scope:
                continue
            wrapped = dotted_name(wrap.call.args[0].value) if wrap.call.args else None
            bound_to = _assigned_name(wrap.statement, wrap.call)
            if bound_to in setup.models and bound_to != wrapped and self.s.line(wrap.statement) < self.s.line(anchor):
                # `if args.cuda: net = DataParallel(ssd_net)`: `net` may be the wrap when the
                # optimizer takes its parameters, and amp.initialize raises on a wrapped model.
                refuse(
                    wrap.call,
                    f"{bound_to} is bound to a DataParallel/DistributedDataParallel wrap of {wrapped or 'a model'} at "
                    f"line {self.s.line(wrap.statement)} (when that code runs), and {self.amp}.initialize rejects "
                    f"wrapped models; call {self.amp}.initialize({wrapped or 'model'}, optimizer) before the wrap by hand",
                )
            if wrapped not in setup.models:
                if self.s.line(wrap.statement) < self.s.line(anchor):
                    # `model = DDP(model); model_without_ddp = model.module` (DETR, DeiT): the wrap
                    # holds the very module amp.initialize gets under another name, and apex must
                    # see the model before any DataParallel/DDP wrap.
                    refuse(
                        wrap.call,
                        f"{wrapped or 'a model'} is wrapped in DataParallel/DistributedDataParallel at line "
                        f"{self.s.line(wrap.statement)}, before {self.amp}.initialize({', '.join(setup.models)}, ...), "
                        f"and may be the same model under another name; apex needs the wrap after "
                        f"{self.amp}.initialize: move the wrap after the optimizer by hand",
                    )
                continue
            statement = wrap.statement
            if self.s.position(statement).line > self.s.position(anchor).line:
                continue  # already after amp.initialize
            if self.s.block_of(statement) is not anchor_block or not _is_rewrap(statement, wrapped):
                refuse(
                    wrap.call,
                    f"{wrapped} is wrapped in DataParallel/DistributedDataParallel before the optimizer exists, "
                    f"and apex needs the wrap after {self.amp}.initialize; move the wrap after it by hand",
                )
            body = list(anchor_block.body)
            between = body[index_of(body, statement) + 1 : index_of(body, anchor) + 1]
            # A device move of the wrapped model in between moves the same parameters with or
            # without the wrap (DataParallel/DDP have none of their own): the wrap may still move.
            if any(_uses_other_than_parameters(node, wrapped) and not _only_moves(node, wrapped) for node in between):
                refuse(
                    wrap.call,
                    f"{wrapped} is used between its DataParallel/DDP wrap and {self.amp}.initialize, so the wrap "
                    "cannot be moved safely; move it after amp.initialize by hand",
                )
            self.plan.remove_statement(statement)
            self.plan.insert_after(anchor, code_of(statement).strip("\n"))
            self.info("AMP306", f"moved the parallel wrap of {wrapped} after {self.amp}.initialize (apex requires it)", wrap.call)

    # -- backward, clipping, checkpoints

    def plan_backwards(self, unit: TrainingUnit, loss_objects: Optional[Dict[int, LossObjectUse]] = None) -> None:
        backwards = sorted(unit.backwards, key=lambda b: _pos(self.s, b.call))
        losses = distinct_losses(unit)
        optimizers_of: Dict[int, List[str]] = {}
        for site in backwards:
            # a backward() in a helper method (`self.backward_D()`) is wrapped where it runs, once,
            # with the optimizers stepped after the helper call(s) that reach it
            backward = site.delegation.inner if site.delegation is not None else site
            optimizers = self._optimizers_after(unit, site, backwards)
            if optimizers_of.setdefault(id(backward.call), optimizers) != optimizers:
                refuse(
                    site.call,
                    f"the backward() at line {self.s.line(backward.call)} feeds different optimizers depending on "
                    "which helper call reaches it; ampify cannot give it one amp.scale_loss",
                )
        for backward in losses:
            statement = backward.statement
            if not _is_lone_expression(statement, backward.call):
                refuse(
                    backward.call, "backward() is not a statement of its own; ampify cannot wrap it in amp.scale_loss"
                )
            optimizers = [self.amp_optimizer(name) for name in optimizers_of[id(backward.call)]]
            loss_id = losses.index(backward)
            optimizer_text = optimizers[0] if len(optimizers) == 1 else "[" + ", ".join(optimizers) + "]"
            use = (loss_objects or {}).get(id(backward.call))
            if use is not None:
                self.plan.add_keyword(backward.call, AMP_OPTIMIZER, optimizer_text)
                self.info("AMP302", f"{use.receiver}.backward({AMP_OPTIMIZER}={optimizer_text}): {use.class_name}.backward() "
                                    f"({use.where}) backpropagates {use.inner} under amp.scale_loss with that optimizer",
                          backward.call)
                continue
            loss_code = code_of(backward.loss)
            loss_id_text = f", loss_id={loss_id}" if len(losses) > 1 else ""
            header = f"with {self.amp}.scale_loss({loss_code}, {optimizer_text}{loss_id_text}) as {self.scaled_loss_name}:"
            self.plan.wrap(statement, statement, header)
            # the same call, arguments and all, on the scaled loss
            scaled_call = backward.call.with_changes(
                func=backward.call.func.with_changes(value=cst.Name(self.scaled_loss_name))
            )
            self.plan.replace_call(backward.call, scaled_call)
            self.info("AMP302", f"wrapped {loss_code}.backward() in {self.amp}.scale_loss({loss_code}, {optimizer_text})", backward.call)

    def _plan_penalties(self, unit: TrainingUnit) -> None:
        """Each gradient penalty of the unit takes its gradients of the outputs times the loss scale
        of the loss it is added to, and divides them by it (apex_penalty.py)."""
        losses = distinct_losses(unit)
        for site in sites_of_unit(self.s, unit, self.penalties or {}):
            loss_id = loss_index_of_penalty(self.s, unit, losses, site)
            written = self.penalties_written.get(id(site.call))
            if written is not None:
                if written != loss_id:
                    refuse(site.call, f"the gradient penalty at line {self.s.line(site.call)} is added to losses of two "
                                      "scalers (two training loops call its helper); scale it by hand")
                continue
            scale = write_apex_penalty(self.plan, site, self.amp, loss_id, self.penalty_scale_name)
            if scale is None:
                continue
            self.penalties_written[id(site.call)] = loss_id
            where = where_penalty(self.s, unit, site, None)
            self.info(
                "AMP328",
                f"gradient penalty{where}: torch.autograd.grad now differentiates the outputs times {scale} (in float32), "
                f"and {site.target} is divided by it: the loss scale of the loss it is added to, so an overflow there "
                "skips that step and lowers that scale",
                site.call,
            )

    def _optimizers_after(self, unit: TrainingUnit, backward: BackwardCall, backwards: Sequence[BackwardCall]) -> List[str]:
        """The optimizers whose step consumes this backward's gradients: the first run of steps
        after it (a GAN's D accumulates two backward passes before optimizerD.step())."""
        start = _pos(self.s, backward.call)
        events = sorted(
            [(_pos(self.s, b.call), "backward", None) for b in backwards]
            + [(_pos(self.s, st.call), "step", st.receiver) for st in unit.steps],
            key=lambda event: event[0],
        )
        chosen: List[str] = []
        for position, kind, receiver in events:
            if position <= start:
                continue
            if kind == "step" and receiver not in chosen:
                chosen.append(receiver)
            elif kind == "backward" and chosen:
                break
        return chosen or list(unit.optimizers)

    def _plan_clipping(self, unit: TrainingUnit) -> None:
        for clip in unit.clips:
            if not clip.call.args:
                continue
            first = clip.call.args[0]
            optimizer = (unit.optimizers[0] if len(unit.optimizers) == 1
                         else optimizer_of_gradients(self.s, unit, clip.call, clip=True))
            if optimizer is None:
                # O1 keeps no master copy: the clip reads the model's own gradients, which
                # scale_loss has unscaled on exit, and is right as written
                self.info("AMP303", f"clipping kept as written: with several optimizers ({', '.join(unit.optimizers)}) "
                                    f"ampify cannot tell whose {short_text(code_of(first.value))} are; under O1 they "
                                    "are the model's own parameters, unscaled when amp.scale_loss exits", clip.call)
                continue
            optimizer = self.amp_optimizer(optimizer)
            replacement = cst.parse_expression(f"{self.amp}.master_params({optimizer})")
            arguments = [first.with_changes(value=replacement), *clip.call.args[1:]]
            self.plan.replace_call(clip.call, clip.call.with_changes(args=arguments))
            self.info(
                "AMP303", f"clipping now reads {self.amp}.master_params({optimizer}) instead of {short_text(code_of(first.value))}",
                clip.call,
            )

    def plan_checkpoints(self, setup: ApexSetup, anchor: cst.CSTNode) -> None:
        saves_done = set()
        for save in self.s.optimizer_state_saves:
            element = self.s.parent(save.call)
            dictionary = self.s.parent(element) if isinstance(element, cst.DictElement) else None
            call = self.s.parent(element) if isinstance(element, cst.Arg) and element.keyword is not None else None
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "dict":
                # `state = dict(epoch=..., optimizer=optimizer.state_dict())`
                if id(call) in saves_done or any(a.keyword is not None and a.keyword.value == "amp" for a in call.args):
                    continue
                saves_done.add(id(call))
                self.plan.add_keyword(call, "amp", f"{self.amp}.state_dict()")
                self.info("AMP304", f"the checkpoint also saves {self.amp}.state_dict()", save.call)
                continue
            if not isinstance(dictionary, cst.Dict):
                self.warn(
                    "AMP318", f"{save.receiver}.state_dict() is saved outside a dict literal; save {self.amp}.state_dict() "
                    "with it by hand so that a resumed run keeps its loss scale",
                    save.call,
                )
                continue
            if id(dictionary) in saves_done or _dict_has_key(dictionary, "amp"):
                continue
            saves_done.add(id(dictionary))
            self.plan.add_dict_element(element, "amp", f"{self.amp}.state_dict()")
            self.info("AMP304", f"the checkpoint also saves {self.amp}.state_dict()", save.call)
        last_of_checkpoint = {}
        for load in self.s.optimizer_state_loads:
            argument = load.call.args[0].value if load.call.args else None
            source = argument.value if isinstance(argument, cst.Subscript) else None
            source_name = dotted_name(source) if source is not None else None
            if source_name is not None and _is_lone_expression(load.statement, load.call):
                # `D_optimizer.load_state_dict(ckpt['D'])` then `G_optimizer.load_state_dict(ckpt['G'])`:
                # amp's state is restored once, after the last of them
                last_of_checkpoint[(source_name, id(self.s.block_of(load.statement)))] = load
        for load in self.s.optimizer_state_loads:
            argument = load.call.args[0].value if load.call.args else None
            source = argument.value if isinstance(argument, cst.Subscript) else None
            source_name = dotted_name(source) if source is not None else None
            last = last_of_checkpoint.get((source_name, id(self.s.block_of(load.statement))))
            if last is not None and last is not load:
                self.info("AMP304", f"{self.amp}'s state is restored once from {source_name}, after "
                                    f"{last.receiver}'s load", load.call)
                continue
            if source_name is None or not _is_lone_expression(load.statement, load.call):
                self.warn(
                    "AMP318", f"{load.receiver}.load_state_dict(...) does not read a checkpoint dict ampify can follow; "
                    f"restore {self.amp}.load_state_dict(checkpoint['amp']) by hand",
                    load.call,
                )
                continue
            if load.scope is setup.scope and load.statement is not anchor and self.s.contains(anchor, load.statement):
                # Towards-Realtime-MOT: `if resume:` loads the optimizer's state, and amp.initialize
                # follows the whole if/else (each branch builds the optimizer): neither inside the
                # branch (before initialize) nor after the if (its checkpoint is gone) is right
                self.warn(
                    "AMP319", f"the optimizer state is loaded inside the statement {self.amp}.initialize follows "
                    f"(line {self.s.line(anchor)}), so before it: restore {self.amp}.load_state_dict(checkpoint['amp']) "
                    f"after {self.amp}.initialize by hand",
                    load.call,
                )
                continue
            indent = self.parse_config.default_indent
            code = f'if "amp" in {source_name}:\n{indent}{self.amp}.load_state_dict({source_name}["amp"])'
            before_initialize = load.scope is setup.scope and _pos(self.s, load.statement) < _pos(self.s, anchor)
            # amp.load_state_dict needs the loss scalers amp.initialize creates: never restore before it.
            self.plan.insert_after(anchor if before_initialize else load.statement, code)
            self.info("AMP304", f"the checkpoint load also restores {self.amp}.load_state_dict (when saved)"
                       + (f", after {self.amp}.initialize" if before_initialize else ""), load.call)
            if before_initialize:
                self.warn(
                    "AMP319", f"the optimizer state is loaded before {self.amp}.initialize; apex wants checkpoints loaded "
                    "after it: move the load after amp.initialize",
                    load.call,
                )

    # -- the import

    def add_import(self) -> None:
        module = self.s.module
        new = "from apex import amp" if self.amp == "amp" else f"from apex import amp as {self.amp}"
        anchor = last_leading_import(module)
        if anchor is None:
            first = module.body[0] if module.body else None
            if first is None:
                return
            self.plan.insert_before(first, new)
            self.info("AMP305", "added `from apex import amp`", first)
        else:
            self.plan.insert_after(anchor, new)
            self.info("AMP305", "added `from apex import amp`", anchor)


# ---- small CST helpers ---------------------------------------------------------------------


def _pos(structure: TrainingStructure, node: cst.CSTNode) -> Tuple[int, int]:
    position = structure.position(node)
    return (position.line, position.column)


def _only_moves(statement: cst.CSTNode, name: str) -> bool:
    """`model.to(device)`, `model.cuda()`, `model = model.cuda(args.gpu)`: nothing but a device move."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if isinstance(small, cst.Expr):
        value = small.value
    elif isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted_name(small.targets[0].target) == name:
        value = small.value
    else:
        return False
    return (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("cuda", "to") and dotted_name(value.func.value) == name
    )


def _assigned_name(statement: cst.CSTNode, call: cst.Call) -> Optional[str]:
    """`net` for `net = DataParallel(x)` or `net = DataParallel(x).cuda()`: the name the call's
    result is bound to, when the statement is that one assignment."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    value = assign.value
    while isinstance(value, cst.Call) and value is not call and isinstance(value.func, cst.Attribute):
        value = value.func.value  # `.cuda()` / `.to(device)` chained on the wrap
    return dotted_name(assign.targets[0].target) if value is call else None


def _is_rewrap(statement: cst.CSTNode, wrapped: str) -> bool:
    """`model = nn.DataParallel(model, ...)` (optionally followed by `.cuda()`/`.to()`)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    assign = statement.body[0]
    return (
        isinstance(assign, cst.Assign)
        and len(assign.targets) == 1
        and dotted_name(assign.targets[0].target) == wrapped
    )


def _uses_other_than_parameters(statement: cst.CSTNode, name: str) -> bool:
    """Does `statement` use `name` other than as `name.parameters()`? (`named_parameters()` of a
    wrap prefix every name with `module.`, so a filter on the names may select other tensors.)"""
    uses = 0
    parameter_uses = 0

    class _Uses(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
            nonlocal uses
            if dotted_name(node) == name:
                uses += 1
                return False
            return True

        def visit_Name(self, node: cst.Name) -> None:
            nonlocal uses
            if node.value == name:
                uses += 1

        def visit_Call(self, node: cst.Call) -> None:
            nonlocal parameter_uses
            if (
                isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "parameters"
                and dotted_name(node.func.value) == name
            ):
                parameter_uses += 1

    walk(statement, _Uses())
    return uses > parameter_uses


def _is_lone_expression(statement: cst.CSTNode, call: cst.Call) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and statement.body[0].value is call
    )


def _dict_has_key(dictionary: cst.Dict, key: str) -> bool:
    for element in dictionary.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            if element.key.evaluated_value == key:
                return True
    return False


