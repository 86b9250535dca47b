"""Migrate NVIDIA apex amp to torch.amp: apex removed exactly (migrate/apex_removal.py), then the
native conversion adds torch.autocast and a GradScaler with all its own checks.

The file changes only when both halves succeed and the native conversion is complete; otherwise
it stays on apex, with the reason (AMP411). Findings name the lines of the file as it was.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import libcst as cst

from ampify.findings import Finding, Severity, incomplete_codes
from ampify.options import Options
from ampify.transforms.base import TransformResult, UnitContext, Verdict
from ampify.transforms.kit.arguments import with_keyword
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.line_map import LineMap
from ampify.transforms.kit.positions import Positions
from ampify.transforms.migrate.apex_removal import AUTOCAST_OFF, NO_INITIALIZE, ApexRemover, plan_apex_removal
from ampify.transforms.torch.native_amp import TorchNativeAmp

APEX_REMOVED = "AMP403"
APEX_NOT_MIGRATED = "AMP411"
APEX_O0 = "AMP412"

_NATIVE = TorchNativeAmp()


def migrate_apex(module: cst.Module, imports: ImportMap, options: Options, context: UnitContext) -> Optional[TransformResult]:
    """The migrated module, the reason it stays on apex, or None when apex amp is not used here
    (apex imported for its fused optimizers or parallel modules only)."""
    plan = plan_apex_removal(module, imports)
    if not plan.edits and not plan.obstacles:
        return None
    positions = Positions(module).compute_all()
    if plan.obstacles:
        findings = [_not_migrated(positions, node, _where_initialized(reason, context))
                    for node, reason in plan.obstacles]
        return TransformResult(module, Verdict.UNCONVERTED, findings,
                               f"apex amp that cannot be migrated to torch.amp exactly (line {findings[0].line})")
    without_apex = module.visit(ApexRemover(plan))
    code = without_apex.code
    reparsed = cst.parse_module(code)
    native_context = dataclasses.replace(context, source=code.encode(reparsed.encoding))
    native = _NATIVE.apply(reparsed, ImportMap.from_module(reparsed), options, native_context)
    lines = LineMap(module.code, code)
    native_findings = [
        dataclasses.replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message))
        for f in native.findings
    ]
    first_edit = min((positions.get(edit.node) for edit in plan.edits if positions.get(edit.node) is not None),
                     key=lambda p: (p.start.line, p.start.column), default=None)
    if native.verdict is not Verdict.CONVERTED or incomplete_codes(native.findings):
        why = native.reason or next((f.message for f in native_findings if f.severity is Severity.WARNING), "")
        finding = Finding(
            APEX_NOT_MIGRATED,
            "apex amp not migrated to torch.amp: with apex removed, the native conversion of this training code "
            f"does not complete ({why or native.verdict.value}); the file stays on apex",
            first_edit.start.line if first_edit else 0, first_edit.start.column if first_edit else 0, Severity.WARNING,
        )
        return TransformResult(module, Verdict.UNCONVERTED, [finding, *native_findings],
                               "apex amp that the native conversion cannot replace")
    module_out = native.module
    notes: List[Finding] = []
    if plan.casts_disabled:
        switched_off = _autocast_off(module_out)
        if isinstance(switched_off, str):
            return _stays_on_apex(module, first_edit, switched_off, "apex amp.disable_casts")
        module_out = switched_off
    if plan.opt_level == "O0" or plan.flag is not None:
        # O0 is float32 training: torch.amp switched off keeps it so (the flag, if any, no longer matters)
        flag, scopes = ("False", None) if plan.opt_level == "O0" else (plan.flag, plan.flag_scopes)
        switched = _switched_by(module_out, flag, scopes)
        if isinstance(switched, str):
            return _stays_on_apex(module, first_edit, switched, "apex amp switched by a flag")
        module_out = switched
    if plan.static_loss_scale is not None:
        fixed = _static_scale(module_out, plan.static_loss_scale)
        if fixed is None:
            return _stays_on_apex(module, first_edit, f"a static loss_scale={plan.static_loss_scale} and not one "
                                  "GradScaler to give it to", "apex amp with a static loss scale")
        module_out, what = fixed
        initialize = next((positions.get(edit.node) for edit in plan.edits if "initialize" in edit.what), first_edit)
        notes.append(Finding(APEX_REMOVED, f"apex amp -> torch.amp: {what}",
                             initialize.start.line if initialize else 0, initialize.start.column if initialize else 0))
    if plan.runtime_opt_level is not None:
        chosen, default, _ = plan.runtime_opt_level
        initialize = next((positions.get(edit.node) for edit in plan.edits if "initialize" in edit.what), first_edit)
        notes.append(Finding(APEX_REMOVED, f"apex amp -> torch.amp: opt_level={chosen} is chosen at run time; its "
                             f'option\'s default is "{default}", migrated with O1\'s semantics (torch.amp has one mixed '
                             "precision mode): a run that passes another level gets O1's too",
                             initialize.start.line if initialize else 0, initialize.start.column if initialize else 0))
    for edit in plan.edits:
        position = positions.get(edit.node)
        what = edit.what
        if plan.opt_level == "O0" and "initialize" in what:
            notes.append(Finding(APEX_O0, "apex O0 is float32 training: migrated with autocast and the GradScaler "
                                 "written enabled=False, so it still trains in float32, now without apex; set "
                                 "enabled=True for mixed precision", position.start.line if position else 0,
                                 position.start.column if position else 0, Severity.WARNING))
        if plan.opt_level == "O2" and "initialize" in what:
            what += ("; O2 migrated with O1's semantics: torch.amp keeps no float16 copy of the model, the model "
                     "stays float32 and autocast picks each op's precision")
        notes.append(Finding(APEX_REMOVED, f"apex amp -> torch.amp: {what}",
                             position.start.line if position else 0, position.start.column if position else 0))
    before, after = _scaler_calls(native.module), _scaler_calls(module_out)
    if before != after and len(before) == len(after):
        # the findings quote the GradScaler as the native conversion wrote it: quote it as it now is
        native_findings = [dataclasses.replace(f, message=_requoted(f.message, before, after)) for f in native_findings]
    findings = sorted([*notes, *native_findings], key=lambda f: (f.line, f.column, f.code))
    return TransformResult(module_out, Verdict.CONVERTED, findings, native.reason, native.companions)


_AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast")
_SCALERS = ("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cuda.amp.GradScaler")


def _switched_by(module: cst.Module, flag: str, scopes) -> "cst.Module | str":
    """The module with `enabled=<flag>` on every autocast and GradScaler the native conversion wrote,
    or why not: the flag must be readable where they are (in the functions that read it before)."""
    imports = ImportMap.from_module(module)
    targets = {}
    stack: List[cst.CSTNode] = []

    class _Sites(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, cst.Call) and imports.resolve(node.func) in (*_AUTOCAST, *_SCALERS):
                names = [n.name.value for n in stack if isinstance(n, (cst.FunctionDef, cst.ClassDef))]
                targets[id(node)] = ".".join(names) or "<module>"
            stack.append(node)
            return True

        def on_leave(self, original_node: cst.CSTNode) -> None:
            stack.pop()

    module.visit(_Sites())
    outside = sorted(scope for scope in set(targets.values()) if scopes is not None and scope not in scopes)
    if not targets:
        return "no autocast or GradScaler to switch by the flag"
    if outside:
        return (f"the flag {flag} is read in {', '.join(sorted(scopes))}, and torch.amp would need it in "
                f"{', '.join(outside)} too, where it may not be defined")

    class _Switch(cst.CSTTransformer):
        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
            if id(original_node) not in targets:
                return updated_node
            return with_keyword(updated_node, "enabled", cst.parse_expression(flag))

    return module.visit(_Switch())


def _autocast_off(module: cst.Module) -> "cst.Module | str":
    """The module with each AUTOCAST_OFF() stand-in made `torch.autocast(device_type=<the device the
    native conversion chose>, enabled=False)`, or why not (no autocast, or several devices)."""
    imports = ImportMap.from_module(module)
    devices = set()

    class _Devices(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if imports.resolve(node.func) in _AUTOCAST:
                device = next((arg.value for arg in node.args if arg.keyword is not None
                               and arg.keyword.value == "device_type"), node.args[0].value if node.args else None)
                devices.add(cst.Module(body=[]).code_for_node(device) if device is not None else "")

    module.visit(_Devices())
    if len(devices) != 1 or "" in devices:
        return "amp.disable_casts() needs the one device the autocast regions run on, and there is " + (
            "no autocast" if not devices else "more than one")
    device = devices.pop()
    torch_name = next(iter(sorted(imports.local_names_for("torch"))), None)
    if torch_name is None:
        return "amp.disable_casts() needs torch imported by name"

    class _Off(cst.CSTTransformer):
        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
            if isinstance(updated_node.func, cst.Name) and updated_node.func.value == AUTOCAST_OFF:
                return cst.parse_expression(f"{torch_name}.autocast(device_type={device}, enabled=False)")
            return updated_node

    return module.visit(_Off())


#: GradScaler grows the scale after this many finite steps: never, for a static scale
_NEVER = "2**30"


def _static_scale(module: cst.Module, scale: str):
    """(the module with the one GradScaler the native conversion created given `init_scale=scale`
    and a growth interval that never ends, what the finding says), or None when there is not
    exactly one (bfloat16 creates none: the scale is then simply not needed)."""
    imports = ImportMap.from_module(module)
    found: List[cst.Call] = []

    class _Scalers(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if imports.resolve(node.func) in ("torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler",
                                              "torch.cuda.amp.GradScaler"):
                found.append(node)

    module.visit(_Scalers())
    if not found:
        return module, f"static loss_scale={scale} dropped: bfloat16 needs no loss scaling"
    if len(found) != 1:
        return None
    target = found[0]

    class _Give(cst.CSTTransformer):
        def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
            if original_node is not target:
                return updated_node
            return with_keyword(with_keyword(updated_node, "init_scale", cst.parse_expression(scale)),
                                "growth_interval", cst.parse_expression(_NEVER))

    what = (f"static loss_scale={scale} -> GradScaler(init_scale={scale}, growth_interval={_NEVER}): the scale never "
            "grows; unlike apex's static scale, a step whose gradients overflow is skipped and the scale still backs "
            "off (halves)")
    return module.visit(_Give()), what


def _scaler_calls(module: cst.Module) -> List[str]:
    """The code of every GradScaler construction, in source order."""
    imports = ImportMap.from_module(module)
    found: List[str] = []

    class _Scalers(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if imports.resolve(node.func) in _SCALERS:
                found.append(module.code_for_node(node))

    module.visit(_Scalers())
    return found


def _requoted(message: str, before: List[str], after: List[str]) -> str:
    for old, new in zip(before, after):
        message = message.replace(old, new)
    return message


def _stays_on_apex(module: cst.Module, where, why: str, reason: str) -> TransformResult:
    """The file left on apex: a step after the native conversion could not be written (`why`)."""
    finding = Finding(APEX_NOT_MIGRATED, f"{why}; the file stays on apex", where.start.line if where else 0,
                      where.start.column if where else 0, Severity.WARNING)
    return TransformResult(module, Verdict.UNCONVERTED, [finding], reason)


def _where_initialized(reason: str, context: UnitContext) -> str:
    """The obstacle "no amp.initialize in this file", said with the project modules that call it,
    or with none (taesungp/contrastive-unpaired-translation: `amp.scale_loss` under `if
    self.opt.amp:` and no amp.initialize anywhere, which fails at the first scaled step)."""
    if not reason.startswith(NO_INITIALIZE):
        return reason
    ask = getattr(context.project, "modules_spelling", None)
    if ask is None:
        return reason
    found = ask(b"amp.initialize(")
    if found:
        return f"{NO_INITIALIZE} (it runs in {', '.join(found)}): migrate that one"
    return (f"{NO_INITIALIZE} nor in any other module of the repository: its amp.scale_loss would fail before "
            "amp.initialize was called; migrate by hand (or remove the apex calls)")


def _not_migrated(positions: Positions, node: cst.CSTNode, reason: str) -> Finding:
    position = positions.get(node)
    return Finding(
        APEX_NOT_MIGRATED, f"{reason}; the file stays on apex amp (removed from apex after release 25.05)",
        position.start.line if position else 0, position.start.column if position else 0, Severity.WARNING,
    )
