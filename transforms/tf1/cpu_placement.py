"""A graph pinned to the CPU: the graph rewrite converts GPU ops only.

TensorFlow's auto_mixed_precision pass processes a node only when it is placed on a GPU
(`IsOnGPU` in grappler/optimizers/auto_mixed_precision.cc; other nodes are logged as "not on the
GPU"). A TF1 script that builds its whole training graph under `with tf.device("/cpu:0"):` (the
A3C implementations: awjuliani's DeepRL-Agents, MorvanZhou's A3C, where the workers are threads
sharing the CPU) gets its optimizer wrapped and its loss scaled, and every op still runs in
float32. This module tells that shape from the common ones that only pin part of the graph:

- every `tf.device(...)` of the file names a CPU by a string literal (a GPU anywhere, or a device
  that is not a literal, such as `'/gpu:%d' % i` towers, means the graph uses the GPU);
- every optimizer the rewrite wraps is built inside such a block;
- every call that builds the training ops from it (`minimize`, `compute_gradients`,
  `apply_gradients`, `tf.gradients`) is inside such a block, or inside a function or class, which
  the block calls (A3C's workers build their networks in `__init__`); one at module level outside
  the block places its ops by default, on the GPU when there is one.
"""

from __future__ import annotations

from typing import Callable, Collection, List, Optional

import libcst as cst

#: the dotted names `tf.device` resolves to
_DEVICE_SCOPES = frozenset({"tensorflow.device", "tensorflow.compat.v1.device"})
#: methods and functions that build the training ops
_TRAINING_CALLS = frozenset({"minimize", "compute_gradients", "apply_gradients"})
_GRADIENTS = frozenset({"tensorflow.gradients", "tensorflow.compat.v1.gradients"})


def cpu_pinned_graph(module: cst.Module, resolve: Callable[[cst.CSTNode], Optional[str]],
                     wrapped: Collection[int]) -> Optional[cst.Call]:
    """The `tf.device("/cpu:0")` call the training graph is built under, when the whole graph is
    pinned to the CPU (see the module docstring); None otherwise. `wrapped`: ids of the optimizer
    construction calls the rewrite wraps."""
    finder = _Placement(resolve)
    module.visit(finder)
    if finder.elsewhere or not finder.cpu_scopes or not wrapped:
        return None
    if not all(finder.in_cpu_scope.get(call_id, False) for call_id in wrapped):
        return None
    if finder.training_outside:
        return None
    return finder.cpu_scopes[0]


#: device functions whose ops go to a `worker_device`
_REPLICA_SETTERS = frozenset({"tensorflow.train.replica_device_setter", "tensorflow.compat.v1.train.replica_device_setter"})


def _constant_text(value: Optional[cst.BaseExpression]) -> Optional[str]:
    """The constant text of a device string: a literal, `"...".format(...)`, `"..." % x`, an f-string."""
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value if isinstance(value.evaluated_value, str) else None
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "format":
        return _constant_text(value.func.value)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo):
        return _constant_text(value.left)
    if isinstance(value, cst.FormattedString):
        return "".join(part.value for part in value.parts if isinstance(part, cst.FormattedStringText))
    return None


class _Placement(cst.CSTVisitor):
    def __init__(self, resolve: Callable[[cst.CSTNode], Optional[str]]) -> None:
        self.resolve = resolve
        self.cpu_scopes: List[cst.Call] = []
        #: a device scope that may be a GPU (a GPU literal, or no literal at all)
        self.elsewhere = False
        #: a training call at module level outside every CPU scope
        self.training_outside = False
        #: id(call) -> whether it sits in a CPU scope
        self.in_cpu_scope: dict = {}
        self._cpu_depth = 0
        self._definitions = 0
        self._pinning: List[bool] = []
        self._with_items: set = set()
        #: names bound to a device string (None: bound otherwise, or to two devices)
        self._strings: dict = {}

    def _device_literal(self, call: cst.Call) -> Optional[str]:
        if self.resolve(call.func) not in _DEVICE_SCOPES:
            return None
        argument = call.args[0].value if call.args else None
        if isinstance(argument, cst.Call) and self.resolve(argument.func) in _REPLICA_SETTERS:
            # ops go to its worker_device (variables to the parameter servers): universe-starter-agent's
            # `replica_device_setter(1, worker_device="/job:worker/task:0/cpu:0")`
            worker = next((arg.value for arg in argument.args
                           if arg.keyword is not None and arg.keyword.value == "worker_device"), None)
            return self._template(worker) if worker is not None else ""
        return self._template(argument)

    def _template(self, value: Optional[cst.BaseExpression]) -> str:
        """The device a string names: a literal, a template formatted at run time (`"/job:worker/
        task:{}/cpu:0".format(task)`, `"/gpu:%d" % i`, an f-string: its constant text), or a name
        bound once in the file to one of those; "" when unknown (it may name a GPU)."""
        if isinstance(value, cst.Name):
            return self._strings.get(value.value) or ""
        text = _constant_text(value)
        return text if text is not None else ""

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                name = target.target.value
                text = _constant_text(node.value)
                # a name bound twice to different devices (or to anything else) is not followed
                self._strings[name] = text if name not in self._strings or self._strings[name] == text else None

    def visit_With(self, node: cst.With) -> None:
        pins = False
        for item in node.items:
            if isinstance(item.item, cst.Call):
                self._with_items.add(id(item.item))
                device = self._device_literal(item.item)
                if device is None:
                    continue
                if "cpu" in device.lower() and "gpu" not in device.lower():
                    self.cpu_scopes.append(item.item)
                    pins = True
                else:
                    self.elsewhere = True
        self._pinning.append(pins)
        self._cpu_depth += pins

    def leave_With(self, original_node: cst.With) -> None:
        self._cpu_depth -= self._pinning.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._definitions += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._definitions -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._definitions += 1

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._definitions -= 1

    def visit_Call(self, node: cst.Call) -> None:
        self.in_cpu_scope[id(node)] = self._cpu_depth > 0
        if self._device_literal(node) is not None:
            if id(node) not in self._with_items:
                self.elsewhere = True  # a device scope used otherwise than by `with`: not followed
            return
        if self._cpu_depth == 0 and self._definitions == 0 and (
                (isinstance(node.func, cst.Attribute) and node.func.attr.value in _TRAINING_CALLS)
                or self.resolve(node.func) in _GRADIENTS):
            self.training_outside = True
