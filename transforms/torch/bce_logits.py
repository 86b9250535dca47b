"""BCE after a Sigmoid, fused: the fix NVIDIA's apex DCGAN example made.

CUDA autocast and apex refuse `nn.BCELoss` (float16 `log` of a probability is too coarse). When a
model of this file ends in `nn.Sigmoid()` and its output feeds an `nn.BCELoss` criterion:

- the final `nn.Sigmoid()` is dropped from the model's `nn.Sequential`,
- the criterion becomes `nn.BCEWithLogitsLoss(...)` (same arguments; the same loss, computed
  stably from logits),
- every other use of the model's output (a logged `D(x).mean()`, a threshold, a saved sample)
  gets `torch.sigmoid(...)`, so it still sees the probability it saw before.

Only when every use can be followed in this file: the model's class keeps its Sequential to
itself and returns it through shape operations only; its instances are only called or used
through their parameters, state and mode; a name holding its output holds nothing else; the
criterion is applied only to its outputs. Anything else leaves the file as it was (the BCE
warning stays).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.positions import Positions
from ampify.transforms.torch.torch_import import add_import_torch

#: device moves of a criterion module (a statement of their own): BCEWithLogitsLoss moves alike
_DEVICE_MOVES = {"cuda", "cpu", "to"}
#: a sigmoid applied as a function at the end of forward() (`return torch.sigmoid(self.fc(x))`)
_FUNCTIONAL_SIGMOIDS = ("torch.sigmoid", "torch.nn.functional.sigmoid")
#: what a read of the output may ask without its values: the same for logits and probabilities
_SHAPE_READS = {"size", "shape", "dim", "ndim", "numel", "device", "dtype", "is_cuda"}
#: the criterion name of a fusion with no criterion (it matches no name of a file)
_NO_CRITERION = "<no criterion>"
#: functions and methods taking a log (of a probability the fusion hands them)
_LOGS = {"log", "log2", "log10", "log1p"}
_SHAPE_METHODS = {"view", "squeeze", "unsqueeze", "reshape", "flatten", "view_as", "contiguous"}
_MODEL_ATTRIBUTES = {
    "parameters", "named_parameters", "apply", "to", "cuda", "cpu", "state_dict", "load_state_dict", "train",
    "eval", "zero_grad", "modules", "children", "requires_grad_", "half", "float",
}


@dataclass
class Fusion:
    """What was changed, for the findings (lines of the module before the change)."""

    criterion_line: int
    sigmoid_line: int
    wrapped: List[int] = field(default_factory=list)
    #: the finding's first sentence when it is not the Sequential form's (bce_functional.py)
    description: Optional[str] = None
    #: the finding's rule: AMP231 (a BCE fused), AMP248 (a log of the probability taken in float32)
    code: str = "AMP231"
    #: lines of the reads wrapped as `torch.sigmoid(x.float())` (a log reads them)
    float_wrapped: List[int] = field(default_factory=list)


def fuse_bce_after_sigmoid(module: cst.Module, imports: ImportMap, project=None) -> Optional[tuple]:
    """(new module, Fusion) when the shape above holds everywhere for exactly one of the file's
    sigmoids (a generator ending in nn.Sigmoid beside the discriminator that feeds the loss: the
    generator's is not followed to the criterion); None otherwise."""
    return _fuse_one_sigmoid(module, imports, project, logs_only=False)


def fuse_logged_sigmoid(module: cst.Module, imports: ImportMap, project=None) -> Optional[tuple]:
    """The same, for a file with no BCE criterion that takes the log of the model's probability
    itself (`torch.log(D_real + 1e-8) + torch.log(1 - D_fake + 1e-8)`, AMP229): the final sigmoid
    goes, and every read of the output gets `torch.sigmoid(...)`, taken from a float32 copy of the
    logits where a log reads it (`torch.log(torch.sigmoid(D_real.float()) + 1e-8)`): the float32
    probability the fp32 script computed, so `1 - p` and the log stay what they were. None unless
    exactly one sigmoid's outputs can all be followed."""
    return _fuse_one_sigmoid(module, imports, project, logs_only=True)


def _fuse_one_sigmoid(module: cst.Module, imports: ImportMap, project, logs_only: bool) -> Optional[tuple]:
    index = _Index()
    walk(module, index)
    fused = []
    for candidate in _sigmoid_candidates(index, imports):
        try:
            fuser = _Fuser(module, imports, index)
            fuser.project = project
            fuser.logs_only = logs_only
            fused.append(fuser.run(candidate))
        except _NotFollowed:
            continue
        except (IndexError, AttributeError, KeyError, TypeError):
            # a shape the checks did not foresee: not followed, so nothing is fused and the BCE (or
            # AMP229) warning stands (a wrong fusion is the one outcome that must not happen)
            continue
    return fused[0] if len(fused) == 1 else None


def fuse_imported_sigmoid_model(module: cst.Module, imports: ImportMap, project, here: str):
    """The model feeding this module's BCE criterion is a class of another project module that
    ends in a sigmoid: (fused module, Fusion, CompanionChange of the model module) when both sides
    can be followed and the model module is in this run and used by no other module; a one-line
    reason (str) when the only obstacle is that the model module is not in this run; None
    otherwise (the BCE warning stands)."""
    imported_class = getattr(project, "imported_class", None)
    if imported_class is None:
        return None
    calls = _all_calls(module)
    if not any(imports.resolve(c.func) == "torch.nn.BCELoss" for c in calls):
        return None  # only an nn.BCELoss criterion is followed across modules
    # the classes this file builds and binds to a name (`netD = Discriminator().to(device)`)
    locals_called = sorted({c.func.value for c in calls if isinstance(c.func, cst.Name)} |
                           {dotted for c in calls if isinstance(c.func, cst.Attribute)
                            and (dotted := dotted_name(c.func)) is not None and dotted.count(".") == 1
                            and not dotted.startswith("self.")
                            and not (imports.resolve(c.func) or "").startswith(("torch.", "numpy.", "torchvision."))})
    found = []
    for local in locals_called:
        described = imported_class(local)
        if described is None:
            continue
        key, display, class_name, line, trains = described
        source = project.source_of(key)
        if source is None or trains or b"igmoid" not in source:
            continue
        try:
            model_module = cst.parse_module(source)
        except Exception:  # noqa: BLE001 - a module that does not parse is not followed
            continue
        model_imports = ImportMap.from_module(model_module)
        model_index = _Index()
        walk(model_module, model_index)
        for candidate in _sigmoid_candidates(model_index, model_imports):
            try:
                dropped, sigmoid_line, head = _Fuser(model_module, model_imports, model_index).drop_final_sigmoid(
                    class_name, candidate)
                trainer = _Fuser(module, imports)
                trainer.project = project
                fused, fusion = trainer.fuse_with_imported_model(local, head, sigmoid_line, display)
            except (_NotFollowed, IndexError, AttributeError, KeyError, TypeError, ValueError):
                continue
            found.append((key, display, class_name, source, dropped, sigmoid_line, fused, fusion))
    if len(found) != 1:
        return None
    return imported_model_change(project, here, *found[0], loss="nn.BCEWithLogitsLoss")


def imported_model_change(project, here: str, key: str, display: str, class_name: str, source: bytes,
                          dropped: cst.Module, sigmoid_line: int, fused: cst.Module, fusion: "Fusion", loss: str):
    """(fused module, Fusion, CompanionChange of the model module) for a sigmoid dropped in the
    model module `key`, or the one-line reason why not: another module uses the class (where its
    output may be read as a probability), or the model module is not in this run."""
    users = list(project.class_users_elsewhere(key, class_name))
    if users:
        return (f"the model {class_name} ({display}:{sigmoid_line}) ends in a sigmoid that feeds this file's BCE loss, "
                f"but {', '.join(users[:3])} also use{'s' if len(users) == 1 else ''} that class, where its output may be "
                f"read as a probability: fuse it by hand (drop the sigmoid, {loss} here, torch.sigmoid(...) "
                "where a probability is read)")
    if not project.in_this_run(key):
        return (f"the model {class_name} ({display}:{sigmoid_line}) ends in a sigmoid that feeds this file's BCE "
                f"loss; {display} is not in this run: run ampify on both files or on the repository, and the "
                f"sigmoid is fused into the loss ({loss}) there")
    companion = CompanionChange(
        key=key, display=display, old=source, new=dropped.bytes,
        findings=[Finding("AMP231", f"BCE after a Sigmoid fused: the final sigmoid of {class_name} (line {sigmoid_line}) "
                          f"dropped: {here} feeds its output to {loss} now", sigmoid_line, 0, Severity.INFO)],
        reason=f"changed with {here}: the final sigmoid of {class_name} is fused into that file's BCE loss",
    )
    return fused, fusion, companion


def _all_calls(module: cst.Module) -> List[cst.Call]:
    index = _Index()
    walk(module, index)
    return index.calls


def _sigmoid_candidates(index: "_Index", imports: ImportMap) -> List[cst.Call]:
    """`nn.Sigmoid()` modules, and functional sigmoids applied in a model's forward()."""
    found = []
    for call in index.calls:
        resolved = imports.resolve(call.func)
        if resolved == "torch.nn.Sigmoid" and not call.args:
            found.append(call)
        elif resolved in _FUNCTIONAL_SIGMOIDS and len(call.args) == 1 and call.args[0].keyword is None:
            function = index.parent.get(id(call))
            while function is not None and not isinstance(function, cst.FunctionDef):
                function = index.parent.get(id(function))
            if function is not None and function.name.value == "forward":
                found.append(call)
    return found


def criterion_never_applied(structure, call: cst.Call) -> bool:
    """`adversarial_loss = nn.BCELoss()` whose name is only ever moved to a device
    (`adversarial_loss.cuda()`), never called nor passed on: no BCE runs, so nothing blocks the
    conversion (PyTorch-GAN's Softmax GAN builds one and computes its own loss)."""
    top = call
    while True:
        attribute = structure.parent(top)
        outer = structure.parent(attribute) if attribute is not None else None
        if isinstance(attribute, cst.Attribute) and attribute.attr.value in _DEVICE_MOVES and isinstance(outer, cst.Call):
            top = outer
            continue
        break
    assign = structure.parent(top)
    if not (isinstance(assign, cst.Assign) and assign.value is top and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)):
        return False
    name = assign.targets[0].target
    for node in _names_called(structure.module, name.value):
        if node is name:
            continue
        attribute = structure.parent(node)
        move = structure.parent(attribute) if attribute is not None else None
        if not (isinstance(attribute, cst.Attribute) and attribute.value is node and attribute.attr.value in _DEVICE_MOVES
                and isinstance(move, cst.Call) and move.func is attribute and isinstance(structure.parent(move), cst.Expr)):
            return False
    return True


def _names_called(module: cst.Module, value: str) -> List[cst.Name]:
    """Every Name node spelled `value` (also attribute names and keywords: a conservative superset)."""
    found: List[cst.Name] = []

    class _Find(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            if node.value == value:
                found.append(node)

    walk(module, _Find())
    return found


class _NotFollowed(Exception):
    pass


def _need(condition: bool) -> None:
    if not condition:
        raise _NotFollowed()


class _Index(cst.CSTVisitor):
    """Parents, positions in source order, and every Name node by value."""

    def __init__(self) -> None:
        super().__init__()
        self.parent: Dict[int, cst.CSTNode] = {}
        self.stack: List[cst.CSTNode] = []
        self.names: Dict[str, List[cst.Name]] = {}
        self.calls: List[cst.Call] = []
        self.order: Dict[int, int] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parent[id(node)] = self.stack[-1]
        self.order[id(node)] = len(self.order)
        self.stack.append(node)
        if isinstance(node, cst.Name):
            self.names.setdefault(node.value, []).append(node)
        elif isinstance(node, cst.Call):
            self.calls.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


class _Fuser:
    def __init__(self, module: cst.Module, imports: ImportMap, index: Optional["_Index"] = None) -> None:
        self.module = module
        self.imports = imports
        if index is None:
            index = _Index()
            walk(module, index)
        self.index = index
        self.replace: Dict[int, cst.CSTNode] = {}
        #: reads wrapped as `torch.sigmoid(x.float())`: their probability goes into a log
        self.float_reads: Set[int] = set()
        self._positions: Optional[Positions] = None  # computed on the first line asked for
        self._instance_names: Set[str] = set()
        #: the `nn.Sequential(...)` (with its device moves) bound to a variable, in that form
        self._sequential_value: Optional[cst.CSTNode] = None
        #: (index, length) when forward returns a tuple whose element `index` is the Sequential's
        #: output (ACGAN/SGAN discriminators: `return validity, label`); None for a single output
        self.head: Optional[tuple] = None
        #: module-level functions the model is handed to, already followed
        self._followed_helpers: Set[int] = set()
        #: ids of the parameters every call of their function hands a model instance
        self._instance_parameters: Set[int] = set()
        #: (flag, truthiness under which the Sigmoid is applied) when __init__ adds it only under
        #: `if not self.wass:` and every instance is built with the module-level `wass_metric`
        #: (ClusterGAN); None when it is always applied
        self.condition: Optional[tuple] = None
        #: the `if` of __init__ that adds the Sigmoid (for the finding)
        self._guard_if: Optional[cst.If] = None
        #: a trainer class (not the model) whose methods hold the model and the criterion as
        #: `self.D` / `self.BCE_loss` (znxlwm's GAN collection, pytorch-wgan): its attributes are
        #: followed as names are, when nothing else in the file spells those attributes
        self._trainer_class: Optional[cst.ClassDef] = None
        #: the project (another module's helper that only inspects the model: utils.print_network)
        self.project = None
        #: trainer attributes already checked against the other modules of the project
        self._checked_attributes: Set[str] = set()
        #: no BCE criterion to fuse: the file takes the log of the probability itself (AMP229)
        self.logs_only = False

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.index.parent.get(id(node))

    def run(self, sigmoid: cst.Call):
        criteria = [c for c in self.index.calls if self.imports.resolve(c.func) == "torch.nn.BCELoss"]
        _need(not any(self.imports.resolve(c.func) in ("torch.nn.functional.binary_cross_entropy",) for c in self.index.calls))
        if self.logs_only:
            # no criterion: the training code takes the log of the probability itself
            _need(not criteria)
            criterion_call, criterion_name = sigmoid, _NO_CRITERION
        else:
            _need(bool(criteria) and all(isinstance(c.func, cst.Attribute) for c in criteria))
            criterion_call = criteria[0]
            criterion_name = self._criterion_name(criteria)
        functional = self.imports.resolve(sigmoid.func) in _FUNCTIONAL_SIGMOIDS
        owner = self._functional_owner(sigmoid) if functional else self._sigmoid_attribute_owner(sigmoid)
        variable = self._sequential_variable(sigmoid) if owner is None else None
        if functional:
            # `return torch.sigmoid(self.fc(x))` last in forward()
            klass = owner[0]
            application = self._check_class_applies_sigmoid_last(klass, sigmoid)
            instances = self._instances(klass)
            self._instance_names = instances
            outputs = self._forward_results(instances, klass.name.value)
        elif owner is not None:
            # `self.sigmoid = nn.Sigmoid()`, applied last in forward()
            klass, attribute = owner
            application = self._check_class_applies_sigmoid_last(klass, attribute)
            instances = self._instances(klass)
            self._instance_names = instances
            outputs = self._forward_results(instances, klass.name.value)
        elif variable is not None:
            # `D = nn.Sequential(..., nn.Sigmoid())` bound to a name (the PyTorch tutorial's GAN)
            instances = {variable}
            self._instance_names = instances
            outputs = self._forward_results(instances, None)
        else:
            klass, attribute = self._sequential_owner(sigmoid)
            self._check_class_returns_sequential(klass, attribute)
            instances = self._instances(klass)
            self._instance_names = instances
            self.condition = self._condition_of(self.parent(self.parent(sigmoid)), klass)
            outputs = self._forward_results(instances, klass.name.value)
        fusion = Fusion(self._line(criterion_call), self._line(sigmoid))
        needs_import = self._fuse_outputs(outputs, criteria, criterion_name, fusion)
        if self.logs_only:
            _need(bool(self.float_reads))  # some read goes into a log: the reason this runs
            fusion.code = "AMP248"
        if owner is not None:
            node, replacement = application
            self.replace[id(node)] = replacement
            applied = f"{dotted_name(sigmoid.func)}(...)" if functional else f"self.{owner[1]}(...)"
            if self.logs_only:
                fusion.description = (
                    f"the log of the model's probability taken in float32: {applied} no longer applied at the end "
                    f"of {owner[0].name.value}.forward() (line {self._line(node)})")
                fusion.wrapped.sort()
                return _with_torch_imported(self.module.visit(_Replace(self.replace, self.float_reads)), needs_import), fusion
            fusion.description = (
                f"BCE after a Sigmoid fused: {applied} no longer applied at the end of "
                f"{owner[0].name.value}.forward() (line {self._line(node)}), the criterion at line "
                f"{self._line(criterion_call)} is nn.BCEWithLogitsLoss (the same loss, computed from logits)")
            fusion.wrapped.sort()
            return _with_torch_imported(self.module.visit(_Replace(self.replace, self.float_reads)), needs_import), fusion
        self._plan_sequential_drop(sigmoid)
        fusion.wrapped.sort()
        if self.logs_only:
            _need(self.condition is None)
            fusion.description = (f"the log of the model's probability taken in float32: nn.Sigmoid() at line "
                                   f"{fusion.sigmoid_line} dropped from the model")
        elif self.condition is not None:
            flag, truthy = self.condition
            fusion.description = (
                f"BCE after a Sigmoid fused: nn.Sigmoid() at line {fusion.sigmoid_line} dropped from the model "
                f"(added under `if {cst.Module(body=[]).code_for_node(self._guard_if.test).strip()}:`, that is when "
                f"{flag} is {'true' if truthy else 'false'}), the criterion at line {fusion.criterion_line} is "
                "nn.BCEWithLogitsLoss (the same loss, computed from logits); reads of the output where "
                f"{flag} is {'false' if truthy else 'true'} keep the raw output they saw before")
        return _with_torch_imported(self.module.visit(_Replace(self.replace, self.float_reads)), needs_import), fusion

    def _plan_sequential_drop(self, sigmoid: cst.Call) -> None:
        """The Sigmoid, last argument of its nn.Sequential, goes; the layout around it stays."""
        sequential = self.parent(self.parent(sigmoid))
        args = list(sequential.args)
        kept = args[:-1]
        # `..., nn.Conv2d(...),\n    nn.Sigmoid()\n)` -> `..., nn.Conv2d(...),\n)`: the closing
        # parenthesis keeps the line it had
        if isinstance(args[-1].comma, cst.Comma):
            # `nn.Linear(256, 1),\n    nn.Sigmoid(),\n)`: the trailing comma and its line break stay
            kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
        elif isinstance(kept[-1].comma, cst.Comma) and "\n" in cst.Module(body=[]).code_for_node(
                kept[-1].comma.whitespace_after) and "\n" in cst.Module(body=[]).code_for_node(args[-1].whitespace_after_arg):
            # `nn.Linear(256, 1),\n    nn.Sigmoid()\n)`: the closing parenthesis keeps its own line
            kept[-1] = kept[-1].with_changes(comma=kept[-1].comma.with_changes(whitespace_after=args[-1].whitespace_after_arg))
        elif isinstance(kept[-1].comma, cst.Comma):
            # all on one line: `nn.Linear(128, 1), nn.Sigmoid())` -> `nn.Linear(128, 1))`
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=args[-1].whitespace_after_arg)
        else:
            kept[-1] = kept[-1].with_changes(whitespace_after_arg=args[-1].whitespace_after_arg)
        self.replace[id(sequential)] = sequential.with_changes(args=kept)

    # ---- a model class of another module (cross-module form) --------------------------------

    def drop_final_sigmoid(self, class_name: str, sigmoid: cst.Call):
        """This module defines the model class `class_name`, used only by another module: its
        final sigmoid (`sigmoid`, a Sequential's last layer, a `self.sigmoid` applied last, a
        functional sigmoid ending forward()) is dropped, unconditionally. Returns (new module,
        line of the sigmoid, head of forward's output)."""
        klass = next((c for c in self.module.body if isinstance(c, cst.ClassDef) and c.name.value == class_name), None)
        _need(klass is not None and self._inside(sigmoid, klass))
        # the class is neither built nor subclassed here: its only uses are in the training module
        for name in self._references(class_name):
            if name is klass.name:
                continue
            holder = self.parent(name)
            _need(isinstance(holder, cst.Arg) and dotted_name(self.parent(holder).func) == "super")
        functional = self.imports.resolve(sigmoid.func) in _FUNCTIONAL_SIGMOIDS
        owner = self._functional_owner(sigmoid) if functional else self._sigmoid_attribute_owner(sigmoid)
        if owner is not None:
            _need(owner[0] is klass)
            node, replacement = self._check_class_applies_sigmoid_last(klass, sigmoid if functional else owner[1])
            self.replace[id(node)] = replacement
        else:
            owner_class, attribute = self._sequential_owner(sigmoid)
            _need(owner_class is klass)
            self._check_class_returns_sequential(klass, attribute)
            assign = self.parent(self.parent(sigmoid))
            # added under no condition (a flag would have to be followed into the other module)
            function = self._enclosing(assign, cst.FunctionDef)
            current = self.parent(assign)
            while current is not function:
                _need(not isinstance(current, (cst.BaseCompoundStatement, cst.Else)))
                current = self.parent(current)
            _need(self._condition_of(assign, klass) is None)
            self._plan_sequential_drop(sigmoid)
        return self.module.visit(_Replace(self.replace, self.float_reads)), self._line(sigmoid), self.head

    def fuse_with_imported_model(self, local: str, head, sigmoid_line: int, model_display: str):
        """This training module builds the model class it imports as `local`, whose final sigmoid
        `drop_final_sigmoid` removes in its own module: the criterion takes logits and every other
        read of the output gets torch.sigmoid(...), as for a class of this file."""
        criteria = [c for c in self.index.calls if self.imports.resolve(c.func) == "torch.nn.BCELoss"]
        _need(bool(criteria) and all(isinstance(c.func, cst.Attribute) for c in criteria))
        _need(not any(self.imports.resolve(c.func) in ("torch.nn.functional.binary_cross_entropy",) for c in self.index.calls))
        _need(not any(self.imports.resolve(c.func) in ("torch.nn.Sigmoid",) + _FUNCTIONAL_SIGMOIDS for c in self.index.calls))
        criterion_call = criteria[0]
        criterion_name = self._criterion_name(criteria)
        self.head = head
        instances = self._instances_named(local)
        self._instance_names = instances
        outputs = self._forward_results(instances, local)
        fusion = Fusion(self._line(criterion_call), sigmoid_line)
        needs_import = self._fuse_outputs(outputs, criteria, criterion_name, fusion)
        fusion.wrapped.sort()
        fusion.description = (
            f"BCE after a Sigmoid fused: the final sigmoid of {local} ({model_display}:{sigmoid_line}) dropped there, "
            f"the criterion at line {fusion.criterion_line} is nn.BCEWithLogitsLoss (the same loss, computed from "
            "logits); both files are written as one change set")
        return _with_torch_imported(self.module.visit(_Replace(self.replace, self.float_reads)), needs_import), fusion

    # ---- the model -------------------------------------------------------------------------

    def _sigmoid_attribute_owner(self, sigmoid: cst.Call):
        """(class, attribute) for `self.<attribute> = nn.Sigmoid()` in a class's `__init__`; None
        for any other place of the Sigmoid."""
        assign = self.parent(sigmoid)
        if not (isinstance(assign, cst.Assign) and assign.value is sigmoid and len(assign.targets) == 1):
            return None
        target = dotted_name(assign.targets[0].target) or ""
        if not (target.startswith("self.") and target.count(".") == 1):
            return None
        function = self._enclosing(assign, cst.FunctionDef)
        _need(function is not None and function.name.value == "__init__")
        klass = self._enclosing(function, cst.ClassDef)
        _need(klass is not None)
        return klass, target.split(".")[1]

    def _functional_owner(self, sigmoid: cst.Call):
        """(class, "") for a functional sigmoid in the forward() of a class of this file."""
        function = self._enclosing(sigmoid, cst.FunctionDef)
        _need(function is not None and function.name.value == "forward")
        klass = self.parent(self.parent(function))
        _need(isinstance(klass, cst.ClassDef) and self.parent(klass) is self.module)
        return klass, ""

    def _check_class_applies_sigmoid_last(self, klass: cst.ClassDef, applied):
        """forward() applies the sigmoid last: `return self.sigmoid(x)`, or `out = self.sigmoid(x)`
        right before `return out`. `applied` is the attribute name of `self.<attribute> =
        nn.Sigmoid()`, which forward() may also apply to hidden layers before (the attribute stays
        for those; it is used nowhere else), or the functional sigmoid call itself. Returns (node to
        replace, replacement): the call by its argument, or the whole statement removed when it was
        `out = self.sigmoid(out)`."""
        forward = next((s for s in klass.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
        _need(forward is not None and isinstance(forward.body, cst.IndentedBlock))
        if isinstance(applied, str):
            attribute = applied
            uses = []
            for name in self.index.names.get(attribute, []):
                attr = self.parent(name)
                if isinstance(attr, cst.Attribute) and attr.attr is name and dotted_name(attr) == f"self.{attribute}" \
                        and self._inside(attr, klass):
                    uses.append(attr)
            calls = [self.parent(u) for u in uses if isinstance(self.parent(u), cst.Call) and self.parent(u).func is u]
            # the assignment in __init__, and applications in forward() only
            _need(len(uses) == len(calls) + 1 and calls)
            _need(all(self._enclosing(c, cst.FunctionDef) is forward for c in calls))
        else:
            calls = [applied]
        _need(not self._calls_itself(klass))
        _need(len(list(self._nodes(forward, cst.Return))) == 1)
        body = list(forward.body.body)
        last = body[-1]
        _need(isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 and isinstance(last.body[0], cst.Return))
        returned = last.body[0].value
        if isinstance(returned, cst.Tuple):
            return self._sigmoid_head_of_tuple(forward, returned, calls)
        if any(returned is c for c in calls):
            call = returned
        else:
            _need(len(body) >= 2 and isinstance(body[-2], cst.SimpleStatementLine) and len(body[-2].body) == 1)
            value = getattr(body[-2].body[0], "value", None)
            _need(any(value is c for c in calls))
            call = value
        _need(len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star)
        argument = call.args[0].value
        if returned is call:
            self.head = None
            return call, argument
        _need(len(body) >= 2 and isinstance(returned, cst.Name))
        before = body[-2]
        _need(isinstance(before, cst.SimpleStatementLine) and len(before.body) == 1)
        assign = before.body[0]
        _need(isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1)
        target = assign.targets[0].target
        _need(isinstance(target, cst.Name) and target.value == returned.value)
        self.head = None
        if isinstance(argument, cst.Name) and argument.value == target.value:
            return before, cst.RemoveFromParent()  # `output = self.sigmoid(output)`: gone
        return call, argument

    def _sigmoid_head_of_tuple(self, forward: cst.FunctionDef, returned: cst.Tuple, calls: List[cst.Call]):
        """forward() returns several heads and one of them is a sigmoid's output (infoGAN's
        discriminator: `a = F.sigmoid(x[:, 0])`, `b = x[:, 1:3]`, ..., `return a, b, c`): the
        sigmoid is applied once, in a statement of forward()'s own body `head = sigmoid(value)`,
        the head is bound nowhere else and read only as one element of the one return (through
        shape operations). Returns (the call, its argument) and sets self.head to (index, length)."""
        body = list(forward.body.body)
        _need(len(calls) == 1)
        call = calls[0]
        statement = self.parent(self.parent(call))
        _need(any(statement is b for b in body) and isinstance(statement, cst.SimpleStatementLine)
              and len(statement.body) == 1)
        assign = statement.body[0]
        _need(isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1)
        target = assign.targets[0].target
        _need(isinstance(target, cst.Name))
        _need(len(call.args) == 1 and call.args[0].keyword is None and not call.args[0].star)
        head = target.value
        uses = [n for n in self._nodes(forward, cst.Name) if n.value == head and n is not target]
        _need(not any(self._is_binding(n) or isinstance(self.parent(n), (cst.AugAssign, cst.For, cst.CompFor,
                                                                          cst.WithItem, cst.AsName, cst.NamedExpr))
                      for n in uses))
        _need(all(self._inside(n, returned) for n in uses))
        self.head = self._head_of(returned, {head})
        return call, call.args[0].value

    # ---- a Sigmoid added under a flag (path-sensitive) ---------------------------------------

    def _condition_of(self, assign_value: cst.CSTNode, klass: cst.ClassDef) -> Optional[tuple]:
        """None when the Sequential ending in the Sigmoid is always the model's; (flag, truthy)
        when __init__ assigns it only under `if not self.<attr>:` (or `if self.<attr>: ... else:`),
        `self.<attr>` is an __init__ parameter stored once, and every instance of the class is
        built with the same module-level name bound once (`Discriminator_CNN(wass_metric=wass_metric)`):
        the Sigmoid is then applied exactly where that name's truthiness is `truthy`. Anything else
        conditional (a loop, a try, an elif, another test) is not followed."""
        assign = self.parent(assign_value) if not isinstance(assign_value, cst.Assign) else assign_value
        _need(isinstance(assign, cst.Assign))
        init = self._enclosing(assign, cst.FunctionDef)
        compounds = []
        current = self.parent(assign)
        while current is not None and current is not init:
            if isinstance(current, cst.BaseCompoundStatement):
                compounds.append(current)
            if isinstance(current, cst.Else):
                compounds.append(current)
            current = self.parent(current)
        target = dotted_name(assign.targets[0].target)
        # the Sigmoid's Sequential is the last model assigned to self.<model> in __init__
        later = [a for a in self._nodes(init, cst.Assign)
                 if len(a.targets) == 1 and dotted_name(a.targets[0].target) == target
                 and self.index.order[id(a)] > self.index.order[id(assign)]]
        _need(not later)
        if not compounds:
            return None
        guard = compounds[-1]
        in_else = False
        if isinstance(guard, cst.Else):
            _need(len(compounds) == 2 and isinstance(compounds[0], cst.If) and compounds[0].orelse is guard)
            guard, in_else = compounds[0], True
        else:
            _need(len(compounds) == 1 and isinstance(guard, cst.If))
        test = guard.test
        negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
        attribute = dotted_name(test.expression if negated else test) or ""
        _need(attribute.startswith("self.") and attribute.count(".") == 1)
        attribute = attribute.split(".")[1]
        # applied when self.<attribute> is truthy (`if self.sigmoid_out:`), falsy (`if not self.wass:`)
        truthy = (not negated) != in_else
        parameter = self._stored_parameter(init, attribute)
        flag = self._constructed_with(klass, init, parameter)
        self._guard_if = guard
        return flag, truthy

    def _stored_parameter(self, init: cst.FunctionDef, attribute: str) -> str:
        """`self.<attribute> = <parameter>`, a statement of __init__'s own body, the only
        assignment to any `.<attribute>` in the file."""
        stores = []
        for name in self.index.names.get(attribute, []):
            attr = self.parent(name)
            if not (isinstance(attr, cst.Attribute) and attr.attr is name):
                continue
            holder = self.parent(attr)
            if isinstance(holder, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.Del)) or (
                    isinstance(holder, cst.Element)):
                stores.append(attr)
        _need(len(stores) == 1 and dotted_name(stores[0]) == f"self.{attribute}")
        assign = self.parent(self.parent(stores[0]))
        _need(isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.value, cst.Name))
        _need(self.parent(self.parent(assign)) is init.body)
        parameter = assign.value.value
        _need(any(p.name.value == parameter for p in init.params.params))
        # the parameter is not rebound in __init__ before it is stored
        _need(not any(self._is_binding(n) for n in self._references(parameter) if self._scope(n) is init))
        return parameter

    def _constructed_with(self, klass: cst.ClassDef, init: cst.FunctionDef, parameter: str) -> str:
        """The one module-level name every `Klass(...)` call passes as `parameter`."""
        params = list(init.params.params)
        _need(init.params.star_arg is cst.MaybeSentinel.DEFAULT or init.params.star_arg is None)
        index = next(i for i, p in enumerate(params) if p.name.value == parameter) - 1  # after self
        flags = set()
        for name in self._references(klass.name.value):
            call = self.parent(name)
            if not (isinstance(call, cst.Call) and call.func is name):
                continue
            _need(not any(a.star for a in call.args))
            passed = [a for a in call.args if a.keyword is not None and a.keyword.value == parameter]
            if not passed:
                plain = [a for a in call.args if a.keyword is None]
                _need(0 <= index < len(plain))
                passed = [plain[index]]
            _need(len(passed) == 1 and isinstance(passed[0].value, cst.Name))
            flags.add(passed[0].value.value)
        _need(len(flags) == 1)
        flag = flags.pop()
        # bound once, by a statement of the module's own body; never imported, never global
        # (inside __init__ the name may be the parameter itself: `def __init__(self, wass_metric=False)`)
        bindings = []
        for node in self._references(flag):
            if self._scope(node) is init:
                continue
            holder = self.parent(node)
            _need(not isinstance(holder, (cst.ImportAlias, cst.NamedExpr, cst.Param, cst.Global, cst.Nonlocal,
                                          cst.AugAssign, cst.For, cst.CompFor, cst.WithItem, cst.AsName)))
            if self._is_binding(node):
                bindings.append(node)
        _need(len(bindings) == 1 and isinstance(self.parent(bindings[0]), cst.AssignTarget))
        assign = self.parent(self.parent(bindings[0]))
        _need(isinstance(assign, cst.Assign) and self.parent(self.parent(assign)) is self.module)
        return flag

    def _applied_at(self, node: cst.CSTNode) -> bool:
        """Does the model apply the Sigmoid for the output read at `node`? Always when it is
        unconditional; else from the `if <flag>:` around the read (or around every call of the
        module-level function it is in); unknown is not followed."""
        if self.condition is None:
            return True
        flag, truthy = self.condition
        value = self._flag_value(node, flag, set())
        _need(value is not None)
        return value == truthy

    def _flag_value(self, node: cst.CSTNode, flag: str, seen: Set[int]) -> Optional[bool]:
        child, current = node, self.parent(node)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            if isinstance(current, cst.If):
                test = current.test
                negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
                tested = test.expression if negated else test
                if isinstance(tested, cst.Name) and tested.value == flag:
                    if child is current.body:
                        return not negated
                    if child is current.orelse:
                        return negated
            child, current = current, self.parent(current)
        if isinstance(current, cst.FunctionDef) and self.parent(current) is self.module and id(current) not in seen:
            seen.add(id(current))
            values = set()
            for name in self._references(current.name.value):
                if name is current.name:
                    continue
                call = self.parent(name)
                if not (isinstance(call, cst.Call) and call.func is name):
                    return None
                values.add(self._flag_value(call, flag, seen))
            if len(values) == 1:
                return values.pop()
        return None

    def _fuse_outputs(self, outputs, criteria: List[cst.Call], criterion_name: str, fusion: Fusion) -> bool:
        """Every model output followed (torch.sigmoid(...) where it is read as a probability), every
        use of the criterion checked, the criteria made BCEWithLogitsLoss. Returns whether the
        wrappers need `import torch` (a file with only `from torch import ...`)."""
        seen: Set[int] = set()
        for result in outputs:
            if id(result) not in seen:  # a call reached both by name and through a parameter
                seen.add(id(result))
                self._follow_result(result, criterion_name, fusion)
        for use in self._references(criterion_name):
            self._check_criterion_use(use, criterion_name)
        for criterion in criteria:
            self.replace[id(criterion)] = criterion.with_changes(
                func=criterion.func.with_changes(attr=cst.Name("BCEWithLogitsLoss")))
        needs_import = bool(fusion.wrapped) and "torch" not in self.imports.local_names_for("torch")
        if needs_import:
            # the name torch means nothing else here (only `from torch import ...` spells it)
            _need(all(self._enclosing(n, (cst.ImportFrom, cst.Import)) is not None for n in self.index.names.get("torch", [])))
        return needs_import

    def _criterion_name(self, criteria: List[cst.Call]) -> str:
        """One criterion, or one per function under the same name (`criterion = nn.BCELoss()` in
        both train() and test(), pytorch/examples' siamese network), each assigned once there."""
        criterion_name = self._assigned_name(criteria[0])
        _need(criterion_name is not None and all(self._assigned_name(c) == criterion_name for c in criteria))
        _need(len(self._assignments(criterion_name)) == len(criteria))
        if "." not in criterion_name:
            _need(len({id(self._scope(c)) for c in criteria}) == len(criteria))
        return criterion_name

    def _calls_itself(self, klass: cst.ClassDef) -> bool:
        """`self(x)` or `self.forward(x)` in a method: forward's output read inside the class,
        where no use is followed."""
        for call in self._nodes(klass, cst.Call):
            name = dotted_name(call.func)
            if name in ("self", "self.forward"):
                return True
        return False

    def _sequential_variable(self, sigmoid: cst.Call) -> Optional[str]:
        """The name a Sequential ending in the Sigmoid is bound to, when it is a plain variable
        (not `self.main = ...`); None for the class form."""
        arg = self.parent(sigmoid)
        sequential = self.parent(arg)
        _need(isinstance(arg, cst.Arg) and isinstance(sequential, cst.Call))
        _need(self.imports.resolve(sequential.func) == "torch.nn.Sequential" and sequential.args[-1] is arg)
        _need(len(sequential.args) > 1 and all(a.keyword is None and not a.star for a in sequential.args))
        top = sequential
        while True:  # nn.Sequential(...).to(device)
            attribute = self.parent(top)
            outer = self.parent(attribute) if attribute is not None else None
            if isinstance(attribute, cst.Attribute) and attribute.value is top and attribute.attr.value in _DEVICE_MOVES \
                    and isinstance(outer, cst.Call) and outer.func is attribute:
                top = outer
                continue
            break
        assign = self.parent(top)
        _need(isinstance(assign, cst.Assign) and len(assign.targets) == 1)
        target = assign.targets[0].target
        if not isinstance(target, cst.Name):
            klass = self._enclosing(assign, cst.ClassDef)
            if klass is None or any(isinstance(s, cst.FunctionDef) and s.name.value == "forward" for s in klass.body.body):
                return None  # `self.main = nn.Sequential(...)` of a model class: the class form
            # `self.D = nn.Sequential(..., nn.Sigmoid())` in a trainer class (pytorch-wgan's GAN): the
            # attribute is the model, as a variable would be
            self._sequential_value = top
            return self._trainer_attribute(target)
        _need(self._enclosing(assign, cst.ClassDef) is None)
        self._sequential_value = top
        return target.value

    def _sequential_owner(self, sigmoid: cst.Call):
        arg = self.parent(sigmoid)
        sequential = self.parent(arg)
        _need(isinstance(arg, cst.Arg) and isinstance(sequential, cst.Call))
        _need(self.imports.resolve(sequential.func) == "torch.nn.Sequential" and sequential.args[-1] is arg)
        _need(len(sequential.args) > 1 and all(a.keyword is None and not a.star for a in sequential.args))
        assign = self.parent(sequential)
        _need(isinstance(assign, cst.Assign) and len(assign.targets) == 1)
        target = dotted_name(assign.targets[0].target) or ""
        _need(target.startswith("self.") and target.count(".") == 1)
        function = self._enclosing(assign, cst.FunctionDef)
        _need(function is not None and function.name.value == "__init__")
        klass = self._enclosing(function, cst.ClassDef)
        _need(klass is not None)
        return klass, target.split(".")[1]

    def _check_class_returns_sequential(self, klass: cst.ClassDef, attribute: str) -> None:
        forward = next((s for s in klass.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
        _need(forward is not None)
        results: Set[str] = set()
        direct: Set[int] = set()  # ids of `return self.model(...)` statements
        for name in self.index.names.get(attribute, []):
            attr = self.parent(name)
            if not (isinstance(attr, cst.Attribute) and attr.attr is name and dotted_name(attr) == f"self.{attribute}"):
                continue
            if not self._inside(attr, klass):
                continue  # another class's own `self.main`
            if self._enclosing(attr, cst.FunctionDef) is not forward:
                statement = self._enclosing(attr, cst.Assign)
                _need(self._enclosing(attr, cst.FunctionDef).name.value == "__init__")
                printed = self.parent(attr)
                _need(statement is not None or (
                    isinstance(printed, cst.Arg) and dotted_name(self.parent(printed).func) == "print"))
                continue
            holder = self.parent(attr)
            if isinstance(holder, cst.Arg):  # nn.parallel.data_parallel(self.main, input, ...)
                holder = self.parent(holder)
                _need(self.imports.resolve(holder.func) == "torch.nn.parallel.data_parallel")
            _need(isinstance(holder, cst.Call))
            returned = self.parent(_outermost_shape_op(holder, self.parent))
            if isinstance(returned, cst.Return):  # `return self.model(x)`, through shape operations only
                direct.add(id(returned))
                continue
            assign = self.parent(holder)
            _need(isinstance(assign, cst.Assign) and len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name))
            results.add(assign.targets[0].target.value)
        _need(bool(results) or bool(direct))
        parameters = {p.name.value for p in (*forward.params.params, *forward.params.kwonly_params,
                                               *forward.params.posonly_params)}
        for result in results:
            if result in parameters:
                # `def forward(self, x): x = self.dis(x); return x`: the input's name, rebound to the
                # Sequential's output by the last statement before the one return
                _need(self._returned_after_sequential(forward, result, attribute))
                continue
            assignments = self._assignments(result, within=forward)
            if all(self._calls_sequential(a.value, attribute) for a in assignments):
                continue
            # `x = self.conv(input); x = x.view(...); x = self.fc(x); return x`: the name also holds
            # earlier layers' outputs, but the one return sees the Sequential's (the last binding)
            _need(self._returned_after_sequential(forward, result, attribute))
        returns = [n for n in self._nodes(forward, cst.Return)]
        _need(bool(returns))
        heads = set()
        for ret in returns:
            if id(ret) in direct:
                heads.add(None)
                continue
            if isinstance(ret.value, cst.Tuple):
                heads.add(self._head_of(ret.value, results))
                continue
            base = _strip_shape_ops(ret.value)
            _need(isinstance(base, cst.Name) and base.value in results)
            heads.add(None)
        _need(len(heads) == 1)  # every return has the same shape
        self.head = heads.pop()

    def _calls_sequential(self, value: cst.BaseExpression, attribute: str) -> bool:
        if not isinstance(value, cst.Call):
            return False
        parallel = self.imports.resolve(value.func) == "torch.nn.parallel.data_parallel"
        return dotted_name(value.func) == f"self.{attribute}" or (
            parallel and bool(value.args) and dotted_name(value.args[0].value) == f"self.{attribute}")

    def _returned_after_sequential(self, forward: cst.FunctionDef, result: str, attribute: str) -> bool:
        """forward()'s only return is its last statement, and the last statement before it that
        binds `result` is `result = self.<attribute>(...)`, a line of its own."""
        body = list(forward.body.body)
        if len(self._nodes(forward, cst.Return)) != 1 or not body:
            return False
        last = body[-1]
        if not (isinstance(last, cst.SimpleStatementLine) and len(last.body) == 1 and isinstance(last.body[0], cst.Return)):
            return False
        for statement in reversed(body[:-1]):
            binds = [n for n in self._nodes(statement, cst.Name) if n.value == result and self._is_binding(n)] + [
                n for n in self._nodes(statement, cst.Name) if n.value == result
                and isinstance(self.parent(n), (cst.AugAssign, cst.For, cst.CompFor, cst.WithItem, cst.AsName, cst.NamedExpr))]
            if not binds:
                continue
            if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                    and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1):
                return False
            assign = statement.body[0]
            target = assign.targets[0].target
            return isinstance(target, cst.Name) and target.value == result and self._calls_sequential(assign.value, attribute)
        return False

    def _head_of(self, returned: cst.Tuple, results: Set[str]) -> tuple:
        """(index, length) of the one element of `return validity, label` that is the
        Sequential's output; the other elements must not be computed from it."""
        indices = []
        for index, element in enumerate(returned.elements):
            _need(isinstance(element, cst.Element))
            base = _strip_shape_ops(element.value)
            if isinstance(base, cst.Name) and base.value in results:
                indices.append(index)
                continue
            _need(not any(isinstance(node, cst.Name) and node.value in results for node in self._nodes(element, cst.Name)))
        _need(len(indices) == 1)
        return indices[0], len(returned.elements)

    def _instances(self, klass: cst.ClassDef) -> Set[str]:
        return self._instances_named(klass.name.value)

    def _instances_named(self, class_name: str) -> Set[str]:
        """The names bound to `<class_name>(...)` (moved to a device or not), its only uses
        besides its definition, its import and super() calls."""
        instances: Set[str] = set()
        for name in self._references(class_name):
            holder = self.parent(name)
            if isinstance(holder, cst.ClassDef) or self._enclosing(name, (cst.Import, cst.ImportFrom)) is not None:
                continue
            call = self.parent(name)
            if isinstance(call, cst.Arg) and dotted_name(self.parent(call).func) == "super":
                continue  # super(Discriminator, self).__init__()
            _need(isinstance(call, cst.Call) and call.func is name)
            top = call
            while True:  # Discriminator(ngpu).to(device).cuda()
                attr = self.parent(top)
                if isinstance(attr, cst.Attribute) and attr.value is top and attr.attr.value in ("to", "cuda", "cpu"):
                    outer = self.parent(attr)
                    _need(isinstance(outer, cst.Call))
                    top = outer
                    continue
                break
            assign = self.parent(top)
            _need(isinstance(assign, cst.Assign) and len(assign.targets) == 1)
            target = assign.targets[0].target
            if isinstance(target, cst.Name):
                instances.add(target.value)
                continue
            # `self.D = discriminator(...)` in a trainer class's __init__
            instances.add(self._trainer_attribute(target))
        _need(bool(instances))
        return instances

    def _trainer_attribute(self, target: cst.BaseExpression) -> str:
        """"self.D" for `self.D = ...` in a method of a class other than the model's; every class
        holding one must be the same."""
        dotted = dotted_name(target) or ""
        _need(dotted.startswith("self.") and dotted.count(".") == 1)
        method = self._enclosing(target, cst.FunctionDef)
        klass = self._enclosing(method, cst.ClassDef) if method is not None else None
        _need(klass is not None and self.parent(method) is klass.body)
        _need(self._trainer_class is None or self._trainer_class is klass)
        if dotted not in self._checked_attributes:
            # another module of the project reading `gan.D(...)` is not followed
            spelled = getattr(self.project, "attribute_spelled_elsewhere", None)
            _need(spelled is None or spelled(klass.name.value, dotted.split(".")[1]) is None)
            self._checked_attributes.add(dotted)
        self._trainer_class = klass
        return dotted

    def _forward_results(self, instances: Set[str], klass_name: Optional[str]) -> List[cst.BaseExpression]:
        """Every call of the instances (klass_name None: the Sequential bound to a variable, whose
        other bindings may only move it, `D = D.to(device)`)."""
        results = []
        self._instance_parameters_named_like(instances)
        for instance in instances:
            for assignment in self._assignments(instance):
                value = assignment.value
                if klass_name is None and value is self._sequential_value:
                    continue
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("to", "cuda", "cpu"):
                    value = value.func.value
                if isinstance(value, cst.Name) and value.value == instance:
                    continue  # `D = D.cuda()`: the same model, moved
                _need(klass_name is not None)
                _need(isinstance(value, cst.Call) and isinstance(value.func, (cst.Name, cst.Attribute))
                      and dotted_name(value.func) == klass_name)
            for name in self._references(instance):
                holder = self.parent(name)
                if isinstance(holder, cst.AssignTarget):
                    continue
                if isinstance(holder, cst.Param) and id(holder) in self._instance_parameters:
                    continue
                if isinstance(holder, cst.Call) and holder.func is name:
                    results.append(_outermost_shape_op(holder, self.parent))
                    continue
                if isinstance(holder, cst.Arg) and isinstance(self.parent(holder), cst.Call) and dotted_name(self.parent(holder).func) == "print":
                    continue
                if isinstance(holder, cst.Arg) and holder.value is name:
                    # `compute_gradient_penalty(discriminator, x)` (DRAGAN): the helper's parameter
                    # is the model, and its calls are the model's outputs
                    results += self._results_through_parameter(holder, instances)
                    continue
                if self._initializer_call(holder, name):
                    continue
                _need(isinstance(holder, cst.Attribute) and holder.value is name and holder.attr.value in _MODEL_ATTRIBUTES)
        return results

    def _initializer_call(self, holder: cst.CSTNode, name: cst.Name) -> bool:
        """`D.weight_init(mean=0.0, std=0.02)` (znxlwm's pix2pix and DCGAN), `net.init_weights()`,
        `net.reset_parameters()`, a statement of its own: a weight initializer, which runs no forward
        pass and returns nothing the script reads."""
        if not (isinstance(holder, cst.Attribute) and holder.value is name):
            return False
        method = holder.attr.value.lower()
        if not ("init" in method or method == "reset_parameters"):
            return False
        call = self.parent(holder)
        if not (isinstance(call, cst.Call) and call.func is holder):
            return False
        return isinstance(self.parent(call), cst.Expr)

    def _verify_helper_parameter(self, function: cst.FunctionDef, parameter: str, instances: Set[str]) -> None:
        """Every call of the module-level `function` passes an instance as `parameter`."""
        params = function.params
        _need(params.star_arg is cst.MaybeSentinel.DEFAULT and params.star_kwarg is None and not params.posonly_params)
        _need(any(self._enclosing(function, t) is None for t in (cst.ClassDef, cst.FunctionDef)))
        positional = list(params.params)
        index = next((i for i, p in enumerate(positional) if p.name.value == parameter), None)
        calls = 0
        for use in self._references(function.name.value):
            if use is function.name:
                continue
            scope = self._scope(use)
            if scope is not self.module and self._binds_locally(scope, function.name.value):
                continue  # another function's own `train` (a parameter, a local)
            site = self.parent(use)
            _need(isinstance(site, cst.Call) and site.func is use)
            passed = [a for a in site.args if a.keyword is not None and a.keyword.value == parameter]
            if not passed and index is not None:
                unnamed = [a for a in site.args if a.keyword is None]
                _need(not any(a.star for a in unnamed))
                passed = unnamed[index:index + 1]
            _need(len(passed) == 1 and isinstance(passed[0].value, (cst.Name, cst.Attribute))
                  and dotted_name(passed[0].value) in instances)
            calls += 1
        _need(calls > 0)
        for param in [*positional, *params.kwonly_params]:
            if param.name.value == parameter:
                self._instance_parameters.add(id(param))

    def _instance_parameters_named_like(self, instances: Set[str]) -> None:
        """A module-level function whose parameter has an instance's name (`def train(args, model,
        ...)`): its calls must all hand it an instance, so that the name means the model there too."""
        for instance in instances:
            for name in self._references(instance):
                param = self.parent(name)
                if isinstance(param, cst.Param) and param.name is name:
                    function = self._enclosing(param, cst.FunctionDef)
                    _need(function is not None and self.parent(function) is self.module)
                    self._verify_helper_parameter(function, instance, instances)

    def _results_through_parameter(self, argument: cst.Arg, instances: Set[str]) -> List[cst.BaseExpression]:
        """The model handed to a module-level function of this file: every call of that function
        hands an instance in the same place, and the parameter is only called (or used through
        the model's own attributes) there. Its calls are the outputs to follow."""
        call = self.parent(argument)
        _need(isinstance(call, cst.Call) and not argument.star)
        if not isinstance(call.func, cst.Name) or not any(
                isinstance(s, cst.FunctionDef) and s.name.value == call.func.value for s in self.module.body):
            # a function of another module: followed when it only inspects the model there
            inspects = getattr(self.project, "only_inspects_parameter", None)
            position = None if argument.keyword is not None else [a for a in call.args if a.keyword is None].index(argument)
            _need(inspects is not None and inspects(dotted_name(call.func) or "", position,
                                                    argument.keyword.value if argument.keyword else None,
                                                    tuple(sorted(_MODEL_ATTRIBUTES))))
            return []
        function = next((s for s in self.module.body if isinstance(s, cst.FunctionDef) and s.name.value == call.func.value), None)
        _need(function is not None)
        if id(function) in self._followed_helpers:
            return []
        self._followed_helpers.add(id(function))
        params = function.params
        _need(params.star_arg is cst.MaybeSentinel.DEFAULT and params.star_kwarg is None and not params.posonly_params)
        positional = list(params.params)
        if argument.keyword is None:
            index = [a for a in call.args if a.keyword is None].index(argument)
            _need(index < len(positional))
            parameter = positional[index].name.value
        else:
            parameter = argument.keyword.value
            _need(any(p.name.value == parameter for p in [*positional, *params.kwonly_params]))
        results = []
        for use in self._references(parameter):
            if self._scope(use) is not function:
                continue
            holder = self.parent(use)
            if isinstance(holder, cst.Param):
                continue
            _need(not self._is_binding(use))
            if isinstance(holder, cst.Call) and holder.func is use:
                results.append(_outermost_shape_op(holder, self.parent))
                continue
            if isinstance(holder, cst.Arg) and holder.value is use and dotted_name(self.parent(holder).func) == "print":
                continue
            _need(isinstance(holder, cst.Attribute) and holder.value is use and holder.attr.value in _MODEL_ATTRIBUTES)
        if not results:
            # a helper that only inspects what it is handed (`print_network(net)`): whatever
            # else its other calls pass, no output of the model is read there
            self._followed_helpers.discard(id(function))
            return []
        self._verify_helper_parameter(function, parameter, instances)
        return results

    # ---- its outputs -----------------------------------------------------------------------

    def _follow_result(self, result: cst.BaseExpression, criterion: str, fusion: Fusion) -> None:
        holder = self.parent(result)
        if self.head is not None:
            # `validity, label = discriminator(x)`: the head's name is followed, the rest is not
            # the Sequential's output and stays as it is
            index, length = self.head
            _need(isinstance(holder, cst.Assign) and holder.value is result and len(holder.targets) == 1)
            target = holder.targets[0].target
            _need(isinstance(target, (cst.Tuple, cst.List)) and len(target.elements) == length)
            _need(all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements))
            name = target.elements[index].value.value
            if name == "_" and all(self._is_binding(use) for use in self._references(name)):
                return  # `_, D_cont, D_disc = self.D(G_)`: the head is discarded, never read
            self._follow_name(name, holder, result, criterion, fusion)
            return
        if isinstance(holder, cst.Arg) and self._is_criterion_first_argument(holder, criterion):
            return
        if isinstance(holder, cst.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0].target, cst.Name):
            self._follow_name(holder.targets[0].target.value, holder, result, criterion, fusion)
            return
        if self._applied_at(result):
            self._wrap(result, fusion)

    def _follow_name(self, name: str, holder: cst.Assign, result: cst.BaseExpression, criterion: str,
                     fusion: Fusion) -> None:
        """Every read of `name` (bound to the model's output at `holder`) is the criterion's first
        argument or gets torch.sigmoid(...)."""
        scope = self._scope(holder)
        assignments = self._assignments(name, within=scope)
        reaching = None
        if not all(a.value is result or self._is_forward_result(a.value) for a in assignments):
            # the name also holds something else (`out = model.decode(z)` before `out, _, _ = model(x)`):
            # followed read by read, when the assignments are statements of one block
            reaching = self._reaching_assignments(name, assignments, scope)
        for use in self._references(name):
            if self._is_binding(use):
                continue
            if self._scope(use) is not scope:
                # another function's own local of that name is another variable; a read of
                # this one from elsewhere (a global, a closure) cannot be followed
                _need(self._binds_locally(self._scope(use), name))
                continue
            if reaching is not None:
                source = reaching[id(use)]
                if not (source.value is result or self._is_forward_result(source.value)):
                    continue  # this read sees the other value, which the fusion leaves as it was
            argument = self.parent(use)
            # `del output`, `global output`, `output += ...`: not a read that sigmoid can wrap
            _need(not isinstance(argument, (cst.Del, cst.Global, cst.Nonlocal, cst.AugAssign)))
            if self._feeds_criterion(use, criterion):
                continue  # `criterion(output.view(-1), label)`: the logits the criterion now takes
            if self._applied_at(use):
                self._wrap(use, fusion)

    def _reaching_assignments(self, name: str, assignments: List[cst.Assign], scope: cst.CSTNode) -> Dict[int, cst.Assign]:
        """id(read) -> the assignment each read of `name` in `scope` sees, when every assignment is
        a statement of its own in one block (no branch or loop between them) and every read comes
        after one of them in that block: then the last one before it is the one it sees."""
        lines = [self.parent(a) for a in assignments]
        _need(all(isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 for line in lines))
        block = self.parent(lines[0])
        _need(all(self.parent(line) is block for line in lines))
        body = list(block.body)
        positions = {id(line): body.index(line) for line in lines}
        found: Dict[int, cst.Assign] = {}
        for use in self._references(name):
            if self._is_binding(use) or self._scope(use) is not scope:
                continue
            statement = use
            while statement is not None and self.parent(statement) is not block:
                statement = self.parent(statement)
            _need(statement is not None)
            index = body.index(statement)
            before = [a for a, line in zip(assignments, lines) if positions[id(line)] < index]
            _need(bool(before))
            found[id(use)] = max(before, key=lambda a: positions[id(self.parent(a))])
        return found

    def _feeds_criterion(self, use: cst.BaseExpression, criterion: str) -> bool:
        """Is this read the criterion's input, directly or through shape operations
        (`criterion(output.view(-1), label)`, `self.loss(outputs.flatten(), labels)`)?"""
        top = _outermost_shape_op_of(use, self.parent)
        argument = self.parent(top)
        return isinstance(argument, cst.Arg) and self._is_criterion_first_argument(argument, criterion)

    def _is_binding(self, name: cst.Name) -> bool:
        """`name = ...` or `name, other = ...`: where the name is bound, not read."""
        parent = self.parent(name)
        if isinstance(parent, cst.AssignTarget):
            return True
        return isinstance(parent, cst.Element) and isinstance(self.parent(self.parent(parent)), cst.AssignTarget)

    def _is_forward_result(self, value: cst.BaseExpression) -> bool:
        return self._is_instance_call(_strip_shape_ops(value))

    def _is_criterion_first_argument(self, argument: cst.Arg, criterion: str) -> bool:
        call = self.parent(argument)
        return (
            isinstance(call, cst.Call) and isinstance(call.func, (cst.Name, cst.Attribute))
            and dotted_name(call.func) == criterion and call.args and call.args[0] is argument and argument.keyword is None
        )

    def _check_criterion_use(self, use: cst.Name, criterion: str) -> None:
        holder = self.parent(use)
        if isinstance(holder, cst.AssignTarget):
            return
        if isinstance(holder, cst.Attribute) and holder.attr.value in _DEVICE_MOVES:
            # `adversarial_loss.cuda()` as a statement of its own: a device move, for any criterion
            call = self.parent(holder)
            _need(isinstance(call, cst.Call) and call.func is holder and isinstance(self.parent(call), cst.Expr))
            return
        _need(isinstance(holder, cst.Call) and holder.func is use and holder.args)
        # a conditional Sigmoid: the criterion runs only where the flag says it is applied
        _need(self._applied_at(holder))
        first = _strip_shape_ops(holder.args[0].value)
        # its input is a forward result, or a name that holds only forward results
        if isinstance(first, cst.Name):
            scope = self._scope(holder)
            assignments = self._assignments(first.value, within=scope)
            _need(bool(assignments) and all(self._is_instance_call(_strip_shape_ops(a.value)) for a in assignments))
        else:
            _need(self.head is None and self._is_instance_call(first))  # a tuple is no probability

    def _is_instance_call(self, node: cst.CSTNode) -> bool:
        return isinstance(node, cst.Call) and isinstance(node.func, (cst.Name, cst.Attribute)) \
            and dotted_name(node.func) in self._instance_names

    def _wrap(self, node: cst.BaseExpression, fusion: Fusion) -> None:
        if id(node) in self.replace:
            return
        holder = self.parent(node)
        if isinstance(holder, cst.Attribute) and holder.value is node and holder.attr.value in _SHAPE_READS:
            return  # `torch.ones(D_result.size())`: logits and probabilities have one shape, device, dtype
        self.replace[id(node)] = cst.Call(func=cst.parse_expression("torch.sigmoid"), args=[cst.Arg(node)])
        if self._read_by_a_log(node):
            # `-np.log(D(s, a).cpu().numpy())` (a GAIL reward): computed under autocast the logit is
            # float16, and so would its sigmoid be, which rounds to 0 below about -17 (the log is
            # inf) where the fp32 script's was finite: the probability is taken in float32
            self.float_reads.add(id(node))
            fusion.float_wrapped.append(self._line(node))
        fusion.wrapped.append(self._line(node))

    def _read_by_a_log(self, node: cst.CSTNode) -> bool:
        """Is this read, through the expression holding it, an argument of a log (`np.log(...)`,
        `torch.log(...)`, `math.log(...)`, `(...).log()`)?"""
        child, current = node, self.parent(node)
        while current is not None and not isinstance(current, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            if isinstance(current, cst.Call) and child is not current.func:
                name = dotted_name(current.func) or ""
                if name.rsplit(".", 1)[-1] in _LOGS:
                    return True
            if isinstance(current, cst.Attribute) and current.attr.value in _LOGS and child is current.value:
                return True
            child, current = current, self.parent(current)
        return False

    # ---- small queries ---------------------------------------------------------------------

    def _references(self, name: str) -> List[cst.Name]:
        """Name nodes that refer to a variable `name` (not `obj.name`, not a keyword `name=`); for
        "self.D", the `self.D` nodes of the trainer class, the only ones spelling `.D` in the file."""
        if "." in name:
            return self._attribute_references(name)
        found = []
        for node in self.index.names.get(name, []):
            parent = self.parent(node)
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue
            if isinstance(parent, (cst.Arg, cst.Param)) and getattr(parent, "keyword", None) is node:
                continue
            if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is node:
                continue
            found.append(node)
        return found

    def _attribute_references(self, name: str) -> List[cst.Attribute]:
        attribute = name.split(".", 1)[1]
        if not name.startswith("self."):
            # `network.discriminator`, a class reached through its module: every `.discriminator`
            # of the file must spell it so
            found = []
            for node in self.index.names.get(attribute, []):
                holder = self.parent(node)
                if isinstance(holder, cst.Attribute) and holder.attr is node:
                    _need(dotted_name(holder) == name)
                    found.append(holder)
            return found
        _need(self._trainer_class is not None)
        found = []
        for node in self.index.names.get(attribute, []):
            holder = self.parent(node)
            if not (isinstance(holder, cst.Attribute) and holder.attr is node):
                continue  # a variable or a keyword of that name: not the attribute
            _need(dotted_name(holder) == name and self._inside(holder, self._trainer_class))
            found.append(holder)
        return found

    def _assigned_name(self, call: cst.Call) -> Optional[str]:
        top = call
        while True:  # nn.BCELoss().cuda()
            attribute = self.parent(top)
            outer = self.parent(attribute) if attribute is not None else None
            if isinstance(attribute, cst.Attribute) and attribute.value is top and attribute.attr.value in _DEVICE_MOVES \
                    and isinstance(outer, cst.Call) and outer.func is attribute:
                top = outer
                continue
            break
        assign = self.parent(top)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return None
        target = assign.targets[0].target
        if isinstance(target, cst.Name):
            return target.value
        if isinstance(target, cst.Attribute) and (dotted_name(target) or "").startswith("self."):
            # `self.BCE_loss = nn.BCELoss().cuda()` in the trainer class
            return self._trainer_attribute(target)
        return None

    def _assignments(self, name: str, within: Optional[cst.CSTNode] = None) -> List[cst.Assign]:
        found = []
        for node in self._references(name):
            target = self.parent(node)
            if within is not None and self._scope(node) is not within:
                continue
            if isinstance(target, cst.AssignTarget):
                assign = self.parent(target)
                _need(isinstance(assign, cst.Assign) and len(assign.targets) == 1)
                found.append(assign)
            elif isinstance(target, cst.Param) and id(target) in self._instance_parameters:
                continue  # a helper's parameter that every call hands an instance
            elif isinstance(target, (cst.AugAssign, cst.For, cst.CompFor, cst.WithItem, cst.AsName, cst.Param, cst.Global, cst.Nonlocal)):
                _need(False)  # bound another way: not followed
            elif isinstance(target, cst.Element):
                sequence = self.parent(target)
                grand = self.parent(sequence)
                if isinstance(grand, cst.AssignTarget):
                    # only the head of a two-headed model's output: `validity, _ = discriminator(x)`
                    assign = self.parent(grand)
                    _need(self.head is not None and isinstance(assign, cst.Assign) and len(assign.targets) == 1)
                    _need(len(sequence.elements) == self.head[1] and sequence.elements[self.head[0]] is target)
                    _need(self._is_instance_call(assign.value))
                    found.append(assign)
        return found

    def _binds_locally(self, scope: cst.CSTNode, name: str) -> bool:
        if isinstance(scope, cst.FunctionDef) and any(p.name.value == name for p in scope.params.params):
            return True
        return any(self._scope(n) is scope and self._is_binding(n) for n in self._references(name))

    def _enclosing(self, node: cst.CSTNode, kind) -> Optional[cst.CSTNode]:
        current = self.parent(node)
        while current is not None and not isinstance(current, kind):
            current = self.parent(current)
        return current

    def _scope(self, node: cst.CSTNode) -> cst.CSTNode:
        current = self.parent(node)
        while current is not None and not isinstance(current, (cst.FunctionDef, cst.Lambda, cst.Module)):
            current = self.parent(current)
        return current

    def _inside(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
        current = node
        while current is not None:
            if current is outer:
                return True
            current = self.parent(current)
        return False

    def _nodes(self, root: cst.CSTNode, kind) -> List[cst.CSTNode]:
        found = []

        class _Find(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                if isinstance(node, kind):
                    found.append(node)
                return True

        walk(root, _Find())
        return found

    def _line(self, node: cst.CSTNode) -> int:
        if self._positions is None:
            self._positions = Positions(self.module)
        return self._positions[node].start.line


def _with_torch_imported(module: cst.Module, needed: bool) -> cst.Module:
    return add_import_torch(module) if needed else module


def _strip_shape_ops(node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _SHAPE_METHODS:
        node = node.func.value
    return node


def _outermost_shape_op_of(node: cst.BaseExpression, parent) -> cst.BaseExpression:
    """`output` in `output.view(-1).squeeze()`: the whole chain of shape operations on it."""
    top = node
    while True:
        attr = parent(top)
        if isinstance(attr, cst.Attribute) and attr.value is top and attr.attr.value in _SHAPE_METHODS:
            outer = parent(attr)
            if isinstance(outer, cst.Call) and outer.func is attr:
                top = outer
                continue
        return top


def _outermost_shape_op(call: cst.Call, parent) -> cst.BaseExpression:
    top = call
    while True:
        attr = parent(top)
        if isinstance(attr, cst.Attribute) and attr.value is top and attr.attr.value in _SHAPE_METHODS:
            outer = parent(attr)
            if isinstance(outer, cst.Call) and outer.func is attr:
                top = outer
                continue
        return top


class _Replace(cst.CSTTransformer):
    def __init__(self, replace: Dict[int, cst.CSTNode], float_reads: Set[int] = frozenset()) -> None:
        super().__init__()
        self.replace = replace
        self.float_reads = float_reads

    def on_leave(self, original_node, updated_node):
        new = self.replace.get(id(original_node))
        if new is None:
            return updated_node
        if isinstance(new, cst.Call) and isinstance(new.func, cst.Attribute) and dotted_name(new.func) == "torch.sigmoid":
            if id(original_node) in self.float_reads:
                value = updated_node
                if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not value.lpar:
                    value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                updated_node = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("float")))
            return new.with_changes(args=[cst.Arg(updated_node)])
        return new  # the criterion and the Sequential: nothing inside them is replaced
