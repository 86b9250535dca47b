"""Gradient penalties under float16 loss scaling (WGAN-GP, R1), as PyTorch's AMP examples do it:
the penalty's gradients are taken of the *scaled* outputs, then divided by the scale.

    gradients = torch.autograd.grad(outputs=scaler.scale(d_out), inputs=x, create_graph=True)[0]
    gradients = gradients / scaler.get_scale()

Without it the penalty's float16 gradients underflow (or the penalty is computed from gradients
the scaler never sees). Converted where the grad call is a plain assignment
(`g = autograd.grad(...)[0]` or `grads = autograd.grad(...)`), in a converted training step or
in a module-level helper of the file (`compute_gradient_penalty(D, real, fake)`) whose every use
is a direct call: the helper gets a `scaler=None` parameter (None keeps its float32 behaviour for
any caller that does not pass one) and the step passes its scaler. Anything else stays a hazard
(AMP212) and blocks the file as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.training_loop import HazardKind, TrainingStructure, TrainingUnit, method_calls


@dataclass
class PenaltySite:
    """One `torch.autograd.grad(..., create_graph=True)` that can be scaled."""

    call: cst.Call
    statement: cst.SimpleStatementLine
    target: str
    #: `autograd.grad(...)[0]`: one tensor; else the tuple of gradients
    indexed: bool
    outputs: cst.Arg
    #: the module-level helper holding it, or None when it sits in the step's own function
    helper: Optional[cst.FunctionDef] = None
    helper_calls: List[cst.Call] = field(default_factory=list)
    #: create_graph=True (a gradient penalty); False: a plain autograd.grad of a loss (MAML, FGSM)
    penalty: bool = True
    #: `grad_real, = autograd.grad(...)` (stylegan2's R1): the names the gradients are unpacked to
    unpacked: Tuple[str, ...] = ()

    def unscale(self, scale: str, indent: str = "") -> str:
        """The statement(s) dividing the gradients by `scale`, lines after the first indented by `indent`."""
        if self.unpacked:
            return f"\n{indent}".join(f"{name} = {name} / {scale}" for name in self.unpacked)
        if self.indexed:
            return f"{self.target} = {self.target} / {scale}"
        return f"{self.target} = tuple(g / {scale} for g in {self.target})"


def penalty_sites(s: TrainingStructure, scaler_name: str,
                  kinds=(HazardKind.CREATE_GRAPH,)) -> Dict[int, PenaltySite]:
    """The hazards of `kinds` that can be scaled, by id of their call: gradient penalties
    (create_graph), and for native AMP also the plain `torch.autograd.grad(loss, ...)` of a
    training step (AUTOGRAD_GRAD: a MAML inner loop, adversarial examples), scaled the same way."""
    sites = {}
    for hazard in s.hazards:
        if hazard.kind not in kinds:
            continue
        site = _site(s, hazard.node, scaler_name)
        if site is not None:
            site.penalty = hazard.kind is HazardKind.CREATE_GRAPH
            sites[id(hazard.node)] = site
    return sites


def _site(s: TrainingStructure, call: cst.Call, scaler_name: str) -> Optional[PenaltySite]:
    site = _assigned_site(s, call)
    if site is None:
        return None
    statement = site.statement
    scope = s.scope_of(statement)
    if isinstance(scope, cst.FunctionDef) and not _is_a_unit_scope(s, scope):
        # a helper: a module-level function, or a method called as self.<name>(...) in its own class
        # (StarGAN's Solver.gradient_penalty(y, x)); every use must be a direct call, and the
        # parameter name free
        from ampify.transforms.torch.scaler_placement import _calls_of_function

        klass = s.class_of(scope)
        if klass is not None and (_decorated(scope) or len(s.enclosing_scopes(scope)) != 2):
            return None  # a static/class method, or a function nested in a method
        calls, other_uses = method_calls(s, scope, klass) if klass is not None else _calls_of_function(s, scope)
        parameters = {p.name.value for p in statements.all_params(scope)}
        if other_uses or not calls or scaler_name in parameters or scope.params.star_kwarg is not None:
            return None
        site.helper, site.helper_calls = scope, calls
    return site


def _assigned_site(s: TrainingStructure, call: cst.Call) -> Optional[PenaltySite]:
    """`g = autograd.grad(outputs, ...)[0]`, `grads = autograd.grad(...)` or `g, = autograd.grad(...)`:
    the site, helper unset."""
    statement = s.statement_of(call)
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    unpacked: Tuple[str, ...] = ()
    if isinstance(target, (cst.Tuple, cst.List)) and assign.value is call and target.elements and all(
            isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements):
        unpacked = tuple(e.value.value for e in target.elements)
    elif not isinstance(target, cst.Name):
        return None
    value = assign.value
    indexed = (
        isinstance(value, cst.Subscript) and value.value is call and len(value.slice) == 1
        and isinstance(value.slice[0].slice, cst.Index) and isinstance(value.slice[0].slice.value, cst.Integer)
        and value.slice[0].slice.value.value == "0"
    )
    if value is not call and not indexed:
        return None
    if any(a.keyword is not None and a.keyword.value == "allow_unused" and not (
            isinstance(a.value, cst.Name) and a.value.value == "False") for a in call.args):
        return None  # gradients that may be None cannot be divided by the scale
    outputs = next((a for a in call.args if a.keyword is not None and a.keyword.value == "outputs"), None)
    if outputs is None and call.args and call.args[0].keyword is None and not call.args[0].star:
        outputs = call.args[0]
    if outputs is None:
        return None
    return PenaltySite(call, statement, unpacked[0] if unpacked else target.value, indexed, outputs,
                       unpacked=unpacked)


def _decorated(function: cst.FunctionDef) -> bool:
    return bool(function.decorators)


def _is_a_unit_scope(s: TrainingStructure, scope) -> bool:
    return any(unit.scope is scope for unit in s.units)


@dataclass
class Bridge:
    """A helper's call one function away from the step: inside `function` (a method of the step's
    class, or a module-level function of the file), which the step calls directly (`calls`).
    GAN_stability's `wgan_gp_reg()` calling `compute_grad2(d_out, x_interp)`."""

    call: cst.Call
    function: cst.FunctionDef
    calls: List[cst.Call]


def bridges_of_unit(s: TrainingStructure, unit: TrainingUnit, site: PenaltySite,
                    parameter: Optional[str]) -> Optional[List[Bridge]]:
    """The helper's calls that run in the unit's iteration one call away from it, each with the
    function holding it and the unit's calls of that function; None when a call the iteration
    reaches (through any chain of the file's functions) cannot be followed that way: deeper, or
    in a function that cannot take `parameter` (None: no parameter needed, apex)."""
    if site.helper is None:
        return []
    reached = functions_reached(s, unit)
    bridges: List[Bridge] = []
    for call in site.helper_calls:
        if s.contains(unit.owner, call):
            continue
        function = s.scope_of(call)
        if not isinstance(function, cst.FunctionDef) or id(function) not in reached:
            continue
        klass = s.class_of(function)
        if _decorated(function) or len(s.enclosing_scopes(function)) != 2:
            return None
        calls, other_uses = method_calls(s, function, klass) if klass is not None else _function_calls(s, function)
        from_unit = [c for c in calls if s.contains(unit.owner, c)]
        if not from_unit or other_uses:
            return None
        if parameter is not None and (parameter in {p.name.value for p in statements.all_params(function)}
                                      or function.params.star_kwarg is not None):
            return None
        bridges.append(Bridge(call, function, from_unit))
    return bridges


def functions_reached(s: TrainingStructure, unit: TrainingUnit) -> Set[int]:
    """Ids of the functions of the file the unit's iteration runs by name, through any chain of
    calls: module-level functions (`f(...)`) and methods of the unit's class (`self.m(...)`)."""
    functions = {st.name.value: st for st in s.module.body if isinstance(st, cst.FunctionDef)}
    methods = {} if unit.klass is None else {
        st.name.value: st for st in unit.klass.body.body if isinstance(st, cst.FunctionDef)}
    reached: Set[int] = set()
    pending: List[cst.CSTNode] = [unit.owner]
    while pending:
        node = pending.pop()
        for call in statements.calls_within(node):
            name = dotted_name(call.func) or ""
            target = methods.get(name[len("self."):]) if name.startswith("self.") else functions.get(name)
            if target is not None and id(target) not in reached:
                reached.add(id(target))
                pending.append(target)
    return reached


def _function_calls(s: TrainingStructure, function: cst.FunctionDef):
    from ampify.transforms.torch.scaler_placement import _calls_of_function

    return _calls_of_function(s, function)


def sites_of_unit(s: TrainingStructure, unit: TrainingUnit, sites: Dict[int, PenaltySite],
                  parameter: Optional[str] = None) -> List[PenaltySite]:
    """The penalties this unit computes: in its own body, through helper calls in it, or through
    helper calls one function away (bridges_of_unit)."""
    found = []
    for site in sites.values():
        if site.helper is None:
            if s.contains(unit.owner, site.statement):
                found.append(site)
        elif any(s.contains(unit.owner, call) for call in site.helper_calls) or bridges_of_unit(s, unit, site, parameter):
            found.append(site)
    return found


def state_fed_back(s: TrainingStructure, call: cst.Call) -> Optional[str]:
    """"self.mean_path_length" when the statement holding a penalty call hands it a name or
    attribute that the same statement rebinds from its result (StyleGAN2's path length
    regularizer: `loss, self.mean_path_length = g_path_regularize(img, latents,
    self.mean_path_length)`): a running statistic of the gradients, carried across steps. Under a
    GradScaler the first steps overflow on purpose (their updates are skipped), and that statistic
    would turn non-finite for every later step. None otherwise."""
    statement = s.statement_of(call)
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    targets: Set[str] = set()
    for small in statement.body:
        if isinstance(small, cst.Assign):
            for target in small.targets:
                elements = target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else [target.target]
                for element in elements:
                    node = element.value if isinstance(element, (cst.Element, cst.StarredElement)) else element
                    name = dotted_name(node)
                    if name:
                        targets.add(name)
        elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
            name = dotted_name(small.target)
            if name:
                targets.add(name)
    for arg in call.args:
        name = dotted_name(arg.value)
        if name and name in targets:
            return name
    return None


def state_kept_across_steps(s: TrainingStructure, site: PenaltySite) -> Optional[str]:
    """"self.pl_mean" when the function holding the penalty keeps a running statistic of its
    gradients in an attribute whose value it computes with (NVlabs' StyleGAN2 loss: `pl_mean =
    self.pl_mean.lerp(pl_lengths.mean(), decay)`, the penalty from `pl_mean`, then
    `self.pl_mean.copy_(pl_mean.detach())`): what state_fed_back finds when the statistic is
    handed back, kept in place instead. None otherwise."""
    scope = site.helper if site.helper is not None else s.scope_of(site.statement)
    if not isinstance(scope, cst.FunctionDef):
        return None
    return kept_state(scope, site.statement, set(site.unpacked) or {site.target})


def kept_state(function: cst.FunctionDef, after: cst.CSTNode, tainted: Set[str]) -> Optional[str]:
    """The attribute that a statement of `function` after `after` updates from the names in
    `tainted` (followed through assignments) and that the function computes with (reads into a
    local or returns: a running statistic, not a value kept for logging); None when there is none."""
    lines = statements.nodes_of_type(function.body, cst.SimpleStatementLine)
    if after not in lines:
        return None
    computed_with: Set[str] = set()
    for line in lines:
        for small in line.body:
            if isinstance(small, cst.Assign) and any("." not in name for name in _target_names(
                    [t.target for t in small.targets])):
                computed_with |= statements.used_names(small.value)
            elif isinstance(small, cst.Return) and small.value is not None:
                computed_with |= statements.used_names(small.value)
    tainted = set(tainted)
    for line in lines[lines.index(after) + 1:]:
        for small in line.body:
            found = _kept_by(small, tainted, computed_with)
            if found is not None:
                return found
    return None


def _kept_by(small: cst.BaseSmallStatement, tainted: Set[str], computed_with: Set[str]) -> Optional[str]:
    """The attribute of `computed_with` this statement updates from `tainted` (adding the plain
    names it binds from `tainted` to it), or None."""
    if isinstance(small, (cst.Assign, cst.AugAssign)) and statements.used_names(small.value) & tainted:
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
        for name in _target_names(targets):
            if "." not in name:
                tainted.add(name)
            elif name in computed_with:
                return name
    elif isinstance(small, cst.Expr):
        for call in statements.nodes_of_type(small.value, cst.Call):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value.endswith("_")
                    and not func.attr.value.startswith("_")):
                continue
            receiver = dotted_name(func.value)
            if (receiver and receiver in computed_with and "." in receiver
                    and any(statements.used_names(a.value) & tainted for a in call.args)):
                return receiver
    return None


def _target_names(targets) -> List[str]:
    names: List[str] = []
    for target in targets:
        if isinstance(target, (cst.Tuple, cst.List)):
            names += _target_names([e.value for e in target.elements])
        else:
            name = dotted_name(target)
            if name:
                names.append(name)
    return names


def where_penalty(s: TrainingStructure, unit: TrainingUnit, site: PenaltySite, parameter: Optional[str]) -> str:
    """" in compute_grad2() (called in wgan_gp_reg())" for a message; "" for a penalty in the step."""
    if site.helper is None:
        return ""
    through = sorted({bridge.function.name.value + "()" for bridge in bridges_of_unit(s, unit, site, parameter) or []})
    return f" in {site.helper.name.value}()" + (f" (called in {', '.join(through)})" if through else "")


def unreached_penalties(s: TrainingStructure, sites: Dict[int, PenaltySite], parameter: Optional[str]) -> Set[int]:
    """Ids of the sites a training unit runs through a chain ampify cannot thread the scaler
    through (bridges_of_unit None): they stay hazards (AMP212 / AMP312), not claimed as scaled."""
    return {key for key, site in sites.items()
            if any(bridges_of_unit(s, unit, site, parameter) is None for unit in s.units)}


def write_penalty(edits, site: PenaltySite, unit: TrainingUnit, s: TrainingStructure, reference: str,
                  scaler_name: str, indent: str) -> None:
    """Scale the outputs, unscale the gradients; for a helper, its new parameter and the calls."""
    outputs = statements.code_of(site.outputs.value)
    if site.helper is None:
        scaled = cst.parse_expression(f"{reference}.scale({outputs})")
        edits.insert_after(site.statement, site.unscale(f"{reference}.get_scale()"))
    else:
        plain = outputs if isinstance(site.outputs.value, (cst.Name, cst.Attribute)) else f"({outputs})"
        scaled = cst.parse_expression(f"{scaler_name}.scale({outputs}) if {scaler_name} is not None else {plain}")
        edits.insert_after(site.statement, f"if {scaler_name} is not None:\n{indent}"
                           + site.unscale(f"{scaler_name}.get_scale()", indent))
        edits.add_parameter(site.helper, scaler_name, default="None")
        for call in site.helper_calls:
            if s.contains(unit.owner, call):
                edits.add_keyword(call, scaler_name, reference)
        for bridge in (bridges_of_unit(s, unit, site, scaler_name) or []) if unit is not None else []:
            if reference.startswith("self.") and unit.klass is not None and s.class_of(bridge.function) is unit.klass:
                edits.add_keyword(bridge.call, scaler_name, reference)  # the step's own scaler, reached through self
                continue
            edits.add_parameter(bridge.function, scaler_name, default="None")
            edits.add_keyword(bridge.call, scaler_name, scaler_name)
            for call in bridge.calls:
                edits.add_keyword(call, scaler_name, reference)
    arguments = [a.with_changes(value=scaled) if a is site.outputs else a for a in site.call.args]
    edits.replace_call(site.call, site.call.with_changes(args=arguments))


def penalty_of_another_module(project, nodes) -> Optional[tuple]:
    """The first of penalties_of_other_modules(project, nodes), or None."""
    found = penalties_of_other_modules(project, nodes)
    return found[0] if found else None


def penalties_of_other_modules(project, nodes) -> List[tuple]:
    """(call, "gan.gradient_penalty", "torchprob/gan/gradient_penalty.py:69") for each call
    within `nodes` of a function of another project module that runs
    torch.autograd.grad(..., create_graph=True) (LynnHo's `gan.gradient_penalty(D, x_real,
    x_fake, ...)`; BasicSR's StyleGAN2 step calls both `r1_penalty(...)` and
    `g_path_regularize(...)`): their gradients would be taken of unscaled float16 outputs.
    Empty when there is none (or no project)."""
    ask = getattr(project, "gradient_penalty_called", None)
    if ask is None:
        return []
    found, seen = [], set()
    for node in nodes:
        for call in statements.calls_within(node):
            called = dotted_name(call.func)
            if not called or id(call) in seen:
                continue
            seen.add(id(call))
            where = ask(called)
            if where is not None:
                found.append((call, called, where))
    return found


def _scaled_already(site: PenaltySite, scaler_name: str) -> bool:
    """The outputs read `scaler.scale(pred) if scaler is not None else pred` (written by ampify)."""
    value = site.outputs.value
    return (isinstance(value, cst.IfExp) and isinstance(value.body, cst.Call)
            and dotted_name(value.body.func) == f"{scaler_name}.scale"
            and statements.code_of(value.test) == f"{scaler_name} is not None")


def scale_penalty_of_module(source: bytes, function_name: str, scaler_name: str
                            ) -> Union[Tuple[Optional[bytes], int], str]:
    """The other half of a penalty of another module (LynnHo's `torchprob/gan/gradient_penalty.py`,
    called as `gan.gradient_penalty(D, x_real, x_fake, ...)` from the step): its module-level
    function gets `scaler=None` and scales the outputs it differentiates when given one, as an
    in-file helper does (None keeps its float32 behaviour for every other caller). Returns (new
    source, line of the autograd.grad call), (None, line) when it takes and scales a scaler already
    (another training file's change set of this run wrote it), or the reason it cannot be done."""
    from ampify.transforms.kit.imports import ImportMap
    from ampify.transforms.torch.edits import StatementEdits, apply_edits
    from ampify.transforms.torch.training_loop import analyze_training

    try:
        module = cst.parse_module(source)
    except Exception as error:  # the other module does not parse
        return f"it does not parse ({type(error).__name__})"
    s = analyze_training(module, ImportMap.from_module(module))
    function = next((st for st in s.module.body if isinstance(st, cst.FunctionDef) and st.name.value == function_name),
                    None)
    if function is None:
        return f"{function_name}() is not a module-level function there"
    grads = [h.node for h in s.hazards if h.kind is HazardKind.CREATE_GRAPH and s.contains(function, h.node)]
    if len(grads) != 1:
        return (f"{function_name}() runs torch.autograd.grad(..., create_graph=True) through a helper of its module"
                if not grads else f"{function_name}() runs torch.autograd.grad(..., create_graph=True) more than once")
    site = _assigned_site(s, grads[0])
    if site is None:
        return "its torch.autograd.grad(...) is not assigned to a name (`g = torch.autograd.grad(...)[0]`)"
    parameters = {p.name.value for p in statements.all_params(function)}
    if scaler_name in parameters and _scaled_already(site, scaler_name):
        return None, s.line(site.call)  # another training file's change set of this run scaled it already
    if scaler_name in parameters or function.params.star_kwarg is not None or _decorated(function):
        return f"{function_name}() cannot take a `{scaler_name}` parameter (taken, **kwargs, or decorated)"
    kept = kept_state(function, site.statement, set(site.unpacked) or {site.target})
    if kept is not None:
        return (f"{function_name}() keeps a running statistic of its gradients in {kept}, which GradScaler's "
                "skipped overflow steps would leave non-finite for every later step")
    site.helper = function
    edits = StatementEdits()
    write_penalty(edits, site, None, s, scaler_name, scaler_name, s.module.config_for_parsing.default_indent)
    return apply_edits(s.module, edits).bytes, s.line(site.call)
