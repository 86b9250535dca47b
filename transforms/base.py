"""The contract between the engine and a transform."""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

import libcst as cst

from ampify.findings import Finding
from ampify.options import Options
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.source_facts import SourceFacts

if TYPE_CHECKING:
    from ampify.transforms.torch.inherited_optimizers import InheritedAttribute


class Verdict(str, enum.Enum):
    """What a transform concluded about one module."""

    CONVERTED = "converted"  # the module was rewritten
    NOTHING_TO_DO = "nothing to do"  # the framework is used, but there is no training code here
    ALREADY_MIXED_PRECISION = "already mixed precision"
    NOT_APPLICABLE = "not applicable"  # e.g. TF2/Keras code for the TF1 graph rewrite
    UNCONVERTED = "unconverted"  # training code found, nothing could be converted safely


@dataclass
class TransformResult:
    """A transform's output: the (possibly new) module, its verdict, and its findings."""

    module: cst.Module
    verdict: Verdict
    findings: List[Finding] = field(default_factory=list)
    reason: str = ""
    #: edits of other modules of the project that belong to this change (one change set)
    companions: List["CompanionChange"] = field(default_factory=list)


class ProjectFacts(Protocol):
    """What a transform may ask about the rest of the project its module belongs to (the
    implementation, ampify/repository.py, reads other files; a transform never does)."""

    def star_bound_imports(self) -> Dict[str, str]:
        """Names this module's `from X import *` bind to imports of project modules (`torch`)."""

    def returns_device_moved(self, dotted: str) -> Optional[str]:
        """"utils.py:12 get_network()" when the project function `dotted` (as this module calls
        it) returns a model moved to a device; else None."""

    def penalty_methods_used(self) -> List[str]:
        """"models/Losses.py:206 LogisticGAN.R1Penalty()" for each gradient penalty taken in a
        method of a class of another project module that this module (or one it imports) builds."""

    def returns_parallel_wrapped(self, dotted: str) -> Optional[str]:
        """"models/networks.py:56 init_net()" when the project function `dotted` (as this module
        calls it) returns its model wrapped in DataParallel / DistributedDataParallel; else None."""

    def touches_gradients(self, dotted: str) -> bool:
        """Is `dotted` a function of another project module whose body reads or changes `.grad`?"""

    def module_trains(self, key: str) -> bool:
        """Does the project module `key` call `.backward(...)` itself?"""

    def is_project_package(self, package: str) -> bool:
        """Does `import package` in this module mean a module or package of the project?"""

    def gradient_penalty_function(self, dotted: str) -> Optional[Tuple[str, str, str]]:
        """(key, display, function name) of the project function `dotted` when it runs a gradient
        penalty (see gradient_penalty_called)."""

    def gradient_penalty_called(self, dotted: str) -> Optional[str]:
        """"torchprob/gan/gradient_penalty.py:69" (the autograd.grad call) when the project function
        `dotted` (as this module calls it, also through re-exporting packages) runs
        torch.autograd.grad(..., create_graph=True), itself or through functions of its module."""

    def float16_overflows_imported(self) -> Sequence[str]:
        """"transformer/Modules.py:25 masked_fill(..., -1e9)" for model code of the project modules
        this module imports (directly or through each other) that raises on float16 tensors."""

    def gram_matrix_functions_called(self) -> Sequence[str]:
        """"utils.py:25 gram_matrix()" for the functions of other project modules this module calls
        that compute a Gram matrix of a flattened feature map."""

    def probability_clamps_imported(self) -> Sequence[Tuple[str, str, float]]:
        """("losses.py:49", clamp text, eps) for the probability clamps `clamp(p, lo, 1 - eps)` in the
        project modules this module imports whose complement is logged."""

    def probability_clamp_modules(self, max_eps: float) -> Sequence[Tuple[str, str, bool]]:
        """(key, display, the module trains) for each project module this module imports with a
        probability clamp of eps up to `max_eps`."""

    def gram_matrix_modules(self) -> Sequence[Tuple[str, str, Tuple[str, ...], bool]]:
        """(key, display, function names, the module trains) for each project module with a Gram
        matrix function this module calls."""

    def sigmoid_log_sources(self) -> Sequence[Tuple[str, str, bytes]]:
        """(key, "loss.py", source) for the project modules this module imports that name a sigmoid
        and a log."""

    def probability_models(self) -> Dict[str, str]:
        """The name a model class of another project module is called by here (`Discriminator`,
        `models.Discriminator`) -> "models.py:12 Discriminator", for those whose forward() returns a
        sigmoid's probability."""

    def no_grad_method(self, local: str, method: str) -> bool:
        """Is `method` of the class this module imports from another project module as `local`
        decorated `@torch.no_grad()` there (what it returns carries no gradient)?"""

    def imported_module_sources(self) -> Sequence[Tuple[str, str, bytes]]:
        """(key, "vae.py", source) for the project modules this module imports, directly or not."""

    def gradient_dropping_functions(self) -> Sequence[str]:
        """"ctc/ctc.py:11 _CTC: why" for the custom autograd Functions of this module and the project
        modules it imports whose backward() drops the incoming gradient (and so the loss scale)."""

    def gradient_dropping_imports(self) -> Sequence[Tuple[str, str]]:
        """("train.py:94", "warpctc_pytorch") for imports of bindings whose backward() dropped the
        incoming gradient in some releases, here or in the project modules this module imports."""

    def unsafe_autograd_functions(self) -> Sequence[str]:
        """"op/conv2d_gradfix.py:134 Conv2d: its backward() runs ..." for the custom autograd
        Functions of the project modules this module imports that fail or compute wrong values
        under autocast."""

    def unsafe_autograd_functions_run_beside(self) -> Sequence[str]:
        """The same, for Functions of model code this module's imports do not reach but a script
        that runs it imports (a trainer handed its model by main.py)."""

    def unsafe_autograd_function_modules(self) -> Sequence[Tuple[str, str, Tuple[str, ...], bool]]:
        """(key, display, class names, the module trains) for each project module this module imports
        with custom autograd Functions that break under autocast."""

    def inplace_product_modules(self) -> Sequence[Tuple[str, str, bool]]:
        """(key, display, trains) of the project modules this module imports whose model code runs an
        in-place matrix product (`dist.addmm_(inputs, inputs.t())`, torch/inplace_matmuls.py)."""

    def float16_overflow_modules(self) -> Sequence[Tuple[str, str, bool]]:
        """(key, display, has a training step of its own) of the project modules this module
        imports whose model code has a masked_fill constant beyond float16."""

    def optimizer_method_over_self(self, method: str) -> Optional[str]:
        """"model.py:215 GPT.configure_optimizers()" when every project class defining `method`
        returns a torch.optim optimizer built from its own parameters only; else None."""

    def training_functions_called(self) -> Sequence[Tuple[str, str, str, bool]]:
        """(key, "engine.py:12", "engine.train_one_epoch" as called here, is a class) for each function of
        another project module this module calls that runs a training step, or class with a method that does."""

    def gradients_function(self, dotted: str) -> Optional[Tuple[str, str, str]]:
        """(key, display, function name) of the project function `dotted` of another module when it
        computes tf.gradients and hands them back (applies none, builds no optimizer); else None."""

    def calls_gradients_functions(self) -> bool:
        """Does this module call a function of another project module that hands back tf.gradients?"""

    def tf1_optimizer_classes(self) -> Mapping[str, str]:
        """{"MpiAdamOptimizer": "spinup/utils/mpi_tf.py:36"}: the names this module calls that reach
        a class of another project module subclassing a TF1 optimizer (as this module calls them)."""

    def tf1_optimizer_builders(self) -> Sequence[Tuple[str, str, str]]:
        """(key, "optimization.py:59", "optimization.create_optimizer" as called here) for each
        project function this module calls that builds a TF1 optimizer in its own module."""

    def loss_classes_with_backward(self) -> Sequence[Tuple[str, str, str]]:
        """("loss/loss.py:78", class name, "self.acc_loss") for every project class with a
        backward() of its own that runs `self.<attribute>.backward()` (a loss object)."""

    def tf_gradients_function(self, dotted: str) -> Optional[Tuple[str, str, str]]:
        """(key, display, function name) of the function of another project module that `dotted`
        (as this module calls it) reaches, when it runs tf.gradients; None otherwise."""

    def loss_class_filled_by(self, method: str) -> Union[None, str, Tuple[str, str, str, str]]:
        """(key, "loss/loss.py:78", class name, "self.acc_loss") of the one loss class with a
        backward() of its own (or a subclass of it) that defines `method` (`eval_batch`); None when
        there is none; the reason when several do, or a subclass has its own backward()."""

    def torch_module_imported(self) -> Optional[str]:
        """"models/pix2pix_model.py" when a project module this module imports imports torch."""

    def callers_elsewhere(self, function_name: str) -> Sequence[str]:
        """"main.py:212" for every call of this module's `function_name` in other project files."""

    def call_sites_elsewhere(self, function_name: str, through_registries: bool = False) -> Sequence["CallSite"]:
        """Every call of this module's `function_name` in other project files, to edit them;
        `through_registries`: also `model(...)` in `for model in [GAN, CGAN]:` (a call of each)."""

    def imported_class(self, local: str) -> Optional[Tuple[str, str, str, int, bool]]:
        """(key, "models.py", class name, line, its module trains) for a class of another project
        module that this module binds as `local` (`from models import Discriminator`)."""

    def host_model_class(self, local: str) -> Optional[str]:
        """"model.py:12" for a class of another project module bound here as `local` (by name or a
        star import) whose module names no device or CUDA: what it builds stays on the CPU."""

    def only_inspects_parameter(self, dotted: str, position: Optional[int], keyword: Optional[str],
                                allowed: Sequence[str]) -> bool:
        """Does the project function `dotted` use that argument only through the attributes
        `allowed` or by printing it (a model handed to `utils.print_network(net)`)?"""

    def attribute_spelled_elsewhere(self, class_name: str, attribute: str) -> Optional[str]:
        """"main.py" when a module that may use this module's class spells `.attribute`."""

    def attribute_calls_elsewhere(self, class_name: str, attribute: str, method: str) -> Sequence[str]:
        """"worker.py:49" for every `<name>.attribute.method(` (`<name>` not `self`) in the project
        modules that may use this module's class `class_name` (`global_estimator.optimizer.apply_gradients(...)`)."""

    def inherited_attribute(self, base: str, attribute: str) -> Optional["InheritedAttribute"]:
        """What the project class this module names as `base` does with `self.<attribute>`
        (torch/inherited_optimizers.py); None when `base` is no project class or never sets it."""

    def class_users_elsewhere(self, key: str, name: str) -> Sequence[str]:
        """"test.py" for every other project module (not this one, not `key`) that may use that class."""

    def source_of(self, key: str) -> Optional[bytes]:
        """The bytes of another project module (a CallSite's `key`); None when unreadable."""

    def wrapper_step_methods(self) -> Sequence[str]:
        """Names of the stepping methods of the project's optimizer wrapper classes."""

    def wrapper_step(self, method: str, called: Sequence[str] = ()) -> Optional[Tuple[str, str, Any, bool]]:
        """(key, display, ampify.optimizer_wrappers.WrapperStep, it is one of several) for the
        wrapper class of the project with a stepping method of this name (the one of the classes
        `called` that this module builds, when several have a step()); else None."""

    def wrapper_steps_here(self) -> Sequence[Any]:
        """The stepping methods (WrapperStep) of the wrapper classes of this module."""

    def is_this_module(self, key: str) -> bool:
        """Is `key` the module this view is of?"""

    def in_this_run(self, key: str) -> bool:
        """Did the user name that module (itself or a folder holding it)? Only those are written."""

    def dependency_pins(self) -> Dict[str, Tuple[str, str]]:
        """Package -> (version specifier, "requirements.txt:3") as the project's requirement files pin it."""


@dataclass(frozen=True)
class CallSite:
    """A call in another module of the project: `key` names the module for ProjectFacts,
    `display` for people (`main.py`), line and column where the call starts."""

    key: str
    display: str
    line: int
    column: int


@dataclass
class CompanionChange:
    """An edit of another module that must land together with this module's change (the
    GradScaler created where the optimizer is, passed to the step in this module): both files
    are written as one change set, or neither."""

    key: str
    display: str
    old: bytes
    new: bytes
    #: findings about the other module, with its own line numbers
    findings: List[Finding] = field(default_factory=list)
    #: one line for the other module's report ("changed with engine.py: ...")
    reason: str = ""


@dataclass(frozen=True)
class UnitContext:
    """Where a source unit comes from: its path (for messages) and its project, when known.
    A source given as a string (tests, notebooks) has neither."""

    display: str = "<source>"
    project: Optional[ProjectFacts] = None
    #: the bytes the module handed to `apply` was parsed from (b"" when unknown), for byte
    #: tests that would otherwise regenerate the module's code
    source: bytes = b""
    #: the stdlib `ast` parse of `source` the screen made (None when unknown), for checks that read
    #: the syntax tree without parsing the file again
    tree: Optional[Any] = None


class Transform(abc.ABC):
    """One rewrite, e.g. "wrap TF1 optimizers with the mixed precision graph rewrite"."""

    #: short name used in reports and the registry
    name: str = ""
    #: one line on what it does
    description: str = ""
    #: the target's `x00` rule code (see ampify/rules.py): the engine reports an exception raised
    #: by `apply` with it, leaves the file unchanged and goes on (one policy for every target)
    internal_error_code: str = ""

    @abc.abstractmethod
    def may_apply(self, source: bytes, options: Options) -> bool:
        """Cheapest test, on the raw bytes before any parse: could this file concern us at all?

        A False here means the file is reported as not applicable without a LibCST parse, so
        it must never be False for a file the transform would change or warn about.
        """

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        """Second test, on the names the module uses (stdlib `ast`, no LibCST parse yet).

        False promises more than `may_apply`: the transform would return the module unchanged,
        with no findings and a "not applicable" / "nothing to do" verdict. Only then is the file
        reported as not applicable (with `screened_out_reason`) without a LibCST parse.
        """
        return True

    #: why the file is not applicable when `screen` said no
    screened_out_reason: str = "no training code"

    @abc.abstractmethod
    def concerns(self, imports: ImportMap, options: Options) -> bool:
        """Cheap test: should this transform look at a module with these imports?"""

    @abc.abstractmethod
    def apply(
        self, module: cst.Module, imports: ImportMap, options: Options, context: UnitContext = UnitContext()
    ) -> TransformResult:
        """Rewrite `module`; never raise for unusual code, report it as a finding instead.
        `context.project` answers questions about other modules of the project, when known."""


@dataclass(frozen=True)
class TargetOption:
    """An option a target declares (as LibCST codemod commands declare theirs with `add_args`):
    the Options field it sets, its command-line flag and its `[tool.ampify]` key.

    With `choices` the option takes one of them (`--dtype bfloat16`, `dtype = "bfloat16"`);
    without, it is a switch whose flag turns the field off (`--no-tf-ignore-performance`) and
    whose key is a boolean.
    """

    field: str
    flag: str
    config_key: str
    help: str
    choices: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """One conversion target: a folder under transforms/, one entry in ampify/registry.py.

    Everything ampify needs to know about a target is here: the transform, when it runs, the
    options it declares, the rule codes it owns, how `ampify verify` probes and judges the
    scripts it writes, and where its golden fixtures live.
    """

    name: str
    description: str
    transform: Transform
    #: does the target run for these options (the PyTorch backends exclude each other)?
    runs_when: Callable[[Options], bool]
    options: Tuple[TargetOption, ...]
    #: rule codes it emits start with this (see ampify/rules.py); its `x00` is the internal error
    rule_prefix: str
    #: the verify target (ampify/verify/targets.py) that probes and judges scripts it converted
    verify: str
    #: its golden fixtures: fixtures/<folder>/
    fixtures: str
