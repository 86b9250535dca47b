"""`optimize_loss(..., optimizer="Adam")` spelled as the optimizer it names, so it can be wrapped.

Also `optimizer=tf.train.AdamOptimizer`, a class, which optimize_loss builds the same way
(`optimizer(learning_rate=lr)`).

`tf.contrib.layers.optimize_loss` builds the optimizer a string names inside TensorFlow
(`OPTIMIZER_CLS_NAMES[optimizer](learning_rate=lr)`, lr its learning-rate tensor after any
`learning_rate_decay_fn`), where no wrapper can reach it. A callable is called the same way
(`opt = optimizer(lr)` when a learning rate is given), so `optimizer="Adam"` becomes
`optimizer=lambda lr: tf.train.AdamOptimizer(learning_rate=lr)`: the same optimizer built from
the same tensor, now a construction in the file, which the graph rewrite wraps like any other.
optimize_loss then computes the gradients with the wrapper's compute_gradients (the loss scaled,
the gradients unscaled before its clipping and summaries) and applies them with its
apply_gradients (a step skipped on overflow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.tf1.names import is_tf1_optimizer_class, normalise_tf_name

#: optimize_loss's OPTIMIZER_CLS_NAMES (tensorflow/contrib/layers/python/layers/optimizers.py):
#: the construction each name stands for, given the learning rate `lr`
_NAMED_OPTIMIZERS: Dict[str, str] = {
    "Adagrad": "{tf}.train.AdagradOptimizer(learning_rate=lr)",
    "Adam": "{tf}.train.AdamOptimizer(learning_rate=lr)",
    "Ftrl": "{tf}.train.FtrlOptimizer(learning_rate=lr)",
    "Momentum": "{tf}.train.MomentumOptimizer(lr, momentum=0.9)",
    "RMSProp": "{tf}.train.RMSPropOptimizer(learning_rate=lr)",
    "SGD": "{tf}.train.GradientDescentOptimizer(learning_rate=lr)",
}

_OPTIMIZE_LOSS = "tensorflow.contrib.layers.optimize_loss"
#: optimize_loss(loss, global_step, learning_rate, optimizer, ...)
_LEARNING_RATE_POSITION, _OPTIMIZER_POSITION = 2, 3


@dataclass(frozen=True)
class NamedOptimizer:
    """One `optimizer="Adam"` argument and the callable that builds the same optimizer."""

    argument: cst.Arg
    #: as written: `"Adam"`, `tf.train.AdamOptimizer`
    name: str
    replacement: str


def named_optimizers(module: cst.Module, imports: ImportMap) -> List[NamedOptimizer]:
    """The optimize_loss calls of the module that name their optimizer by a string of
    OPTIMIZER_CLS_NAMES and pass a learning rate (without one, optimize_loss calls a callable
    with no argument); none when no import binds TensorFlow's TF1 API to a name."""
    spelling = _tensorflow_spelling(imports)
    if spelling is None or b"optimize_loss" not in module.code.encode("utf-8", "replace"):
        return []
    found: List[NamedOptimizer] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if normalise_tf_name(imports.resolve(node.func)) != _OPTIMIZE_LOSS:
                return
            optimizer = _argument(node, "optimizer", _OPTIMIZER_POSITION)
            learning_rate = _argument(node, "learning_rate", _LEARNING_RATE_POSITION)
            if optimizer is None or learning_rate is None:
                return
            if isinstance(learning_rate.value, cst.Name) and learning_rate.value.value == "None":
                return
            if is_tf1_optimizer_class(normalise_tf_name(imports.resolve(optimizer.value))):
                # a class: optimize_loss builds `optimizer(learning_rate=lr)`
                shown = cst.Module([]).code_for_node(optimizer.value)
                found.append(NamedOptimizer(optimizer, shown, f"lambda lr: {shown}(learning_rate=lr)"))
                return
            if not isinstance(optimizer.value, cst.SimpleString):
                return
            name = optimizer.value.evaluated_value
            template = _NAMED_OPTIMIZERS.get(name) if isinstance(name, str) else None
            if template is not None:
                found.append(NamedOptimizer(optimizer, f'"{name}"', "lambda lr: " + template.format(tf=spelling)))

    walk(module, _Calls())
    return found


def spelled_out(module: cst.Module, found: List[NamedOptimizer]) -> cst.Module:
    """The module with each named optimizer replaced by its callable."""
    replacements = {id(item.argument): cst.parse_expression(item.replacement) for item in found}

    class _Replace(cst.CSTTransformer):
        def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
            replacement = replacements.get(id(original_node))
            return updated_node if replacement is None else updated_node.with_changes(value=replacement)

    return module.visit(_Replace())


def _argument(call: cst.Call, keyword: str, position: int) -> Optional[cst.Arg]:
    for index, arg in enumerate(call.args):
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
        if arg.keyword is None and not arg.star and index == position:
            return arg
    return None


def _tensorflow_spelling(imports: ImportMap) -> Optional[str]:
    """The local name bound to TensorFlow's TF1 API (`tf` for `import tensorflow as tf` or
    `import tensorflow.compat.v1 as tf`), None when there is none."""
    for local, qualified in sorted(imports.aliases.items()):
        if "." not in local and normalise_tf_name(qualified) == "tensorflow":
            return local
    return None
