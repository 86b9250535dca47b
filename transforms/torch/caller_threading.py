"""The other half of a training step that spans two modules: in the module that calls the step
function (`train_one_epoch(model, criterion, loader, optimizer, device)` in main.py), create the
GradScaler after the optimizer it passes and pass the scaler in by keyword.

The step's own module (engine.py) is converted by NativeConversion, which asks for this edit of
each calling module; both are written as one change set (ampify/change_set.py). Anything that
cannot be followed raises Unconvertible with the reason, and neither module changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.base import CallSite, CompanionChange
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.checkpoints import CheckpointWriter
from ampify.transforms.torch.device_choice import DeviceChoice
from ampify.transforms.torch.edits import StatementEdits, apply_edits
from ampify.transforms.torch.scaler_placement import FarApart, ScalerHome, ScalerPlacement, no_op_optimizer_class
from ampify.transforms.torch.torch_import import add_import_torch, last_leading_import, module_level_aliases
from ampify.transforms.torch.training_loop import (
    HazardKind,
    MixedPrecisionElsewhere,
    Scope,
    TrainingStructure,
    Unconvertible,
    analyze_training,
    describe_mixed_precision_use,
    flat_parameter_fsdp_wraps,
)


@dataclass
class _Findings:
    """Findings about the calling module (its own line numbers)."""

    structure: object = None
    findings: List[Finding] = field(default_factory=list)

    def _add(self, code: str, message: str, node: Optional[cst.CSTNode], severity: Severity) -> None:
        position = self.structure.position(node) if node is not None else None
        finding = Finding(code, message, position.line if position else 0, position.column if position else 0, severity)
        if finding not in self.findings:
            self.findings.append(finding)

    def info(self, code: str, message: str, node: Optional[cst.CSTNode]) -> None:
        self._add(code, message, node, Severity.INFO)

    def warn(self, code: str, message: str, node: Optional[cst.CSTNode]) -> None:
        self._add(code, message, node, Severity.WARNING)


@dataclass
class CallerPlan:
    """The calling module's planned edit, and the device its GradScaler names (None: none found)."""

    change: CompanionChange
    device: Optional[str]


def thread_scaler_into_caller(
    source: bytes,
    sites: Sequence[CallSite],
    function_name: str,
    positions: Dict[str, int],
    receivers: Sequence[str],
    keyword: str,
    step_display: str,
    device: Optional[str] = None,
) -> CallerPlan:
    """Plan the edit of one calling module (all `sites` are in it). `positions`: the step
    function's parameters by position; `receivers`: the optimizer parameters; `keyword`: the
    scaler's new parameter; `device`: the device expression to use, when already decided."""
    display = sites[0].display
    try:
        module = cst.parse_module(source)
    except Exception as error:  # the other module does not parse: nothing to thread into
        raise Unconvertible(f"{display} does not parse ({type(error).__name__}), so the scaler cannot be created there")
    imports = ImportMap.from_module(module)
    s = analyze_training(module, imports)
    module = s.module
    if s.backwards:
        raise Unconvertible(
            f"{display} trains too (backward() at {display}:{s.line(s.backwards[0].call)}); ampify threads a scaler "
            "into a module that only sets the training up"
        )
    existing = _existing_scalers(s)
    check_caller_setup(s, display, "native", creates_sharded_scaler=True,
                       own_scalers=[statement for _, statement in existing])
    report = _Findings(s)
    local = sorted(module_level_aliases(module, "torch"))
    torch_import_needed = not local
    torch = "torch" if "torch" in local or not local else local[0]
    scaler_name = _numbered_name(s, "scaler", ())
    placements = [ScalerPlacement(s, scaler_name)]
    edits = StatementEdits()
    homes: List[ScalerHome] = []
    calls = []
    idle_calls: List[Tuple[cst.Call, str]] = []
    found_existing: Optional[str] = None
    for site in sites:
        idle = _idle_optimizer_call(s, site, function_name, positions, receivers)
        if idle is not None:
            idle_calls.append(idle)
            continue
        call, passed = call_and_passed_optimizers(s, site, function_name, positions, receivers)
        scope = s.scope_of(call)
        for name in passed:
            if any(b.kind == "parameter" for b in s.bindings_visible(name, scope)):
                raise Unconvertible(
                    f"the caller at {display}:{site.line} receives the optimizer as a parameter too; ampify follows "
                    "one level of calls across files"
                )
        if any(arg.keyword is not None and arg.keyword.value == keyword for arg in call.args):
            raise Unconvertible(f"the call at {display}:{site.line} already passes {keyword}=")
        covering = [scaler for scaler in existing if _scaler_covers(s, scaler, call)]
        if covering:
            name, statement = max(covering, key=lambda scaler: s.line(scaler[1]))  # the nearest above
            edits.add_keyword(call, keyword, name)
            report.info("AMP204", f"{function_name}(...) now passes {keyword}={name}, the GradScaler created at line "
                                  f"{s.line(statement)} (one scaler per optimizer)", call)
            found_existing = found_existing or _scaler_device(statement)
            continue
        homes.append(_home_for(s, placements, passed, scope, call))
        calls.append(call)
    devices = DeviceChoice(s, torch, report)
    scaler_class = f"{torch}.amp.GradScaler"
    fsdp = flat_parameter_fsdp_wraps(s)
    if fsdp:
        # FSDP1 wraps the model here: its GradScaler is ShardedGradScaler (see native_amp)
        scaler_class = s.fresh_name("ShardedGradScaler", "AmpShardedGradScaler")
        anchor = last_leading_import(module)
        statement = "from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler" + (
            f" as {scaler_class}" if scaler_class != "ShardedGradScaler" else "")
        if anchor is not None:
            edits.insert_after(anchor, statement)
        else:
            edits.insert_before(module.body[0], statement)
        report.info(
            "AMP236",
            f"the model is wrapped in FullyShardedDataParallel (line {s.line(fsdp[0].node)}): the GradScaler is "
            "torch.distributed.fsdp's ShardedGradScaler, whose inf/NaN check is reduced over the ranks (a plain "
            "GradScaler lets ranks disagree on skipped steps); added its import",
            anchor if anchor is not None else module.body[0],
        )
    chosen: Dict[int, str] = {}
    found_device = found_existing
    for home in homes:
        if id(home.after) in chosen:
            continue
        expression = device or devices.expression(home.device_scope, home.line + 1)
        found_device = found_device or expression
        chosen[id(home.after)] = expression or '"cuda"'
        edits.insert_after(home.after, f"{home.reference} = {scaler_class}({chosen[id(home.after)]})")
        report.info(
            "AMP204",
            f"created {home.reference} = {scaler_class}({chosen[id(home.after)]}) after the optimizer(s) "
            f"{', '.join(home.optimizers)}, for {function_name}() in {step_display}",
            home.after,
        )
    for call, home in zip(calls, homes):
        edits.add_keyword(call, keyword, home.reference)
        report.info("AMP204", f"{function_name}(...) now passes {keyword}={home.reference}", call)
    for call, idle in idle_calls:
        disabled = f"{torch}.amp.GradScaler(enabled=False)"
        edits.add_keyword(call, keyword, disabled)
        report.info(
            "AMP204",
            f"this call of {function_name}() passes a {idle}, whose step() does nothing: it gets {keyword}={disabled}, "
            "which leaves its backward and step exactly as they were",
            call,
        )
    CheckpointWriter(
        s, imports, edits, torch, lambda scope, line: _reference_in(s, homes, scope, line), report.info, report.warn,
    ).write({name for home in homes for name in home.optimizers})
    new_module = apply_edits(module, edits)
    if torch_import_needed:
        new_module = add_import_torch(new_module)
    change = CompanionChange(
        key=sites[0].key, display=display, old=source, new=new_module.bytes,
        findings=sorted(report.findings, key=lambda f: (f.line, f.column, f.code)),
        reason=f"changed with {step_display}: the GradScaler of {function_name}() is created here and passed in",
    )
    return CallerPlan(change, found_device)


def _idle_optimizer_call(
    s, site: CallSite, function_name: str, positions: Dict[str, int], receivers: Sequence[str]
) -> Optional[Tuple[cst.Call, str]]:
    """(the call, the class) when the call at `site` passes, for every optimizer parameter, a new
    instance of a class of this module whose step() does nothing (`DummyOptimizer()`)."""
    call = call_at_site(s, site, function_name)
    if call is None:
        return None
    idle = [no_op_optimizer_class(s, statements.argument_for(call, receiver, positions), s.scope_of(call))
            for receiver in receivers]
    return (call, idle[0]) if idle and all(idle) else None


def _existing_scalers(s: TrainingStructure) -> List[Tuple[str, cst.CSTNode]]:
    """(name, statement) of each `scaler = torch.amp.GradScaler(<device>)` of the calling module,
    each name bound once: the GradScalers other step functions of the repository get already
    (this run's edits for them, or the user's). Calls one covers pass it too (`_scaler_covers`):
    a second scaler would step the same optimizer through two. None at all when any GradScaler
    is made otherwise, or with options (`GradScaler(enabled=args.amp)` may be off while autocast
    is on)."""
    creations = []
    for use in s.mixed_precision_uses:
        if not isinstance(use, cst.Call):
            continue
        qualified = s.imports.resolve(use.func) or dotted_name(use.func) or ""
        if qualified.rsplit(".", 1)[-1] not in ("GradScaler", "ShardedGradScaler"):
            continue
        statement = s.statement_of(use)
        assignment = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        if not (isinstance(assignment, cst.Assign) and assignment.value is use and len(assignment.targets) == 1
                and isinstance(assignment.targets[0].target, cst.Name)):
            return []
        if any(arg.keyword is not None for arg in use.args) or len(use.args) > 1:
            return []
        name = assignment.targets[0].target.value
        if len(s.bindings_visible(name, s.scope_of(statement))) != 1:
            return []
        creations.append((name, statement))
    return creations


def _scaler_covers(s: TrainingStructure, existing: Tuple[str, cst.CSTNode], call: cst.Call) -> bool:
    """The existing scaler always exists when `call` runs: same scope, above it, in a block that
    holds it; and the call does not pass it already."""
    name, statement = existing
    if s.scope_of(call) is not s.scope_of(statement) or s.line(call) <= s.line(statement):
        return False
    if not any(block is s.block_of(statement) for block, _ in s.block_path(call)):
        return False
    return not any(isinstance(arg.value, cst.Name) and arg.value.value == name for arg in call.args)


def _scaler_device(statement: cst.CSTNode) -> Optional[str]:
    scaler_call = statement.body[0].value
    return statements.code_of(scaler_call.args[0].value) if scaler_call.args else None


def check_caller_setup(s: TrainingStructure, display: str, backend: str, creates_sharded_scaler: bool = False,
                       own_scalers: Sequence[cst.CSTNode] = ()) -> None:
    """The module that creates the optimizer and calls the step also decides how the model
    trains: when it already sets mixed precision up (FSDP's policy, a GradScaler, amp), the step
    is in mixed precision already (MixedPrecisionElsewhere); when it wraps the model in a way
    loss scaling cannot follow (FullyShardedDataParallel under float16 where no ShardedGradScaler
    is created, Opacus, hand-made half precision), the step is refused with that reason.
    `creates_sharded_scaler`: the caller's GradScaler is created as a ShardedGradScaler for
    FSDP1 (the native backend's caller edit does). `own_scalers`: statements creating plain
    GradScalers that calls of the step may get passed (see `_existing_scalers`), not a setup of
    their own."""
    uses = [use for use in s.mixed_precision_uses if not any(s.contains(own, use) for own in own_scalers)]
    if uses:
        use = uses[0]
        raise MixedPrecisionElsewhere(
            f"{display}, which creates the optimizer, sets mixed precision up at line {s.line(use)} "
            f"({describe_mixed_precision_use(s, use)})", None,
        )
    if s.hand_written_mixed_precision is not None:
        what, node = s.hand_written_mixed_precision
        raise MixedPrecisionElsewhere(
            f"{display}, which creates the optimizer, does mixed precision by hand at line {s.line(node)} ({what})"
        )
    for binding in s.bindings:
        if binding.qualified_call in names.HOROVOD_OPTIMIZERS:
            raise Unconvertible(f"{display}:{s.line(binding.statement)} wraps the optimizer in horovod's "
                                f"DistributedOptimizer ({binding.name} = {binding.qualified_call}(...))" + HOROVOD_ELSEWHERE)
    for hazard in s.hazards:
        where = f"{display}:{s.line(hazard.node)}"
        if hazard.kind is HazardKind.FSDP or (backend == "apex" and hazard.kind is HazardKind.FULLY_SHARD):
            if backend != "apex" and creates_sharded_scaler and hazard.detail in names.FLAT_PARAMETER_FSDP_WRAPPERS:
                continue
            if backend == "apex":
                raise Unconvertible(f"{where} wraps the model in {hazard.detail}, which apex amp does not support")
            raise Unconvertible(
                f"{where} wraps the model in {hazard.detail}: float16 loss scaling needs "
                "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler there (a plain GradScaler lets "
                "ranks disagree on skipped steps); use --dtype bfloat16, or FSDP's MixedPrecision policy"
            )
        if hazard.kind is HazardKind.DIFFERENTIAL_PRIVACY:
            raise Unconvertible(
                f"{where} trains with Opacus ({hazard.detail}): loss scaling would scale the per-sample gradients "
                "its optimizer clips"
            )
        if hazard.kind is HazardKind.MANUAL_HALF:
            raise Unconvertible(
                f"{where} casts to half precision by hand ({hazard.detail}); autocast and GradScaler expect "
                "float32 weights"
            )


#: why a step whose optimizer horovod wraps in another module is refused
HOROVOD_ELSEWHERE = (": its allreduce runs asynchronously until the optimizer's step(), and the step in this module "
                     "would need horovod's recipe (optimizer.synchronize() before the scaler unscales, the step under "
                     "optimizer.skip_synchronize()), which ampify writes only where the wrap and the step are in one "
                     "file; convert by hand")


def call_at_site(s, site: CallSite, function_name: str) -> Optional[cst.Call]:
    """The call at `site` in the parsed module: on its line, calling `function_name` by that name
    or, imported under another (`from helper.loops import train_vanilla as train`), starting at the
    site's column."""
    on_line = [c for c in statements.calls_within(s.module) if s.line(c) == site.line]
    named = next((c for c in on_line if (dotted_name(c.func) or "").split(".")[-1] == function_name), None)
    return named or next((c for c in on_line if s.position(c).column == site.column), None)


def call_and_passed_optimizers(
    s, site: CallSite, function_name: str, positions: Dict[str, int], receivers: Sequence[str]
) -> Tuple[cst.Call, List[str]]:
    """The call of the step function at `site`, found again in the parsed module, and the plain
    variable it passes for each optimizer parameter; Unconvertible when either is not there."""
    display = site.display
    call = call_at_site(s, site, function_name)
    if call is None:
        raise Unconvertible(f"the call of {function_name}() at {display}:{site.line} could not be found again")
    passed = []
    for receiver in receivers:
        argument = statements.argument_for(call, receiver, positions)
        name = dotted_name(argument) if argument is not None else None
        if name is None or "." in name:
            raise Unconvertible(
                f"the call of {function_name}() at {display}:{site.line} does not pass {receiver} as a plain variable"
            )
        passed.append(name)
    return call, passed


def _home_for(s: TrainingStructure, placements: List[ScalerPlacement], passed: List[str], scope: Scope,
              call: cst.Call) -> ScalerHome:
    """The scaler home for one call: shared with the other calls of its scope when one scaler can
    be created before all of them, else a scaler of its own after the optimizer it passes
    (`tg_optimizer` at the top of a stage, `tg_ft_optimizer` for fine-tuning far below)."""
    for placement in placements:
        try:
            return placement._variable_home(passed, scope, s.statement_of(call), call)
        except FarApart:
            continue
    placements.append(ScalerPlacement(s, _numbered_name(s, "scaler", [p.scaler_name for p in placements])))
    return placements[-1]._variable_home(passed, scope, s.statement_of(call), call)


def _numbered_name(s: TrainingStructure, base: str, taken: Sequence[str]) -> str:
    """`scaler`, else `scaler_2`, `scaler_3`, ...: the first the module does not use yet (the
    GradScalers an earlier change set of the run created here included)."""
    candidates = [base] + [f"{base}_{k}" for k in range(2, 1000)]
    return next(n for n in candidates if n not in taken and n not in s.all_names)


def _reference_in(s, homes: Sequence[ScalerHome], scope: Scope, line: int) -> Optional[str]:
    """The scaler a checkpoint at `line` of `scope` saves; None when several scalers of the scope
    precede it (which one goes with the optimizer saved is not followed: AMP224 says so)."""
    found = {home.reference for home in homes if scope is home.scope and line > home.line}
    return found.pop() if len(found) == 1 else None
