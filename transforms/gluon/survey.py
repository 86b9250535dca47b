"""One walk over an MXNet module: what the Gluon AMP conversion needs to decide.

Whether the module already uses `mxnet.contrib.amp` or casts its network by hand, uses the
symbolic Module API or Horovod's trainer, where its Gluon Trainers are built (and under which
name), where its `autograd.record()` blocks, backward passes, trainer steps and gradient reads
are, and the parent of every node on the way (to place statements in the right suite).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name

AMP_MODULE = "mxnet.contrib.amp"
#: MXNet 2.0 moved AMP to `mxnet.amp`: a script using it is mixed precision already
AMP_MODULES = (AMP_MODULE, "mxnet.amp")
#: MXNet 2.0's numpy interface (`npx.set_np()`, `mx.np.ones`): not the MXNet 1.x API this target writes
MXNET2_MODULES = ("mxnet.np", "mxnet.npx", "mxnet.numpy", "mxnet.numpy_extension")
TRAINERS = ("mxnet.gluon.Trainer", "mxnet.gluon.trainer.Trainer")
HOROVOD_TRAINERS = ("horovod.mxnet.DistributedTrainer",)
MODULE_API = ("mxnet.mod.Module", "mxnet.module.Module", "mxnet.mod.BucketingModule",
              "mxnet.module.BucketingModule", "mxnet.module.module.Module")
RECORD = ("mxnet.autograd.record",)
BACKWARD = ("mxnet.autograd.backward",)
CLIP = ("mxnet.gluon.utils.clip_global_norm",)
#: methods of Parameters and ParameterDicts that read gradients
GRADIENT_READS = frozenset({"grad", "list_grad"})
#: trainer methods that apply the gradients (`update` after a manual `allreduce_grads`)
TRAINER_STEPS = frozenset({"step", "update"})


@dataclass
class TrainerBuild:
    call: cst.Call
    #: `trainer`, `self.trainer`; None when the Trainer is not assigned to one name
    name: Optional[str]
    statement: Optional[cst.SimpleStatementLine]


@dataclass
class Backward:
    """`loss.backward()` or `autograd.backward(loss)`, as a whole statement."""

    call: cst.Call
    #: its line (a SimpleStatementSuite when written on its compound statement's line)
    statement: Optional[Union[cst.SimpleStatementLine, cst.SimpleStatementSuite]]
    #: the loss expression: the receiver, or autograd.backward's first argument
    loss: Optional[cst.BaseExpression]
    #: `autograd.backward(...)` (else a method call)
    functional: bool
    #: why this backward cannot be scaled as it is written; "" when it can
    problem: str = ""


@dataclass
class GluonSurvey:
    #: (what, node) of `mxnet.contrib.amp` already used
    amp_use: Optional[Tuple[str, cst.CSTNode]] = None
    #: (what, node) of MXNet 2.0's numpy interface
    mxnet2: Optional[Tuple[str, cst.CSTNode]] = None
    #: `net.cast(...)` to a reduced precision: the network is cast by hand
    hand_cast: Optional[cst.Call] = None
    module_api: Optional[cst.Call] = None
    horovod_trainer: Optional[cst.Call] = None
    trainers: List[TrainerBuild] = field(default_factory=list)
    record_blocks: List[cst.With] = field(default_factory=list)
    backwards: List[Backward] = field(default_factory=list)
    #: (receiver's dotted name, call) of every `x.step(...)` / `x.update(...)`
    steps: List[Tuple[str, cst.Call]] = field(default_factory=list)
    gradient_reads: List[cst.Call] = field(default_factory=list)
    #: node -> parent, for every node walked
    parents: Dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)

    def is_training(self) -> bool:
        """A Gluon Trainer is built here, or a backward pass is followed by what looks like a trainer's
        step (`trainer.step(...)`, `self.trainer.update(...)`). Backward passes alone are gradient
        checks (tests), not a training step."""
        trainer_like = any("trainer" in receiver.rsplit(".", 1)[-1].lower() for receiver, _ in self.steps)
        return bool(self.trainers or (self.backwards and trainer_like))


_REDUCED = ("float16", "bfloat16", "half")


class _Walker(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.survey = GluonSurvey()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._note_amp(node)

    def visit_Name(self, node: cst.Name) -> None:
        self._note_amp(node)

    def _note_amp(self, node: cst.CSTNode) -> None:
        if self.survey.amp_use is not None and self.survey.mxnet2 is not None:
            return
        qualified = self.imports.resolve(node)
        if not qualified:
            return
        if self.survey.amp_use is None and any(qualified == m or qualified.startswith(m + ".") for m in AMP_MODULES):
            self.survey.amp_use = (qualified, node)
        if self.survey.mxnet2 is None and any(qualified == m or qualified.startswith(m + ".") for m in MXNET2_MODULES):
            self.survey.mxnet2 = (qualified, node)

    def visit_With(self, node: cst.With) -> None:
        if any(isinstance(item.item, cst.Call) and self.imports.resolve(item.item.func) in RECORD
               for item in node.items):
            self.survey.record_blocks.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.imports.resolve(node.func)
        survey = self.survey
        if qualified in TRAINERS:
            survey.trainers.append(TrainerBuild(node, None, None))
        elif qualified in HOROVOD_TRAINERS:
            survey.horovod_trainer = survey.horovod_trainer or node
        elif qualified in MODULE_API:
            survey.module_api = survey.module_api or node
        elif qualified in CLIP:
            survey.gradient_reads.append(node)
        elif qualified in BACKWARD:
            survey.backwards.append(Backward(node, None, node.args[0].value if node.args else None, True))
        if qualified is not None or not isinstance(node.func, cst.Attribute):
            if isinstance(node.func, cst.Name) and node.func.value == "clip_global_norm":
                survey.gradient_reads.append(node)
            return
        method = node.func.attr.value
        if method == "backward":
            survey.backwards.append(Backward(node, None, node.func.value, False))
        elif method in TRAINER_STEPS:
            receiver = dotted_name(node.func.value)
            if receiver:
                survey.steps.append((receiver, node))
        elif method in GRADIENT_READS or method == "clip_global_norm":
            survey.gradient_reads.append(node)
        elif method == "cast" and len(node.args) == 1 and survey.hand_cast is None:
            value = node.args[0].value
            literal = value.evaluated_value if isinstance(value, cst.SimpleString) else None
            if literal is None or any(word in str(literal) for word in _REDUCED):
                survey.hand_cast = node


def survey_gluon(module: cst.Module, imports: ImportMap) -> GluonSurvey:
    walker = _Walker(imports)
    walk(module, walker, walker.survey.parents)
    survey = walker.survey
    for build in survey.trainers:
        _name_trainer(build, survey.parents)
    for backward in survey.backwards:
        _place_backward(backward, survey.parents)
    return survey


def _name_trainer(build: TrainerBuild, parents) -> None:
    parent = parents.get(build.call)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        name = dotted_name(parent.targets[0].target)
        statement = parents.get(parent)
        if name and isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            build.name, build.statement = name, statement


def _place_backward(backward: Backward, parents) -> None:
    expression = parents.get(backward.call)
    statement = parents.get(expression)
    if not isinstance(expression, cst.Expr) or not isinstance(
            statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        backward.problem = "its result is used in an expression"
        return
    if len(statement.body) != 1:
        backward.problem = "it shares its line with other statements"
        return
    backward.statement = statement
    call = backward.call
    if backward.functional:
        others = call.args[1:]
        if backward.loss is None or call.args[0].keyword is not None or call.args[0].star:
            backward.problem = "autograd.backward without a positional loss"
        elif any(arg.keyword is None or arg.keyword.value == "head_grads" for arg in others):
            backward.problem = "explicit head gradients (they would need the loss scale too)"
    elif any(arg.keyword is None or arg.keyword.value == "out_grad" for arg in call.args):
        backward.problem = "an explicit output gradient (it would need the loss scale too)"
