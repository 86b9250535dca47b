"""apex: an optimizer handed to a trainer class (`Trainer(model, loader, optimizer, ...)`).

The DDP tutorial's layout, and many research trainers':

    def load_train_objs():                          class Trainer:
        model = Net()                                   def __init__(self, model, data, optimizer, gpu_id):
        optimizer = SGD(model.parameters(), lr)             self.model = model.to(gpu_id)
        return data, model, optimizer                       self.optimizer = optimizer
                                                            (+ amp.initialize(self.model, self.optimizer))
    data, model, optimizer = load_train_objs()              self.model = DDP(self.model, ...)
    trainer = Trainer(model, data, optimizer, gpu_id)

amp.initialize goes in `__init__`, where the model reaches the GPU and before its wrap, once the
optimizer and the model attribute are set. That is right only when `self.model` holds the very
model the optimizer trains, so both are followed back from every place this file builds the class
(through parameters and a function's returned tuple) to one construction each: the optimizer's
`<model>.parameters()` must name the model `self.model` comes from. Anything not followed leaves
the optimizer unexplained, and the caller refuses with its own reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.kit.returns import returns_of
from ampify.transforms.torch.statements import all_params, calls_within
from ampify.transforms.torch.training_loop import Binding, Scope, TrainingStructure, Unconvertible

_DEVICE_METHODS = ("to", "cuda")


@dataclass
class InjectedOptimizer:
    """`self.optimizer = optimizer` in `__init__`, with the model attribute it trains."""

    binding: Binding
    models: List[str]  # ["self.model"]
    #: the statements of `__init__` that must run before amp.initialize (the model attribute's)
    statements: List[cst.CSTNode]


def injected_optimizer(structure: TrainingStructure, bindings: List[Binding], models_of) -> Optional[InjectedOptimizer]:
    """The injected optimizer behind `bindings` (one `self.x = <parameter>` in `__init__`), or
    None when it is not that shape; raises Unconvertible when it is, but cannot be followed.
    `models_of(binding)` names the models an optimizer construction trains."""
    if len(bindings) != 1:
        return None
    binding = bindings[0]
    init = binding.scope
    if not (binding.kind == "attribute" and isinstance(binding.value, cst.Name) and isinstance(init, cst.FunctionDef)
            and init.name.value == "__init__" and binding.klass is not None):
        return None
    parameters = [p.name.value for p in all_params(init)]
    if binding.value.value not in parameters:
        return None
    return _Follower(structure, binding, init, models_of).follow()


class _Follower:
    def __init__(self, structure: TrainingStructure, binding: Binding, init: cst.FunctionDef, models_of) -> None:
        self.s = structure
        self.binding = binding
        self.init = init
        self.klass = binding.klass
        self.models_of = models_of

    def follow(self) -> InjectedOptimizer:
        klass_name = self.klass.name.value
        sites = [call for call in calls_within(self.s.module) if dotted_name(call.func) == klass_name]
        parameter = self.binding.value.value
        if not sites:
            raise Unconvertible(
                f"{self.binding.name} is the {parameter} passed to {klass_name}(), which this file never builds, so "
                f"amp.initialize cannot tell which model it trains; call amp.initialize(model, {parameter}) where both "
                "are created, by hand", self.binding.statement)
        constructions = []
        for call in sites:
            constructions.append(self._origin_of_argument(call, parameter))
        if any(c is None for c in constructions) or any(c is not constructions[0] for c in constructions):
            raise Unconvertible(
                f"{self.binding.name} comes from the {parameter} passed to {klass_name}(), which ampify cannot follow "
                "to one optimizer construction in this file (through parameters and returned tuples)",
                self.binding.statement)
        construction = constructions[0]
        trained = self.models_of(construction)
        if len(trained) != 1:
            raise Unconvertible(
                f"cannot tell which one model the optimizer at line {self.s.line(construction.statement)} trains, so "
                f"amp.initialize cannot be placed in {klass_name}.__init__", self.binding.statement)
        model_origin = self._origin(trained[0], construction.scope)
        if model_origin is None:
            raise Unconvertible(
                f"the model the optimizer at line {self.s.line(construction.statement)} trains ({trained[0]}) is not "
                "built once in this file, so ampify cannot tell which attribute of "
                f"{klass_name} holds it", self.binding.statement)
        matches = []
        for attribute in self._model_attributes():
            origins = [self._origin_of_argument(call, attribute[1]) for call in sites]
            if origins and all(o is model_origin for o in origins):
                matches.append(attribute)
        if len({name for name, _, _ in matches}) != 1:
            raise Unconvertible(
                f"no single attribute of {klass_name} holds the model the optimizer at line "
                f"{self.s.line(construction.statement)} trains, so amp.initialize cannot be placed in its __init__",
                self.binding.statement)
        return InjectedOptimizer(self.binding, [matches[0][0]], [m[2] for m in matches])

    # ---- following values -------------------------------------------------------------------

    def _origin_of_argument(self, call: cst.Call, parameter: str) -> Optional[Binding]:
        argument = _argument(self.init, parameter, call)
        name = dotted_name(argument) if argument is not None else None
        if name is None or "." in name:
            return None
        statement = self.s.statement_of(call)
        return self._origin(name, self.s.scope_of(statement or call))

    def _origin(self, name: str, scope: Scope, depth: int = 0) -> Optional[Binding]:
        """The one construction (`name = SomeCall(...)`) the value of `name` in `scope` comes
        from, through a function's returned tuple; None when not exactly one."""
        if depth > 3:
            return None
        bindings = self.s.bindings_visible(name, scope)
        if len(bindings) != 1:
            return None
        binding = bindings[0]
        if binding.kind == "assign" and isinstance(binding.value, cst.Call):
            function = self._function_called(binding.value)
            if function is None:
                return binding
            return None  # `model = build()` returning something: not followed
        if binding.kind == "tuple":
            return self._origin_in_tuple(binding, name, depth)
        return None

    def _origin_in_tuple(self, binding: Binding, name: str, depth: int) -> Optional[Binding]:
        statement = binding.statement
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call)):
            return None
        target = small.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)):
            return None
        names = [dotted_name(e.value) if isinstance(e, cst.Element) else None for e in target.elements]
        if names.count(name) != 1:
            return None
        index = names.index(name)
        function = self._function_called(small.value)
        if function is None:
            return None
        returns = [r for r in returns_of(function)]
        if len(returns) != 1 or not isinstance(returns[0].value, cst.Tuple):
            return None
        elements = returns[0].value.elements
        if len(elements) != len(names) or not isinstance(elements[index], cst.Element):
            return None
        returned = dotted_name(elements[index].value)
        if returned is None or "." in returned:
            return None
        return self._origin(returned, function, depth + 1)

    def _function_called(self, call: cst.Call) -> Optional[cst.FunctionDef]:
        """The module-level function of this file that `call` calls, if any."""
        called = dotted_name(call.func)
        for statement in self.s.module.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == called:
                return statement
        return None

    def _model_attributes(self):
        """(attribute, parameter, statement) for `self.x = <parameter>` or
        `self.x = <parameter>.to(...)` / `.cuda(...)` in `__init__`."""
        found = []
        parameters = {p.name.value for p in all_params(self.init)}
        for binding in self.s.bindings:
            if binding.scope is not self.init or binding.kind != "attribute" or binding is self.binding:
                continue
            value = binding.value
            while (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                   and value.func.attr.value in _DEVICE_METHODS):
                value = value.func.value
            if isinstance(value, cst.Name) and value.value in parameters:
                found.append((binding.name, value.value, binding.statement))
        return found


def _argument(function: cst.FunctionDef, parameter: str, call: cst.Call) -> Optional[cst.BaseExpression]:
    """The expression `call` (a class instantiation) passes for `parameter` of `__init__`."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == parameter:
            return arg.value
    if any(arg.star for arg in call.args):
        return None
    positional = [p.name.value for p in list(function.params.posonly_params) + list(function.params.params)]
    if positional and positional[0] == "self":
        positional = positional[1:]
    if parameter not in positional:
        return None
    index = positional.index(parameter)
    plain = [arg for arg in call.args if arg.keyword is None]
    return plain[index].value if index < len(plain) else None
