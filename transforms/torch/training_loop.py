"""Find the training structure of a PyTorch script, without changing it.

`analyze_training(module, imports)` walks a module once and returns a `TrainingStructure`:
the optimizers and where each is bound, every `backward()` call, every optimizer `step()`,
`zero_grad()`, gradient clipping call, checkpoint save/load of optimizer state, the script's
device expressions, DataParallel/DDP wraps, and the hazards that make automatic mixed
precision unsafe (BCELoss, step(closure), create_graph gradients, huge masked_fill constants,
optimizer wrapper classes). It groups backward calls with their optimizer steps into
`TrainingUnit`s: one unit is one training iteration, the body of the innermost loop (or
function) that holds a backward call and at least one optimizer step.

Both PyTorch backends (native torch.amp and NVIDIA apex) build on this module; it never
rewrites anything and never imports PyTorch. The nodes it returns are the nodes of the module
passed in (`TrainingStructure.module` is that module), so plan edits against them by identity
(see `StatementEdits` in torch/edits.py).

How a backend uses it (the native backend, `torch/native_amp.py`, is the worked example):

    s = analyze_training(module, imports)
    s.mixed_precision_uses        # non-empty: the file already uses torch.amp / apex amp
    for unit in s.units:          # one training iteration each
        unit.backwards            # BackwardCall: .call, .loss (receiver expression), .statement
        unit.steps                # StepCall: .receiver ("optimizer", "self.opt"), .has_closure
        unit.clips, unit.zero_grads
        unit.grad_reads           # `p.grad` read in the iteration (needs unscaled gradients)
        unit.owner, unit.scope    # the loop (or function) and the function that holds it
        s.bindings_visible(unit.optimizers[0], unit.scope)   # where that optimizer is created
    s.unpaired_backwards          # backward() with no optimizer step found: report, never skip
    s.optimizers                  # name -> Optimizer(bindings, reason, model_names it optimizes)
    s.optimizer_state_saves / s.optimizer_state_loads    # checkpoint call sites
    s.parallel_wraps              # DataParallel / DDP calls (apex: amp.initialize goes before)
    s.device_bindings, s.to_device_arguments             # the script's own device expressions
    s.hazards                     # Hazard(kind, node, detail), kind a HazardKind

Navigation helpers (`statement_of`, `block_of`, `block_path`, `scope_of`, `class_of`,
`position`/`line`, `bindings_visible`, `insertion_point`, `fresh_name`) answer the questions a
rewrite asks about those nodes.
"""

from __future__ import annotations

import enum

import dataclasses
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst
from libcst.metadata import CodePosition

from ampify.transforms.torch import names as names
from ampify.transforms.kit.calls import nodes_within
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.hand_written_precision import fp16_utils_evidence, loss_scaling_evidence
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.positions import Positions
from ampify.transforms.kit.log_of_sigmoid import log_of_probability_calls
from ampify.transforms.torch.statements import calls_within, code_of, nodes_of_type, short_text

#: where a name can be bound: a function (parameters and locals) or the module
Scope = Union[cst.FunctionDef, cst.Module]
#: the node whose body is one training iteration
UnitOwner = Union[cst.For, cst.While, cst.FunctionDef, cst.Module]
#: a node that holds a list of statements
Block = Union[cst.IndentedBlock, cst.Module]


class Unconvertible(Exception):
    """A training structure that cannot be converted safely; the message says why (it is shown
    to the user, followed by what was left unconverted). `node` locates it."""

    def __init__(self, message: str, node: Optional[cst.CSTNode] = None, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.node = node
        #: the rule code of the warning, when not the backend's generic "step left unconverted"
        self.code = code


class LossNotFound(Unconvertible):
    """The statements that compute a backward()'s loss were not found (or call no model): the
    name may hold something else than a tensor (a loss object with a backward() of its own)."""

    def __init__(self, message: str, node: Optional[cst.CSTNode] = None, receiver: str = "") -> None:
        super().__init__(message, node)
        #: the name backward() is called on (`loss` of `loss.backward()`)
        self.receiver = receiver


def receiver_of(backward: "BackwardCall") -> str:
    """`loss` of `loss.backward()` (no arguments); empty for anything else."""
    func = backward.call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and not backward.call.args:
        return func.value.value
    return ""


class MixedPrecisionElsewhere(Unconvertible):
    """The step is already in mixed precision, set up by the module that calls it (FSDP's
    MixedPrecision policy, a GradScaler, amp.initialize there): nothing is added."""


@dataclass
class Binding:
    """One place where a (dotted) name gets a value: `optimizer = ...`, `self.opt = ...`, a parameter."""

    name: str  # "optimizer", "self.optimizer"
    statement: Optional[cst.CSTNode]  # the statement that binds it; None for a parameter
    scope: Scope  # the function (or module) whose namespace holds it
    value: Optional[cst.BaseExpression]  # the assigned expression, None for parameters and loop targets
    qualified_call: Optional[str]  # "torch.optim.SGD" when value is a call to an imported name
    kind: str  # "assign", "tuple", "parameter", "for", "with", "attribute"
    klass: Optional[cst.ClassDef] = None  # for "self.x" bindings: the class of the method


@dataclass
class Optimizer:
    """A name the script steps as an optimizer, and why we believe it is one."""

    name: str
    bindings: List[Binding]
    reason: str  # "torch.optim.SGD", "parameter named like an optimizer", ...
    #: models whose parameters the optimizer is built from: `model` in SGD(model.parameters())
    model_names: List[str] = field(default_factory=list)
    #: `optimizer = hvd.DistributedOptimizer(optimizer, ...)` on every path: its allreduce runs
    #: asynchronously until step(), so a GradScaler steps it under horovod's recipe (the wrap's code)
    horovod: Optional[str] = None


@dataclass
class CallSite:
    """A call of interest, with the statement that holds it."""

    call: cst.Call
    statement: cst.CSTNode
    receiver: Optional[str]  # dotted receiver for method calls: "optimizer" in optimizer.step()
    scope: Scope


@dataclass
class BackwardCall(CallSite):
    """`<loss>.backward(...)`; `loss` is the receiver expression.

    A unit's backward can also be a call of a helper method that runs the backward
    (`self.backward_D()`, see `torch/helper_backwards.py`): then `call` is that helper call in the
    iteration, `loss` is None, and `delegation` leads to the real `<loss>.backward()`."""

    loss: Optional[cst.BaseExpression] = None
    delegation: Optional["Delegation"] = None


@dataclass
class Delegation:
    """How an iteration reaches a backward() that runs in helper methods of its class."""

    #: the real `<loss>.backward()` call, in the innermost helper
    inner: BackwardCall
    #: the helper calls, from the one in the iteration down to the call of the innermost helper
    sites: List[cst.Call] = field(default_factory=list)
    #: the helper methods, outermost first (sites[i] calls helpers[i])
    helpers: List[cst.FunctionDef] = field(default_factory=list)


@dataclass
class StepCall(CallSite):
    """`<optimizer>.step(...)` on an identified optimizer, or a stepping method of an optimizer
    wrapper class of the project (`optimizer.step_and_update_lr()`, see `wrapper`)."""

    has_closure: bool = False
    #: the wrapper's stepping method this call runs, or None for an optimizer's own step()
    wrapper: Optional["WrapperUse"] = None


@dataclass(frozen=True)
class WrapperUse:
    """A stepping method of an optimizer wrapper class of the project (`ScheduledOptim`)."""

    key: str  # its module, for ProjectFacts
    display: str  # its module, for people
    step: Any  # ampify.optimizer_wrappers.WrapperStep
    #: `optimizer.step()` on a name that may hold that wrapper or a plain optimizer: not converted
    ambiguous: bool = False

    @property
    def described(self) -> str:
        return f"{self.display}:{self.step.line} {self.step.klass}.{self.step.method}()"


#: ProjectView.project_class: (module key, class name, it subclasses an optimizer, it only averages
#: weights) for a class of another project module imported under a local name (or reached as
#: `module.Class`), else None
ProjectClass = Callable[[str], Optional[Tuple[str, str, bool, bool]]]


@dataclass
class GradRead:
    """`<tensor>.grad` read or modified by the script itself (`p.grad.data.clamp_(-1, 1)`)."""

    node: cst.Attribute
    statement: cst.CSTNode
    scope: Scope


@dataclass
class TrainingUnit:
    """One training iteration: backward calls and the optimizer steps that consume their gradients."""

    owner: UnitOwner  # a loop, or a function/module when the iteration is its whole body
    scope: Scope  # the function holding the owner (the owner itself for a function)
    klass: Optional[cst.ClassDef]
    backwards: List[BackwardCall] = field(default_factory=list)
    steps: List[StepCall] = field(default_factory=list)
    clips: List[CallSite] = field(default_factory=list)
    zero_grads: List[CallSite] = field(default_factory=list)
    #: `.grad` accesses inside the iteration; only those between a backward and a step matter
    grad_reads: List[GradRead] = field(default_factory=list)

    @property
    def body(self) -> Block:
        """The block that runs once per iteration."""
        return self.owner if isinstance(self.owner, cst.Module) else self.owner.body

    @property
    def optimizers(self) -> List[str]:
        """Stepped optimizer names, in order of first step, without repeats."""
        seen: List[str] = []
        for step in self.steps:
            if step.receiver and step.receiver not in seen:
                seen.append(step.receiver)
        return seen


class HazardKind(str, enum.Enum):
    """A pattern that makes mixed precision unsafe (each backend maps it to its own rule code)."""

    BCE = "bce"  # nn.BCELoss / F.binary_cross_entropy, which CUDA autocast refuses
    SIGMOID = "sigmoid"  # an nn.Sigmoid layer (a model ending in Sigmoid usually feeds BCELoss)
    CLOSURE = "closure"  # optimizer.step(closure), which GradScaler does not support
    CREATE_GRAPH = "create_graph"  # torch.autograd.grad(..., create_graph=True): manual loss scaling
    #: torch.autograd.grad(loss, inputs) without create_graph in a training iteration (a MAML inner
    #: loop's fast weights, FGSM/PGD adversarial examples): float16 gradients the GradScaler never
    #: scaled; kept only when the call runs in a training unit or a helper called there
    AUTOGRAD_GRAD = "autograd_grad"
    MASKED_FILL = "masked_fill"  # masked_fill with a constant beyond the float16 range
    #: torch.mm(f, f.t()): a Gram matrix of feature maps (style transfer) sums h*w products, which
    #: overflow float16 under autocast: the loss is inf and every step is skipped
    GRAM_MATRIX = "gram_matrix"
    #: a custom torch.autograd.Function of the model code whose backward() mixes the float16
    #: gradient with float32 tensors, or that calls a compiled extension (ampify/autograd_functions.py);
    #: found through the project, reported by the driver
    AUTOGRAD_FUNCTION = "autograd_function"
    #: a custom torch.autograd.Function whose backward() never reads the incoming gradient: the loss
    #: scale stops there (warp-ctc's `return ctx.grads, None, ...`); reported by the driver
    GRADIENT_DROPPED = "gradient_dropped"
    #: an import of a binding (warpctc_pytorch) whose Function dropped the incoming gradient in some
    #: releases: named for the user to check; reported by the driver
    GRADIENT_DROPPING_BINDING = "gradient_dropping_binding"
    #: `p = torch.clamp(p, 1e-4, 1.0 - 1e-4)` before `log(1 - p)`: the bound rounds to 1 in float16
    #: (bfloat16 for eps up to 2**-9), the log is -inf; reported by the driver
    PROBABILITY_CLAMP = "probability_clamp"
    #: torch.log(1 - D(x)) of a model ending in a sigmoid: in float16 the probability rounds to 1 (or
    #: 0), the log is -inf, the loss inf, and every step is skipped (log_of_sigmoid.py)
    LOG_OF_PROBABILITY = "log_of_probability"
    WRAPPER_CLASS = "wrapper_class"  # a class with its own step() that steps an inner optimizer
    AUTOGRAD_BACKWARD = "autograd_backward"  # torch.autograd.backward(...), not followed
    #: torch.distributed.autograd.backward(context_id, [loss]): RPC training, gradients held in a
    #: distributed autograd context that a DistributedOptimizer steps, forward passes on remote workers
    DISTRIBUTED_AUTOGRAD = "distributed_autograd"
    FSDP = "fsdp"  # FullyShardedDataParallel (float16 needs ShardedGradScaler; apex refuses it)
    #: torch.distributed.fsdp.fully_shard (FSDP2, PyTorch >= 2.6): DTensor parameters, whose inf check
    #: GradScaler's unscale_ reduces over the mesh; only apex refuses it
    FULLY_SHARD = "fully_shard"
    MANUAL_HALF = "manual_half"  # .half(), .to(torch.float16): hand-made half precision
    #: Opacus (DP-SGD): per-sample gradients clipped by the optimizer, which loss scaling would scale
    DIFFERENTIAL_PRIVACY = "differential_privacy"
    #: `optimizer = Optimizer(torch.optim.Adam(...))` with Optimizer a class ampify cannot read: the
    #: name stepped is not the optimizer (`scaler.step(wrapper)` / `amp.initialize(model, wrapper)`
    #: would fail, or skip what the class does); its steps are left unconverted
    UNSEEN_WRAPPER = "unseen_wrapper"
    #: horovod's DistributedOptimizer on some paths only (`if args.horovod: optimizer =
    #: hvd.DistributedOptimizer(...)`): the gradients are averaged asynchronously until its step(),
    #: so they cannot be unscaled before `optimizer.synchronize()`, which a plain optimizer lacks;
    #: its steps are left unconverted
    HOROVOD = "horovod"
    #: horovod's DistributedOptimizer on every path: native steps it under horovod's recipe
    #: (synchronize(), then scaler.step under skip_synchronize()); apex refuses the file
    HOROVOD_STEP = "horovod_step"


@dataclass
class Hazard:
    """A pattern that makes mixed precision unsafe, where it is, and what it names."""

    kind: HazardKind
    node: cst.CSTNode
    detail: str = ""


@dataclass
class TrainingStructure:
    """Everything `analyze_training` found; nodes belong to `module`."""

    module: cst.Module
    imports: ImportMap
    optimizers: Dict[str, Optimizer] = field(default_factory=dict)
    bindings: List[Binding] = field(default_factory=list)
    backwards: List[BackwardCall] = field(default_factory=list)
    steps: List[StepCall] = field(default_factory=list)
    #: `.step()` calls on objects that are not identified optimizers (schedulers, envs, wrappers)
    other_steps: List[CallSite] = field(default_factory=list)
    zero_grads: List[CallSite] = field(default_factory=list)
    clips: List[CallSite] = field(default_factory=list)
    #: every `<expr>.grad` attribute access
    grad_reads: List[GradRead] = field(default_factory=list)
    #: receivers named like optimizers that hold an average of weights built by a class of another
    #: project module (self-ensemble's `teacher_optimizer`): their step() is no optimizer's
    weight_averages: Set[str] = field(default_factory=set)
    units: List[TrainingUnit] = field(default_factory=list)
    #: backward calls that no unit holds (no optimizer step in any enclosing loop or function)
    unpaired_backwards: List[BackwardCall] = field(default_factory=list)
    #: id of an unpaired backward call -> why its helper method could not be followed to a step
    #: (filled by helper_backwards.pair_helper_backwards)
    helper_refusals: Dict[int, str] = field(default_factory=dict)
    #: helper calls through which a unit reaches a backward() (`self.backward_D()`)
    delegated_sites: List[cst.Call] = field(default_factory=list)
    #: `<optimizer>.state_dict()` calls (checkpoint saves)
    optimizer_state_saves: List[CallSite] = field(default_factory=list)
    #: `<optimizer>.load_state_dict(...)` calls (checkpoint loads)
    optimizer_state_loads: List[CallSite] = field(default_factory=list)
    #: bindings whose value is a torch.device(...) / current_accelerator() call
    device_bindings: List[Binding] = field(default_factory=list)
    #: argument expressions of `.to(...)` calls, in source order
    to_device_arguments: List[Tuple[cst.BaseExpression, Scope]] = field(default_factory=list)
    uses_cuda_method: bool = False  # the script calls `.cuda()`
    parallel_wraps: List[CallSite] = field(default_factory=list)
    hazards: List[Hazard] = field(default_factory=list)
    #: nodes that show the file already uses torch.amp / torch.cuda.amp / apex amp
    mixed_precision_uses: List[cst.CSTNode] = field(default_factory=list)
    #: mixed precision written by hand (fp16_utils master weights, a loss scale divided out of
    #: the gradients): (what it is, the node that shows it), or None
    hand_written_mixed_precision: Optional[Tuple[str, cst.CSTNode]] = None
    #: name of a framework that owns the loop (accelerate, lightning ...), if imported
    loop_owning_framework: Optional[str] = None
    #: every Name value in the module, to pick fresh names
    all_names: Set[str] = field(default_factory=set)
    #: every Name node, by value (to find the uses of a function without another walk)
    name_nodes: Dict[str, List[cst.Name]] = field(default_factory=dict)
    _parents: Dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict, repr=False)
    _positions: Optional[Positions] = field(default=None, repr=False)

    # ---- navigation -------------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The node's parent, None for the module."""
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Parent, grandparent, ... up to the module."""
        current = self._parents.get(node)
        while current is not None:
            yield current
            current = self._parents.get(current)

    def position(self, node: cst.CSTNode) -> CodePosition:
        """Start line (1-based) and column (0-based) of a node."""
        found = self._positions.get(node) if self._positions is not None else None
        return found.start if found is not None else CodePosition(0, 0)

    def compute_all_positions(self) -> None:
        """Generate every node's position now: cheaper than a partial code generation per node
        when several nodes spread over the module are about to be asked about."""
        if self._positions is not None:
            self._positions.compute_all()

    def line(self, node: cst.CSTNode) -> int:
        """The node's 1-based start line."""
        return self.position(node).line

    def end_line(self, node: cst.CSTNode) -> int:
        """The node's 1-based last line."""
        found = self._positions.get(node) if self._positions is not None else None
        return found.end.line if found is not None else 0

    def statement_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The statement that directly sits in a block (IndentedBlock or Module) and holds node."""
        current: Optional[cst.CSTNode] = node
        while current is not None:
            parent = self._parents.get(current)
            if isinstance(parent, (cst.IndentedBlock, cst.Module)) and isinstance(
                current, (cst.SimpleStatementLine, cst.BaseCompoundStatement)
            ):
                return current
            current = parent
        return None

    def block_of(self, statement: cst.CSTNode) -> Optional[Block]:
        """The IndentedBlock or Module that lists `statement`."""
        parent = self._parents.get(statement)
        return parent if isinstance(parent, (cst.IndentedBlock, cst.Module)) else None

    def block_path(self, node: cst.CSTNode, stop: Optional[Block] = None) -> List[Tuple[Block, cst.CSTNode]]:
        """(block, statement of that block holding node) pairs, innermost first, up to `stop`
        (a block, usually a unit's body) or the module."""
        path: List[Tuple[Block, cst.CSTNode]] = []
        statement = self.statement_of(node)
        while statement is not None:
            block = self.block_of(statement)
            if block is None:
                break
            path.append((block, statement))
            if block is stop or isinstance(block, cst.Module):
                break
            owner = self._parents.get(block)
            statement = self.statement_of(owner) if owner is not None else None
        return path

    def scope_of(self, node: cst.CSTNode) -> Scope:
        """The innermost function holding node, else the module."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return ancestor
        return self.module

    def class_of(self, scope: Scope) -> Optional[cst.ClassDef]:
        """The class whose method `scope` is, if it is a method."""
        if isinstance(scope, cst.FunctionDef):
            parent = self._parents.get(scope)
            if isinstance(parent, cst.IndentedBlock) and isinstance(self._parents.get(parent), cst.ClassDef):
                return self._parents.get(parent)  # type: ignore[return-value]
        return None

    def contains(self, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
        """Is `node` inside `outer` (or outer itself)?"""
        return node is outer or any(a is outer for a in self.ancestors(node))

    def enclosing_scopes(self, scope: Scope) -> List[Scope]:
        """scope, the functions around it, and the module: where a free name is looked up."""
        chain: List[Scope] = [scope]
        for ancestor in self.ancestors(scope):
            if isinstance(ancestor, cst.FunctionDef):
                chain.append(ancestor)
        if scope is not self.module:
            chain.append(self.module)
        return chain

    def bindings_visible(self, name: str, scope: Scope) -> List[Binding]:
        """Bindings of `name` as seen from `scope`: the class's `self.x` bindings, else the
        nearest enclosing scope that binds the name (locals, closures, module)."""
        if name.startswith("self."):
            klass = self.class_of(scope)
            if klass is None:
                return []
            return [b for b in self.bindings if b.name == name and b.klass is klass]
        for candidate in self.enclosing_scopes(scope):
            found = [b for b in self.bindings if b.name == name and b.scope is candidate]
            if found:
                return found
        return []

    def not_found_reason(self, name: str, scope: Scope) -> str:
        """Why no binding of `name` is visible from `scope`, naming where the file does bind it."""
        where = self._scope_label(scope)
        collection = collection_of_optimizers(name)
        if collection is not None:
            return (f"{name} is an optimizer taken from {collection}, a collection of optimizers (a list, dict or "
                    "namespace); ampify does not follow a collection to each optimizer's construction")
        elsewhere = [b for b in self.bindings if b.name == name and b.statement is not None]
        if elsewhere:
            first = elsewhere[0]
            if all(b.kind == "for" for b in elsewhere):
                return (f"{name} is a loop variable (line {self.line(first.statement)}), drawn from a collection of "
                        "optimizers that ampify does not follow to each optimizer's construction")
            if name.startswith("self.") and first.klass is not None and first.klass is self.class_of(scope):
                return (f"{name} is set at line {self.line(first.statement)} from a value ampify does not follow to "
                        "an optimizer construction in this file")
            if name.startswith("self."):
                owner = first.klass.name.value if first.klass is not None else "another class"
                return (f"{name} is created in class {owner} (line {self.line(first.statement)}), not in the class "
                        f"of {where}: ampify follows self.<attribute> within one class and the base class that sets it (not "
                        "a class beside it)")
            return (f"{name} is created in {self._scope_label(first.scope)} (line {self.line(first.statement)}), "
                    f"which {where} cannot see (it is neither passed in nor a module-level variable)")
        return (f"no assignment to {name} that {where} can see: ampify follows local, enclosing and module-level "
                "variables, parameters and self.<attribute> within one class (not class attributes, globals set "
                "elsewhere, star imports or other modules)")

    def _scope_label(self, scope: Scope) -> str:
        if isinstance(scope, cst.FunctionDef):
            klass = self.class_of(scope)
            return f"{klass.name.value}.{scope.name.value}()" if klass is not None else f"{scope.name.value}()"
        return "the module body"

    def insertion_point(
        self, after: Sequence[cst.CSTNode], before: Sequence[cst.CSTNode] = ()
    ) -> Optional[cst.CSTNode]:
        """The statement after which new code runs once every statement in `after` has run and
        before any in `before`: in the deepest block holding them all, the last statement that
        holds one of `after`. None when no such place exists (a `before` statement holds an
        `after` one, or comes first). E.g. after the optimizer(s), before the training loop;
        an optimizer created in both branches of an `if` gives the whole `if`."""
        paths = [list(reversed(self.block_path(st))) for st in list(after) + list(before)]
        if not after or any(not p for p in paths):
            return None
        depth = 0
        while all(len(p) > depth + 1 for p in paths) and len({id(p[depth + 1][0]) for p in paths}) == 1:
            depth += 1
        if len({id(p[depth][0]) for p in paths}) != 1:
            return None
        body = list(paths[0][depth][0].body)
        indexes = [_position_in(body, p[depth][1]) for p in paths]
        if any(i is None for i in indexes):
            return None
        last_after = max(indexes[: len(after)])
        if indexes[len(after):] and min(indexes[len(after):]) <= last_after:
            return None
        return body[last_after]

    def fresh_name(self, preferred: str, *alternatives: str) -> str:
        """`preferred` unless the module already uses it, then the first free alternative."""
        for candidate in (preferred,) + alternatives:
            if candidate not in self.all_names:
                return candidate
        index = 1
        while f"{preferred}_{index}" in self.all_names:
            index += 1
        return f"{preferred}_{index}"


def _position_in(body: Sequence[cst.CSTNode], statement: cst.CSTNode) -> Optional[int]:
    for index, candidate in enumerate(body):
        if candidate is statement:
            return index
    return None


def _keep_gradients_taken_in_training(structure: TrainingStructure) -> None:
    """Drop the AUTOGRAD_GRAD hazards outside training: a `torch.autograd.grad(out, x)` counts when
    it runs in a training unit's iteration, or in a function of the file called there by name
    (`fgsm(model, x, y)`, `self.inner_update(...)`); a saliency map in an evaluation function
    does not."""
    hazards = [h for h in structure.hazards if h.kind is HazardKind.AUTOGRAD_GRAD]
    if not hazards:
        return
    called: Set[str] = set()
    for unit in structure.units:
        for call in calls_within(unit.owner):
            name = dotted_name(call.func) or ""
            called.add(name[len("self."):] if name.startswith("self.") else name)

    def in_training(node: cst.CSTNode) -> bool:
        if any(structure.contains(unit.owner, node) for unit in structure.units):
            return True
        scope = structure.scope_of(node)
        return isinstance(scope, cst.FunctionDef) and scope.name.value in called

    dropped = {id(h) for h in hazards if not in_training(h.node)}
    structure.hazards = [h for h in structure.hazards if id(h) not in dropped]


def _switches_autocast_off(call: cst.Call, qualified: str) -> bool:
    """`torch.autocast(..., enabled=False)` (also torch.amp.autocast): a float32 region, no mixed precision."""
    return qualified.rsplit(".", 1)[-1] == "autocast" and any(
        a.keyword is not None and a.keyword.value == "enabled" and isinstance(a.value, cst.Name)
        and a.value.value == "False" for a in call.args)


def _is_float32_block(node: cst.With, imports: ImportMap) -> bool:
    """`with torch.autocast(..., enabled=False):` whose body first copies a name to float32
    (`y = y.float()`), as gram_matrix_float32.py writes it."""
    if not any(isinstance(item.item, cst.Call) and _switches_autocast_off(item.item, imports.resolve(item.item.func) or "")
               for item in node.items):
        return False
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
    first = body[0] if body else None
    if not (isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Assign)):
        return False
    assign = first.body[0]
    value = assign.value
    return (len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "float" and isinstance(value.func.value, cst.Name)
            and value.func.value.value == assign.targets[0].target.value)


#: the names a log is taken through (log_of_sigmoid.py): without one, no model's probability is logged
_LOG_NAMES = frozenset({"log", "log2", "log10", "log1p"})


def analyze_training(module: cst.Module, imports: ImportMap,
                     wrapper_steps: Optional[Dict[str, WrapperUse]] = None,
                     project_class: Optional[ProjectClass] = None,
                     probability_models: Optional[Callable[[], Dict[str, str]]] = None) -> TrainingStructure:
    """Walk `module` once and describe its training structure (see the module docstring).
    `wrapper_steps`: stepping methods of the project's optimizer wrapper classes, by name (a call
    `x.<name>()` steps the optimizer x wraps). `project_class(local)`: (module key, class name, it
    subclasses an optimizer) for a class of another project module imported as `local`, else None
    (ProjectView.project_class). `probability_models`: model classes of other project modules
    imported here whose forward() returns a sigmoid's probability, by the name they are called by
    (ProjectView.probability_models; asked only when the module takes a log)."""
    collector = _Collector(imports)
    collector.wrapper_steps = wrapper_steps or {}
    collector.project_class = project_class or (lambda local: None)
    walk(module, collector, parents=collector.parents)
    structure = collector.structure
    structure.module = module
    structure._parents = collector.parents
    structure._positions = Positions(module)
    _identify_optimizers(structure, collector)
    _group_units(structure)
    _keep_gradients_taken_in_training(structure)
    imported = {}
    if probability_models is not None and structure.all_names & _LOG_NAMES:
        imported = {name: where for name, where in probability_models().items()
                    if name.split(".")[0] in structure.all_names}
    own_sigmoid = bool(structure.all_names & {"sigmoid", "Sigmoid", "expit"})
    if own_sigmoid or imported:
        origin = ""
        if imported and not own_sigmoid:
            shown = sorted(imported.values())
            origin = (f" (the model {shown[0]} ends in a sigmoid)" if len(shown) == 1
                      else f" (the models {', '.join(shown[:-1])} and {shown[-1]} end in a sigmoid)")
        structure.hazards.extend(Hazard(HazardKind.LOG_OF_PROBABILITY, call, code_of(call) + origin)
                                 for call, _ in log_of_probability_calls(module, imports, imported_models=imported))
    structure.hand_written_mixed_precision = _hand_written_mixed_precision(structure)
    return structure


def _hand_written_mixed_precision(structure: TrainingStructure) -> Optional[Tuple[str, cst.CSTNode]]:
    """fp16_utils-style master weights used (not just imported), or a loss scale that is divided
    out of the gradients (`p.grad.data.div_(loss_scale)`): the file scales its loss by hand."""
    for value, nodes in structure.name_nodes.items():
        evidence = fp16_utils_evidence(value)
        if evidence is None:
            continue
        used = [node for node in nodes if not _in_import(structure, node)]
        if used:
            return evidence, used[0]
    scale_in_statement: Dict[int, Tuple[str, cst.Name]] = {}
    for value, nodes in structure.name_nodes.items():
        if loss_scaling_evidence(value) is not None:
            for node in nodes:
                scale_in_statement.setdefault(id(structure.statement_of(node)), (value, node))
    for read in structure.grad_reads:
        found = scale_in_statement.get(id(read.statement))
        if found is not None:
            return f"manual loss scaling: {found[0]} divided out of the gradients", found[1]
    return None


def _in_import(structure: TrainingStructure, node: cst.CSTNode) -> bool:
    statement = structure.statement_of(node)
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


# ---- collection -----------------------------------------------------------------------------


def _call_receiver(call: cst.Call) -> Optional[str]:
    if isinstance(call.func, cst.Attribute):
        return dotted_name(call.func.value)
    return None


def _collection_member(receiver: cst.BaseExpression) -> Optional[str]:
    """`optimizersD[i]`, `self.optims["G"]`, `optimizers[k].optimizer`: an optimizer taken from a
    collection named like optimizers, spelled as written; None for anything else (`envs[i]`)."""
    node = receiver
    while isinstance(node, cst.Attribute):
        node = node.value
    if not isinstance(node, cst.Subscript):
        return None
    base = node
    while isinstance(base, (cst.Subscript, cst.Attribute)) and not (
        isinstance(base, cst.Attribute) and dotted_name(base) is not None
    ):
        base = base.value
    collection = dotted_name(base)
    if collection is None or not names.looks_like_optimizer_name(collection):
        return None
    return cst.Module([]).code_for_node(receiver)


def collection_of_optimizers(receiver: str) -> Optional[str]:
    """The collection an optimizer step's receiver takes its optimizer from: `optimizersD` for
    `optimizersD[i]`, `optims` for `optims.discriminator` (a Munch or namespace of optimizers,
    clovaai/stargan-v2); None for a plain name or attribute."""
    if "[" in receiver:
        return receiver.split("[", 1)[0]
    parts = receiver.split(".")
    for index, part in enumerate(parts[:-1]):
        if part != "self" and names.looks_like_optimizer_name(part) and not names.looks_like_optimizer_name(parts[-1]):
            return ".".join(parts[: index + 1])
    return None


def _method_name(call: cst.Call) -> Optional[str]:
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    if isinstance(call.func, cst.Name):
        return call.func.value
    return None


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def numeric_value(node: cst.BaseExpression) -> Optional[float]:
    """The value of `1e9`, `-1e9`, `float("-1e9")`; None for anything else."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = numeric_value(node.expression)
        return None if inner is None else -inner
    if isinstance(node, (cst.Integer, cst.Float)):
        try:
            return float(node.evaluated_value)
        except (ValueError, OverflowError):
            return None
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == "float"
        and len(node.args) == 1
        and isinstance(node.args[0].value, cst.SimpleString)
    ):
        try:
            return float(node.args[0].value.evaluated_value)
        except (ValueError, TypeError):
            return None
    return None


def _target_names(target: cst.BaseExpression) -> List[Tuple[str, bool]]:
    """Dotted names bound by an assignment target, with True when part of a tuple."""
    if isinstance(target, (cst.Tuple, cst.List)):
        found = []
        for element in target.elements:
            value = element.value
            for name, _ in _target_names(value):
                found.append((name, True))
        return found
    if isinstance(target, cst.StarredElement):
        return [(n, True) for n, _ in _target_names(target.value)]
    name = dotted_name(target)
    return [(name, False)] if name else []


class _Collector(cst.CSTVisitor):
    """One walk that records every call and binding the analysis needs."""

    # Parents are recorded during this one walk (a ParentNodeProvider would walk the tree again).

    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.structure = TrainingStructure(module=cst.Module(body=[]), imports=imports)
        self.scopes: List[Scope] = []
        self.classes: List[Optional[cst.ClassDef]] = [None]
        self.statements: List[cst.CSTNode] = []
        #: names bound (by assignment) to instances of optimizer wrapper classes
        self.wrapper_classes: Dict[str, cst.ClassDef] = {}
        #: the names of the classes this module defines with no base (or `object` only)
        self.plain_local_classes: Set[str] = set()
        #: classes of this module that subclass an optimizer
        self.optimizer_subclasses: Set[str] = set()
        self.project_class: ProjectClass = lambda local: None
        self.step_candidates: List[CallSite] = []
        self.wrapper_steps: Dict[str, WrapperUse] = {}
        self.parents: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.state_dict_calls: List[CallSite] = []
        self.load_state_dict_calls: List[CallSite] = []
        for framework in names.LOOP_OWNING_FRAMEWORKS:
            if imports.uses(framework):
                self.structure.loop_owning_framework = framework
                break
        self.in_import = False
        # An import alone is no use: `try: from apex import amp / except ImportError: pass` with
        # `amp` never called is an fp32 trainer. Uses are the references found by the walk.
        #: how many float32 blocks the walk is in (`with torch.autocast(..., enabled=False):` whose
        #: body first copies a name to float32: gram_matrix_float32.py's rewrite)
        self.float32_depth = 0
        #: ids of `torch.autocast` references that switch autocast off: no use of mixed precision
        self.switched_off: Set[int] = set()

    # scopes ---------------------------------------------------------------------------

    @property
    def scope(self) -> Scope:
        return self.scopes[-1] if self.scopes else self.structure.module

    def visit_Module(self, node: cst.Module) -> None:
        self.structure.module = node
        self.scopes.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node)
        if all(dotted_name(base.value) == "object" for base in node.bases):
            self.plain_local_classes.add(node.name.value)
        self._note_wrapper_class(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        klass = self.classes[-1] if self._is_method(node) else None
        self.scopes.append(node)
        params = node.params
        for param in list(params.posonly_params) + list(params.params) + list(params.kwonly_params):
            self.structure.bindings.append(
                Binding(param.name.value, None, node, None, None, "parameter", klass)
            )
        self.classes.append(None)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scopes.pop()
        self.classes.pop()

    def _is_method(self, node: cst.FunctionDef) -> bool:
        parent = self.parents.get(node)
        grand = self.parents.get(parent) if parent is not None else None
        return isinstance(grand, cst.ClassDef)

    def _method_class(self) -> Optional[cst.ClassDef]:
        """The class of the method we are in (for `self.x` bindings)."""
        scope = self.scope
        if isinstance(scope, cst.FunctionDef):
            parent = self.parents.get(scope)
            grand = self.parents.get(parent) if parent is not None else None
            if isinstance(grand, cst.ClassDef):
                return grand
        return None

    # statements -----------------------------------------------------------------------

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.statements.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self.statements.pop()

    def _current_statement(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost statement around node (a compound one for `for` targets, one-liners)."""
        current: Optional[cst.CSTNode] = node
        while current is not None:
            parent = self.parents.get(current)
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                return current
            current = parent
        return node

    # bindings -------------------------------------------------------------------------

    def _bind(self, target: cst.BaseExpression, value: Optional[cst.BaseExpression], statement: cst.CSTNode, kind: str) -> None:
        if self.classes[-1] is not None:
            return  # a class attribute: not a variable any loop can read by its bare name
        qualified = None
        if isinstance(value, cst.Call):
            qualified = self.imports.resolve(value.func)
        for name, in_tuple in _target_names(target):
            klass = self._method_class() if name.startswith("self.") else None
            binding = Binding(
                name, statement, self.scope, None if in_tuple else value, None if in_tuple else qualified,
                "tuple" if in_tuple else ("attribute" if "." in name else kind), klass,
            )
            self.structure.bindings.append(binding)
            if not in_tuple and self._builds_device(value):
                self.structure.device_bindings.append(binding)
            if not in_tuple and isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
                wrapper = self.wrapper_classes.get(value.func.value)
                if wrapper is not None:
                    self.wrapper_classes[name] = wrapper

    def _clip_looked_up(self, node: cst.Call) -> bool:
        """`getattr(torch.nn.utils, 'clip_grad_%s_' % opt.grad_clip_mode)(params, value)`: a clip
        function picked by name (ruotianluo/self-critical.pytorch); it reads the gradients as
        clip_grad_norm_ does."""
        looked_up = node.func
        if not (isinstance(looked_up, cst.Call) and isinstance(looked_up.func, cst.Name)
                and looked_up.func.value == "getattr" and len(looked_up.args) >= 2):
            return False
        owner = self.imports.resolve(looked_up.args[0].value) or ""
        if not owner.startswith("torch.nn.utils"):
            return False
        return any("clip_grad" in string.value for string in nodes_within(looked_up.args[1].value, cst.SimpleString))

    def _builds_device(self, value: Optional[cst.BaseExpression]) -> bool:
        """`torch.device(...)`, `current_accelerator()`, or a conditional choosing between them."""
        if isinstance(value, cst.IfExp):
            return self._builds_device(value.body) and self._builds_device(value.orelse)
        if isinstance(value, cst.Call):
            return self.imports.resolve(value.func) in names.DEVICE_CONSTRUCTORS
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        statement = self._current_statement(node)
        for target in node.targets:
            self._bind(target.target, node.value, statement, "assign")

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value, self._current_statement(node), "assign")

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target, None, node, "for")

    def visit_With(self, node: cst.With) -> None:
        if _is_float32_block(node, self.imports):
            self.float32_depth += 1

    def leave_With(self, original_node: cst.With) -> None:
        if _is_float32_block(original_node, self.imports):
            self.float32_depth -= 1

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind(node.asname.name, node.item, self._current_statement(node), "with")

    def visit_Name(self, node: cst.Name) -> None:
        self.structure.all_names.add(node.value)
        self.structure.name_nodes.setdefault(node.value, []).append(node)

    # `import torch.cuda.amp` names a module, it is no use of it: inside an import statement
    # attributes are not mixed precision uses (names are still collected, for fresh_name).
    def visit_Import(self, node: cst.Import) -> None:
        self.in_import = True

    def leave_Import(self, node: cst.Import) -> None:
        self.in_import = False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.in_import = True

    def leave_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.in_import = False

    def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
        qualified = self.imports.resolve(node)
        if qualified in names.FUNCTION_PRECISION_DECORATORS:
            return False  # `torch.amp.custom_fwd` keeps a Function in float32: not even its `torch.amp` is a use
        if qualified is None:
            if node.attr.value == "grad":
                self.structure.grad_reads.append(GradRead(node, self._current_statement(node), self.scope))
        elif not self.in_import and names.is_mixed_precision(qualified) and id(node) not in self.switched_off:
            self.structure.mixed_precision_uses.append(node)

    # classes --------------------------------------------------------------------------

    def _note_wrapper_class(self, node: cst.ClassDef) -> None:
        """A class with a `step` method that steps an attribute is an optimizer wrapper,
        unless it subclasses an optimizer itself."""
        for base in node.bases:
            base_name = self.imports.resolve(base.value) or dotted_name(base.value) or ""
            if "Optimizer" in base_name or base_name.startswith("torch.optim"):
                # an optimizer itself, or a scheduler (`_LRScheduler`): no wrapper either way
                if _is_optimizer_base(base_name):
                    self.optimizer_subclasses.add(node.name.value)
                return
        if not isinstance(node.body, cst.IndentedBlock):
            return
        for item in node.body.body:
            if isinstance(item, cst.FunctionDef) and item.name.value == "step":
                inner_steps = [
                    call for call in calls_within(item)
                    if _method_name(call) == "step" and (_call_receiver(call) or "").startswith("self.")
                ]
                backwards = [call for call in calls_within(item) if _method_name(call) == "backward"]
                if inner_steps and not backwards:
                    # a step() that runs backward() itself is a training step (an RL agent's
                    # `step()`: act, learn, `self.optimizer.step()`), converted where it is
                    self.wrapper_classes[node.name.value] = node
                    self.structure.hazards.append(Hazard(HazardKind.WRAPPER_CLASS, node, node.name.value))
                return

    # calls ----------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        structure = self.structure
        statement = self._current_statement(node)
        qualified = self.imports.resolve(node.func)
        method = _method_name(node)
        receiver = _call_receiver(node)
        if receiver is None and method == "step" and isinstance(node.func, cst.Attribute):
            receiver = _collection_member(node.func.value)
        site = CallSite(node, statement, receiver, self.scope)

        if qualified and names.is_mixed_precision(qualified):
            if _switches_autocast_off(node, qualified):
                # `torch.autocast(..., enabled=False)`: a float32 region, no use (nor is its `torch.amp`)
                func = node.func
                while isinstance(func, cst.Attribute):
                    self.switched_off.add(id(func))
                    func = func.value
            else:
                structure.mixed_precision_uses.append(node)
        if qualified == "torch.autograd.backward":
            structure.hazards.append(Hazard(HazardKind.AUTOGRAD_BACKWARD, node))
            return
        if qualified == names.DISTRIBUTED_AUTOGRAD_BACKWARD:
            structure.hazards.append(Hazard(HazardKind.DISTRIBUTED_AUTOGRAD, node, qualified))
            return
        if method == "backward" and isinstance(node.func, cst.Attribute) and qualified is None:
            structure.backwards.append(
                BackwardCall(node, statement, receiver, self.scope, loss=node.func.value)
            )
            return
        if (method == "step" or (method in self.wrapper_steps and not node.args)) \
                and isinstance(node.func, cst.Attribute) and receiver is not None:
            self.step_candidates.append(site)
            return
        if method == "zero_grad":
            structure.zero_grads.append(site)
            return
        if qualified in names.CLIP_FUNCTIONS or (
            qualified is None and method in names.CLIP_ATTRIBUTES and receiver is not None
            and receiver.endswith("utils")
        ) or self._clip_looked_up(node):
            structure.clips.append(site)
            return
        if method == "state_dict" and receiver is not None and not node.args:
            self.state_dict_calls.append(site)
            return
        if method == "load_state_dict" and receiver is not None:
            self.load_state_dict_calls.append(site)
            return
        if method in ("half", "bfloat16") and isinstance(node.func, cst.Attribute) and not node.args:
            structure.hazards.append(Hazard(HazardKind.MANUAL_HALF, node, f".{method}()"))
        if method == "to" and isinstance(node.func, cst.Attribute) and any(
            (self.imports.resolve(a.value) or "") in names.HALF_DTYPES for a in node.args
        ):
            structure.hazards.append(Hazard(HazardKind.MANUAL_HALF, node, ".to(half dtype)"))
        if method == "to" and isinstance(node.func, cst.Attribute) and node.args:
            first = node.args[0]
            if first.keyword is None or first.keyword.value == "device":
                structure.to_device_arguments.append((first.value, self.scope))
            for arg in node.args[1:]:
                if arg.keyword is not None and arg.keyword.value == "device":
                    structure.to_device_arguments.append((arg.value, self.scope))
            return
        if method == "cuda" and isinstance(node.func, cst.Attribute):
            structure.uses_cuda_method = True
            return
        if qualified in names.PARALLEL_WRAPPERS:
            structure.parallel_wraps.append(site)
            return
        if qualified and qualified.split(".")[0] == "opacus":
            if not any(h.kind is HazardKind.DIFFERENTIAL_PRIVACY for h in structure.hazards):
                structure.hazards.append(Hazard(HazardKind.DIFFERENTIAL_PRIVACY, node, qualified))  # once per file
            return
        if qualified in names.FSDP_WRAPPERS:
            kind = HazardKind.FULLY_SHARD if qualified in names.DTENSOR_FSDP_WRAPPERS else HazardKind.FSDP
            structure.hazards.append(Hazard(kind, node, qualified))
            if fsdp_precision_policy(node) is not None:
                structure.mixed_precision_uses.append(node)  # FSDP casts parameters itself
            return
        if qualified in names.BCE_LOSS_CLASSES or qualified in names.BCE_FUNCTIONS:
            structure.hazards.append(Hazard(HazardKind.BCE, node, qualified))
            return
        if qualified in names.SIGMOID_MODULES:
            structure.hazards.append(Hazard(HazardKind.SIGMOID, node, qualified))
            return
        if qualified == "torch.autograd.grad":
            if any(a.keyword is not None and a.keyword.value == "create_graph" and _is_true(a.value) for a in node.args):
                structure.hazards.append(Hazard(HazardKind.CREATE_GRAPH, node))
            else:
                structure.hazards.append(Hazard(HazardKind.AUTOGRAD_GRAD, node))
            return
        gram = _gram_matrix_operand(node, qualified, method, lambda name: self._transposed_name(name, statement))
        if gram is not None and not self.float32_depth and self._flattened_feature_map(gram, statement):
            structure.hazards.append(Hazard(HazardKind.GRAM_MATRIX, node, code_of(node)))
            return
        if method in ("masked_fill", "masked_fill_"):
            value_arg = None
            for index, arg in enumerate(node.args):
                if arg.keyword is not None and arg.keyword.value == "value":
                    value_arg = arg.value
                elif arg.keyword is None and index == (1 if isinstance(node.func, cst.Attribute) and qualified is None else 2):
                    value_arg = arg.value
            number = numeric_value(value_arg) if value_arg is not None else None
            if number is not None and abs(number) > names.FLOAT16_MAX and abs(number) != float("inf"):
                structure.hazards.append(Hazard(HazardKind.MASKED_FILL, node, str(number)))
            elif value_arg is not None and self._is_wide_finfo_limit(value_arg):
                structure.hazards.append(Hazard(HazardKind.MASKED_FILL, node, code_of(value_arg)))

    def _flattened_feature_map(self, name: str, statement: Optional[cst.CSTNode]) -> bool:
        """Was `name` last bound (above `statement`, in this scope) to a feature map flattened by a
        product of its sizes, `f.view(c, h * w)` / `input.view(a * b, c * d)`: style transfer's
        Gram matrices, whose sums grow with h*w. Normalized embeddings (EBGAN's pull-away term,
        cosine similarities within [-1, 1]) are bound otherwise and are not flagged."""
        scope = self.scopes[-1]
        earlier = [b for b in self.structure.bindings
                   if b.name == name and b.scope is scope and b.statement is not statement and b.kind == "assign"]
        if not earlier:
            return False
        value = earlier[-1].value
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in ("view", "reshape")):
            return False
        return any(isinstance(arg.value, cst.BinaryOperation) and isinstance(arg.value.operator, cst.Multiply)
                   for arg in value.args)

    def _transposed_name(self, name: str, statement: Optional[cst.CSTNode]) -> Optional[str]:
        """The tensor `name` was last bound (above `statement`, in this scope) to the transpose of:
        `features_t = features.transpose(1, 2)` gives "features"."""
        scope = self.scopes[-1]
        earlier = [b for b in self.structure.bindings
                   if b.name == name and b.scope is scope and b.statement is not statement and b.kind == "assign"]
        return _transpose_operand(earlier[-1].value) if earlier else None

    def _is_wide_finfo_limit(self, node: cst.BaseExpression) -> bool:
        """`torch.finfo(torch.float32).min` (or of float64, or numpy's): finite, beyond float16."""
        if isinstance(node, cst.UnaryOperation):
            return self._is_wide_finfo_limit(node.expression)
        if not (isinstance(node, cst.Attribute) and node.attr.value in ("min", "max")):
            return False
        call = node.value
        if not (isinstance(call, cst.Call) and call.args):
            return False
        function = self.imports.resolve(call.func) or ""
        if function not in ("torch.finfo", "numpy.finfo"):
            return False
        dtype = self.imports.resolve(call.args[0].value) or dotted_name(call.args[0].value) or ""
        return dtype.rsplit(".", 1)[-1] in names.WIDE_FLOAT_DTYPES


# ---- optimizers -----------------------------------------------------------------------------


def _identify_optimizers(structure: TrainingStructure, collector: _Collector) -> None:
    """Decide which `.step()` receivers are optimizers; record them, their state saves and loads."""
    opaque_receivers: Set[str] = set()
    for site in collector.step_candidates:
        receiver = site.receiver or ""
        wrapper = collector.wrapper_steps.get(_method_name(site.call) or "")
        if wrapper is not None and _method_name(site.call) == "step":
            # `optimizer.step()` where the project's wrapper class has a step() of its own: the
            # wrapper when the name is bound to an instance of that class here; a name known by
            # its name only may be either
            reason = _optimizer_reason(structure, collector, receiver, site.scope)
            if any(_instance_of_wrapper(collector, b, wrapper) for b in structure.bindings_visible(receiver, site.scope)):
                reason = f"{wrapper.described} steps the optimizer it wraps"
                wrapper = dataclasses.replace(wrapper, ambiguous=False)
            elif reason is None:
                wrapper = None  # `scheduler.step()`: no optimizer, and no wrapper of one
            elif reason == NAMED_LIKE_AN_OPTIMIZER and _handed_torch_optimizers(structure, receiver, site.scope):
                wrapper = None  # pytorch/examples' `train(args, model, ..., optimizer, epoch)`, handed optim.Adadelta(...)
            elif wrapper.ambiguous and reason == NAMED_LIKE_AN_OPTIMIZER:
                pass  # several wrapper classes have a step(), and nothing here tells which: not converted
            elif _stepped_through_opaque_wrapper(structure, collector, site, opaque_receivers):
                reason = None
            elif reason == NAMED_LIKE_AN_OPTIMIZER and _used_as_the_wrapper(structure, receiver, site.scope, wrapper.step):
                reason = f"{wrapper.described} steps the optimizer it wraps ({receiver} is used as one)"
            elif reason == NAMED_LIKE_AN_OPTIMIZER:
                wrapper = dataclasses.replace(wrapper, ambiguous=True)
            else:
                wrapper = None
        elif wrapper is not None:
            reason = f"{wrapper.described} steps the optimizer it wraps"
        else:
            reason = _optimizer_reason(structure, collector, receiver, site.scope)
            if reason is not None and _stepped_through_opaque_wrapper(structure, collector, site, opaque_receivers):
                reason = None
        if reason is None:
            structure.other_steps.append(site)
            continue
        if receiver not in structure.optimizers:
            bindings = structure.bindings_visible(receiver, site.scope)
            optimizer = Optimizer(receiver, bindings, reason, _parameter_owners(bindings))
            structure.optimizers[receiver] = optimizer
            horovod, _ = _horovod_reaching(structure, site)
            if horovod is not None:  # on every path (_stepped_through_opaque_wrapper took the others)
                optimizer.horovod = _wrap_shown(horovod, horovod.value, _first_argument(horovod.value))
                structure.hazards.append(Hazard(HazardKind.HOROVOD_STEP, horovod.value, optimizer.horovod))
        call = site.call
        has_closure = bool(call.args) and not _steps_a_distributed_context(structure, receiver, site.scope, call)
        step = StepCall(call, site.statement, receiver, site.scope, has_closure=has_closure, wrapper=wrapper)
        structure.steps.append(step)
        if has_closure:
            structure.hazards.append(Hazard(HazardKind.CLOSURE, call, receiver))
    optimizer_names = set(structure.optimizers)
    for site in collector.state_dict_calls:
        if site.receiver in optimizer_names or _optimizer_reason(structure, collector, site.receiver or "", site.scope, need_step=True):
            structure.optimizer_state_saves.append(site)
    for site in collector.load_state_dict_calls:
        if site.receiver in optimizer_names or _optimizer_reason(structure, collector, site.receiver or "", site.scope, need_step=True):
            structure.optimizer_state_loads.append(site)


#: what a torch.optim optimizer answers to (methods and attributes of torch.optim.Optimizer and of
#: the optimizers torch ships); a name used with anything else is not a plain optimizer
_OPTIMIZER_MEMBERS = frozenset({
    "step", "zero_grad", "state_dict", "load_state_dict", "add_param_group", "param_groups", "state",
    "defaults", "register_step_pre_hook", "register_step_post_hook", "register_state_dict_pre_hook",
    "register_state_dict_post_hook", "register_load_state_dict_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_post_hook", "train", "eval", "profile_hook_step", "__class__", "__dict__",
    "__setstate__", "__getstate__", "__repr__",
})


def _used_as_the_wrapper(structure: TrainingStructure, receiver: str, scope: Scope, step: Any) -> bool:
    """Is a name known by its name only used, where it is visible, as an instance of the project's
    wrapper class and never as a plain optimizer: read for a member the class has and a torch
    optimizer does not (seq2seq's trainer reads `self.optimizer.optimizer` and calls
    `self.optimizer.update(loss, epoch)`, which a torch optimizer would fail on), and never for
    one only a torch optimizer has (`param_groups`). The uses looked at are those in the class of
    the method for `self.<name>`, in the function otherwise; a use under a type test
    (`hasattr(self.optimizer, ...)`, `isinstance(...)`) makes it no evidence."""
    region: Optional[cst.CSTNode] = scope
    if receiver.startswith("self."):
        region = next((a for a in structure.ancestors(scope) if isinstance(a, cst.ClassDef)), None)
    if region is None or isinstance(region, cst.Module):
        return False
    wrapper_only = step.members - _OPTIMIZER_MEMBERS
    as_wrapper = as_optimizer = False
    for node in nodes_of_type(region, cst.Attribute):
        if dotted_name(node.value) != receiver:
            continue
        member = node.attr.value
        if member in wrapper_only:
            as_wrapper = True
        elif member in _OPTIMIZER_MEMBERS and member not in step.members:
            as_optimizer = True
    if not as_wrapper or as_optimizer:
        return False
    for call in calls_within(region):
        if dotted_name(call.func) in ("hasattr", "isinstance", "getattr", "type") and call.args \
                and dotted_name(call.args[0].value) == receiver:
            return False
    return True


def _parameter_owners(bindings: List[Binding]) -> List[str]:
    """`model` for `SGD(model.parameters())`, `netD` for `Adam(netD.named_parameters())`..."""
    owners: List[str] = []
    for binding in bindings:
        if binding.value is None:
            continue
        for call in calls_within(binding.value):
            if _method_name(call) in ("parameters", "named_parameters") and isinstance(call.func, cst.Attribute):
                owner = _call_receiver(call)
                if owner and owner not in owners:
                    owners.append(owner)
    return owners


def _optimizer_reason(
    structure: TrainingStructure, collector: _Collector, receiver: str, scope: Scope, need_step: bool = False
) -> Optional[str]:
    """Why `receiver` is an optimizer, or None when it is not (or we cannot tell)."""
    if not receiver:
        return None
    bindings = structure.bindings_visible(receiver, scope)
    for binding in bindings:
        if receiver in collector.wrapper_classes or binding.name in collector.wrapper_classes:
            return None
        if binding.qualified_call:
            if names.is_optimizer_qualname(binding.qualified_call) or binding.qualified_call in _HOROVOD_OPTIMIZERS:
                return binding.qualified_call
            if "sched" in binding.qualified_call.lower():
                return None
        if _builds_an_optimizer_subclass(collector, binding.value):
            return f"{dotted_name(binding.value.func)}, a subclass of an optimizer"
    if receiver in collector.wrapper_classes:
        return None
    if any(_instance_of_a_weight_average(collector, binding) for binding in bindings):
        structure.weight_averages.add(receiver)
        return None  # self-ensemble's `teacher_optimizer = optim_weight_ema.EMAWeightOptimizer(...)`
    if any(_instance_of_a_plain_local_class(collector, binding) for binding in bindings):
        return None  # MixMatch's `ema_optimizer = WeightEMA(model, ema_model)`: named so, not one
    if bindings and all(binding.kind == "parameter" for binding in bindings):
        # `def train(..., optimizer, ema_optimizer, ...)` called as `train(..., ema_optimizer, ...)`
        passed = _names_passed_for(structure, receiver, bindings[0].scope)
        if passed and all(any(_instance_of_a_plain_local_class(collector, b) or _instance_of_a_weight_average(collector, b)
                              for b in structure.bindings_visible(name, where))
                          for name, _, where in passed):
            return None
    if names.looks_like_optimizer_name(receiver) or collection_of_optimizers(receiver) is not None:
        return NAMED_LIKE_AN_OPTIMIZER
    return None


def _instance_of_a_weight_average(collector: _Collector, binding: Binding) -> bool:
    """Is `binding` built by a class of another project module that only averages weights
    (self-ensemble's `teacher_optimizer = optim_weight_ema.EMAWeightOptimizer(teacher_net, student_net)`:
    no base, a step() that reads no gradient and steps nothing)?"""
    value = binding.value
    if not isinstance(value, cst.Call):
        return False
    called = dotted_name(value.func)
    found = collector.project_class(called) if called is not None else None
    return found is not None and len(found) > 3 and bool(found[3])


def _instance_of_a_plain_local_class(collector: _Collector, binding: Binding) -> bool:
    """Is `binding` built by a class of this module with no base (a subclass of an optimizer of
    another module could be one) that is no wrapper stepping an optimizer (an EMA of the weights
    with a `step()` of its own)?"""
    value = binding.value
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return False
    local = value.func.value
    return local in collector.plain_local_classes and local not in collector.wrapper_classes


def _stepped_through_opaque_wrapper(
    structure: TrainingStructure, collector: _Collector, site: CallSite, reported: Set[str]
) -> bool:
    """Is the receiver of this step bound to a wrapper ampify cannot step through (_opaque_wrapper)?
    Its hazard is recorded once per name."""
    receiver = site.receiver or ""
    opaque = _opaque_wrapper(structure, collector, receiver, site.scope) or _horovod_on_some_paths(structure, site)
    if opaque is None:
        return False
    if receiver not in reported:
        reported.add(receiver)
        structure.hazards.append(opaque)
    return True


#: the reason of an optimizer known by its name only (a parameter, an attribute set elsewhere)
NAMED_LIKE_AN_OPTIMIZER = "named like an optimizer"

#: classes that wrap an optimizer and are one to GradScaler and apex: they forward param_groups
#: and their step() steps the optimizer they wrap (apex's LARC is one amp.initialize accepts)
_OPTIMIZERS_WRAPPING_OPTIMIZERS = ("apex.parallel.LARC", "apex.parallel.LARC.LARC", "torchcontrib.optim.SWA")

_HOROVOD_OPTIMIZERS = names.HOROVOD_OPTIMIZERS


def _opaque_wrapper(structure: TrainingStructure, collector: _Collector, receiver: str, scope: Scope) -> Optional[Hazard]:
    """A hazard when `receiver` is bound to an object built around a torch optimizer by a class
    ampify cannot read or cannot step through: `optimizer = Optimizer(torch.optim.Adam(...))`
    with Optimizer imported from a module that is not in the project (or not followed), or
    horovod's `hvd.DistributedOptimizer(optimizer, ...)`. None for a plain optimizer, for the
    optimizer wrappers that are optimizers themselves (a class of this module or of the project
    with an Optimizer base, apex's LARC, torch_optimizer's Lookahead)."""
    for binding in structure.bindings_visible(receiver, scope):
        value = binding.value
        if not isinstance(value, cst.Call):
            continue
        local = dotted_name(value.func) or ""
        callee = binding.qualified_call or local
        if not callee or names.is_optimizer_qualname(callee) or callee in _HOROVOD_OPTIMIZERS:
            continue
        if any(callee == p or callee.startswith(p + ".") for p in _OPTIMIZERS_WRAPPING_OPTIMIZERS):
            continue
        if _builds_an_optimizer_subclass(collector, value):
            continue
        if any(_instance_of_wrapper(collector, binding, use) for use in collector.wrapper_steps.values()):
            continue  # the project's wrapper class, stepped through (wrapper_steps.py)
        wrapped = next((arg.value for arg in value.args if _builds_an_optimizer(structure, arg.value, binding)), None)
        if wrapped is None:
            continue
        shown = _wrap_shown(binding, value, wrapped)
        where = f"{callee}, " if callee != local else ""
        return Hazard(HazardKind.UNSEEN_WRAPPER, value, f"{shown} ({where}which ampify does not follow)")
    return None


def _horovod_wrap(structure: TrainingStructure, receiver: str, scope: Scope) -> Optional[Binding]:
    """The binding of `receiver` to `hvd.DistributedOptimizer(...)`, if one is visible."""
    return next((b for b in structure.bindings_visible(receiver, scope)
                 if b.qualified_call in _HOROVOD_OPTIMIZERS and isinstance(b.value, cst.Call)), None)


def _horovod_on_some_paths(structure: TrainingStructure, site: CallSite) -> Optional[Hazard]:
    """A HOROVOD hazard when the optimizer of a step may be wrapped in horovod's
    DistributedOptimizer on some paths only (`if args.horovod:`), or may be it or not (a parameter
    some calls hand a wrapped optimizer): whether `optimizer.synchronize()` exists depends on the
    run."""
    wrap, shown = _horovod_reaching(structure, site)
    if not shown:
        return None
    return Hazard(HazardKind.HOROVOD, wrap.value if wrap is not None and shown.endswith("paths only") else site.call, shown)


def _horovod_reaching(structure: TrainingStructure, site: CallSite) -> Tuple[Optional[Binding], str]:
    """(the horovod wrap, "") when the optimizer stepped is wrapped in horovod's DistributedOptimizer
    on every path to the step: bound so here, or a parameter of a function of this file that every
    call hands such a name; (a wrap, why not sure) when it may or may not be; (None, "") when
    horovod is not involved."""
    receiver = site.receiver or ""
    wrap = _horovod_wrap(structure, receiver, site.scope)
    if wrap is not None:
        if _on_every_path(structure, wrap, site.call):
            return wrap, ""
        return wrap, _wrap_shown(wrap, wrap.value, _first_argument(wrap.value)) + " on some paths only"
    elsewhere = next((b for b in structure.bindings
                      if b.qualified_call in _HOROVOD_OPTIMIZERS and isinstance(b.value, cst.Call)), None)
    if _plain_optimizer(structure, receiver, site.scope):
        return None, ""
    if elsewhere is None:
        # no wrap bound here, but the file trains with horovod: a helper may return the wrapped
        # optimizer (`optimizer = build_optimizer(model)`), or a caller hand it in
        if structure.imports.uses("horovod"):
            return None, f"{receiver} may be wrapped in horovod's DistributedOptimizer (this file uses horovod)"
        return None, ""
    passed = _names_passed_for(structure, receiver, site.scope)
    if passed:
        wraps = [(_horovod_wrap(structure, name, scope), call, name, scope) for name, call, scope in passed]
        if all(w is not None and _on_every_path(structure, w, call) for w, call, _, _ in wraps):
            return wraps[0][0], ""
        if all(w is None and _plain_optimizer(structure, name, scope) for w, _, name, scope in wraps):
            return None, ""
    shown = _wrap_shown(elsewhere, elsewhere.value, _first_argument(elsewhere.value))
    return elsewhere, f"{receiver} may be the optimizer of line {structure.line(elsewhere.value)} ({shown})"


def _plain_optimizer(structure: TrainingStructure, name: str, scope: Scope) -> bool:
    """Is every binding of `name` seen from `scope` a torch optimizer construction (and one at least)?"""
    bindings = structure.bindings_visible(name, scope)
    return bool(bindings) and all(names.is_optimizer_qualname(b.qualified_call or "") for b in bindings)


def _handed_torch_optimizers(structure: TrainingStructure, receiver: str, scope: Scope) -> bool:
    """Is `receiver` a parameter that every call of its function in this file hands a name bound
    to a torch optimizer built here (`optimizer = optim.Adadelta(model.parameters(), ...)`)? Then
    it is no wrapper class of the project, whatever the project holds."""
    bindings = structure.bindings_visible(receiver, scope)
    if not bindings or not all(binding.kind == "parameter" for binding in bindings):
        return False
    passed = _names_passed_for(structure, receiver, bindings[0].scope)
    if not passed:
        return False
    for name, _, where in passed:
        built = structure.bindings_visible(name, where)
        if not built or not all(b.qualified_call and names.is_optimizer_qualname(b.qualified_call) for b in built):
            return False
    return True


def _names_passed_for(structure: TrainingStructure, parameter: str, function: Scope) -> Optional[List[Tuple[str, cst.Call, Scope]]]:
    """(name, call, the call's scope) for every call in this file of the module-level function
    `function` that hands its parameter `parameter` a plain name (a call handing it `None` hands
    nothing: left out); None when the function is used any other way (passed as a value, a starred
    argument, an expression handed in) or never called."""
    if not (isinstance(function, cst.FunctionDef) and isinstance(structure.parent(function), cst.Module)):
        return None
    params = list(function.params.params)
    position = next((i for i, p in enumerate(params) if p.name.value == parameter), None)
    if position is None and not any(p.name.value == parameter for p in function.params.kwonly_params):
        return None
    found: List[Tuple[str, cst.Call, Scope]] = []
    for node in structure.name_nodes.get(function.name.value, []):
        if node is function.name:
            continue
        call = structure.parent(node)
        if isinstance(call, cst.Attribute) and call.attr is node:
            continue  # `model.train()`: another object's method of the same name
        if isinstance(call, (cst.Arg, cst.Param)) and (getattr(call, "keyword", None) is node or
                                                       getattr(call, "name", None) is node):
            continue  # `MNIST(..., train=True)`, `def test(model, train):`: a keyword, a parameter
        visible = structure.bindings_visible(node.value, structure.scope_of(node))
        if visible and not isinstance(visible[0].scope, cst.Module):
            continue  # a local name of another function (that parameter `train`)
        if not (isinstance(call, cst.Call) and call.func is node):
            return None
        value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == parameter), None)
        if value is None:
            positional = [a for a in call.args if a.keyword is None]
            if any(a.star for a in call.args) or position is None or position >= len(positional):
                return None
            value = positional[position].value
        if not isinstance(value, cst.Name):
            return None
        if value.value == "None":
            continue  # `train_val(model, test_loader, None)`: this call hands nothing in (no step runs)
        found.append((value.value, call, structure.scope_of(call)))
    return found or None


#: what the calls of a module-level function hand one of its parameters (see _names_passed_for)
names_passed_for = _names_passed_for


def _first_argument(call: cst.Call) -> cst.BaseExpression:
    return call.args[0].value if call.args else call


def _wrap_shown(binding: Binding, value: cst.Call, wrapped: cst.BaseExpression) -> str:
    """`optimizer = hvd.DistributedOptimizer(optimizer, ...)`, for messages."""
    return f"{binding.name} = {short_text(code_of(value.func), 40)}({short_text(code_of(wrapped), 40)}, ...)"


def _on_every_path(structure: TrainingStructure, binding: Binding, step: cst.CSTNode) -> bool:
    """Does the statement of `binding` run whenever the step runs: no if/try/loop around it that
    does not hold the step too (the script's `if __name__ == "__main__":` block aside)?"""
    if binding.statement is None:
        return False
    for ancestor in structure.ancestors(binding.statement):
        if ancestor is binding.scope:
            return True
        if isinstance(ancestor, (cst.If, cst.Try, cst.For, cst.While)) and not structure.contains(ancestor, step) \
                and not is_main_guard(ancestor):
            return False
    return True


def is_main_guard(node: cst.CSTNode) -> bool:
    """`if __name__ == "__main__":`"""
    test = node.test if isinstance(node, cst.If) else None
    return (isinstance(test, cst.Comparison) and dotted_name(test.left) == "__name__" and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)
            and isinstance(test.comparisons[0].comparator, cst.SimpleString)
            and test.comparisons[0].comparator.evaluated_value == "__main__")


def _is_optimizer_base(base_name: str) -> bool:
    """`torch.optim.Optimizer`, `Optimizer`, `optim.Adam`: yes; `torch.optim.lr_scheduler._LRScheduler`: no."""
    if "sched" in base_name.lower():
        return False
    return names.is_optimizer_qualname(base_name) or base_name.rsplit(".", 1)[-1].endswith("Optimizer")


def _builds_an_optimizer_subclass(collector: _Collector, value: Optional[cst.BaseExpression]) -> bool:
    """`Lookahead(optim.Adam(...))` with Lookahead a class of this module or of the project whose
    base is an optimizer: an optimizer itself."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
        return False
    local = value.func.value
    if local in collector.optimizer_subclasses:
        return True
    found = collector.project_class(local)
    return found is not None and found[2]


def _instance_of_wrapper(collector: _Collector, binding: Binding, use: WrapperUse) -> bool:
    """Is `binding` an instance of the project's wrapper class `use` names: built by a call of that
    class as this module imports it (`from nmt.optim import Optimizer`), not of a namesake from
    elsewhere (`from onmt.utils.optimizers import Optimizer`)?"""
    value = binding.value
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Name):
        found = collector.project_class(value.func.value)
        return found is not None and found[:2] == (use.key, use.step.klass)
    module, _, klass = (binding.qualified_call or "").rpartition(".")
    if klass != use.step.klass or not module:
        return False
    wrapper = Path(use.key).with_suffix("")
    parts = module.lstrip(".").split(".")
    return list(wrapper.parts[-len(parts):]) == parts or (
        wrapper.name == "__init__" and list(wrapper.parent.parts[-len(parts):]) == parts)


def _builds_an_optimizer(structure: TrainingStructure, value: cst.BaseExpression, binding: Binding) -> bool:
    """Is `value` (an argument in `binding`'s value) a torch optimizer: built right there, or a
    name bound to one before (`Wrapper(base_optimizer)`, `optimizer = LARC(optimizer)`)?"""
    if isinstance(value, cst.Call):
        return names.is_optimizer_qualname(structure.imports.resolve(value.func) or "")
    name = dotted_name(value)
    if not name:
        return False
    return any(other is not binding and names.is_optimizer_qualname(other.qualified_call or "")
               for other in structure.bindings_visible(name, binding.scope))


# ---- grouping -------------------------------------------------------------------------------


def method_calls(
    structure: TrainingStructure, method: cst.FunctionDef, klass: cst.ClassDef
) -> Tuple[List[cst.Call], List[cst.CSTNode]]:
    """`self.m(...)` calls of a method inside its own class, and every other use of the name
    (`obj.m(...)` elsewhere may be this method too, so it counts as an unknown caller)."""
    name = method.name.value
    calls: List[cst.Call] = []
    others: List[cst.CSTNode] = []
    for node in structure.name_nodes.get(name, []):
        if node is method.name:
            continue
        parent = structure.parent(node)
        if isinstance(parent, cst.Attribute) and parent.attr is node:
            call = structure.parent(parent)
            own_call = (
                isinstance(call, cst.Call)
                and call.func is parent
                and isinstance(parent.value, cst.Name)
                and parent.value.value == "self"
                and structure.contains(klass, call)
            )
            (calls if own_call else others).append(call if own_call else node)
        elif isinstance(parent, (cst.FunctionDef, cst.Param, cst.ImportAlias)) or (
            isinstance(parent, cst.Arg) and parent.keyword is node
        ):
            continue
        else:
            others.append(node)
    return calls, others


def loop_body_owners(structure: TrainingStructure, node: cst.CSTNode, scope: Scope) -> List[UnitOwner]:
    """Loops whose body holds node (innermost first, within scope), then the scope itself."""
    owners: List[UnitOwner] = []
    child = node
    for ancestor in structure.ancestors(node):
        if ancestor is scope:
            break
        if isinstance(ancestor, (cst.For, cst.While)) and child is ancestor.body:
            owners.append(ancestor)
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return owners  # a nested def/class inside the scope: stop here
        child = ancestor
    owners.append(scope)
    return owners


def _group_units(structure: TrainingStructure) -> None:
    """Pair backward calls with steps: the innermost loop (or function) holding both."""
    units: Dict[int, TrainingUnit] = {}
    step_owners = [(step, loop_body_owners(structure, step.call, step.scope)) for step in structure.steps]
    for backward in structure.backwards:
        owners = loop_body_owners(structure, backward.call, backward.scope)
        chosen: Optional[UnitOwner] = None
        for owner in owners:
            if any(any(o is owner for o in s_owners) for _, s_owners in step_owners):
                chosen = owner
                break
        if chosen is None:
            structure.unpaired_backwards.append(backward)
            continue
        unit = units.get(id(chosen))
        if unit is None:
            unit = TrainingUnit(chosen, backward.scope, structure.class_of(backward.scope))
            units[id(chosen)] = unit
            structure.units.append(unit)
        unit.backwards.append(backward)
    # every step, clip and zero_grad belongs to the innermost unit that holds it
    for step, s_owners in step_owners:
        for owner in s_owners:
            unit = units.get(id(owner))
            if unit is not None:
                unit.steps.append(step)
                break
    for attribute, sites in (("clips", structure.clips), ("zero_grads", structure.zero_grads)):
        for site in sites:
            for owner in loop_body_owners(structure, site.call, site.scope):
                unit = units.get(id(owner))
                if unit is not None:
                    getattr(unit, attribute).append(site)
                    break
    for read in structure.grad_reads:
        for owner in loop_body_owners(structure, read.node, read.scope):
            unit = units.get(id(owner))
            if unit is not None:
                unit.grad_reads.append(read)
                break


# ---- files that train without importing torch ------------------------------------------------

#: other frameworks whose files may also call `.backward()` / `.step()`: never treated as torch
OTHER_TRAINING_FRAMEWORKS = ("tensorflow", "keras", "mxnet", "chainer", "jax", "paddle", "mindspore", "oneflow")


#: a file the PyTorch transforms change or warn about holds one of these bytes next to `torch`:
#: training (backward calls, optimizer steps, closures, wrapper classes' step) or a hazard they
#: report on its own (AMP210/310 BCE, AMP212/312 create_graph, AMP213/313 masked_fill)
TORCH_RELEVANT_MARKERS = (b"backward", b"step", b"BCELoss", b"binary_cross_entropy", b"create_graph", b"masked_fill",
                          b"optim")


def may_concern_torch_training(source: bytes) -> bool:
    """Byte test shared by both PyTorch backends, before any parse: most of a code base that
    imports torch (models, data, utilities) never trains or trips a hazard, and is ruled out here."""
    if b"torch" in source and any(marker in source for marker in TORCH_RELEVANT_MARKERS):
        return True
    return may_train_without_torch_import(source)


def may_train_without_torch_import(source: bytes) -> bool:
    """Byte test: a file that never names torch but calls `.backward(` (a trainer module that
    only receives the model and optimizer, or torch reached through a star import)."""
    return b".backward(" in source


def concerns_torch(imports: ImportMap) -> bool:
    """A PyTorch transform looks at a file that imports torch, or that imports no other
    framework (it may train with objects made elsewhere)."""
    return imports.uses("torch") or not any(imports.uses(name) for name in OTHER_TRAINING_FRAMEWORKS)


def training_without_torch_import(structure: TrainingStructure) -> Optional[cst.CSTNode]:
    """In a file that does not import torch: the first backward() of a training unit (a
    backward() paired with an optimizer step), else None (nothing that trains)."""
    for unit in structure.units:
        if unit.backwards and unit.steps:
            return unit.backwards[0].call
    return None


# ---- mixed precision used, but not around the training step --------------------------------

#: parts of a mixed precision API that only training code uses: the file trains in mixed precision
_TRAINING_MIXED_PRECISION_WORDS = ("GradScaler", "scale_loss", "initialize", "grad_scaler", "MixedPrecision", "fp16_utils")


def units_outside_mixed_precision(structure: TrainingStructure) -> List[Tuple[TrainingUnit, cst.CSTNode]]:
    """Training units that no mixed precision use of the file reaches (autocast only in an
    evaluation function, say), each with one such use to point at, when no unit at all is reached. Empty when a loss-scaling API
    is used (the file trains in mixed precision), when a use sits at module level, in the unit's
    function, class or an enclosing function, in a function the unit calls, or on a `forward`."""
    uses = [u for u in structure.mixed_precision_uses if structure.parent(u) is not None]
    if not uses:
        return []
    for use in uses:
        target = use.func if isinstance(use, cst.Call) else use
        qualified = structure.imports.resolve(target) or dotted_name(target) or ""
        if any(word in qualified for word in _TRAINING_MIXED_PRECISION_WORDS) or qualified in names.FSDP_WRAPPERS:
            return []  # loss scaling, or FSDP's policy: the model trains in mixed precision wherever it runs
    outside: List[Tuple[TrainingUnit, cst.CSTNode]] = []
    for unit in structure.units:
        called = names_called_in(unit.owner)
        covered = False
        for use in uses:
            scope = structure.scope_of(use)
            if scope is structure.module or any(a is scope for a in structure.enclosing_scopes(unit.scope)):
                covered = True
            elif isinstance(scope, cst.FunctionDef) and (
                scope.name.value in called or scope.name.value == "forward"
                or (unit.klass is not None and structure.class_of(scope) is unit.klass)
            ):
                covered = True
            if covered:
                break
        if not covered:
            outside.append((unit, uses[0]))
    if len(outside) < len(structure.units):
        # some training step is under mixed precision: the file was converted on purpose (a step
        # ampify refused then was reported then); only a file with none at all is suspicious
        return []
    return outside


def names_called_in(node: cst.CSTNode) -> Set[str]:
    """Function names called inside node: `f(...)`, `self.f(...)`, `obj.f(...)`."""
    found: Set[str] = set()
    for call in calls_within(node):
        if isinstance(call.func, cst.Name):
            found.add(call.func.value)
        elif isinstance(call.func, cst.Attribute):
            found.add(call.func.attr.value)
    return found


def _steps_a_distributed_context(structure: TrainingStructure, receiver: str, scope: cst.CSTNode, call: cst.Call) -> bool:
    """`opt.step(context_id)` of a DistributedOptimizer: its argument is the distributed autograd
    context (bound to a DistributedOptimizer here, or the context a
    `dist_autograd.backward(context_id, ...)` of this file names), not a closure."""
    if any(b.qualified_call in names.DISTRIBUTED_OPTIMIZERS for b in structure.bindings_visible(receiver, scope)):
        return True
    if len(call.args) != 1:
        return False
    contexts = {
        dotted_name(h.node.args[0].value) for h in structure.hazards
        if h.kind is HazardKind.DISTRIBUTED_AUTOGRAD and isinstance(h.node, cst.Call) and h.node.args
    }
    return dotted_name(call.args[0].value) in contexts - {None}


def fsdp_precision_policy(call: cst.Call) -> Optional[cst.Arg]:
    """The `mixed_precision=` / `mp_policy=` argument of an FSDP wrap, unless it is `None`."""
    for arg in call.args:
        if (arg.keyword is not None and arg.keyword.value in names.FSDP_POLICY_KEYWORDS
                and not (isinstance(arg.value, cst.Name) and arg.value.value == "None")):
            return arg
    return None


_PRODUCTS = ("torch.mm", "torch.bmm", "torch.matmul")
_TRANSPOSES = {"t", "transpose", "permute"}


def _gram_matrix_operand(node: cst.Call, qualified: Optional[str], method: Optional[str],
                         transposed_name=lambda name: None) -> Optional[str]:
    """The features `f` of `torch.mm(f, f.t())`, `f.bmm(f.transpose(1, 2))`, `torch.matmul(G, G.T)`,
    `f.bmm(f_t)` with `f_t = f.transpose(1, 2)` above (`transposed_name` tells): a matrix times its
    own transpose, either way round; None for any other product (attention's `q @ k.transpose`)."""
    arguments = [a.value for a in node.args if a.keyword is None and not a.star]
    if qualified in _PRODUCTS and len(arguments) == 2:
        left, right = arguments
    elif qualified is None and method in ("mm", "bmm", "matmul") and isinstance(node.func, cst.Attribute) \
            and len(arguments) == 1:
        left, right = node.func.value, arguments[0]
    else:
        return None
    sides = []
    for operand in (left, right):
        base = _transpose_operand(operand)
        if base is None and isinstance(operand, cst.Name):
            base = transposed_name(operand.value)
        sides.append((base, True) if base is not None else (dotted_name(operand), False))
    (left_name, left_transposed), (right_name, right_transposed) = sides
    if left_name is not None and left_name == right_name and left_transposed != right_transposed:
        return left_name
    return None


def _transpose_operand(node: Optional[cst.BaseExpression]) -> Optional[str]:
    """`f` for `f.t()`, `f.transpose(1, 2)`, `f.permute(0, 2, 1)`, `f.T`, `f.mT`; else None."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _TRANSPOSES:
        return dotted_name(node.func.value)
    if isinstance(node, cst.Attribute) and node.attr.value in ("T", "mT"):
        return dotted_name(node.value)
    return None


def describe_mixed_precision_use(structure: TrainingStructure, use: cst.CSTNode) -> str:
    """What a mixed precision use is, for a reason: `torch.amp.GradScaler`, or
    `FullyShardedDataParallel(..., mixed_precision=...)` for FSDP's own policy."""
    target = use.func if isinstance(use, cst.Call) else use
    qualified = structure.imports.resolve(target) or dotted_name(target) or "torch.amp / apex amp"
    policy = fsdp_precision_policy(use) if isinstance(use, cst.Call) else None
    if policy is not None:
        return f"{qualified.rsplit('.', 1)[-1]}(..., {policy.keyword.value}=...), FSDP's own mixed precision policy"
    return qualified


def flat_parameter_fsdp_wraps(s: TrainingStructure) -> List[Hazard]:
    """The FullyShardedDataParallel (FSDP1) wraps of a module: its GradScaler must be ShardedGradScaler."""
    return [h for h in s.hazards if h.kind is HazardKind.FSDP and h.detail in names.FLAT_PARAMETER_FSDP_WRAPPERS]
