"""apex across two modules: the step function (`train_one_epoch(model, ..., optimizer, ...)` in
engine.py) gets `amp.scale_loss` and `amp.master_params`; the module that creates the optimizer and
calls it (main.py) gets `amp.initialize` after the optimizer and the model's device moves, before
any DataParallel/DDP wrap, and amp's state in its checkpoints. amp is a module-level singleton,
so nothing is threaded through the call: `optimizer` is the patched one when the step runs.

Both modules are written as one change set. Anything that cannot be followed raises
Unconvertible with the reason, and neither module changes.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Union

import libcst as cst

from ampify.options import Options
from ampify.transforms.base import CallSite, CompanionChange, ProjectFacts
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.caller_threading import call_and_passed_optimizers, check_caller_setup
from ampify.transforms.torch.edits import apply_edits
from ampify.transforms.torch.training_loop import TrainingStructure, TrainingUnit, Unconvertible, analyze_training


def foreign_call_sites(
    structure: TrainingStructure, unit: TrainingUnit, project: Optional[ProjectFacts], in_file_calls: int
) -> Optional[List[CallSite]]:
    """The calls in other modules when this unit's optimizers are all parameters of a
    module-level function called only from other modules; None for any other shape."""
    function = unit.scope
    if project is None or in_file_calls or not isinstance(function, cst.FunctionDef):
        return None
    if structure.class_of(function) is not None:
        return None
    parameters = {p.name.value for p in statements.all_params(function)}
    if not unit.optimizers or not all(optimizer in parameters for optimizer in unit.optimizers):
        return None
    sites = list(project.call_sites_elsewhere(function.name.value))
    return sites or None


def _existing_initialize(s: TrainingStructure, sites: Sequence[CallSite], function: cst.FunctionDef,
                         receivers: Sequence[str], losses: int) -> Optional[int]:
    """The line of the calling module's one `model, optimizer = amp.initialize(model, optimizer,
    ...)` when it already initializes every optimizer the calls at `sites` pass, with enough
    losses, and runs before each of them (same scope, above, in a block that holds the call):
    amp.initialize set up for another step function of the repository (an earlier change set
    of this run, or the user). The step then only needs amp.scale_loss; the caller stays as it is.
    None for any other shape (check_caller_setup decides)."""
    initializes = [use for use in s.mixed_precision_uses if isinstance(use, cst.Call)
                   and (s.imports.resolve(use.func) or "").endswith("amp.initialize")]
    if len(initializes) != 1:
        return None
    initialize = initializes[0]
    statement = s.statement_of(initialize)
    if not isinstance(statement, cst.SimpleStatementLine) or any(
            use is not initialize and not s.contains(statement, use) for use in s.mixed_precision_uses):
        return None
    arguments = [arg for arg in initialize.args if arg.keyword is None]
    if len(arguments) < 2:
        return None
    optimizer_argument = arguments[1].value
    elements = ([e.value for e in optimizer_argument.elements]
                if isinstance(optimizer_argument, (cst.List, cst.Tuple)) else [optimizer_argument])
    initialized = {dotted_name(e) for e in elements}
    declared = next((arg.value for arg in initialize.args if arg.keyword is not None and arg.keyword.value == "num_losses"), None)
    if declared is None:
        num_losses = 1
    elif isinstance(declared, cst.Integer):
        num_losses = int(declared.value)
    else:
        return None
    if losses > num_losses:
        return None
    positions = statements.parameter_positions(function)
    for site in sites:
        call, passed = call_and_passed_optimizers(s, site, function.name.value, positions, receivers)
        if not set(passed) <= initialized:
            return None
        if s.scope_of(call) is not s.scope_of(statement) or s.line(call) <= s.line(statement):
            return None
        if not any(block is s.block_of(statement) for block, _ in s.block_path(call)):
            return None
    return s.line(statement)


def plan_caller(
    make_conversion: Callable[[TrainingStructure, Options], object],
    options: Options,
    source: bytes,
    sites: Sequence[CallSite],
    function: cst.FunctionDef,
    receivers: Sequence[str],
    losses: int,
    step_display: str,
) -> Union[CompanionChange, int]:
    """The calling module's edit: amp.initialize for the optimizers it passes at `sites`; or the
    line of the amp.initialize it already has for them (see `_existing_initialize`)."""
    display = sites[0].display
    try:
        module = cst.parse_module(source)
    except Exception as error:
        raise Unconvertible(f"{display} does not parse ({type(error).__name__}), so amp.initialize cannot go there")
    s = analyze_training(module, ImportMap.from_module(module))
    if s.backwards:
        raise Unconvertible(
            f"{display} trains too (backward() at {display}:{s.line(s.backwards[0].call)}); ampify places "
            "amp.initialize in a module that only sets the training up"
        )
    existing = _existing_initialize(s, sites, function, receivers, losses)
    if existing is not None:
        return existing
    check_caller_setup(s, display, "apex")
    conversion = make_conversion(s, options)
    positions = statements.parameter_positions(function)
    setup = None
    calls = []
    for site in sites:
        call, passed = call_and_passed_optimizers(s, site, function.name.value, positions, receivers)
        found = conversion.setups.setup_of_passed_optimizers(passed, s.scope_of(call), call)
        if setup is not None and found.construction_statements != setup.construction_statements:
            raise Unconvertible(
                f"{display} calls {function.name.value}() with optimizers created in different places; apex allows "
                "one amp.initialize per process"
            )
        setup = found
        calls.append(s.statement_of(call) or call)
    conversion.setups.check_models_reach_the_gpu(setup)
    conversion.setups.check_models_not_wrapped_by_helpers(setup)
    anchor = conversion.place_initialize(losses, setup, calls, f" (for {function.name.value}() in {step_display})")
    conversion.plan_checkpoints(setup, anchor)
    conversion.add_import()
    new_module = apply_edits(s.module, conversion.plan)
    return CompanionChange(
        key=sites[0].key, display=display, old=source, new=new_module.bytes,
        findings=sorted(conversion.findings, key=lambda f: (f.line, f.column, f.code)),
        reason=f"changed with {step_display}: amp.initialize for the optimizer {function.name.value}() steps",
    )
