"""Decide whether a callee builds a TF1 optimizer, a Keras optimizer, or neither.

Real code instantiates optimizers through more than a literal `tf.train.AdamOptimizer(...)`:
a name bound to a class (`opt_cls = A if f else B`), a dict of classes indexed by a flag,
`functools.partial(cls, ...)`, `getattr(tf.train, name)`, and classes the file defines itself
that subclass a TF optimizer (BERT's AdamWeightDecayOptimizer). `OptimizerClassifier` learns
those bindings once per module, then classifies any callee expression.
"""

from __future__ import annotations

from typing import Callable, Collection, Dict, Iterable, Optional

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.tf1.names import (
    TF1_OPTIMIZER_CLASS_FACTORIES,
    TF1_OPTIMIZER_CLASS_TABLES,
    TF1_OPTIMIZER_MODULES,
    TF1_WRAPPING_OPTIMIZERS,
    is_keras_optimizer,
    is_tf1_optimizer_class,
)

#: What a callee builds.
TF1 = "tf1"
KERAS = "keras"
MIXED = "mixed"  # some choices are TF1 optimizers, some Keras ones

Resolver = Callable[[cst.CSTNode], Optional[str]]

_PARTIAL = {"functools.partial"}
_TF1_OPTIMIZER_BASE = "tensorflow.train.Optimizer"


def _combine(kinds: Iterable[Optional[str]]) -> Optional[str]:
    found = {k for k in kinds if k is not None}
    if not found:
        return None
    if found == {TF1}:
        return TF1
    if found == {KERAS}:
        return KERAS
    return MIXED


def _wraps_another_optimizer(cls: cst.ClassDef) -> bool:
    """Does this class wrap another optimizer?

    It does when `__init__` takes one (`opt`, `optimizer`, `base_optimizer`), the way
    SyncReplicasOptimizer does, or when its methods hand the work to an optimizer it holds
    (`self._opt.compute_gradients(...)`, tensor2tensor's ConditionalOptimizer, which builds
    its inner optimizer itself). Wrapping it as well as its inner optimizer would scale the
    loss twice; the inner one is wrapped where it is built.
    """
    for statement in cls.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__":
            params = statement.params
            for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
                name = param.name.value.lower()
                if name in ("opt", "optimizer") or name.endswith(("_opt", "_optimizer")):
                    return True
    finder = _DelegationFinder()
    walk(cls.body, finder)
    return finder.delegates


class _DelegationFinder(cst.CSTVisitor):
    """Finds `self.<inner>.compute_gradients(...)` (or apply_gradients / minimize)."""

    _OPTIMIZER_METHODS = frozenset({"compute_gradients", "apply_gradients", "minimize"})

    def __init__(self) -> None:
        self.delegates = False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in self._OPTIMIZER_METHODS
            and isinstance(func.value, cst.Attribute)
            and isinstance(func.value.value, cst.Name)
            and func.value.value.value == "self"
        ):
            self.delegates = True


class _BindingCollector(cst.CSTVisitor):
    """Every `target = value`, parameter default and class definition, file-wide."""

    def __init__(self) -> None:
        self.assignments: list = []  # (target dotted name, value)
        self.classes: list = []  # ClassDef nodes
        self.functions: Dict[str, list] = {}  # name -> FunctionDef nodes
        self.calls: list = []

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            name = dotted_name(target.target)
            if name:
                self.assignments.append((name, node.value))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        name = dotted_name(node.target)
        if name and node.value is not None:
            self.assignments.append((name, node.value))

    def visit_Param(self, node: cst.Param) -> None:
        if node.default is not None:
            self.assignments.append((node.name.value, node.default))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.setdefault(node.name.value, []).append(node)

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def bind_call_arguments(self) -> None:
        """`build(tf.train.AdamOptimizer)` binds the class to `build`'s parameter, file-wide, and
        `Net(tf.train.AdamOptimizer)` to the parameter of `Net.__init__` (MorvanZhou's tutorial)."""
        for call in self.calls:
            func = call.func
            name = func.value if isinstance(func, cst.Name) else (
                func.attr.value if isinstance(func, cst.Attribute) else None
            )
            constructors = [
                (definition, True) for cls in self.classes if cls.name.value == name
                for definition in cls.body.body
                if isinstance(definition, cst.FunctionDef) and definition.name.value == "__init__"
            ]
            for definition, is_constructor in [*((d, False) for d in self.functions.get(name or "", ())), *constructors]:
                params = [p.name.value for p in definition.params.params]
                if (is_constructor or isinstance(func, cst.Attribute)) and params[:1] in (["self"], ["cls"]):
                    params = params[1:]  # a method called on its instance or class; `Net(opt)` binds __init__'s
                by_name = params + [p.name.value for p in definition.params.kwonly_params]
                positional = [a for a in call.args if a.keyword is None and not a.star]
                for param, arg in zip(params, positional):
                    self.assignments.append((param, arg.value))
                for arg in call.args:
                    if arg.keyword is not None and arg.keyword.value in by_name:
                        self.assignments.append((arg.keyword.value, arg.value))


class OptimizerClassifier:
    """Classifies callees of one module as TF1 optimizer classes, Keras ones, or neither."""

    def __init__(self, module: cst.Module, resolve: Resolver, project_classes: Collection[str] = ()) -> None:
        self._resolve = resolve
        #: names this module calls that reach a TF1 optimizer class of another project module
        #: (`MpiAdamOptimizer`, from spinup.utils.mpi_tf)
        self.project_classes = frozenset(project_classes)
        #: dotted local name -> kind, for names bound to optimizer classes (or dicts of them)
        self.class_names: Dict[str, str] = {}
        #: classes this file defines that subclass a TF1 optimizer
        self.local_optimizer_classes: Dict[str, cst.ClassDef] = {}
        collector = _BindingCollector()
        walk(module, collector)
        collector.bind_call_arguments()
        #: names of every function or method the file defines
        self.defined_functions = set(collector.functions)
        #: names of every class the file defines
        self.defined_classes = {cls.name.value for cls in collector.classes}
        self._learn(collector)

    def _learn(self, collector: _BindingCollector) -> None:
        # Fixpoint: a subclass of a subclass, or a name bound to a name bound to a class.
        changed = True
        rounds = 0
        # computed once per class: it walks the class body
        wrappers = {id(cls) for cls in collector.classes if _wraps_another_optimizer(cls)}
        while changed and rounds < 10:
            changed = False
            rounds += 1
            for cls in collector.classes:
                if cls.name.value in self.local_optimizer_classes:
                    continue
                if id(cls) in wrappers:
                    continue  # e.g. a gradient-accumulation wrapper: its inner one is wrapped
                if any(self._is_tf1_base(base.value) for base in cls.bases if base.keyword is None):
                    self.local_optimizer_classes[cls.name.value] = cls
                    changed = True
            for name, value in collector.assignments:
                kind = self.class_kind(value)
                if kind is not None and self.class_names.get(name) != kind:
                    # A name bound to different kinds in different places is "mixed".
                    previous = self.class_names.get(name)
                    self.class_names[name] = _combine([previous, kind])
                    changed = changed or self.class_names[name] != previous

    def _is_tf1_base(self, base: cst.BaseExpression) -> bool:
        resolved = self._resolve(base)
        if resolved == _TF1_OPTIMIZER_BASE or is_tf1_optimizer_class(resolved):
            return True
        name = dotted_name(base)
        return name is not None and name in self.local_optimizer_classes

    def class_kind(self, node: cst.BaseExpression) -> Optional[str]:
        """The kind of optimizer CLASS this expression evaluates to, or None."""
        if isinstance(node, (cst.Name, cst.Attribute)):
            resolved = self._resolve(node)
            if is_tf1_optimizer_class(resolved) or resolved in TF1_OPTIMIZER_CLASS_TABLES:
                return TF1
            if resolved in TF1_WRAPPING_OPTIMIZERS:
                return None
            if is_keras_optimizer(resolved) and resolved.rsplit(".", 1)[-1][:1].isupper():
                return KERAS
            name = dotted_name(node)
            if name in self.local_optimizer_classes or name in self.project_classes:
                return TF1
            return self.class_names.get(name) if name else None
        if isinstance(node, cst.BooleanOperation):
            # `optimizer_cls or tf.train.AdamOptimizer`
            return _combine([self.class_kind(node.left), self.class_kind(node.right)])
        if isinstance(node, cst.IfExp):
            return _combine([self.class_kind(node.body), self.class_kind(node.orelse)])
        if isinstance(node, (cst.Dict,)):
            return _combine(
                self.class_kind(element.value)
                for element in node.elements
                if isinstance(element, cst.DictElement)
            )
        if isinstance(node, cst.Subscript):
            return self.class_kind(node.value)
        if isinstance(node, cst.Call):
            return self._call_class_kind(node)
        return None

    def _call_class_kind(self, node: cst.Call) -> Optional[str]:
        resolved = self._resolve(node.func)
        if resolved in _PARTIAL and node.args:
            return self.class_kind(node.args[0].value)
        if resolved in TF1_OPTIMIZER_CLASS_FACTORIES:
            return TF1
        if isinstance(node.func, cst.Name) and node.func.value == "getattr" and node.args:
            module = self._resolve(node.args[0].value)
            if module in TF1_OPTIMIZER_MODULES:
                return TF1
            if module is not None and is_keras_optimizer(module + "."):
                return KERAS
            return None
        # `OPTIMIZERS.get(name)` on a dict of classes.
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "get":
            return self.class_kind(node.func.value)
        return None

    def instance_kind(self, call: cst.Call) -> Optional[str]:
        """The kind of optimizer a call INSTANTIATES (`X(...)` where X is an optimizer class)."""
        func = call.func
        resolved = self._resolve(func)
        if isinstance(func, (cst.Name, cst.Attribute)) and is_keras_optimizer(resolved):
            # `tf.keras.optimizers.Adam(...)`, also `tf.keras.optimizers.get("adam")`.
            return KERAS
        return self.class_kind(func)
