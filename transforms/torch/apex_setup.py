"""Where apex's `amp.initialize` goes: the scope that creates a training unit's optimizers, the
models they train (`<model>.parameters()` in their arguments), and the statement after the last
construction and the last device move of those models in that block.

Optimizers passed in as parameters are followed to their in-file call sites (a few levels deep).
Anything that cannot be followed raises Unconvertible with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NoReturn, Optional, Sequence, Tuple

import libcst as cst

from ampify.transforms.base import ProjectFacts
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch.apex_injected import InjectedOptimizer, injected_optimizer
from ampify.transforms.torch.scaler_placement import callers_elsewhere_note, inherited_from_a_base, no_op_optimizer_class
from ampify.transforms.torch.statements import calls_within, code_of, used_names
from ampify.transforms.torch.training_loop import Binding, Scope, TrainingStructure, TrainingUnit, Unconvertible


def refuse(node: cst.CSTNode, message: str) -> NoReturn:
    """This training unit cannot be converted safely: say why, and where."""
    raise Unconvertible(message, node)


@dataclass
class ApexSetup:
    """Where the models and optimizers of one training unit are created."""

    scope: Scope
    optimizers: List[str]  # names as seen in the setup scope
    models: List[str]
    construction_statements: List[cst.CSTNode]
    #: unit optimizer name -> setup-scope name
    renames: Dict[str, str] = field(default_factory=dict)
    #: ids of the optimizers' bindings
    binding_ids: List[int] = field(default_factory=list)


class ApexSetupFinder:
    """Finds the setup of a training unit in one module; `amp` is how the module spells apex amp."""

    def __init__(self, structure: TrainingStructure, amp: str, project: Optional[ProjectFacts] = None) -> None:
        self.s = structure
        self.amp = amp
        #: the rest of the project: callers in other files, helpers that move models to the GPU
        self.project = project
        #: optimizers handed to a trainer class's __init__ (apex_injected.py), by id of their binding
        self._injected: Dict[int, InjectedOptimizer] = {}
        #: id(binding) -> how its model was found, when it took the project (for the finding)
        self.notes: Dict[int, str] = {}
        #: id(binding) -> every statement of its scope that creates the same optimizer (the branches
        #: of `if args.optim == "sgd": ... elif ...: ...`), in order
        self._all_constructions: Dict[int, List[cst.CSTNode]] = {}

    def find(self, unit: TrainingUnit) -> ApexSetup:
        """Where the unit's optimizers and the models they train are created (one scope)."""
        scopes: List[Scope] = []
        optimizers: List[str] = []
        models: List[str] = []
        statements: List[cst.CSTNode] = []
        renames: Dict[str, str] = {}
        binding_ids: List[int] = []
        for optimizer in unit.optimizers:
            step = next(st for st in unit.steps if st.receiver == optimizer)
            binding, setup_name = self._construction(optimizer, step.scope, step.call, depth=0)
            binding_ids.append(id(binding))
            scopes.append(binding.scope)
            optimizers.append(setup_name)
            renames[optimizer] = setup_name
            self._refuse_rebuilt_optimizer(setup_name, self._all_constructions.get(id(binding), []))
            # amp.initialize goes after every construction: one in each branch of an if/elif gives
            # the whole if statement, not the last branch only
            statements.extend(st for st in self._all_constructions.get(id(binding), [binding.statement])
                              if all(st is not other for other in statements))
            injected = self._injected.get(id(binding))
            if injected is not None:
                statements.extend(injected.statements)  # the model attribute is set before amp.initialize
            model_names = injected.models if injected is not None else self._models_of(binding)
            if not model_names:
                refuse(
                    binding.statement,
                    f"cannot tell which model {setup_name} trains (no `<model>.parameters()` in its arguments); "
                    f"call {self.amp}.initialize(model, {setup_name}) by hand",
                )
            if "self" in model_names:
                refuse(
                    binding.statement,
                    f"{setup_name} trains the parameters of the object that creates it (self.parameters() in its "
                    f"own class): that module is built before it reaches the GPU (amp.initialize raises on CPU "
                    f"models) and each instance would call {self.amp}.initialize again (apex allows one call per "
                    f"process); pass every model and optimizer to a single {self.amp}.initialize by hand, or use "
                    "--backend native",
                )
            for model in model_names:
                if model not in models:
                    models.append(model)
        if any(scope is not scopes[0] for scope in scopes):
            refuse(unit.steps[0].call, "the optimizers of this loop are created in different functions")
        return ApexSetup(scopes[0], optimizers, models, statements, renames, binding_ids)

    def _refuse_rebuilt_optimizer(self, name: str, constructions: Sequence[cst.CSTNode]) -> None:
        """Two constructions of `name` in one block both run (a notebook that trains a CartPole
        model, then builds and trains an Atari one): each pair would need its own amp.initialize,
        and apex allows one per process. A later statement that wraps the optimizer it reads
        (`optimizer = Lookahead(optimizer)`) builds no new one."""
        if len(constructions) > 1:
            for construction in constructions:
                loop = self._loop_around(construction)
                if loop is not None:
                    refuse(
                        construction,
                        f"{name} is created again inside the loop at line {self.s.line(loop)} (line "
                        f"{self.s.line(construction)}): each new optimizer needs "
                        f"{self.amp}.initialize, and apex allows one call per process; use --backend native (a "
                        "GradScaler after each construction), or convert by hand",
                    )
        for first, later in zip(constructions, constructions[1:]):
            small = later.body[0] if isinstance(later, cst.SimpleStatementLine) and later.body else None
            value = small.value if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None else later
            if self.s.block_of(first) is self.s.block_of(later) and name not in used_names(value):
                refuse(
                    later,
                    f"{name} is created again at line {self.s.line(later)} after line {self.s.line(first)}: when both "
                    f"are trained, each needs its own {self.amp}.initialize, and apex allows one call per "
                    "process; use --backend native (a GradScaler after each), or convert by hand",
                )

    def _loop_around(self, statement: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The innermost `for`/`while` of the same function around `statement`, if any."""
        for ancestor in self.s.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            if isinstance(ancestor, (cst.For, cst.While)):
                return ancestor
        return None

    def check_models_reach_the_gpu(self, setup: ApexSetup) -> None:
        """amp.initialize raises on models whose parameters are not on a CUDA device. Refuse when
        the models are built in this file and nothing in it moves anything to a device (a CPU
        script, e.g. a small RL example): the converted script would crash at amp.initialize."""
        s = self.s
        if s.uses_cuda_method or s.to_device_arguments or s.device_bindings or s.parallel_wraps:
            return
        moved_by_helpers = True
        for model in setup.models:
            built = [
                b for b in s.bindings_visible(model, setup.scope)
                if b.kind in ("assign", "attribute") and isinstance(b.value, cst.Call)
            ]
            if not built:
                return  # the model comes from elsewhere (a parameter): it may be on the GPU already
            moved_by_helpers = moved_by_helpers and any(self._built_on_a_device(b.value) for b in built)
        if moved_by_helpers:
            return  # `net = get_network(args)`, a project function returning `net.cuda()`
        refuse(
            setup.construction_statements[0],
            f"{self.amp}.initialize needs the models on a CUDA device, and nothing moves "
            f"{', '.join(setup.models)} there (no .cuda() / .to(device) in this file, and no function of the "
            "project that builds it returns it moved); move the model to the GPU in this file, then rerun ampify",
        )

    def check_models_not_wrapped_by_helpers(self, setup: ApexSetup) -> None:
        """amp.initialize raises on a model already wrapped in DataParallel / DistributedDataParallel.
        Refuse when a model is built by a project function that returns it so wrapped (pix2pix and
        BicycleGAN's `networks.define_G(...)`, whose init_net wraps the net for its GPUs): the
        converted script would crash at amp.initialize."""
        if self.project is None:
            return
        for model in setup.models:
            for binding in self.s.bindings_visible(model, setup.scope):
                if binding.kind not in ("assign", "attribute") or not isinstance(binding.value, cst.Call):
                    continue
                called = dotted_name(binding.value.func)
                wrapped = self.project.returns_parallel_wrapped(called) if called is not None else None
                if wrapped is not None:
                    refuse(
                        binding.statement or setup.construction_statements[0],
                        f"{self.amp}.initialize refuses models already wrapped in DataParallel / "
                        f"DistributedDataParallel, and {called}() returns {model} so wrapped ({wrapped}): "
                        f"{self.amp}.initialize must run before that wrap, which ampify does not move into another "
                        "module; use --backend native, or initialize there by hand",
                    )

    def _built_on_a_device(self, call: cst.Call) -> bool:
        """Does this call (`get_network(args)`, `utils.build(cfg)`) reach a function of the
        project that returns its model moved to a device?"""
        called = dotted_name(call.func)
        return self.project is not None and called is not None and self.project.returns_device_moved(called) is not None

    def _construction(self, name: str, scope: Scope, use: cst.CSTNode, depth: int) -> Tuple[Binding, str]:
        """The binding that creates optimizer `name` as seen from `scope`, following function
        parameters to the in-file call sites (a few levels deep)."""
        bindings = self.s.bindings_visible(name, scope)
        optional = next((b for b in bindings if b.kind in ("assign", "attribute") and b.value is not None
                         and _may_be_none(b.value)), None)
        if optional is not None:
            refuse(use, self._none_reason(name, optional.statement, optional.value))
        constructions = [b for b in bindings if b.kind in ("assign", "attribute") and isinstance(b.value, cst.Call)]
        if constructions:
            if len({id(b.scope) for b in constructions}) > 1:
                refuse(use, f"{name} is created in several functions")
            self._all_constructions[id(constructions[-1])] = [b.statement for b in constructions]
            return constructions[-1], name
        injected = injected_optimizer(self.s, bindings, self._models_of)
        if injected is not None:
            self._injected[id(injected.binding)] = injected
            return injected.binding, name
        parameters = [b for b in bindings if b.kind == "parameter"]
        klass = self.s.class_of(scope) if isinstance(scope, cst.FunctionDef) else None
        inherited = inherited_from_a_base(self.project, klass, name) if not bindings and klass is not None else None
        if inherited is not None:
            base, fact = inherited
            refuse(use, f"{name} is set by {base}.__init__ ({fact.where}), which {klass.name.value} inherits: "
                        f"{self.amp}.initialize must take the model and {name} where they are created, in that "
                        "module (or in the script that hands them in), and ampify does not move it there; the native "
                        "backend converts this class")
        if not parameters or depth >= 3 or not isinstance(parameters[0].scope, cst.FunctionDef):
            refuse(use, self.s.not_found_reason(name, scope))
        function = parameters[0].scope
        callers = self._call_sites_of(function)
        if not callers:
            refuse(
                function,
                f"{name} is a parameter of {function.name.value}(), which is not called in this file"
                + callers_elsewhere_note(self.project, self.s.class_of(function), function),
            )
        found: List[Tuple[Binding, str]] = []
        for call, caller_scope in callers:
            argument = _argument_for(function, name, call)
            if isinstance(argument, cst.Name) and argument.value == "None":
                continue  # `train_val(model, test_loader, None)`: no optimizer, so no step runs there
            argument_name = dotted_name(argument) if argument is not None else None
            idle = no_op_optimizer_class(self.s, argument, caller_scope)
            if idle is not None:
                refuse(call, f"{function.name.value}() is called with a {idle}, whose step() does nothing, for "
                             f"{name}: apex's amp.scale_loss needs an optimizer that amp.initialize set up (the "
                             "native backend passes a disabled GradScaler there)")
            if argument_name is None:
                refuse(call, f"{function.name.value}() is called without a plain name for {name}")
            found.append(self._construction(argument_name, caller_scope, call, depth + 1))
        if not found:
            refuse(function, f"{function.name.value}() is only called with None for {name}")
        if any(f[0] is not found[0][0] for f in found):
            refuse(function, f"{function.name.value}() is called with different optimizers")
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
        if not found:
            found = self._model_of_optimizer_method(binding)
        return found

    def _model_of_optimizer_method(self, binding: Binding) -> List[str]:
        """`model.configure_optimizers(config)` (minGPT, Lightning's convention) trains `model`
        when every class of the project with that method builds its optimizer from its own
        parameters and returns it."""
        value = binding.value
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and self.project is not None):
            return []
        receiver = dotted_name(value.func.value)
        if receiver is None:
            return []
        where = self.project.optimizer_method_over_self(value.func.attr.value)
        if where is None:
            return []
        self.notes[id(binding)] = f"{value.func.attr.value}() builds it from {receiver}'s parameters, {where}"
        return [_model_root(receiver)]

    def check_defined_for_scale_loss(self, unit: TrainingUnit, setup: ApexSetup) -> None:
        """amp.scale_loss(loss, optimizer) runs at every backward: refuse when the optimizer is
        created only under a condition (`if args.use_optimizer:` with no else) and every step of it
        is guarded by that same condition apart from the backward, so the script runs without it
        when the condition fails. A step guarded by another test (gradient accumulation) is not."""
        backward = unit.backwards[0].call
        common = _deepest_common_block([self.s.block_path(c) for c in setup.construction_statements]
                                       + [self.s.block_path(self.s.statement_of(backward))])
        if common is None:
            return
        holders = common[1][:len(setup.construction_statements)]
        if any(holder is c for holder, c in zip(holders, setup.construction_statements)):
            return  # created by a plain statement of the block amp.initialize goes in
        conditional = next((h for h in holders if isinstance(h, cst.If)), None)
        if conditional is None or _binds_in_every_branch(self.s, conditional, setup.construction_statements):
            return
        tests = set()
        branch: Optional[cst.CSTNode] = conditional
        while isinstance(branch, cst.If):
            tests.add(code_of(branch.test).strip())
            branch = branch.orelse
        if any(not (_guard_tests_apart(self.s, step.call, backward) & tests) for step in unit.steps):
            # stepped wherever the backward runs, or under another condition (gradient accumulation's
            # `if step % accumulate == 0:`): the optimizer exists whenever the script trains
            return
        test = code_of(conditional.test).strip()
        refuse(
            backward,
            f"{', '.join(setup.optimizers)} is created only when `{test}` holds (line {self.s.line(conditional)}) and stepped "
            f"only under a condition, while this backward() runs regardless: {self.amp}.scale_loss(loss, "
            f"{setup.optimizers[0]}) would fail where it does not exist; use --backend native (GradScaler needs no "
            "optimizer to scale the loss), or convert by hand",
        )

    def check_never_none(self, unit: TrainingUnit, setup: ApexSetup) -> None:
        """amp.initialize and amp.scale_loss take every optimizer of the unit and fail on None
        (`_process_optimizer` sets attributes on it): refuse an optimizer stepped only under
        `if optimizer is not None:` (the image-captioning tutorial's frozen encoder), where a
        GradScaler needs no change. One made `Adam(...) if fine_tune else None` is refused where
        its construction is looked up (_construction)."""
        for step in unit.steps:
            current = self.s.parent(step.call)
            while current is not None and current is not unit.body:
                if isinstance(current, cst.If) and step.receiver and _tests_not_none(current.test, step.receiver):
                    refuse(step.call,
                           f"{step.receiver} is stepped only under `if {code_of(current.test).strip()}:` (line "
                           f"{self.s.line(current)}): it may be None, and {self.amp}.initialize and "
                           f"{self.amp}.scale_loss need every optimizer to exist; use --backend native (a GradScaler "
                           "steps only the optimizers that exist), or convert by hand")
                current = self.s.parent(current)

    def _none_reason(self, name: str, statement: Optional[cst.CSTNode], value: cst.BaseExpression) -> str:
        where = f"line {self.s.line(statement)}: " if statement is not None else ""
        test = " ".join(code_of(value.test).split()) if isinstance(value, cst.IfExp) else "..."
        shown = (f"... if {test} else None" if isinstance(value, cst.IfExp) and _is_none(value.orelse)
                 else f"None if {test} else ..." if isinstance(value, cst.IfExp) and _is_none(value.body)
                 else "... if ... else ...")
        return (f"{name} may be None ({where}`{name} = {shown}`): {self.amp}.initialize and "
                f"{self.amp}.scale_loss need every optimizer to exist; use --backend native (a GradScaler steps only "
                "the optimizers that exist), or convert by hand")

    def note_for(self, setup: "ApexSetup") -> str:
        """What the finder followed to pair the setup's models and optimizers, for the finding."""
        notes = [self.notes[i] for i in setup.binding_ids if i in self.notes]
        return f" ({'; '.join(notes)})" if notes else ""

    def initialize_anchor(self, unit: TrainingUnit, setup: ApexSetup) -> cst.CSTNode:
        """The statement after which amp.initialize goes: the last construction, moved past any
        later `.cuda()` / `.to(...)` of a model in the same block, before the training."""
        return self.anchor_before([unit.owner, *(b.call for b in unit.backwards)], setup)

    def anchor_before(self, training: Sequence[cst.CSTNode], setup: ApexSetup) -> cst.CSTNode:
        """The anchor for amp.initialize, which must come before any of the `training` nodes (the
        loop, its backward calls; or the call of a step function of another module)."""
        paths = [self.s.block_path(statement) for statement in setup.construction_statements]
        common = _deepest_common_block(paths)
        if common is None:
            refuse(setup.construction_statements[0], "the optimizers are created in unrelated blocks")
        block, holders = common
        body = list(block.body)
        index = max(index_of(body, holder) for holder in holders)
        for later in body[index + 1:]:
            if any(self.s.contains(later, node) for node in training):
                break
            if _moves_a_model(later, setup.models):
                index = index_of(body, later)
        anchor = body[index]
        if any(self.s.contains(anchor, node) for node in training[1:] or training):
            refuse(anchor, "the optimizer is created in the same statement that trains")
        return anchor

    def setup_of_passed_optimizers(self, names: Sequence[str], scope: Scope, use: cst.CSTNode) -> ApexSetup:
        """The setup of optimizers this module passes to a step function of another module."""
        scopes, optimizers, models, statements = [], [], [], []
        for name in names:
            binding, setup_name = self._construction(name, scope, use, depth=0)
            scopes.append(binding.scope)
            optimizers.append(setup_name)
            statements.append(binding.statement)
            found = self._models_of(binding)
            if not found:
                refuse(binding.statement, f"cannot tell which model {setup_name} trains (no `<model>.parameters()` in its arguments)")
            models += [model for model in found if model not in models]
        if any(scope is not scopes[0] for scope in scopes):
            refuse(use, "the optimizers passed here are created in different functions")
        return ApexSetup(scopes[0], optimizers, models, statements)


# ---- small CST helpers ---------------------------------------------------------------------


def index_of(body: Sequence[cst.CSTNode], statement: cst.CSTNode) -> int:
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


def _binds_in_every_branch(structure: TrainingStructure, statement: cst.CSTNode, constructions: Sequence[cst.CSTNode]) -> bool:
    """Does every way through `statement` (an if/elif/else chain) run one of `constructions`?"""
    if not isinstance(statement, cst.If):
        return False
    branches: List[cst.CSTNode] = []
    node: Optional[cst.CSTNode] = statement
    while isinstance(node, cst.If):
        branches.append(node.body)
        node = node.orelse
    if node is None:
        return False  # no else: nothing runs when every test fails
    branches.append(node.body)
    return all(any(structure.contains(branch, c) for c in constructions) for branch in branches)


def _guard_tests_apart(structure: TrainingStructure, node: cst.CSTNode, other: cst.CSTNode) -> set:
    """The tests of the if statements that hold `node` but not `other` (as written)."""
    tests = set()
    current = structure.parent(node)
    while current is not None and not structure.contains(current, other):
        if isinstance(current, cst.If):
            tests.add(code_of(current.test).strip())
        current = structure.parent(current)
    return tests


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


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _may_be_none(value: cst.BaseExpression) -> bool:
    """A conditional expression with a None branch (`Adam(...) if fine_tune else None`, nested
    ones too). A plain `= None` is not: trainers set `self.optimizer = None` before building one."""
    if not isinstance(value, cst.IfExp):
        return False
    return any(_is_none(branch) or _may_be_none(branch) for branch in (value.body, value.orelse))


def _tests_not_none(test: cst.BaseExpression, receiver: str) -> bool:
    """`receiver is not None`, `receiver` alone, or either within an `and`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _tests_not_none(test.left, receiver) or _tests_not_none(test.right, receiver)
    if code_of(test).strip() == receiver:
        return True
    if (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.IsNot) and _is_none(test.comparisons[0].comparator)):
        return code_of(test.left).strip() == receiver
    return False
