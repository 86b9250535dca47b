"""Optimizer wrapper classes of a project, read from their source (part of the repository model).

Transformer repositories step their optimizer through a class of their own that schedules the
learning rate (attention-is-all-you-need's and BERT-pytorch's `ScheduledOptim`, Noam schedules,
seq2seq's `Optimizer` that clips before it steps):

    class ScheduledOptim():
        def __init__(self, optimizer, lr_mul, d_model, n_warmup_steps):
            self._optimizer = optimizer
            ...
        def step_and_update_lr(self):
            self._update_learning_rate()
            self._optimizer.step()

A wrapper here is a module-level class that is not itself an optimizer (no `...Optimizer` base)
and keeps a constructor argument in an attribute (`self._optimizer = optimizer`), or an optimizer
it builds (BiSeNet's `self.optim = torch.optim.SGD(...)`); its stepping
methods are those that call `self.<that attribute>.step()` exactly once, as a statement of their
own, and run no backward(). A training step that calls one is converted through it
(transforms/torch/wrapper_steps.py).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import FrozenSet, List, Optional

from ampify.legacy_syntax import parsed_tree

#: a file can hold a wrapper only if it calls `self.<attribute>.step()`
_MARKER = re.compile(rb"self\.\w+\.step\(\)")


@dataclass(frozen=True)
class WrapperStep:
    """One stepping method of a wrapper class."""

    path: Path
    klass: str
    method: str
    line: int
    #: the attribute holding the real optimizer (`_optimizer`)
    inner: str
    #: the method reads or clips gradients before it steps (seq2seq's max_grad_norm): they must
    #: be unscaled first
    reads_gradients: bool
    #: why the method cannot take a GradScaler (a `scaler` parameter already, `**kwargs`...), or None
    obstacle: Optional[str] = None
    #: it takes `scaler=None` and steps through it already (ampify converted it before)
    takes_scaler: bool = False
    #: the names an instance of the class answers to: its methods and the attributes it sets on
    #: self (seq2seq's Optimizer: update, set_scheduler, optimizer, scheduler, max_grad_norm...)
    members: FrozenSet[str] = frozenset()


def wrapper_steps(path: Path, data: bytes) -> List[WrapperStep]:
    """The stepping methods of the wrapper classes defined at the top level of a module."""
    if b".step()" not in data or _MARKER.search(data) is None:
        return []
    try:
        tree = parsed_tree(data, filename=str(path))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: List[WrapperStep] = []
    for klass in tree.body:
        if not isinstance(klass, ast.ClassDef) or any("Optimizer" in _dotted(base) for base in klass.bases):
            continue
        methods = [node for node in klass.body if isinstance(node, ast.FunctionDef)]
        init = next((m for m in methods if m.name == "__init__"), None)
        if init is None:
            continue
        inner = _attributes_from_arguments(init, any(_calls_backward(m) for m in methods))
        members = _members(klass)
        for method in methods:
            if method.name.startswith("__") or _calls_backward(method):
                continue
            steps = [call for call in ast.walk(method) if _is_inner_step(call, inner)]
            if len(steps) != 1:
                continue
            attribute = steps[0].func.value.attr
            statement_of_its_own = any(
                isinstance(node, ast.Expr) and node.value is steps[0] for node in ast.walk(method))
            takes_scaler = _takes_scaler(method, attribute)
            found.append(WrapperStep(
                path, klass.name, method.name, method.lineno, attribute, _reads_gradients(method),
                None if takes_scaler else _obstacle(method, statement_of_its_own), takes_scaler, members))
    return found


def _members(klass: ast.ClassDef) -> FrozenSet[str]:
    """The class's methods, class attributes and the attributes its methods set on self."""
    found = set()
    for node in klass.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(klass):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                found.add(target.attr)
    return frozenset(found)


#: torch.optim's optimizer classes, by name: a wrapper may build its optimizer itself
_TORCH_OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "ASGD", "LBFGS",
                               "NAdam", "RAdam", "SparseAdam", "Rprop"})


def _attributes_from_arguments(init: ast.FunctionDef, trains: bool = False) -> set:
    """The attributes the constructor sets to one of its arguments (`self._optimizer = optimizer`),
    or to an optimizer it builds itself (BiSeNet's `self.optim = torch.optim.SGD(param_list, ...)`),
    unless the class `trains` (a method runs backward(): DARTS' Architect, an RL agent, is a
    trainer holding its optimizer, not a wrapper)."""
    arguments = {a.arg for a in [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs][1:]}
    attributes = set()
    for node in ast.walk(init):
        if not isinstance(node, ast.Assign):
            continue
        handed = isinstance(node.value, ast.Name) and node.value.id in arguments
        built = not trains and isinstance(node.value, ast.Call) and \
            _dotted(node.value.func).rsplit(".", 1)[-1] in _TORCH_OPTIMIZERS
        if handed or built:
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    attributes.add(target.attr)
    return attributes


def _is_inner_step(node: ast.AST, inner: set) -> bool:
    return (isinstance(node, ast.Call) and not node.args and not node.keywords
            and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in inner
            and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "self")


def _calls_backward(method: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
               for n in ast.walk(method))


def _reads_gradients(method: ast.FunctionDef) -> bool:
    for node in ast.walk(method):
        if isinstance(node, ast.Attribute) and node.attr == "grad":
            return True
        if isinstance(node, ast.Call) and "clip_grad" in _dotted(node.func):
            return True
    return False


def _takes_scaler(method: ast.FunctionDef, inner: str) -> bool:
    """`def step(self, scaler=None)` that calls `scaler.step(self.<inner>)`: converted already."""
    arguments = method.args
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(arguments.defaults):], arguments.defaults))
    defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
    default = defaults.get("scaler")
    if not (isinstance(default, ast.Constant) and default.value is None):
        return False
    return any(isinstance(node, ast.Call) and _dotted(node.func) == "scaler.step" and len(node.args) == 1
               and _dotted(node.args[0]) == f"self.{inner}" for node in ast.walk(method))


def _obstacle(method: ast.FunctionDef, statement_of_its_own: bool) -> Optional[str]:
    arguments = method.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    if "scaler" in names:
        return "it already has a parameter named scaler"
    if arguments.vararg is not None or arguments.kwarg is not None:
        return "it takes *args or **kwargs"
    if not statement_of_its_own:
        return "its inner step() is part of a larger expression"
    if any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in method.decorator_list):
        return "it is not a plain method"
    return None


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""
