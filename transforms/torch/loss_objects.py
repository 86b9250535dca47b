"""Loss objects with a backward() of their own, on the native backend.

pytorch-seq2seq's `Loss` accumulates a loss tensor in `eval_batch()` and backpropagates it in a
method of its own, so the step never holds the tensor:

    loss.reset()
    for step, step_output in enumerate(decoder_outputs):
        loss.eval_batch(step_output, target[:, step + 1])
    loss.backward()                          # Loss.backward(): self.acc_loss.backward()
    optimizer.step()

The conversion puts the forward pass and the calls that fill the object under autocast, passes
the step's GradScaler to the object's backward(), and has the class's backward() (in its own
module: one change set with the step) scale the tensor it backpropagates when given one:

    def backward(self, scaler=None):
        (scaler.scale(self.acc_loss) if scaler is not None else self.acc_loss).backward()

`scaler=None` keeps the float32 behaviour for every caller that passes none. On apex the class's
backward() takes the optimizer amp.scale_loss needs (one loss per step, `amp.initialize` where the
step's optimizer is built, as for any apex step):

    def backward(self, amp_optimizer=None):
        if amp_optimizer is not None:
            from apex import amp
            with amp.scale_loss(self.acc_loss, amp_optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            self.acc_loss.backward()

and the step calls `loss.backward(amp_optimizer=optimizer)`. The object is
recognised only when the step calls, last before its backward(), a method that the loss class (or a
subclass of it) defines and a tensor does not (`eval_batch`, not `add_`; a model class's `forward()`
when the model has the backward() of its own), and the autocast region ends there: a name that may
hold a plain tensor is never rewritten this way. The class must be the only one with such a backward() that defines the
method, and no subclass may override backward() (it would not take the scaler).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.training_loop import BackwardCall, Block, TrainingStructure

#: methods of torch.Tensor a step may call on a loss tensor before backward(): a name filled
#: through one of these may be a tensor, not a loss object
TENSOR_METHODS = frozenset({
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "sum", "mean", "item", "to", "cuda", "cpu",
    "detach", "detach_", "backward", "register_hook", "retain_grad", "requires_grad_", "float", "half",
    "double", "view", "reshape", "squeeze", "unsqueeze", "clamp", "clamp_", "copy_", "zero_", "fill_",
    "masked_fill", "masked_fill_", "index_add_", "scatter_add_", "append", "extend",
})


#: methods that compute nothing the backward() reads: the region need not reach them
_NOT_COMPUTING = frozenset({"zero_grad", "train", "eval", "reset", "state_dict", "parameters"})


@dataclass
class LossObjectUse:
    """One `<loss>.backward()` on an instance of a project loss class with its own backward()."""

    backward: BackwardCall
    receiver: str
    #: the method that fills it (`eval_batch`), and the last statement before the backward() that
    #: calls it, in `block` at `index`
    method: str
    block: Block
    index: int
    #: the class whose backward() runs the real one: its module's key, "loss/loss.py:78", its
    #: name, and the tensor it backpropagates ("self.acc_loss")
    key: str
    where: str
    class_name: str
    inner: str

    @property
    def display(self) -> str:
        return self.where.rsplit(":", 1)[0]


def loss_receiver(backward: BackwardCall) -> str:
    """`loss` of `loss.backward()`, `self.loss` of `self.loss.backward()` (no arguments); empty
    for anything else."""
    func = backward.call.func
    if backward.call.args or not isinstance(func, cst.Attribute):
        return ""
    if isinstance(func.value, cst.Name):
        return func.value.value
    value = func.value
    if isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name) and value.value.value == "self":
        return f"self.{value.attr.value}"
    return ""


def _filling_method(statement: cst.CSTNode, receiver: str) -> Optional[str]:
    """`eval_batch` when the statement calls `<receiver>.eval_batch(...)` (last one wins): a method
    that may compute what the object's backward() backpropagates (`model.forward()` of a model
    class with a backward() of its own counts too: the region must reach it)."""
    found = None
    for call in statements.calls_within(statement):
        func = call.func
        if (isinstance(func, cst.Attribute) and dotted_name(func.value) == receiver
                and func.attr.value not in TENSOR_METHODS and func.attr.value not in _NOT_COMPUTING):
            found = func.attr.value
    return found


def filling_statement(structure: TrainingStructure, backward: BackwardCall, receiver: str,
                      stop: Block) -> Optional[Tuple[Block, int, str]]:
    """(block, index, method) of the last statement before `<receiver>.backward()` (in its block or
    an enclosing one, up to `stop`) that calls a method of the object that may fill it; None when
    no statement does."""
    for block, statement in structure.block_path(backward.call, stop=stop):
        body = list(block.body)
        index = next(i for i, st in enumerate(body) if st is statement)
        for candidate in range(index - 1, -1, -1):
            if isinstance(body[candidate], (cst.FunctionDef, cst.ClassDef)):
                break
            if receiver in statements.assigned_names(body[candidate]):
                return None  # rebound before being filled: not followed
            method = _filling_method(body[candidate], receiver)
            if method is not None:
                return block, candidate, method
    return None


def find_loss_object(structure: TrainingStructure, project, backward: BackwardCall,
                     stop: Block) -> Union[None, str, LossObjectUse]:
    """The loss object `<loss>.backward()` is called on, when the step fills it through a method
    of a project loss class with its own backward(); the reason it cannot be converted when the
    class cannot be told (or a subclass overrides backward()); None when nothing says that the
    receiver is such an object."""
    receiver = loss_receiver(backward)
    ask = getattr(project, "loss_class_filled_by", None) or (lambda method: _in_this_module(structure, method))
    if not receiver:
        return None
    filled = filling_statement(structure, backward, receiver, stop)
    if filled is None:
        return None
    block, index, method = filled
    found = ask(method)
    if found is None:
        return None
    if isinstance(found, str):
        return found
    key, where, class_name, inner = found
    return LossObjectUse(backward, receiver, method, block, index, key, where, class_name, inner)


def loss_class_of_backward(structure: TrainingStructure, backward: BackwardCall) -> Optional[str]:
    """`Loss` when `backward` is the `self.acc_loss.backward()` in `Loss.backward()`, the method of a
    loss class that training code calls on its instances; None otherwise."""
    scope = backward.scope
    func = backward.call.func
    if not (isinstance(scope, cst.FunctionDef) and scope.name.value == "backward" and isinstance(func, cst.Attribute)):
        return None
    klass = structure.class_of(scope)
    receiver = func.value
    if _scaled(receiver, "scaler") and isinstance(receiver, cst.IfExp):
        receiver = receiver.orelse  # converted already: `(scaler.scale(self.acc_loss) if ... else self.acc_loss)`
    if (isinstance(receiver, cst.Name) and receiver.value == "scaled_loss"
            and AMP_OPTIMIZER in {p.name.value for p in statements.all_params(scope)}):
        # converted for apex already: `with amp.scale_loss(self.acc_loss, amp_optimizer) as scaled_loss:`
        scaled = [c for c in statements.calls_within(scope) if (dotted_name(c.func) or "").endswith(".scale_loss")]
        if len(scaled) == 1 and scaled[0].args:
            receiver = scaled[0].args[0].value
    if (klass is None or not isinstance(receiver, cst.Attribute) or not isinstance(receiver.value, cst.Name)
            or receiver.value.value != "self" or any(d for d in scope.decorators)):
        return None
    if any(dotted_name(call.func) == "self.backward" for call in statements.calls_within(klass)):
        return None  # the class runs it itself (`self.backward()` in optimize_parameters): not a loss object's
    return klass.name.value


@dataclass
class BackwardToScale:
    """A loss class's backward() method and the backward() call in it; `done` when it takes and
    uses a scaler already (written by an earlier change set of this run)."""

    method: cst.FunctionDef
    call: cst.Call
    done: bool = False


def _backward_method(module: cst.Module, class_name: str) -> Optional[cst.FunctionDef]:
    """`class_name.backward`, defined at module level, if any."""
    klass = next((st for st in module.body if isinstance(st, cst.ClassDef) and st.name.value == class_name), None)
    if klass is None or not isinstance(klass.body, cst.IndentedBlock):
        return None
    return next((st for st in klass.body.body if isinstance(st, cst.FunctionDef) and st.name.value == "backward"), None)


def backward_to_scale(module: cst.Module, class_name: str, scaler_name: str) -> Union[str, BackwardToScale]:
    """The class's backward() to edit, or the reason it cannot be edited."""
    method = _backward_method(module, class_name)
    if method is None:
        return f"{class_name}.backward() was not found again at module level"
    inner_calls = _inner_backwards(method)
    if len(inner_calls) != 1:
        return f"{class_name}.backward() calls backward() {len(inner_calls)} times"
    call = inner_calls[0]
    parameters = {p.name.value for p in statements.all_params(method)}
    if scaler_name in parameters:
        if _scaled(call.func.value, scaler_name):  # type: ignore[union-attr]
            return BackwardToScale(method, call, done=True)
        return f"{class_name}.backward() has a parameter named `{scaler_name}` already"
    if method.params.star_kwarg is not None or method.decorators:
        return f"{class_name}.backward() cannot take a `{scaler_name}` parameter (**kwargs, or decorated)"
    return BackwardToScale(method, call)


def write_scaled_backward(edits, method: cst.FunctionDef, call: cst.Call, scaler_name: str) -> None:
    """`def backward(self, scaler=None)` backpropagating `(scaler.scale(x) if scaler is not None else x)`."""
    plain = statements.code_of(call.func.value)  # type: ignore[union-attr]
    scaled = cst.parse_expression(f"({scaler_name}.scale({plain}) if {scaler_name} is not None else {plain})")
    edits.add_parameter(method, scaler_name, default="None")
    edits.replace_call(call, call.with_changes(func=call.func.with_changes(value=scaled)))  # type: ignore[union-attr]


def _in_this_module(structure: TrainingStructure, method: str) -> Union[None, str, Tuple[str, str, str, str]]:
    """loss_class_filled_by for a source with no project (a notebook, a string): its own classes,
    key "" for this module."""
    from ampify.repository import loss_classes_defining, module_loss_classes

    try:
        tree = ast.parse(structure.module.code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    shapes, owners = module_loss_classes(tree)
    found = loss_classes_defining(shapes, owners, method, lambda _path, line: f"line {line}" if line else "this file")
    if found is None or isinstance(found, str):
        return found
    _path, name, line, inner = found
    return "", f"line {line}", name, inner


def is_this_module(project, key: str) -> bool:
    """Is the loss class's module (its key) the one being converted?"""
    return key == "" or (project is not None and project.is_this_module(key))


def scale_loss_object_backward(source: bytes, class_name: str, scaler_name: str
                               ) -> Union[Tuple[Optional[bytes], int], str]:
    """The class's backward() gets `scaler=None` and backpropagates `scaler.scale(<inner>)` when
    given one. Returns (new source, line of its inner backward()), (None, line) when it takes and
    uses a scaler already (another training file's change set of this run wrote it), or the reason
    it cannot be done."""
    from ampify.transforms.torch.edits import StatementEdits, apply_edits

    try:
        module = cst.parse_module(source)
    except Exception as error:  # the other module does not parse
        return f"it does not parse ({type(error).__name__})"
    found = backward_to_scale(module, class_name, scaler_name)
    if isinstance(found, str):
        return found
    line = _line_of(module, found.call)
    if found.done:
        return None, line
    edits = StatementEdits()
    write_scaled_backward(edits, found.method, found.call, scaler_name)
    return apply_edits(module, edits).bytes, line


#: the parameter an apex-converted loss class's backward() takes (the step's optimizer)
AMP_OPTIMIZER = "amp_optimizer"


def scale_loss_object_backward_apex(source: bytes, class_name: str) -> Union[Tuple[Optional[bytes], int], str]:
    """apex: the class's backward() gets `amp_optimizer=None` and backpropagates its tensor under
    `amp.scale_loss(<inner>, amp_optimizer)` when given one. (new source, line), (None, line) when
    written already, or the reason it cannot be done."""
    from ampify.transforms.torch.edits import StatementEdits, apply_edits

    try:
        module = cst.parse_module(source)
    except Exception as error:  # the other module does not parse
        return f"it does not parse ({type(error).__name__})"
    edits = StatementEdits()
    found = plan_apex_backward(module, class_name, edits)
    if isinstance(found, str):
        return found
    done, call = found
    line = _line_of(module, call)
    if done:
        return None, line
    return apply_edits(module, edits).bytes, line


def plan_apex_backward(module: cst.Module, class_name: str, edits, amp: Optional[str] = None
                       ) -> Union[str, Tuple[bool, cst.Call]]:
    """Plan the apex edit of the class's backward() into `edits` (see the module's docstring):
    (done already, its inner backward() call), or the reason it cannot be done. `amp`: the name
    the module imports apex's amp as (the class is in the file being converted); None: the
    method imports it itself."""
    method = _backward_method(module, class_name)
    if method is None:
        return f"{class_name}.backward() was not found again at module level"
    inner_calls = _inner_backwards(method)
    parameters = {p.name.value for p in statements.all_params(method)}
    if AMP_OPTIMIZER in parameters:
        scaled = [c for c in statements.calls_within(method) if (dotted_name(c.func) or "").endswith(".scale_loss")]
        if len(scaled) == 1 and len(inner_calls) == 2:
            return True, scaled[0]
        return f"{class_name}.backward() has a parameter named `{AMP_OPTIMIZER}` already"
    if len(inner_calls) != 1:
        return f"{class_name}.backward() calls backward() {len(inner_calls)} times"
    call = inner_calls[0]
    if call.args:
        return f"{class_name}.backward() passes arguments to the backward() it runs"
    if method.params.star_kwarg is not None or method.decorators:
        return f"{class_name}.backward() cannot take an `{AMP_OPTIMIZER}` parameter (**kwargs, or decorated)"
    taken = {amp or "amp", "scaled_loss"} & statements.used_names(method)
    if taken:
        return f"{class_name}.backward() uses the name `{sorted(taken)[0]}` already"
    statement = _lone_statement(method, call)
    if statement is None:
        return f"the backward() in {class_name}.backward() is not a statement of its own"
    inner = statements.code_of(call.func.value)  # type: ignore[union-attr]
    edits.add_parameter(method, AMP_OPTIMIZER, default="None")
    edits.insert_before(statement, (
        f"if {AMP_OPTIMIZER} is not None:\n"
        + ("    from apex import amp\n" if amp is None else "")
        + f"    with {amp or 'amp'}.scale_loss({inner}, {AMP_OPTIMIZER}) as scaled_loss:\n"
        f"        scaled_loss.backward()\n"
        f"else:\n"
        f"    {inner}.backward()"))
    edits.remove_statement(statement)
    return False, call


def _lone_statement(method: cst.FunctionDef, call: cst.Call) -> Optional[cst.SimpleStatementLine]:
    """The statement line that is exactly `call` (`self.acc_loss.backward()`), anywhere in the method."""
    for line in statements.nodes_of_type(method, cst.SimpleStatementLine):
        if len(line.body) == 1 and isinstance(line.body[0], cst.Expr) and line.body[0].value is call:
            return line
    return None


def _inner_backwards(method: cst.FunctionDef) -> List[cst.Call]:
    found: List[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
                found.append(node)

    method.body.visit(_Calls())
    return found


def _scaled(receiver: cst.BaseExpression, scaler_name: str) -> bool:
    """`(scaler.scale(self.acc_loss) if scaler is not None else self.acc_loss)` (written by ampify)."""
    value = receiver
    return (isinstance(value, cst.IfExp) and isinstance(value.body, cst.Call)
            and dotted_name(value.body.func) == f"{scaler_name}.scale"
            and statements.code_of(value.test) == f"{scaler_name} is not None")


def _line_of(module: cst.Module, node: cst.CSTNode) -> int:
    from libcst.metadata import MetadataWrapper, PositionProvider

    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    return wrapper.resolve(PositionProvider)[node].start.line
