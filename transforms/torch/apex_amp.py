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

from dataclasses import dataclass, field
from typing import Dict, List, NoReturn, Optional, Sequence, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.torch import names as names
from ampify.transforms.torch import screen as torch_screen
from ampify.transforms.base import Transform, TransformResult, Verdict
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.torch.edits import StatementEdits, apply_edits
from ampify.transforms.torch.helper_backwards import call_of_unfollowed_backward, helper_refusal_note, distinct_losses, pair_helper_backwards
from ampify.transforms.torch.statements import calls_within, code_of
from ampify.transforms.torch.step_plan import StepPlanner
from ampify.transforms.torch.training_loop import (
    BackwardCall,
    Binding,
    CallSite,
    Scope,
    TrainingStructure,
    TrainingUnit,
    Unconvertible,
    analyze_training,
    concerns_torch,
    may_concern_torch_training,
    training_without_torch_import,
    units_outside_mixed_precision,
)

#: hazards that make apex amp raise at run time: the file is not converted
_BLOCKING_HAZARDS = {
    "bce": (
        "AMP310",
        "{detail} under apex amp raises at run time (apex bans binary_cross_entropy on fp16 inputs); "
        "compute the loss with nn.BCEWithLogitsLoss / F.binary_cross_entropy_with_logits on logits, "
        "then run ampify again",
    ),
    "fsdp": (
        "AMP320",
        "{detail}: apex amp does not support FullyShardedDataParallel; this file is left unconverted "
        "(use the native backend, e.g. --dtype bfloat16, or FSDP's MixedPrecision policy)",
    ),
    "manual_half": (
        "AMP321",
        "{detail}: this script casts to half precision by hand; amp.initialize raises on float16 model "
        "parameters (it expects float32 models and does the casting itself): remove the manual casts and run "
        "ampify again; this file is left unconverted",
    ),
    "closure": (
        "AMP311",
        "{detail}.step(closure): apex amp does not support optimizer closures (LBFGS and friends); "
        "this file is left unconverted",
    ),
}
#: hazards that need the user's attention but do not stop the conversion
_WARNING_HAZARDS = {
    "create_graph": (
        "AMP312",
        "torch.autograd.grad(..., create_graph=True) (a gradient penalty?) is not loss-scaled by "
        "amp.scale_loss; scale the inputs of the penalty by hand (see apex's docs on gradient penalties)",
    ),
    "masked_fill": (
        "AMP313",
        "masked_fill with {detail} overflows float16 under apex O1; use a value within the float16 range "
        "(e.g. -1e4) or torch.finfo(scores.dtype).min",
    ),
    "wrapper_class": (
        "AMP314",
        "class {detail} steps an optimizer inside its own step(); ampify cannot follow it: call "
        "amp.initialize on the inner optimizer and wrap its backward in amp.scale_loss by hand",
    ),
    "autograd_backward": (
        "AMP315",
        "torch.autograd.backward(...) is not rewritten; use `with amp.scale_loss(loss, optimizer) as "
        "scaled_loss: scaled_loss.backward()` by hand",
    ),
    "sigmoid": None,  # reported together with BCE only
}


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

    def apply(self, module: cst.Module, imports: ImportMap, options: Options) -> TransformResult:
        structure = analyze_training(module, imports)
        pair_helper_backwards(structure)
        return _ApexConversion(structure, options).run()


@dataclass
class _Setup:
    """Where the models and optimizers of one training unit are created."""

    scope: Scope
    optimizers: List[str]  # names as seen in the setup scope
    models: List[str]
    construction_statements: List[cst.CSTNode]
    #: unit optimizer name -> setup-scope name
    renames: Dict[str, str] = field(default_factory=dict)


class _ApexConversion:
    """Plans and applies the apex rewrite of one module."""

    def __init__(self, structure: TrainingStructure, options: Options) -> None:
        self.s = structure
        self.options = options
        self.findings: List[Finding] = []
        self.plan = StatementEdits()
        self.amp = "amp" if "amp" not in structure.all_names else structure.fresh_name("apex_amp")
        self.scaled_loss_name = structure.fresh_name("scaled_loss", "scaled")
        self.parse_config = structure.module.config_for_parsing
        #: (training unit, setup scope) whose amp.initialize is planned: apex allows one call per
        #: process, so a second unit set up in the same scope is refused (other classes/functions
        #: are usually alternative trainers and keep their own)
        self.initialize_planned: Optional[Tuple[TrainingUnit, Scope]] = None
        self._last_setup_scope: Optional[Scope] = None

    # ---- findings -----------------------------------------------------------------------

    def _note(self, code: str, node: cst.CSTNode, message: str, severity: Severity = Severity.INFO) -> None:
        position = self.s.position(node)
        self.findings.append(Finding(code, message, position.line, position.column, severity))

    def _warn(self, code: str, node: cst.CSTNode, message: str) -> None:
        self._note(code, node, message, Severity.WARNING)

    def _result(self, verdict: Verdict, reason: str = "", module: Optional[cst.Module] = None) -> TransformResult:
        return TransformResult(module or self.s.module, verdict, self.findings, reason)

    # ---- the whole module ---------------------------------------------------------------

    def run(self) -> TransformResult:
        s = self.s
        if not (s.imports.uses("torch") or s.imports.uses("apex")):
            backward = training_without_torch_import(s)
            if backward is None:
                return self._result(Verdict.NOT_APPLICABLE, "does not import torch")
            self._warn(
                "AMP323", backward,
                "this file trains (backward() and an optimizer step) but never imports torch by name (the "
                "model and optimizer come from elsewhere, or torch through `from ... import *`); nothing "
                "converted: add `import torch` to this file and rerun ampify, or convert by hand",
            )
            return self._result(Verdict.UNCONVERTED, "trains without importing torch; see the warning")
        if s.hand_written_mixed_precision is not None and (s.backwards or s.steps):
            what, node = s.hand_written_mixed_precision
            return self._result(
                Verdict.ALREADY_MIXED_PRECISION,
                f"already in mixed precision by hand ({what}, line {s.line(node)}); adding AMP would stack a "
                "second loss scale on it",
            )
        if s.mixed_precision_uses:
            outside = units_outside_mixed_precision(s)
            for unit, use in outside:
                self._warn(
                    "AMP322", unit.backwards[0].call,
                    f"this file uses mixed precision (line {s.line(use)}) but not around this training step: "
                    "it may still train in float32; nothing converted because the file already uses torch.amp / "
                    "apex amp: convert this step by hand",
                )
            if outside:
                return self._result(Verdict.UNCONVERTED, "mixed precision is used, but not around the training step")
            used = dotted_name(s.mixed_precision_uses[0]) or "torch.amp / apex amp"
            return self._result(Verdict.ALREADY_MIXED_PRECISION, f"already uses {used}")
        if s.loop_owning_framework:
            advice = names.LOOP_OWNING_FRAMEWORKS[s.loop_owning_framework]
            return self._result(Verdict.NOT_APPLICABLE, advice)
        if not s.backwards and not s.steps:
            return self._result(Verdict.NOTHING_TO_DO, "no backward() or optimizer step (inference or library code)")

        blocked = self._report_hazards()
        if blocked:
            return self._result(Verdict.UNCONVERTED, "apex amp would raise on this script (see the warnings)")
        for backward in s.unpaired_backwards:
            followed = helper_refusal_note(s, backward)
            self._warn(
                "AMP316", backward.call,
                f"backward() with no optimizer step that ampify can identify in the same loop or function{followed}; "
                "not converted: wrap it in `with amp.scale_loss(loss, optimizer) as scaled_loss:` by hand",
            )
        converted_units = 0
        for unit in s.units:
            attempt = self.plan.copy()
            findings_before = len(self.findings)
            try:
                self._convert_unit(unit)
                converted_units += 1
                self.initialize_planned = (unit, self._last_setup_scope)
            except Unconvertible as refusal:
                self.plan = attempt  # drop the half-planned edits of a refused unit
                del self.findings[findings_before:]
                self._warn(
                    "AMP317", refusal.node or unit.backwards[0].call,
                    f"{refusal}; this training loop is left unconverted",
                )
        if converted_units == 0:
            return self._result(Verdict.UNCONVERTED, "training code found, but none of it could be converted safely")
        self._add_import()
        new_module = apply_edits(s.module, self.plan)
        return self._result(Verdict.CONVERTED, module=new_module)

    def _report_hazards(self) -> bool:
        blocked = False
        bce_found = any(h.kind == "bce" for h in self.s.hazards)
        for hazard in self.s.hazards:
            if hazard.kind in _BLOCKING_HAZARDS:
                code, template = _BLOCKING_HAZARDS[hazard.kind]
                message = template.format(detail=_short(hazard.detail) or "this call")
                if hazard.kind == "bce" and any(h.kind == "sigmoid" for h in self.s.hazards):
                    message += "; the model ends in nn.Sigmoid in this file: drop it and feed logits"
                self._warn(code, hazard.node, message)
                blocked = True
            elif _WARNING_HAZARDS.get(hazard.kind):
                code, template = _WARNING_HAZARDS[hazard.kind]
                self._warn(code, hazard.node, template.format(detail=hazard.detail))
            elif hazard.kind == "sigmoid" and not bce_found:
                continue
        return blocked


    # ---- one training unit ---------------------------------------------------------------

    @staticmethod
    def _refuse(node: cst.CSTNode, message: str) -> NoReturn:
        """This training unit cannot be converted safely: say why, and where."""
        raise Unconvertible(message, node)

    def _convert_unit(self, unit: TrainingUnit) -> None:
        """Plan the whole conversion of one training unit, or raise Unconvertible."""
        if not unit.steps:
            self._refuse(unit.backwards[0].call, "no optimizer step found for this backward()")
        unfollowed = call_of_unfollowed_backward(self.s, unit)
        if unfollowed is not None:
            self._refuse(unfollowed[1], unfollowed[0])
        setup = self._find_setup(unit)
        if self.initialize_planned is not None and self.initialize_planned[1] is setup.scope:
            self._refuse(
                unit.backwards[0].call,
                f"apex allows one {self.amp}.initialize per process and the training loop at line "
                f"{self.s.line(self.initialize_planned[0].backwards[0].call)} already gets one from the same setup; "
                f"pass every model and optimizer of both loops to a single {self.amp}.initialize(..., num_losses=N) "
                "by hand",
            )
        self._check_models_reach_the_gpu(setup)
        self._last_setup_scope = setup.scope
        anchor = self._initialize_anchor(unit, setup)
        self._plan_initialize(unit, setup, anchor)
        self._plan_parallel_wraps(setup, anchor)
        self._plan_backwards(unit)
        self._plan_index_assignment_casts(unit)
        self._plan_clipping(unit)
        self._plan_checkpoints(setup, anchor)

    # -- where the optimizers and models are built

    def _find_setup(self, unit: TrainingUnit) -> _Setup:
        scopes: List[Scope] = []
        optimizers: List[str] = []
        models: List[str] = []
        statements: List[cst.CSTNode] = []
        renames: Dict[str, str] = {}
        for optimizer in unit.optimizers:
            step = next(st for st in unit.steps if st.receiver == optimizer)
            binding, setup_name = self._construction(optimizer, step.scope, step.call, depth=0)
            scopes.append(binding.scope)
            optimizers.append(setup_name)
            renames[optimizer] = setup_name
            statements.append(binding.statement)
            model_names = self._models_of(binding)
            if not model_names:
                self._refuse(
                    binding.statement,
                    f"cannot tell which model {setup_name} trains (no `<model>.parameters()` in its arguments); "
                    f"call {self.amp}.initialize(model, {setup_name}) by hand",
                )
            for model in model_names:
                if model not in models:
                    models.append(model)
        if any(scope is not scopes[0] for scope in scopes):
            self._refuse(unit.steps[0].call, "the optimizers of this loop are created in different functions")
        return _Setup(scopes[0], optimizers, models, statements, renames)

    def _plan_index_assignment_casts(self, unit: TrainingUnit) -> None:
        """Under O1 model outputs are float16: `values[mask] = net(x)` into a float32 tensor
        raises, so the value is cast to the tensor's dtype (a no-op in float32)."""
        planner = StepPlanner(self.s, self.s.imports)
        for node, target in planner.index_assignments_to_cast(unit.owner, unit.scope):
            self.plan.cast_assigned_value(node, f"{target}.dtype")
            self._note(
                "AMP302", node,
                f"the value assigned into {target}[...] is cast to {target}.dtype: apex O1 makes it float16, and "
                "index assignment into a float32 tensor needs equal dtypes",
            )

    def _check_models_reach_the_gpu(self, setup: _Setup) -> None:
        """amp.initialize raises on models whose parameters are not on a CUDA device. Refuse when
        the models are built in this file and nothing in it moves anything to a device (a CPU
        script, e.g. a small RL example): the converted script would crash at amp.initialize."""
        s = self.s
        if s.uses_cuda_method or s.to_device_arguments or s.device_bindings or s.parallel_wraps:
            return
        for model in setup.models:
            built = [
                b for b in s.bindings_visible(model, setup.scope)
                if b.kind in ("assign", "attribute") and isinstance(b.value, cst.Call)
            ]
            if not built:
                return  # the model comes from elsewhere (a parameter): it may be on the GPU already
        self._refuse(
            setup.construction_statements[0],
            f"{self.amp}.initialize needs the models on a CUDA device, and nothing in this file moves "
            f"{', '.join(setup.models)} there (no .cuda() / .to(device) here; a helper of another module that "
            "moves it is not followed yet: ampify reads one file at a time); move the model to the GPU in this file, "
            "then rerun ampify",
        )

    def _construction(self, name: str, scope: Scope, use: cst.CSTNode, depth: int) -> Tuple[Binding, str]:
        """The binding that creates optimizer `name` as seen from `scope`, following function
        parameters to the in-file call sites (a few levels deep)."""
        bindings = self.s.bindings_visible(name, scope)
        constructions = [b for b in bindings if b.kind in ("assign", "attribute") and isinstance(b.value, cst.Call)]
        if constructions:
            if len({id(b.scope) for b in constructions}) > 1:
                self._refuse(use, f"{name} is created in several functions")
            return constructions[-1], name
        parameters = [b for b in bindings if b.kind == "parameter"]
        if not parameters or depth >= 3 or not isinstance(parameters[0].scope, cst.FunctionDef):
            self._refuse(use, self.s.not_found_reason(name, scope))
        function = parameters[0].scope
        callers = self._call_sites_of(function)
        if not callers:
            self._refuse(function, f"{name} is a parameter of {function.name.value}(), which is not called in this file")
        found: List[Tuple[Binding, str]] = []
        for call, caller_scope in callers:
            argument = _argument_for(function, name, call)
            argument_name = dotted_name(argument) if argument is not None else None
            if argument_name is None:
                self._refuse(call, f"{function.name.value}() is called without a plain name for {name}")
            found.append(self._construction(argument_name, caller_scope, call, depth + 1))
        if any(f[0] is not found[0][0] for f in found):
            self._refuse(function, f"{function.name.value}() is called with different optimizers")
        return found[0]

    def _call_sites_of(self, function: cst.FunctionDef) -> List[Tuple[cst.Call, Scope]]:
        name = function.name.value
        sites = []
        for node in calls_within(self.s.module):
            callee = dotted_name(node.func)
            if callee == name or (callee and callee.startswith("self.") and callee[5:] == name):
                statement = self.s.statement_of(node)
                sites.append((node, self.s.scope_of(statement or node)))
        return sites

    def _models_of(self, binding: Binding) -> List[str]:
        """The models an optimizer trains: receivers of `.parameters()` / `.named_parameters()` in
        its arguments, following one assignment (`params = model.parameters()`). A submodule
        (`model.classifier.parameters()`) stands for its model (`model`)."""
        found: List[str] = []
        sources = [binding.value]
        for argument in binding.value.args:
            argument_name = dotted_name(argument.value)
            if argument_name is not None:
                sources += [b.value for b in self.s.bindings_visible(argument_name, binding.scope) if b.value is not None]
        for source in sources:
            for call in calls_within(source):
                if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("parameters", "named_parameters"):
                    receiver = _model_root(dotted_name(call.func.value))
                    if receiver and receiver not in found:
                        found.append(receiver)
        return found

    # -- amp.initialize

    def _initialize_anchor(self, unit: TrainingUnit, setup: _Setup) -> cst.CSTNode:
        """The statement after which amp.initialize goes: the last construction, moved past any
        later `.cuda()` / `.to(...)` of a model in the same block."""
        paths = [self.s.block_path(statement) for statement in setup.construction_statements]
        common = _deepest_common_block(paths)
        if common is None:
            self._refuse(setup.construction_statements[0], "the optimizers are created in unrelated blocks")
        block, holders = common
        body = list(block.body)
        index = max(_index_of(body, holder) for holder in holders)
        for later in body[index + 1:]:
            if self.s.contains(later, unit.owner) or any(self.s.contains(later, b.call) for b in unit.backwards):
                break
            if _moves_a_model(later, setup.models):
                index = _index_of(body, later)
        anchor = body[index]
        if any(self.s.contains(anchor, b.call) for b in unit.backwards):
            self._refuse(anchor, "the optimizer is created in the same statement that trains")
        return anchor

    def _plan_initialize(self, unit: TrainingUnit, setup: _Setup, anchor: cst.CSTNode) -> None:
        models = setup.models
        optimizers = setup.optimizers
        model_text = models[0] if len(models) == 1 else "[" + ", ".join(models) + "]"
        optimizer_text = optimizers[0] if len(optimizers) == 1 else "[" + ", ".join(optimizers) + "]"
        arguments = f'{model_text}, {optimizer_text}, opt_level="{self.options.apex_opt_level}"'
        losses = len(distinct_losses(unit))
        if losses > 1:
            arguments += f", num_losses={losses}"
        self.plan.insert_after(anchor, f"{model_text}, {optimizer_text} = {self.amp}.initialize({arguments})")
        self._note(
            "AMP301", anchor,
            f"added {self.amp}.initialize({model_text}, {optimizer_text}, opt_level=\"{self.options.apex_opt_level}\") "
            "after the optimizer is created",
        )

    def _plan_parallel_wraps(self, setup: _Setup, anchor: cst.CSTNode) -> None:
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
                self._refuse(
                    wrap.call,
                    f"{bound_to} is bound to a DataParallel/DistributedDataParallel wrap of {wrapped or 'a model'} at "
                    f"line {self.s.line(wrap.statement)} (when that code runs), and {self.amp}.initialize rejects "
                    f"wrapped models; call {self.amp}.initialize({wrapped or 'model'}, optimizer) before the wrap by hand",
                )
            if wrapped not in setup.models:
                continue
            statement = wrap.statement
            if self.s.position(statement).line > self.s.position(anchor).line:
                continue  # already after amp.initialize
            if self.s.block_of(statement) is not anchor_block or not _is_rewrap(statement, wrapped):
                self._refuse(
                    wrap.call,
                    f"{wrapped} is wrapped in DataParallel/DistributedDataParallel before the optimizer exists, "
                    f"and apex needs the wrap after {self.amp}.initialize; move the wrap after it by hand",
                )
            body = list(anchor_block.body)
            between = body[_index_of(body, statement) + 1 : _index_of(body, anchor) + 1]
            # A device move of the wrapped model in between moves the same parameters with or
            # without the wrap (DataParallel/DDP have none of their own): the wrap may still move.
            if any(_uses_other_than_parameters(node, wrapped) and not _only_moves(node, wrapped) for node in between):
                self._refuse(
                    wrap.call,
                    f"{wrapped} is used between its DataParallel/DDP wrap and {self.amp}.initialize, so the wrap "
                    "cannot be moved safely; move it after amp.initialize by hand",
                )
            self.plan.remove_statement(statement)
            self.plan.insert_after(anchor, code_of(statement).strip("\n"))
            self._note("AMP306", wrap.call, f"moved the parallel wrap of {wrapped} after {self.amp}.initialize (apex requires it)")

    # -- backward, clipping, checkpoints

    def _plan_backwards(self, unit: TrainingUnit) -> None:
        backwards = sorted(unit.backwards, key=lambda b: _pos(self.s, b.call))
        losses = distinct_losses(unit)
        optimizers_of: Dict[int, List[str]] = {}
        for site in backwards:
            # a backward() in a helper method (`self.backward_D()`) is wrapped where it runs, once,
            # with the optimizers stepped after the helper call(s) that reach it
            backward = site.delegation.inner if site.delegation is not None else site
            optimizers = self._optimizers_after(unit, site, backwards)
            if optimizers_of.setdefault(id(backward.call), optimizers) != optimizers:
                self._refuse(
                    site.call,
                    f"the backward() at line {self.s.line(backward.call)} feeds different optimizers depending on "
                    "which helper call reaches it; ampify cannot give it one amp.scale_loss",
                )
        for backward in losses:
            statement = backward.statement
            if not _is_lone_expression(statement, backward.call):
                self._refuse(
                    backward.call, "backward() is not a statement of its own; ampify cannot wrap it in amp.scale_loss"
                )
            optimizers = optimizers_of[id(backward.call)]
            loss_id = losses.index(backward)
            optimizer_text = optimizers[0] if len(optimizers) == 1 else "[" + ", ".join(optimizers) + "]"
            loss_code = code_of(backward.loss)
            loss_id_text = f", loss_id={loss_id}" if len(losses) > 1 else ""
            header = f"with {self.amp}.scale_loss({loss_code}, {optimizer_text}{loss_id_text}) as {self.scaled_loss_name}:"
            self.plan.wrap(statement, statement, header)
            # the same call, arguments and all, on the scaled loss
            scaled_call = backward.call.with_changes(
                func=backward.call.func.with_changes(value=cst.Name(self.scaled_loss_name))
            )
            self.plan.replace_call(backward.call, scaled_call)
            self._note("AMP302", backward.call, f"wrapped {loss_code}.backward() in {self.amp}.scale_loss({loss_code}, {optimizer_text})")

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
            optimizer = self._step_after(unit, clip) or unit.optimizers[0]
            first = clip.call.args[0]
            replacement = cst.parse_expression(f"{self.amp}.master_params({optimizer})")
            arguments = [first.with_changes(value=replacement), *clip.call.args[1:]]
            self.plan.replace_call(clip.call, clip.call.with_changes(args=arguments))
            self._note(
                "AMP303", clip.call,
                f"clipping now reads {self.amp}.master_params({optimizer}) instead of {_short(code_of(first.value))}",
            )

    def _step_after(self, unit: TrainingUnit, site: CallSite) -> Optional[str]:
        start = _pos(self.s, site.call)
        for step in sorted(unit.steps, key=lambda st: _pos(self.s, st.call)):
            if _pos(self.s, step.call) > start:
                return step.receiver
        return None

    def _plan_checkpoints(self, setup: _Setup, anchor: cst.CSTNode) -> None:
        saves_done = set()
        for save in self.s.optimizer_state_saves:
            element = self.s.parent(save.call)
            dictionary = self.s.parent(element) if isinstance(element, cst.DictElement) else None
            if not isinstance(dictionary, cst.Dict):
                self._warn(
                    "AMP318", save.call,
                    f"{save.receiver}.state_dict() is saved outside a dict literal; save {self.amp}.state_dict() "
                    "with it by hand so that a resumed run keeps its loss scale",
                )
                continue
            if id(dictionary) in saves_done or _dict_has_key(dictionary, "amp"):
                continue
            saves_done.add(id(dictionary))
            self.plan.add_dict_element(element, "amp", f"{self.amp}.state_dict()")
            self._note("AMP304", save.call, f"the checkpoint also saves {self.amp}.state_dict()")
        for load in self.s.optimizer_state_loads:
            argument = load.call.args[0].value if load.call.args else None
            source = argument.value if isinstance(argument, cst.Subscript) else None
            source_name = dotted_name(source) if source is not None else None
            if source_name is None or not _is_lone_expression(load.statement, load.call):
                self._warn(
                    "AMP318", load.call,
                    f"{load.receiver}.load_state_dict(...) does not read a checkpoint dict ampify can follow; "
                    f"restore {self.amp}.load_state_dict(checkpoint['amp']) by hand",
                )
                continue
            indent = self.parse_config.default_indent
            code = f'if "amp" in {source_name}:\n{indent}{self.amp}.load_state_dict({source_name}["amp"])'
            before_initialize = load.scope is setup.scope and _pos(self.s, load.statement) < _pos(self.s, anchor)
            # amp.load_state_dict needs the loss scalers amp.initialize creates: never restore before it.
            self.plan.insert_after(anchor if before_initialize else load.statement, code)
            self._note("AMP304", load.call, f"the checkpoint load also restores {self.amp}.load_state_dict (when saved)"
                       + (f", after {self.amp}.initialize" if before_initialize else ""))
            if before_initialize:
                self._warn(
                    "AMP319", load.call,
                    f"the optimizer state is loaded before {self.amp}.initialize; apex wants checkpoints loaded "
                    "after it: move the load after amp.initialize",
                )

    # -- the import

    def _add_import(self) -> None:
        module = self.s.module
        new = "from apex import amp" if self.amp == "amp" else f"from apex import amp as {self.amp}"
        anchor = _last_leading_import(module)
        if anchor is None:
            first = module.body[0] if module.body else None
            if first is None:
                return
            self.plan.insert_before(first, new)
            self._note("AMP305", first, "added `from apex import amp`")
        else:
            self.plan.insert_after(anchor, new)
            self._note("AMP305", anchor, "added `from apex import amp`")


# ---- small CST helpers ---------------------------------------------------------------------


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pos(structure: TrainingStructure, node: cst.CSTNode) -> Tuple[int, int]:
    position = structure.position(node)
    return (position.line, position.column)


def _index_of(body: Sequence[cst.CSTNode], statement: cst.CSTNode) -> int:
    for index, item in enumerate(body):
        if item is statement:
            return index
    raise ValueError("statement not in block")


def _deepest_common_block(paths):
    """The innermost block that holds every path, with the statement of each path in it."""
    if not paths or any(not path for path in paths):
        return None
    for block, _ in paths[0]:
        holders = []
        for path in paths:
            holder = next((statement for b, statement in path if b is block), None)
            if holder is None:
                break
            holders.append(holder)
        else:
            return block, holders
    return None


def _model_root(receiver: Optional[str]) -> Optional[str]:
    """`model.encoder` -> `model`, `self.model.head` -> `self.model`: amp.initialize takes models."""
    if receiver is None:
        return None
    parts = receiver.split(".")
    keep = 2 if parts[0] == "self" and len(parts) > 1 else 1
    return ".".join(parts[:keep])


def _argument_for(function: cst.FunctionDef, parameter: str, call: cst.Call) -> Optional[cst.BaseExpression]:
    """The expression a call passes for `parameter` of `function` (positional or keyword)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == parameter:
            return arg.value
    positional = [p.name.value for p in list(function.params.posonly_params) + list(function.params.params)]
    if isinstance(call.func, cst.Attribute) and positional and positional[0] == "self":
        positional = positional[1:]
    if parameter not in positional:
        return None
    index = positional.index(parameter)
    plain = [arg for arg in call.args if arg.keyword is None and not arg.star]
    return plain[index].value if index < len(plain) else None


def _moves_a_model(statement: cst.CSTNode, models: Sequence[str]) -> bool:
    """`model.cuda()`, `model.to(device)`, `model = model.cuda()` and the like, also inside a
    compound statement (`if args.cuda: model.cuda()`): amp.initialize must come after every
    move that may run. A function or class defined here moves nothing yet."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return False
    for call in calls_within(statement):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("cuda", "to", "half"):
            if dotted_name(call.func.value) in models:
                return True
    return False


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
    """Does `statement` use `name` other than as `name.parameters()`/`name.named_parameters()`?"""
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
                and node.func.attr.value in ("parameters", "named_parameters")
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


def _last_leading_import(module: cst.Module) -> Optional[cst.CSTNode]:
    """The last import statement of the module's opening run of imports."""
    last = None
    for index, statement in enumerate(module.body):
        if isinstance(statement, cst.SimpleStatementLine):
            if all(isinstance(item, (cst.Import, cst.ImportFrom)) for item in statement.body):
                last = statement
                continue
            if index == 0 and isinstance(statement.body[0], cst.Expr) and isinstance(
                statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString)
            ):
                continue  # the module docstring
        if isinstance(statement, cst.Try) and last is not None:
            continue  # try: import x / except ImportError: ... among the imports
        if last is not None:
            break
    return last
