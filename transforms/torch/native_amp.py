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

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch import screen as torch_screen
from ampify.transforms.base import Transform, TransformResult, Verdict
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.torch.checkpoints import CheckpointWriter
from ampify.transforms.torch.edits import StatementEdits, apply_edits
from ampify.transforms.torch.helper_backwards import call_of_unfollowed_backward, helper_refusal_note, pair_helper_backwards
from ampify.transforms.torch.step_plan import StepPlanner
from ampify.transforms.torch.training_loop import (
    Unconvertible,
    Block,
    Scope,
    TrainingStructure,
    TrainingUnit,
    analyze_training,
    concerns_torch,
    may_concern_torch_training,
    method_calls,
    training_without_torch_import,
    units_outside_mixed_precision,
)

# The codes this transform emits and what each means: ampify/rules.py (AMP2xx).


@dataclass
class _ScalerHome:
    """Where a scaler is created and how code refers to it."""

    scope: Scope
    reference: str  # "scaler" or "self.scaler"
    after: cst.CSTNode  # the statement the creation goes after
    device_scope: Scope
    line: int  # line of `after`, for findings and ordering checks
    optimizers: List[str] = field(default_factory=list)


@dataclass
class _UnitPlan:
    """Everything to write for one training unit."""

    unit: TrainingUnit
    reference: str  # how the unit's code refers to the scaler
    regions: List[Tuple[Block, int, int]]  # (block, first index, last index) to wrap in autocast
    update_after: Optional[cst.CSTNode] = None
    #: steps in a branch that leaves the iteration (`continue`): scaler.update() after them too
    early_exit_updates: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    unscale_before: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    home: Optional[_ScalerHome] = None
    #: functions that receive the scaler as a new parameter, with their in-file calls
    threaded_function: Optional[cst.FunctionDef] = None
    threaded_calls: List[Tuple[cst.Call, str]] = field(default_factory=list)  # (call, scaler reference)
    caller_homes: List[_ScalerHome] = field(default_factory=list)


class TorchNativeAmp(Transform):
    name = "torch-native-amp"
    internal_error_code = "AMP200"
    description = "Add torch.autocast and torch.amp.GradScaler to PyTorch training steps."

    def may_apply(self, source: bytes, options: Options) -> bool:
        return options.backend == "native" and may_concern_torch_training(source)

    screened_out_reason = torch_screen.SCREENED_OUT_REASON

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        return torch_screen.may_concern_torch_training_code(facts)

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return options.backend == "native" and concerns_torch(imports)

    def apply(self, module: cst.Module, imports: ImportMap, options: Options) -> TransformResult:
        return _NativeRewrite(module, imports, options).run()


class _NativeRewrite:
    """One module's conversion: analysis, safety checks, plan, edits."""

    def __init__(self, module: cst.Module, imports: ImportMap, options: Options) -> None:
        self.module = module
        self.imports = imports
        self.options = options
        self.scaling = options.dtype == "float16"
        self.findings: List[Finding] = []
        self.structure: TrainingStructure
        self.torch = self._torch_name()
        self.edits = StatementEdits()
        self.homes: Dict[int, _ScalerHome] = {}
        #: the device expression each created GradScaler got, by the statement it follows
        self.scaler_devices: Dict[int, str] = {}
        self.scaler_name = "scaler"
        self.unit_of_function: Dict[int, _UnitPlan] = {}
        #: ids of backward() calls already rewritten (a helper's backward is reached from several units)
        self.scaled_backwards: Set[int] = set()

    # ---- driver -----------------------------------------------------------------------

    def run(self) -> TransformResult:
        s = self.structure = analyze_training(self.module, self.imports)
        pair_helper_backwards(s)
        self.planner = StepPlanner(s, self.imports)
        self.module = s.module
        if not self.imports.uses("torch"):
            return self._without_torch_import()
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
                    "AMP218",
                    f"this file uses mixed precision (line {s.line(use)}) but not around this training step: "
                    "its forward pass may still run in float32; nothing converted because the file already "
                    "uses torch.amp: put the training step under torch.autocast (and GradScaler) by hand",
                    unit.backwards[0].call,
                )
            if outside:
                return self._result(Verdict.UNCONVERTED, "mixed precision is used, but not around the training step")
            return self._result(Verdict.ALREADY_MIXED_PRECISION, "already uses torch.amp / torch.cuda.amp / apex amp")
        if s.loop_owning_framework:
            return self._result(Verdict.NOT_APPLICABLE, names.LOOP_OWNING_FRAMEWORKS[s.loop_owning_framework])
        has_training = bool(s.backwards) or any(h.kind == "autograd_backward" for h in s.hazards)
        self._warn_hazards(has_training)
        if not has_training and s.steps:
            step = s.steps[0]
            self._warn(
                "AMP219",
                f"{step.receiver}.step() but no backward() in this file: the backward pass runs elsewhere "
                "(a helper in another module?); nothing converted here, convert that training step by hand",
                step.call,
            )
            return self._result(Verdict.UNCONVERTED, "optimizer steps without a backward() call in this file")
        if not has_training:
            reason = "no backward() call: no training step here (inference or model code)"
            return self._result(Verdict.NOTHING_TO_DO, reason)
        if self._file_blocked():
            return self._result(Verdict.UNCONVERTED, "mixed precision would break this file; see the warnings")

        self.scaler_name = s.fresh_name("scaler", "grad_scaler", "amp_scaler")
        for backward in s.unpaired_backwards:
            followed = helper_refusal_note(s, backward)
            self._warn(
                "AMP220",
                "backward() here has no optimizer step in the same loop or function that ampify can "
                f"identify (wrapped or hidden optimizer?){followed}; this backward is not converted: add "
                "autocast, scaler.scale(loss).backward() and scaler.step()/update() by hand",
                backward.call,
            )
        plans = []
        for unit in s.units:
            saved_homes = dict(self.homes)
            saved_findings = list(self.findings)
            try:
                plans.append(self._plan_unit(unit))
            except Unconvertible as problem:
                self.homes = saved_homes
                self.findings = saved_findings
                node = problem.node or (unit.backwards[0].call if unit.backwards else unit.owner)
                self._warn("AMP215", f"{problem}; this training step was left unconverted", node)
        if not plans:
            return self._result(Verdict.UNCONVERTED, "training code found, but no training step could be converted safely")
        for plan in plans:
            self._write_unit(plan)
        if self.scaling:
            converted = {r for p in plans for r in p.unit.optimizers}
            converted |= {r for home in self.homes.values() for r in home.optimizers}
            CheckpointWriter(
                s, self.imports, self.edits, self.torch,
                lambda scope, line: self._scaler_reference_in(scope, line, plans),
                self._info, self._warn,
            ).write(converted)
        new_module = apply_edits(self.module, self.edits)
        if self.torch_import_needed:
            new_module = _add_import_torch(new_module)
        return self._result(Verdict.CONVERTED, "", new_module)

    def _without_torch_import(self) -> TransformResult:
        """The file does not import torch: report training code, never rewrite it (ampify cannot
        tell which names are torch's)."""
        backward = training_without_torch_import(self.structure)
        if backward is None:
            return self._result(Verdict.NOT_APPLICABLE, "does not import torch")
        self._warn(
            "AMP221",
            "this file trains (backward() and an optimizer step) but never imports torch by name (the "
            "model and optimizer come from elsewhere, or torch through `from ... import *`); nothing "
            "converted: add `import torch` to this file and rerun ampify, or convert by hand",
            backward,
        )
        return self._result(Verdict.UNCONVERTED, "trains without importing torch; see the warning")

    def _result(self, verdict: Verdict, reason: str, module: Optional[cst.Module] = None) -> TransformResult:
        findings = sorted(self.findings, key=lambda f: (f.line, f.column, f.code))
        return TransformResult(module or self.module, verdict, findings, reason)

    # ---- findings ---------------------------------------------------------------------

    def _position(self, node: Optional[cst.CSTNode]) -> Tuple[int, int]:
        if node is None:
            return 0, 0
        position = self.structure.position(node)
        return position.line, position.column

    def _warn(self, code: str, message: str, node: Optional[cst.CSTNode]) -> None:
        line, column = self._position(node)
        finding = Finding(code, message, line, column, Severity.WARNING)
        if finding not in self.findings:
            self.findings.append(finding)

    def _info(self, code: str, message: str, node: Optional[cst.CSTNode]) -> None:
        line, column = self._position(node)
        finding = Finding(code, message, line, column, Severity.INFO)
        if finding not in self.findings:
            self.findings.append(finding)

    # ---- hazards ----------------------------------------------------------------------

    def _warn_hazards(self, has_training: bool) -> None:
        s = self.structure
        sigmoids = [h for h in s.hazards if h.kind == "sigmoid"]
        for hazard in s.hazards:
            if not has_training and hazard.kind in ("bce", "closure", "create_graph", "wrapper_class"):
                # Library code (torch's own loss.py, gradcheck): no training step here to leave
                # unconverted, and a warning would make the file "not converted" (it is not applicable).
                continue
            if hazard.kind == "bce":
                hint = ""
                if sigmoids:
                    hint = f" (the model ends in nn.Sigmoid at line {s.line(sigmoids[0].node)}: drop it and feed logits)"
                self._warn(
                    "AMP210",
                    f"{hazard.detail.rsplit('.', 1)[-1]} raises under CUDA autocast: use nn.BCEWithLogitsLoss "
                    f"(F.binary_cross_entropy_with_logits) on logits{hint}; the training steps of this file "
                    "were left unconverted, rerun ampify after the change",
                    hazard.node,
                )
            elif hazard.kind == "closure":
                self._warn(
                    "AMP211",
                    f"{hazard.detail}.step(closure): GradScaler does not support closures (LBFGS and friends); "
                    "this training step was left unconverted: scale the loss inside the closure by hand or keep fp32",
                    hazard.node,
                )
            elif hazard.kind == "create_graph" and self.scaling:
                self._warn(
                    "AMP212",
                    "torch.autograd.grad(..., create_graph=True) (gradient penalty) needs manual scaling with "
                    "float16: compute it from scaler.scale(outputs) and divide the gradients by scaler.get_scale() "
                    "(see the PyTorch AMP examples); this file was left unconverted (or use --dtype bfloat16)",
                    hazard.node,
                )
            elif hazard.kind == "masked_fill" and self.scaling:
                self._warn(
                    "AMP213",
                    f"masked_fill with {hazard.detail} overflows float16 under autocast: use "
                    "torch.finfo(scores.dtype).min instead"
                    + ("; the training steps of this file were left unconverted" if has_training else ""),
                    hazard.node,
                )
            elif hazard.kind == "wrapper_class":
                self._warn(
                    "AMP214",
                    f"class {hazard.detail} wraps an optimizer in its own step(): ampify does not convert steps "
                    "through it; call scaler.step(inner_optimizer) and scaler.update() inside its step() by hand",
                    hazard.node,
                )
            elif hazard.kind == "manual_half" and has_training:
                self._warn(
                    "AMP217",
                    f"{hazard.detail}: this script casts to half precision by hand; autocast and GradScaler "
                    "expect float32 weights (GradScaler refuses float16 gradients). Remove the manual casts "
                    "and rerun ampify; the training steps of this file were left unconverted",
                    hazard.node,
                )
            elif hazard.kind == "fsdp" and self.scaling and has_training:
                self._warn(
                    "AMP222",
                    "the model is wrapped in FullyShardedDataParallel: float16 loss scaling needs "
                    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler (a plain GradScaler lets ranks "
                    "disagree on skipped steps); this file was left unconverted: use --dtype bfloat16, or FSDP's "
                    "MixedPrecision policy with a ShardedGradScaler by hand",
                    hazard.node,
                )
            elif hazard.kind == "autograd_backward":
                self._warn(
                    "AMP223",
                    "torch.autograd.backward(...) is not converted: scale the tensors with scaler.scale(...) by hand",
                    hazard.node,
                )

    def _file_blocked(self) -> bool:
        """Hazards that make any conversion of this file unsafe."""
        kinds = {h.kind for h in self.structure.hazards}
        if "bce" in kinds or "manual_half" in kinds:
            return True
        if self.scaling and ("create_graph" in kinds or "masked_fill" in kinds or "fsdp" in kinds):
            return True
        return False

    # ---- torch name and imports -------------------------------------------------------

    def _torch_name(self) -> str:
        """The module-level name bound to `torch`; "torch" (to be imported) when there is none.
        An `import torch` inside a function does not count: the new code may run elsewhere."""
        local = sorted(_module_level_aliases(self.module, "torch"))
        self.torch_import_needed = not local
        if "torch" in local or not local:
            return "torch"
        return local[0]

    # ---- planning ---------------------------------------------------------------------

    def _plan_unit(self, unit: TrainingUnit) -> _UnitPlan:
        if not unit.steps:
            raise Unconvertible("no optimizer step in this training step")
        unfollowed = call_of_unfollowed_backward(self.structure, unit)
        if unfollowed is not None:
            raise Unconvertible(*unfollowed)
        for step in unit.steps:
            if step.has_closure:
                raise Unconvertible(f"{step.receiver}.step(closure) cannot go through GradScaler", step.call)
        regions = self.planner.autocast_regions(unit)
        plan = _UnitPlan(unit, self.scaler_name, regions)
        if not self.scaling:
            return plan
        plan.update_after = self.planner.update_anchor(unit)
        plan.early_exit_updates = list(self.planner.early_exit_updates.get(id(unit), []))
        plan.unscale_before = self.planner.unscale_points(unit)
        self._plan_scaler_home(plan)
        delegated = [b for b in unit.backwards if b.delegation is not None]
        if delegated and not plan.reference.startswith("self."):
            helper = delegated[0].delegation.helpers[-1].name.value
            raise Unconvertible(
                f"backward() runs in the method {helper}(), but the optimizers are not attributes of self, "
                "so the method could not reach the GradScaler",
                delegated[0].call,
            )
        return plan

    # autocast regions ------------------------------------------------------------------

    def _plan_scaler_home(self, plan: _UnitPlan) -> None:
        s = self.structure
        unit = plan.unit
        receivers = unit.optimizers
        if all(r.startswith("self.") for r in receivers):
            plan.reference = f"self.{self.scaler_name}"
            if unit.klass is None:
                raise Unconvertible("self.<optimizer> used outside a method", unit.steps[0].call)
            plan.home = self._class_home(unit.klass, unit.scope, receivers, unit.steps[0].call)
            return
        other_attributes = [r for r in receivers if "." in r and not r.startswith("self.")]
        if other_attributes:
            raise Unconvertible(
                f"the optimizer {other_attributes[0]} is an attribute of another object; ampify follows "
                "variables and self.<attribute> only: create the GradScaler next to it by hand",
                unit.steps[0].call,
            )
        if any(r.startswith("self.") for r in receivers):
            raise Unconvertible(
                f"optimizers {', '.join(receivers)} are reached in different ways (self attribute and variable)",
                unit.steps[0].call,
            )
        kinds = {}
        for receiver in receivers:
            bindings = s.bindings_visible(receiver, unit.scope)
            if not bindings:
                raise Unconvertible(s.not_found_reason(receiver, unit.scope), unit.steps[0].call)
            kinds[receiver] = "parameter" if any(b.kind == "parameter" for b in bindings) else "variable"
        if set(kinds.values()) == {"variable"}:
            if isinstance(unit.owner, (cst.For, cst.While)):
                use_statement = s.statement_of(unit.owner)
            else:
                use_statement = s.statement_of(unit.backwards[0].call)
            plan.home = self._variable_home(receivers, unit.scope, use_statement, unit.steps[0].call)
            return
        if set(kinds.values()) == {"parameter"} and isinstance(unit.scope, cst.FunctionDef):
            for receiver in receivers:
                owner = s.bindings_visible(receiver, unit.scope)[0].scope
                if owner is not unit.scope:
                    raise Unconvertible(
                        f"{receiver} is a parameter of the enclosing function "
                        f"{getattr(getattr(owner, 'name', None), 'value', '?')}(): create the GradScaler there "
                        "by hand (once per training run) and use it here",
                        unit.steps[0].call,
                    )
            self._thread_through_parameter(plan, receivers)
            return
        raise Unconvertible(
            f"optimizers {', '.join(receivers)} are partly parameters, partly local variables", unit.steps[0].call
        )

    def _variable_home(
        self, receivers: List[str], scope: Scope, use_statement: Optional[cst.CSTNode], node: cst.CSTNode
    ) -> _ScalerHome:
        """Scaler after the latest binding of the optimizers, in the scope that binds them."""
        s = self.structure
        use_line = s.line(use_statement) if use_statement is not None else s.line(node)
        binding_statements: List[cst.CSTNode] = []
        home_scope: Optional[Scope] = None
        for receiver in receivers:
            bindings = [b for b in s.bindings_visible(receiver, scope) if b.statement is not None]
            if not bindings:
                raise Unconvertible(s.not_found_reason(receiver, scope), node)
            if home_scope is None:
                home_scope = bindings[0].scope
            elif bindings[0].scope is not home_scope:
                raise Unconvertible("the optimizers are created in different functions", node)
            if any(b.kind == "for" for b in bindings):
                raise Unconvertible(f"{receiver} is a loop variable", node)
            if home_scope is scope:
                before = [b for b in bindings if s.line(b.statement) < use_line]
                if not before:
                    raise Unconvertible(f"{receiver} is created inside the training loop", node)
                bindings = before
            latest = max(bindings, key=lambda b: s.line(b.statement))
            binding_statements.append(latest.statement)
        assert home_scope is not None
        uses = [use_statement] if (use_statement is not None and home_scope is scope) else []
        after = self._insertion_point(binding_statements, uses, node)
        existing = self.homes.get(id(home_scope))
        if existing is not None:
            # one scaler per training setup: the existing one must already exist when this loop runs
            if s.line(after) > existing.line or (uses and s.line(uses[0]) <= existing.line):
                raise Unconvertible("two training loops in this function use optimizers created far apart", node)
            existing.optimizers.extend(r for r in receivers if r not in existing.optimizers)
            return existing
        home = _ScalerHome(home_scope, self.scaler_name, after, home_scope, s.line(after), list(receivers))
        self.homes[id(home_scope)] = home
        return home

    def _insertion_point(
        self, binding_statements: List[cst.CSTNode], uses: List[cst.CSTNode], node: cst.CSTNode
    ) -> cst.CSTNode:
        """The statement after which the scaler is created (see TrainingStructure.insertion_point)."""
        anchor = self.structure.insertion_point(binding_statements, uses)
        if anchor is None:
            raise Unconvertible("the optimizer is created inside the training loop or after it", node)
        return anchor

    def _class_home(self, klass: cst.ClassDef, scope: Scope, receivers: List[str], node: cst.CSTNode) -> _ScalerHome:
        """`self.scaler` created next to the class's `self.<optimizer>` assignment(s)."""
        s = self.structure
        existing = self.homes.get(id(klass))
        if existing is not None:
            return existing
        first_bindings: List[cst.CSTNode] = []
        method: Optional[Scope] = None
        for receiver in receivers:
            bindings = [b for b in s.bindings_visible(receiver, scope) if b.statement is not None]
            if not bindings:
                raise Unconvertible(s.not_found_reason(receiver, scope), node)
            first = min(bindings, key=lambda b: s.line(b.statement))
            if method is None:
                method = first.scope
            elif first.scope is not method:
                raise Unconvertible("the optimizers are created in different methods", node)
            first_bindings.append(first.statement)
        after = self._insertion_point(first_bindings, [], node)
        # `self.device = ...` a few lines below the optimizers (StarGAN's Solver): create the
        # scaler after it, so that it can use the script's device
        for binding in s.device_bindings:
            if binding.scope is method and binding.name.startswith("self.") and s.line(binding.statement) > s.line(after):
                later = s.insertion_point(first_bindings + [binding.statement])
                if later is not None:
                    after = later
                break
        home = _ScalerHome(method, f"self.{self.scaler_name}", after, method, s.line(after), list(receivers))
        self.homes[id(klass)] = home
        return home

    def _thread_through_parameter(self, plan: _UnitPlan, receivers: List[str]) -> None:
        """The loop's function takes the optimizer(s) as parameters: create the scaler in every
        in-file caller, pass it along as a new keyword argument."""
        s = self.structure
        function = plan.unit.scope
        assert isinstance(function, cst.FunctionDef)
        node = plan.unit.steps[0].call
        klass = s.class_of(function)
        if self.scaler_name in {p.name.value for p in statements.all_params(function)}:
            raise Unconvertible("the function already has a parameter named like the scaler", node)
        if klass is not None:
            calls, other_uses = method_calls(s, function, klass)
        else:
            calls, other_uses = _calls_of_function(s, function)
        what = f"{'method ' if klass is not None else ''}{function.name.value}()"
        if other_uses:
            raise Unconvertible(
                f"{what} is used at line {s.line(other_uses[0])} other than by a direct "
                f"{'self.' if klass is not None else ''}{function.name.value}(...) call in this file; "
                "ampify cannot add the scaler to every caller", node,
            )
        if not calls:
            raise Unconvertible(
                f"{what} receives the optimizer as a parameter and is not called in this file: "
                f"create the GradScaler where the optimizer is created and pass it in", node,
            )
        positions = statements.parameter_positions(function)
        if klass is not None and not _is_static(function):
            # self.f(a, b): `a` goes to the parameter after self
            positions = {name: index - 1 for name, index in positions.items() if index > 0}
        homes = []
        threaded: List[Tuple[cst.Call, str]] = []
        for call in calls:
            caller_scope = s.scope_of(call)
            passed = []
            for receiver in receivers:
                argument = statements.argument_for(call, receiver, positions)
                name = dotted_name(argument) if argument is not None else None
                if name is None or ("." in name and not name.startswith("self.")):
                    raise Unconvertible(
                        f"the call of {function.name.value}() at line {s.line(call)} does not pass "
                        f"{receiver} as a variable or self.<attribute>", call,
                    )
                passed.append(name)
            if all(name.startswith("self.") for name in passed):
                caller_class = s.class_of(caller_scope)
                if caller_class is None:
                    raise Unconvertible(f"self.<optimizer> passed outside a method at line {s.line(call)}", call)
                home = self._class_home(caller_class, caller_scope, passed, call)
            elif any(name.startswith("self.") for name in passed):
                raise Unconvertible(
                    f"the call at line {s.line(call)} passes optimizers reached in different ways", call
                )
            else:
                bindings = [b for name in passed for b in s.bindings_visible(name, caller_scope)]
                if any(b.kind == "parameter" for b in bindings):
                    raise Unconvertible(
                        f"the caller at line {s.line(call)} receives the optimizer as a parameter too; "
                        "ampify follows one level of calls", call,
                    )
                home = self._variable_home(passed, caller_scope, s.statement_of(call), call)
            homes.append(home)
            threaded.append((call, home.reference))
        plan.threaded_function = function
        plan.threaded_calls = threaded
        plan.caller_homes = homes

    # ---- writing ----------------------------------------------------------------------

    def _device_for(self, scope: Scope, before_line: int, node: cst.CSTNode) -> str:
        """The script's own device, as a string expression valid in `scope` at `before_line`;
        "cuda" (said once per file) when the script names none."""
        device = self._device_expression(scope, before_line)
        if device is not None:
            return device
        if self.structure.uses_cuda_method:
            if not any(f.code in ("AMP207", "AMP216") for f in self.findings):
                self._info(
                    "AMP207",
                    'device "cuda" taken from the script\'s .cuda() calls (no device variable found)',
                    node,
                )
            return '"cuda"'
        if any(f.code in ("AMP207", "AMP216") for f in self.findings):
            return '"cuda"'  # said once per file is enough
        self._warn(
            "AMP216",
            'no device expression found in the script (torch.device(...), args.device, .to(device)): '
            '"cuda" assumed; change device_type/GradScaler("cuda") if this script trains elsewhere',
            node,
        )
        return '"cuda"'

    def _device_expression(self, scope: Scope, before_line: int) -> Optional[str]:
        """The device expression the script itself makes visible in `scope` at `before_line`, or None."""
        s = self.structure
        torch = self.torch
        chain = s.enclosing_scopes(scope)
        for candidate_scope in chain:
            for binding in s.device_bindings:
                if binding.scope is not candidate_scope or "." in binding.name:
                    continue
                if candidate_scope is scope and s.line(binding.statement) >= before_line:
                    continue
                if s.bindings_visible(binding.name, scope) and s.bindings_visible(binding.name, scope)[0].scope is candidate_scope:
                    return f"{binding.name}.type"
        klass = s.class_of(scope)
        if klass is not None:
            for binding in s.device_bindings:
                if binding.name.startswith("self.") and binding.klass is klass and self._set_before(binding, scope, before_line):
                    return f"{binding.name}.type"
        for candidate_scope in chain:
            if isinstance(candidate_scope, cst.FunctionDef):
                for param in statements.all_params(candidate_scope):
                    if param.name.value == "device":
                        return f"{torch}.device(device).type"
        for argument, arg_scope in s.to_device_arguments:
            text = self._visible_device_argument(argument, scope, before_line)
            if text is not None:
                return text
        return None

    def _one_device_for_unit(self, plan: _UnitPlan) -> Optional[str]:
        """Autocast and the GradScaler must take the same device: a scaler on the script's device
        with autocast hard-coded to "cuda" keeps scaling on a CPU run while autocast has switched
        itself off. None when every place sees the same expression (each then computes it);
        when one place sees the script's device and another sees none, "cuda" for all of them, with
        a warning naming the expression that was not visible."""
        s = self.structure
        seen = []
        for block, start, _ in plan.regions:
            seen.append((self._device_expression(plan.unit.scope, s.line(block.body[start])), block.body[start]))
        if self.scaling:
            homes = [plan.home] if plan.home is not None else plan.caller_homes
            for home in homes:
                created = self.scaler_devices.get(id(home.after))
                seen.append((created or self._device_expression(home.device_scope, home.line + 1), home.after))
        expressions = {expression for expression, _ in seen}
        if None not in expressions or len(expressions) == 1:
            # Every place names the script's device (`device.type` here, `torch.device(device).type`
            # where it was passed in as a parameter), or none does (all get "cuda").
            return None
        named = sorted(e for e in expressions if e is not None and e != '"cuda"')
        node = next((where for expression, where in seen if expression is None), seen[0][1])
        self._warn(
            "AMP216",
            f"the script's device ({named[0] if named else 'its device expression'}) is not visible everywhere this training step "
            'needs it (autocast and the GradScaler): "cuda" used for both, so they switch on and off together; '
            "pass the device in to train elsewhere",
            node,
        )
        return '"cuda"'

    def _set_before(self, binding, scope: Scope, before_line: int) -> bool:
        """Is the attribute `binding` sets (`self.device = ...`) already set when code at
        `before_line` in `scope` runs? In the same method: only if bound above that line. From
        another method: yes, except in __init__, which runs before any other method."""
        if binding.scope is scope:
            return binding.statement is not None and self.structure.line(binding.statement) < before_line
        return not (isinstance(scope, cst.FunctionDef) and scope.name.value == "__init__")

    def _visible_device_argument(self, argument: cst.BaseExpression, scope: Scope, before_line: int) -> Optional[str]:
        s = self.structure
        if isinstance(argument, cst.SimpleString):
            value = argument.evaluated_value
            if isinstance(value, str) and value.split(":")[0] in ("cuda", "cpu", "mps", "xpu", "hpu", "npu", "xla"):
                return f'"{value.split(":")[0]}"'
            return None
        name = dotted_name(argument)
        if name is None or not names.looks_like_device_name(name):
            return None  # `.to(dtype)`, `.to(other_tensor)`: not a device
        base = name.split(".")[0]
        if base == "self":
            if not any(self._set_before(b, scope, before_line) for b in s.bindings_visible(name, scope)):
                return None
        else:
            bindings = s.bindings_visible(base, scope)
            if not bindings:
                return None
            if bindings[0].scope is scope and all(
                b.statement is not None and s.line(b.statement) >= before_line for b in bindings
            ):
                return None
        device_names = {b.name for b in s.device_bindings}
        if name in device_names:
            return f"{name}.type"
        return f"{self.torch}.device({name}).type"

    def _write_unit(self, plan: _UnitPlan) -> None:
        s = self.structure
        unit = plan.unit
        dtype = f"{self.torch}.{self.options.dtype}"
        shared_device = self._one_device_for_unit(plan)
        for block, start, end in plan.regions:
            body = list(block.body)
            first = body[start]
            device = shared_device or self._device_for(unit.scope, s.line(first), first)
            header = f"with {self.torch}.autocast(device_type={device}, dtype={dtype}):"
            self.edits.wrap(body[start], body[end], header)
            for index in range(start, end + 1):
                self._cast_index_assignments(body[index], unit)
                if self.scaling:
                    self._warn_penalty_helpers(body[index])
            first_line, last_line = s.line(first), s.line(body[end])
            lines = f"line {first_line}" if first_line == last_line else f"lines {first_line}-{last_line}"
            self._info(
                "AMP201",
                f"forward pass and loss ({lines}) run under "
                f"torch.autocast({device}, {self.options.dtype})",
                first,
            )
        if not self.scaling:
            return
        reference = plan.reference
        for backward in unit.backwards:
            if backward.delegation is not None:
                # the real backward() runs in a helper method, maybe reached by several calls
                backward = backward.delegation.inner
                if id(backward.call) in self.scaled_backwards:
                    continue
            self.scaled_backwards.add(id(backward.call))
            self.edits.replace_call(backward.call, _scaled_backward(backward.call, reference))
            self._info("AMP202", f"{reference}.scale({statements.code_of(backward.loss)}).backward(...)", backward.call)
        for step in unit.steps:
            self.edits.replace_call(step.call, _scaler_call(reference, "step", step.receiver))
            self._info("AMP203", f"{step.receiver}.step() now {reference}.step({step.receiver})", step.call)
        assert plan.update_after is not None
        self.edits.insert_after(plan.update_after, f"{reference}.update()")
        for exit_statement, where in plan.early_exit_updates:
            if where == "after":
                self.edits.insert_after(exit_statement, f"{reference}.update()")
            else:
                self.edits.insert_before(exit_statement, f"{reference}.update()")
            self._info(
                "AMP203",
                f"{reference}.update() also added {where} line {s.line(exit_statement)}: this branch leaves the "
                "iteration after an optimizer step",
                exit_statement,
            )
        for clip_statement, receiver in plan.unscale_before:
            self.edits.insert_before(clip_statement, f"{reference}.unscale_({receiver})")
            self._info(
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
            for call, caller_reference in plan.threaded_calls:
                self.edits.add_keyword(call, self.scaler_name, caller_reference)
            self._info(
                "AMP204",
                f"{plan.threaded_function.name.value}() takes the GradScaler as a new required parameter "
                f"'{self.scaler_name}'; its {len(plan.threaded_calls)} call(s) in this file pass it by keyword "
                f"({self.scaler_name}={self.scaler_name}); calls from other files must pass it too",
                plan.threaded_function,
            )

    def _warn_penalty_helpers(self, statement: cst.CSTNode) -> None:
        """A helper named like a gradient penalty (`compute_gradient_penalty(D, real, fake)`),
        defined elsewhere: if it calls torch.autograd.grad(create_graph=True), float16 loss
        scaling needs it to scale its outputs by hand, which ampify cannot see from here."""
        for call in statements.calls_within(statement):
            func = call.func
            called = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
            if "penalty" in called.lower():
                self._warn(
                    "AMP212",
                    f"{called}() looks like a gradient penalty computed elsewhere: if it uses "
                    "torch.autograd.grad(..., create_graph=True), compute it from scaler.scale(outputs) and divide "
                    "the gradients by scaler.get_scale() (PyTorch AMP examples), or use --dtype bfloat16",
                    call,
                )

    def _cast_index_assignments(self, statement: cst.CSTNode, unit: TrainingUnit) -> None:
        """Index assignments of a model output into a float32 tensor, cast back to its dtype
        (see StepPlanner.index_assignments_to_cast)."""
        for node, target in self.planner.index_assignments_to_cast(statement, unit.scope):
            self.edits.cast_assigned_value(node, f"{target}.dtype")
            self._info(
                "AMP201",
                f"the value assigned into {target}[...] is cast to {target}.dtype: under autocast it is "
                f"{self.options.dtype}, and index assignment into a float32 tensor needs equal dtypes",
                node,
            )

    def _create_scaler(self, home: _ScalerHome, device: Optional[str] = None) -> None:
        key = id(home.after)
        if key in self.edits.created_scalers:
            return
        self.edits.created_scalers.add(key)
        device = device or self._device_for(home.device_scope, home.line + 1, home.after)
        self.scaler_devices[key] = device
        self.edits.insert_after(home.after, f"{home.reference} = {self.torch}.amp.GradScaler({device})")
        self._info(
            "AMP204",
            f"created {home.reference} = torch.amp.GradScaler({device}) after the optimizer(s) "
            f"{', '.join(home.optimizers)}",
            home.after,
        )

    # ---- checkpoints ------------------------------------------------------------------

    def _scaler_reference_in(self, scope: Scope, line: int, plans: List[_UnitPlan]) -> Optional[str]:
        """How code at `line` in `scope` can reach a scaler, if it can."""
        s = self.structure
        klass = s.class_of(scope)
        if klass is not None and id(klass) in self.homes:
            return self.homes[id(klass)].reference
        for plan in plans:
            if plan.threaded_function is scope:
                return self.scaler_name
        for candidate in s.enclosing_scopes(scope):
            home = self.homes.get(id(candidate))
            if home is None:
                continue
            if candidate is scope and home.line >= line:
                return None
            if candidate is not scope and scope is not s.module and s.bindings_visible(self.scaler_name, scope):
                return None
            return home.reference
        return None

# ---- small helpers --------------------------------------------------------------------------


def _calls_of_function(structure: TrainingStructure, function: cst.FunctionDef) -> Tuple[List[cst.Call], List[cst.CSTNode]]:
    """In-file calls `f(...)` of a module-level function, and any other use of its name."""
    name = function.name.value
    calls: List[cst.Call] = []
    others: List[cst.CSTNode] = []

    for node in structure.name_nodes.get(name, []):
        if node is function.name:
            continue
        parent = structure.parent(node)
        if isinstance(parent, cst.Call) and parent.func is node:
            calls.append(parent)
        elif isinstance(parent, cst.Attribute) and parent.attr is node:
            continue  # obj.train(...) is another function
        elif isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param, cst.ImportAlias)):
            continue
        elif isinstance(parent, cst.Arg) and parent.keyword is node:
            continue  # f(train=True) names a keyword, not the function
        else:
            others.append(node)
    return calls, others


def _is_static(function: cst.FunctionDef) -> bool:
    return any(dotted_name(d.decorator) in ("staticmethod", "classmethod") for d in function.decorators)


def _scaled_backward(call: cst.Call, reference: str) -> cst.Call:
    """`loss.backward(args)` -> `scaler.scale(loss).backward(args)`."""
    assert isinstance(call.func, cst.Attribute)
    loss = call.func.value.with_changes(lpar=[], rpar=[]) if call.func.value.lpar else call.func.value
    scaled = cst.Call(func=cst.parse_expression(f"{reference}.scale"), args=[cst.Arg(loss)])
    return call.with_changes(func=call.func.with_changes(value=scaled))


def _scaler_call(reference: str, method: str, receiver: Optional[str]) -> cst.Call:
    return cst.parse_expression(f"{reference}.{method}({receiver})")  # type: ignore[return-value]


class _ModuleLevelImports(cst.CSTVisitor):
    """Local names bound by imports at module level (also under module-level if/try/with)."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.found: Set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted_name(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                if full == self.target:
                    self.found.add(alias.asname.name.value)
            elif full.split(".")[0] == self.target:
                self.found.add(self.target)  # `import torch.nn` binds `torch`


def _module_level_aliases(module: cst.Module, target: str) -> Set[str]:
    visitor = _ModuleLevelImports(target)
    walk(module, visitor)
    return visitor.found


def _add_import_torch(module: cst.Module) -> cst.Module:
    """Insert `import torch` before the first module-level import from torch."""
    body = list(module.body)
    for index, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine) and any(
            isinstance(small, cst.ImportFrom) and small.module is not None
            and (dotted_name(small.module) or "").split(".")[0] == "torch"
            for small in statement.body
        ):
            new = cst.parse_statement("import torch\n", config=module.config_for_parsing)
            new = new.with_changes(leading_lines=statement.leading_lines)
            body[index] = statement.with_changes(leading_lines=[])
            body.insert(index, new)
            return module.with_changes(body=body)
    new = cst.parse_statement("import torch\n", config=module.config_for_parsing)
    return module.with_changes(body=[new] + body)
