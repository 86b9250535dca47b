"""BCE after a Sigmoid, functional form: the VAE shape (pytorch/examples' vae, most VAE tutorials).

    def decode(self, z):                                 def decode(self, z):
        h3 = F.relu(self.fc3(z))                             h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))        ->         return self.fc4(h3)

    def loss_function(recon_x, x, mu, logvar):           def loss_function(recon_x, x, mu, logvar):
        BCE = F.binary_cross_entropy(recon_x, ...)   ->      BCE = F.binary_cross_entropy_with_logits(recon_x, ...)

A method of a model class returns `torch.sigmoid(...)`, and what it returns reaches
`F.binary_cross_entropy` (directly, or through a module-level helper whose parameter feeds it).
The sigmoid goes, the loss takes logits (the same loss, computed stably), and every other read of
the output (a saved reconstruction, a `model.decode(z)` sample) gets `torch.sigmoid(...)`.

The method is `forward` itself, or a method that forward returns (`return self.decode(z), mu,
logvar`: the first element of the model's output). Only when every use can be followed in this
file, as for the Sequential form (bce_logits.py): anything else leaves the file as it was.
"""

from __future__ import annotations

from typing import List, Optional, Set

import libcst as cst

from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.torch.bce_logits import (
    _MODEL_ATTRIBUTES,
    imported_model_change,
    Fusion,
    _Fuser,
    _need,
    _NotFollowed,
    _outermost_shape_op,
    _Replace,
    _strip_shape_ops,
)

_SIGMOIDS = ("torch.sigmoid", "torch.nn.functional.sigmoid")
_FUNCTIONAL_BCE = ("torch.nn.functional.binary_cross_entropy",)


def fuse_imported_functional_bce(module: cst.Module, imports: ImportMap, project, here: str):
    """The VAE shape across modules: the model class is imported from another project module
    (`from models import VAE`) whose `decode()` returns `torch.sigmoid(...)`, and this module feeds
    its output to F.binary_cross_entropy. (fused module, Fusion, CompanionChange of the model
    module), a one-line reason (str) when the model module is used elsewhere or not in this run,
    or None (the BCE warning stands); see bce_logits.fuse_imported_sigmoid_model."""
    imported_class = getattr(project, "imported_class", None)
    if imported_class is None:
        return None
    calls = _FunctionalFuser(module, imports).index.calls
    if not any(imports.resolve(c.func) in _FUNCTIONAL_BCE for c in calls):
        return None
    found = []
    for local in sorted({c.func.value for c in calls if isinstance(c.func, cst.Name)}):
        described = imported_class(local)
        if described is None:
            continue
        key, display, class_name, _line, trains = described
        source = project.source_of(key)
        if source is None or trains or b"sigmoid" not in source:
            continue
        try:
            model_module = cst.parse_module(source)
            dropped, sigmoid_line, method_name, head = _FunctionalFuser(
                model_module, ImportMap.from_module(model_module)).drop_returned_sigmoid(class_name)
            fused, fusion = _FunctionalFuser(module, imports).fuse_with_imported_model(
                local, method_name, head, sigmoid_line, display)
        except (_NotFollowed, IndexError, AttributeError, KeyError, TypeError, ValueError):
            continue
        found.append((key, display, class_name, source, dropped, sigmoid_line, fused, fusion))
    if len(found) != 1:
        return None
    return imported_model_change(project, here, *found[0], loss="F.binary_cross_entropy_with_logits")


def fuse_functional_bce(module: cst.Module, imports: ImportMap) -> Optional[tuple]:
    """(new module, Fusion) when the shape above holds everywhere; None otherwise."""
    try:
        return _FunctionalFuser(module, imports).run()
    except _NotFollowed:
        return None
    except (IndexError, AttributeError, KeyError, TypeError, ValueError):
        return None  # a shape the checks did not foresee: nothing is fused, the BCE warning stands


class _FunctionalFuser(_Fuser):
    def __init__(self, module: cst.Module, imports: ImportMap) -> None:
        super().__init__(module, imports)
        #: module-level helpers `loss_function(recon_x, ...)`: name -> index of the parameter
        #: that reaches F.binary_cross_entropy
        self.helpers: dict = {}
        self.method_name = ""

    def run(self):
        _need("torch" in self.imports.local_names_for("torch"))
        _need(not any(self.imports.resolve(c.func) in ("torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss")
                      for c in self.index.calls))
        bce_calls = [c for c in self.index.calls if self.imports.resolve(c.func) in _FUNCTIONAL_BCE]
        _need(bool(bce_calls) and all(isinstance(c.func, cst.Attribute) for c in bce_calls))
        returned = [c for c in self.index.calls
                    if self.imports.resolve(c.func) in _SIGMOIDS and isinstance(self.parent(c), cst.Return)]
        _need(len(returned) == 1 and len(returned[0].args) == 1 and returned[0].args[0].keyword is None)
        sigmoid = returned[0]
        method = self._enclosing(sigmoid, cst.FunctionDef)
        klass = self._enclosing(method, cst.ClassDef) if method is not None else None
        _need(klass is not None and self._enclosing(method, cst.FunctionDef) is None)
        _need(len(self._nodes(method, cst.Return)) == 1)
        self.method_name = method.name.value
        self.head = None if self.method_name == "forward" else self._head_through_forward(klass)
        instances = self._instances(klass)
        self._instance_names = instances
        fusion = Fusion(self._line(bce_calls[0]), self._line(sigmoid))
        for call in bce_calls:
            self._check_bce_input(call)
        self._check_helper_calls()
        for result in self._outputs(instances, klass.name.value, fusion):
            self._follow_result(result, "", fusion)
        for call in bce_calls:
            self.replace[id(call)] = call.with_changes(
                func=call.func.with_changes(attr=cst.Name("binary_cross_entropy_with_logits")))
        fusion.wrapped.sort()
        fusion.description = (
            f"BCE after a Sigmoid fused: {dotted_name(sigmoid.func)} at line {fusion.sigmoid_line} dropped from "
            f"{klass.name.value}.{self.method_name}(), F.binary_cross_entropy at line{'s' if len(bce_calls) > 1 else ''} "
            f"{', '.join(str(self._line(c)) for c in bce_calls)} is F.binary_cross_entropy_with_logits (the same "
            "loss, computed from logits)")
        return self.module.visit(_SigmoidDropped(self.replace, id(sigmoid))), fusion

    # ---- across modules ------------------------------------------------------------------------

    def drop_returned_sigmoid(self, class_name: str):
        """This module defines the model class `class_name`, used only by another module: the
        `torch.sigmoid(...)` one of its methods returns is dropped. Returns (new module, line of the
        sigmoid, the method's name, head of forward's output)."""
        klass = next((c for c in self.module.body if isinstance(c, cst.ClassDef) and c.name.value == class_name), None)
        _need(klass is not None)
        for name in self._references(class_name):
            if name is klass.name:
                continue
            holder = self.parent(name)
            _need(isinstance(holder, cst.Arg) and dotted_name(self.parent(holder).func) == "super")
        returned = [c for c in self.index.calls if self.imports.resolve(c.func) in _SIGMOIDS
                    and isinstance(self.parent(c), cst.Return) and self._inside(c, klass)]
        _need(len(returned) == 1 and len(returned[0].args) == 1 and returned[0].args[0].keyword is None)
        sigmoid = returned[0]
        method = self._enclosing(sigmoid, cst.FunctionDef)
        _need(method is not None and self._enclosing(method, cst.ClassDef) is klass)
        _need(self._enclosing(method, cst.FunctionDef) is None and len(self._nodes(method, cst.Return)) == 1)
        self.method_name = method.name.value
        head = None if self.method_name == "forward" else self._head_through_forward(klass)
        return self.module.visit(_SigmoidDropped(self.replace, id(sigmoid))), self._line(sigmoid), self.method_name, head

    def fuse_with_imported_model(self, local: str, method_name: str, head, sigmoid_line: int, model_display: str):
        """This training module builds the model class it imports as `local`, whose method
        `method_name` no longer applies its sigmoid (`drop_returned_sigmoid`): the loss takes
        logits, and every other read of the output gets torch.sigmoid(...)."""
        _need("torch" in self.imports.local_names_for("torch"))
        _need(not any(self.imports.resolve(c.func) in ("torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss")
                      for c in self.index.calls))
        bce_calls = [c for c in self.index.calls if self.imports.resolve(c.func) in _FUNCTIONAL_BCE]
        _need(bool(bce_calls) and all(isinstance(c.func, cst.Attribute) for c in bce_calls))
        self.method_name = method_name
        self.head = head
        instances = self._instances_named(local)
        self._instance_names = instances
        fusion = Fusion(self._line(bce_calls[0]), sigmoid_line)
        for call in bce_calls:
            self._check_bce_input(call)
        self._check_helper_calls()
        for result in self._outputs(instances, local, fusion):
            self._follow_result(result, "", fusion)
        for call in bce_calls:
            self.replace[id(call)] = call.with_changes(
                func=call.func.with_changes(attr=cst.Name("binary_cross_entropy_with_logits")))
        fusion.wrapped.sort()
        fusion.description = (
            f"BCE after a Sigmoid fused: the torch.sigmoid that {local}.{method_name}() returns ({model_display}:"
            f"{sigmoid_line}) dropped there, F.binary_cross_entropy at line{'s' if len(bce_calls) > 1 else ''} "
            f"{', '.join(str(self._line(c)) for c in bce_calls)} is F.binary_cross_entropy_with_logits (the same loss, "
            "computed from logits); both files are written as one change set")
        return self.module.visit(_Replace(self.replace)), fusion

    # ---- where the method's output goes --------------------------------------------------------

    def _head_through_forward(self, klass: cst.ClassDef) -> Optional[tuple]:
        """`self.decode(z)` is forward's whole return value (None) or one element of its returned
        tuple ((index, length)); it is called nowhere else in the class."""
        forward = next((s for s in klass.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"), None)
        _need(forward is not None)
        returns = self._nodes(forward, cst.Return)
        _need(len(returns) == 1 and returns[0].value is not None)
        calls = []
        for name in self.index.names.get(self.method_name, []):
            attribute = self.parent(name)
            if isinstance(attribute, cst.Attribute) and attribute.attr is name and dotted_name(attribute) == f"self.{self.method_name}":
                _need(self._inside(attribute, klass))
                call = self.parent(attribute)
                _need(isinstance(call, cst.Call) and call.func is attribute)
                calls.append(call)
        _need(len(calls) == 1)
        call = calls[0]
        value = returns[0].value
        returned = self._returned_as(call, forward)
        if value is returned:
            return None
        _need(isinstance(value, cst.Tuple))
        for index, element in enumerate(value.elements):
            if element.value is returned:
                others = [e for e in value.elements if e is not element]
                _need(not any(self._inside(returned, e) for e in others))
                return index, len(value.elements)
        raise _NotFollowed()

    def _returned_as(self, call: cst.Call, forward: cst.FunctionDef) -> cst.CSTNode:
        """The node forward returns the call's result as: the call itself, or the one read of
        the local it is assigned to (`x_reconst = self.decode(z)` ... `return x_reconst, mu, logvar`)."""
        holder = self.parent(call)
        if not (isinstance(holder, cst.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0].target, cst.Name)):
            return call
        name = holder.targets[0].target.value
        _need(len(self._assignments(name, within=forward)) == 1)
        reads = [n for n in self._references(name) if self._scope(n) is forward and not self._is_binding(n)]
        _need(len(reads) == 1)
        return reads[0]

    def _outputs(self, instances: Set[str], klass_name: str, fusion: Fusion) -> List[cst.BaseExpression]:
        """The instances' forward results; `model.decode(z)` called from outside reads the
        probability directly and gets torch.sigmoid(...) here."""
        results = []
        for instance in instances:
            for assignment in self._assignments(instance):
                value = assignment.value
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in ("to", "cuda", "cpu"):
                    value = value.func.value
                _need(isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == klass_name)
            for name in self._references(instance):
                holder = self.parent(name)
                if isinstance(holder, cst.AssignTarget):
                    continue
                if isinstance(holder, cst.Call) and holder.func is name:
                    results.append(_outermost_shape_op(holder, self.parent))
                    continue
                if isinstance(holder, cst.Arg) and isinstance(self.parent(holder), cst.Call) and dotted_name(self.parent(holder).func) == "print":
                    continue
                _need(isinstance(holder, cst.Attribute) and holder.value is name)
                if holder.attr.value == self.method_name and self.method_name != "forward":
                    call = self.parent(holder)
                    _need(isinstance(call, cst.Call) and call.func is holder)
                    self._wrap(call, fusion)
                    continue
                _need(holder.attr.value in _MODEL_ATTRIBUTES)
        return results

    # ---- the loss ----------------------------------------------------------------------------

    def _check_bce_input(self, call: cst.Call) -> None:
        """F.binary_cross_entropy's input is a model output, or a parameter of a module-level
        helper that uses it for nothing else (the helper's callers pass model outputs)."""
        _need(bool(call.args) and call.args[0].keyword is None and not call.args[0].star)
        first = _strip_shape_ops(call.args[0].value)
        if self.head is None and self._is_instance_call(first):
            return  # F.binary_cross_entropy(model(x), y)
        _need(isinstance(first, cst.Name))
        function = self._enclosing(call, cst.FunctionDef)
        if function is not None and any(p.name.value == first.value for p in function.params.params):
            _need(self._enclosing(function, (cst.FunctionDef, cst.ClassDef)) is None)
            _need(not function.params.star_arg or isinstance(function.params.star_arg, cst.MaybeSentinel))
            uses = [n for n in self._references(first.value) if self._inside(n, function) and not isinstance(self.parent(n), cst.Param)]
            _need(len(uses) == 1)
            _need(not self._binds_locally_assigned(function, first.value))
            index = [p.name.value for p in function.params.params].index(first.value)
            _need(self.helpers.get(function.name.value, index) == index)
            self.helpers[function.name.value] = index
            return
        self._check_holds_outputs(first, call)

    def _check_helper_calls(self) -> None:
        """Every use of a BCE helper is a call that passes a model output at its BCE parameter
        (a probability from anywhere else would be taken for logits)."""
        for helper, index in self.helpers.items():
            for name in self._references(helper):
                call = self.parent(name)
                _need(isinstance(call, cst.Call) and call.func is name)
                _need(not any(a.star for a in call.args))
                plain = [a for a in call.args if a.keyword is None]
                _need(index < len(plain))
                argument = _strip_shape_ops(plain[index].value)
                if isinstance(argument, cst.Name):
                    self._check_holds_outputs(argument, call)
                else:
                    _need(self.head is None and self._is_instance_call(argument))

    def _binds_locally_assigned(self, function: cst.FunctionDef, name: str) -> bool:
        return any(self._scope(n) is function and self._is_binding(n) for n in self._references(name))

    def _check_holds_outputs(self, name: cst.Name, where: cst.CSTNode) -> None:
        assignments = self._assignments(name.value, within=self._scope(where))
        _need(bool(assignments) and all(self._is_instance_call(_strip_shape_ops(a.value)) for a in assignments))

    def _is_criterion_first_argument(self, argument: cst.Arg, criterion: str) -> bool:
        """The output reaches the loss: F.binary_cross_entropy's input, or a helper's BCE parameter."""
        call = self.parent(argument)
        if not isinstance(call, cst.Call) or argument.keyword is not None or argument.star:
            return False
        if self.imports.resolve(call.func) in _FUNCTIONAL_BCE:
            return bool(call.args) and call.args[0] is argument
        helper = dotted_name(call.func)
        if helper in self.helpers:
            plain = [a for a in call.args if a.keyword is None]
            index = self.helpers[helper]
            return index < len(plain) and plain[index] is argument and not any(a.star for a in call.args)
        return False


class _SigmoidDropped(_Replace):
    """The planned replacements; the returned sigmoid becomes its argument as updated (nothing
    inside it is planned, but keep the updated node all the same)."""

    def __init__(self, replace, sigmoid_id: int) -> None:
        super().__init__(replace)
        self.sigmoid_id = sigmoid_id

    def on_leave(self, original_node, updated_node):
        if id(original_node) == self.sigmoid_id:
            return updated_node.args[0].value
        return super().on_leave(original_node, updated_node)

