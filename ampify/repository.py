"""The repository a converted file belongs to: which files form the project, and what each of
its modules defines and imports, read on demand.

A transform that meets a name defined in another module of the project (`from utils import *`,
`engine.train_one_epoch(...)`, `net = get_network(args)`) asks this index instead of guessing. It
is read-only: ampify writes only what the user named, and says when a needed edit lies outside.

Cost: nothing is read until a transform asks. Each module is then parsed once per process with
the stdlib `ast` parser (about a fifth of a LibCST parse) into a small outline, and cached.
Finding the callers of a function reads the modules of the project that import it, no others.
"""

from __future__ import annotations

import ast
import re
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple, Union

from ampify.transforms.kit.ast_names import ast_dotted as _dotted
from ampify.transforms.tf1.names import is_tf1_optimizer_class
from ampify.transforms.torch.bce_imported import BCE_MARKERS, bce_lines
from ampify.transforms.torch.gram_matrix_functions import gram_matrix_line, torch_names
from ampify.transforms.torch.inherited_optimizers import InheritedAttribute, class_named, inherited_attribute
from ampify.transforms.torch.inplace_matmuls import MARKERS as INPLACE_MARKERS, inplace_product_lines
from ampify.transforms.torch.sigmoid_models import sigmoid_model_classes
from ampify.transforms.torch.probability_clamps import (
    clamp_helpers,
    LOG_OF_COMPLEMENT as _LOG_OF_COMPLEMENT,
    probability_clamps,
)
from ampify.transforms.torch.autograd_functions import (
    gradient_dropping_functions,
    gradient_dropping_imports,
    unsafe_autograd_functions,
)
from ampify.dependency_pins import dependency_pins
from ampify.optimizer_wrappers import WrapperStep, wrapper_steps
from ampify.legacy_syntax import parsed_tree
from ampify.source_io import current_bytes, planned_content
from ampify.transforms.base import CallSite

#: files that mark the root of a project
_ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
#: folders never part of the project's own code
_SKIPPED_FOLDERS = {".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "env", "node_modules", "__pycache__",
                    "site-packages", "build", "dist", ".eggs"}
#: the most modules a caller search reads (a monorepo must not make one refusal slow)
MAX_MODULES_SCANNED = 2000
#: a module larger than this is not outlined (generated code, vendored data)
MAX_OUTLINE_BYTES = 2_000_000
#: star imports followed through at most this many modules
MAX_STAR_DEPTH = 4
#: a module naming any of these may put what it builds on a GPU
_NAMES_A_DEVICE = re.compile(rb"cuda|device|\.to\(|set_default_|DataParallel")
#: project modules followed through imports when looking for model code a training file runs
MAX_IMPORTED_MODULES = 200


@dataclass(frozen=True)
class FunctionOutline:
    """A module-level function (or a method) of the project."""

    name: str
    line: int
    params: Tuple[str, ...]
    #: it returns something moved to a device (`return net.cuda()`, `return model.to(device)`),
    #: or moves its argument or a model it builds (`net.cuda()` / `net = net.to(device)`) and
    #: returns it
    returns_device_moved: bool
    #: in a module that imports tensorflow, it builds an optimizer (`optimizer = tf.train.AdamOptimizer(...)`,
    #: BERT's `AdamWeightDecayOptimizer(...)` in `optimization.create_optimizer`): a TF1 file that
    #: trains through it is converted there
    builds_tf1_optimizer: bool = False
    #: its body calls `.backward(...)`: it runs a training step (a driver handing it the optimizer relies on it)
    calls_backward: bool = False
    #: a class with a training step, outlined as its constructor (`Trainer(model, data, optimizer)`)
    is_class: bool = False
    #: line of a `torch.autograd.grad(..., create_graph=True)` in its body (a gradient penalty), 0 if none
    grad_with_graph: int = 0
    #: the plain names it calls (`_gradient_penalty(...)`), to follow into functions of its module
    local_calls: Tuple[str, ...] = ()
    #: in a module that imports tensorflow, the line of a `tf.gradients(...)` in its body (0 if none):
    #: per-tower gradients a caller of another module may apply
    tf_gradients: int = 0
    #: it calls `.apply_gradients(...)` or `.minimize(...)` itself: what it returns is a train op, not gradients
    applies_gradients: bool = False
    #: the line of a Gram matrix of a flattened feature map in its body (style transfer's
    #: `features.bmm(features_t)`), 0 if none (torch/gram_matrix_functions.py)
    gram_matrix: int = 0
    #: its body reads or changes `.grad` (`m.weight.grad.data.add_(...)`): called between backward()
    #: and the step, it needs the gradients unscaled
    touches_grad: bool = False
    #: the line of a DataParallel / DistributedDataParallel wrap it returns (`net = torch.nn.DataParallel(net,
    #: gpu_ids)` ... `return net`, pix2pix's init_net), 0 if none
    returns_parallel_wrap: int = 0
    #: the module's functions whose result it returns (`return init_net(net, init_type, gpu_ids)`)
    returned_calls: Tuple[str, ...] = ()


def _resolved(path: Path) -> Optional[Path]:
    """`path.resolve()`, or None for a symlink loop (RuntimeError on Python 3.11, OSError later)
    or a path the system refuses to resolve: a repository may hold such links, and the run goes on."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return None


@dataclass(frozen=True)
class Call:
    """A call of a name in a module: `train_one_epoch(...)` or `engine.train_one_epoch(...)`."""

    path: Path
    line: int
    column: int
    #: keyword names and the number of positional arguments, to tell what is passed where
    keywords: Tuple[str, ...]
    positional: int


@dataclass
class ModuleOutline:
    """What one module defines and imports, at module level."""

    path: Path
    functions: Dict[str, FunctionOutline] = field(default_factory=dict)
    classes: Dict[str, int] = field(default_factory=dict)
    #: local name -> (module, imported name or None for `import module`, relative level)
    imports: Dict[str, Tuple[str, Optional[str], int]] = field(default_factory=dict)
    #: `import a.b` without `as`: the calls go through `a.b.function`
    dotted_imports: List[str] = field(default_factory=list)
    #: `from X import *`: (module, relative level)
    star_imports: List[Tuple[str, int]] = field(default_factory=list)
    #: `__all__` when the module declares it as a literal list/tuple of strings
    exported: Optional[Tuple[str, ...]] = None
    #: calls by the dotted name they are made through (`train_one_epoch`, `engine.train_one_epoch`)
    calls: Dict[str, List[Call]] = field(default_factory=dict)
    #: (line, value) of `masked_fill(mask, -1e9)` with a constant beyond the float16 range, in
    #: model code: a method of a class, or a module-level function such a method calls
    float16_overflows: List[Tuple[int, str]] = field(default_factory=list)
    #: the module calls `.backward(...)`: it has a training step of its own
    trains: bool = False
    #: calls through a registry: `models = [GAN, CGAN]` ... `for model in models: model(sess, ...)`
    #: is a call of GAN and of CGAN (kept apart: only some questions may follow them)
    registry_calls: Dict[str, List[Call]] = field(default_factory=dict)
    #: the module names a mixed precision API (autocast, GradScaler, apex's scale_loss)
    mixed_precision: bool = False
    #: classes with a method that calls `.backward(...)` (a trainer: `Trainer(model, data, optimizer)`),
    #: outlined as their constructor: its parameters, and calls_backward set
    training_classes: Dict[str, FunctionOutline] = field(default_factory=dict)
    #: loss classes with a backward() of their own that runs `self.<attribute>.backward()`
    #: (pytorch-seq2seq's Loss): class -> (line of that method, "self.acc_loss")
    loss_backwards: Dict[str, Tuple[int, str]] = field(default_factory=dict)
    #: every module-level class: name -> (its bases by their last name, its method names), to
    #: follow a loss class's subclasses across the project
    class_shapes: Dict[str, Tuple[Tuple[str, ...], FrozenSet[str]]] = field(default_factory=dict)
    #: folders the module puts on sys.path at import time (`_init_paths.py`:
    #: `sys.path.insert(0, osp.join(osp.dirname(__file__), '..', 'lib'))`), as far as they can be
    #: computed without running it
    sys_path_additions: List[Path] = field(default_factory=list)
    #: (line, class, why) of torch.autograd.Function subclasses that fail or compute wrong values
    #: under autocast (autograd_functions.py)
    unsafe_autograd_functions: List[Tuple[int, str, str]] = field(default_factory=list)
    #: (line, class, why) of Functions whose backward() drops the incoming gradient, and (line,
    #: package) of imports of bindings that did so in some releases (autograd_functions.py)
    gradient_dropping_functions: List[Tuple[int, str, str]] = field(default_factory=list)
    gradient_dropping_imports: List[Tuple[int, str]] = field(default_factory=list)
    #: (line, clamp, eps) of probability clamps `clamp(p, lo, 1 - eps)` whose complement the same
    #: function takes the log of (torch/probability_clamps.py)
    probability_clamps: List[Tuple[int, str, float]] = field(default_factory=list)
    #: (line of the backward(), "Class.forward") for classes whose forward() or __call__() runs a
    #: backward() and an optimizer step of its own (EDSR's adversarial loss updating its
    #: discriminator each time the loss is computed)
    trains_when_called: List[Tuple[int, str]] = field(default_factory=list)
    #: (line of the backward(), "Class.method") for the public methods (other than forward and
    #: __call__) of a class that run a backward() and an optimizer step, themselves or through
    #: the class's own methods (DARTS' `Architect.step()` updating the architecture): a trainer
    #: that a script using the class runs by calling it
    trainer_methods: List[Tuple[int, str]] = field(default_factory=list)
    #: model classes whose forward() returns a sigmoid's probability: class -> line
    #: (torch/sigmoid_models.py)
    sigmoid_models: Dict[str, int] = field(default_factory=dict)
    #: (line of the Gram matrix, "Class.method") for methods of module-level classes that compute a
    #: Gram matrix of a flattened feature map (MSG-Net's `GramMatrix.forward`): model code the
    #: training files importing this module run (gram_matrix_functions.py)
    gram_matrix_methods: List[Tuple[int, str]] = field(default_factory=list)
    #: the module names a sigmoid and a log (bytes): it may take the log of a sigmoid's probability,
    #: which a training file importing it would run under autocast (kit/log_of_sigmoid.py)
    may_log_a_sigmoid: bool = False
    #: lines of in-place matrix products (`dist.addmm_(inputs, inputs.t())`) in forward() methods of
    #: its classes, which raise under autocast on a float32 receiver (torch/inplace_matmuls.py)
    inplace_products: List[int] = field(default_factory=list)
    #: (line, "F.binary_cross_entropy", (class, method) or (function,)) of the BCE losses on
    #: probabilities its functions and methods compute, which autocast refuses (torch/bce_imported.py)
    bce_calls: List[Tuple[int, str, Tuple[str, ...]]] = field(default_factory=list)
    #: (line of the torch.autograd.grad(..., create_graph=True), "Class.method") for methods of
    #: module-level classes that take a gradient penalty (StyleGAN.pytorch's LogisticGAN.R1Penalty)
    penalty_methods: List[Tuple[int, str]] = field(default_factory=list)
    #: module-level classes with no base (or `object`) whose step() reads no `.grad` and steps
    #: nothing: an average of the weights named like an optimizer (self-ensemble's
    #: `EMAWeightOptimizer`, MixMatch's `WeightEMA`), no optimizer for a GradScaler to step
    weight_averages: FrozenSet[str] = frozenset()
    #: module-level class -> its methods decorated `@torch.no_grad()` (or `inference_mode`):
    #: what they return carries no gradient (stylegan2's `AdaptiveAugment.tune`)
    no_grad_methods: Dict[str, FrozenSet[str]] = field(default_factory=dict)
    #: packages whose modules it imports by a name computed at run time:
    #: `importlib.import_module("models.{}".format(name))` (CornerNet's nnet/py_factory.py) -> "models"
    dynamic_imports: List[str] = field(default_factory=list)
    #: imports inside its functions and methods (module, imported name or None, relative level):
    #: DB's `SegDetectorModel.__init__` runs `from decoders.seg_detector_loss import ...`, whose
    #: losses its training step computes; followed for the closure, never bound as module names
    local_imports: List[Tuple[str, Optional[str], int]] = field(default_factory=list)
    #: the module takes `log(1 - ...)` (bytes): a clamp helper of the project may feed it
    logs_complement: bool = False
    #: (line, clamp, eps) of module-level functions returning a probability clamp, in a module that
    #: takes no `log(1 - ...)` itself (torch/probability_clamps.py clamp_helpers)
    clamp_helpers: List[Tuple[int, str, float]] = field(default_factory=list)

    def exports(self, name: str) -> bool:
        """Would `from this_module import *` bind `name`?"""
        if self.exported is not None:
            return name in self.exported
        return not name.startswith("_")


def find_root(path: Path) -> Path:
    """The project a file or folder belongs to: the nearest folder at or above it with a
    `.git`, `pyproject.toml`, `setup.py` or `setup.cfg`; else, for a file, the folder above the
    packages (folders with an `__init__.py`) that hold it, where `python main.py` imports them
    from (a download without its `.git`: ncsn's `runners/scorenet_runner.py` imports
    `losses.sliced_sm`); else the folder itself."""
    path = path.resolve()
    if path.is_dir():
        return _root_of_folder(path)
    root = _root_of_folder(path.parent)
    return _above_the_packages(root) if root == path.parent else root


@functools.lru_cache(maxsize=4096)
def _root_of_folder(start: Path) -> Path:
    # cached per folder: every file of a run asks, and most share their folder
    for folder in [start, *start.parents]:
        if any((folder / marker).exists() for marker in _ROOT_MARKERS):
            return folder
    return start


#: files that mark the top of a repository checked out without .git or packaging metadata
_TOP_FILES = ("README.md", "README.rst", "README", "README.txt", "requirements.txt", "LICENSE", "LICENSE.txt")


@functools.lru_cache(maxsize=4096)
def _above_the_packages(start: Path) -> Path:
    """The folder that imports the packages holding `start` (at most four levels up, never above
    a folder with a README, requirements.txt or LICENSE: a repository with an __init__.py at its
    top is still its own root)."""
    folder = start
    for _ in range(4):
        if not (folder / "__init__.py").is_file() or folder.parent == folder \
                or any((folder / name).is_file() for name in _TOP_FILES):
            break
        folder = folder.parent
    return folder


class RepositoryIndex:
    """The modules of one project, outlined on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        #: path -> ((mtime_ns, size) when read, its outline)
        self._outlines: Dict[Path, Tuple[Optional[tuple], Optional[ModuleOutline]]] = {}
        self._optimizer_methods: Dict[Tuple[Path, str], List[Tuple[str, int, bool]]] = {}
        self._closures: Dict[Path, List[Path]] = {}
        self._all_modules: Optional[List[Path]] = None
        self._wrapper_steps: Optional[List[WrapperStep]] = None
        self._definitions: Dict[str, int] = {}
        self._search_roots: Dict[Path, List[Path]] = {}
        self._unsafe_holders: Optional[Dict[Path, ModuleOutline]] = None
        self._training_when_called: Optional[Dict[Path, ModuleOutline]] = None
        self._init_paths: Optional[List[Path]] = None
        self._trainer_subclassers: Dict[Path, List[Path]] = {}

    # ---- where modules are -------------------------------------------------------------------

    def search_roots(self, importer: Path) -> List[Path]:
        """What `sys.path` holds for the project's own modules when `python importer` runs:
        the folders the importer, or a module of its own folder it imports first (the
        `import _init_paths` of detection and pose repositories), puts there; the script's
        folder; then the root and a `src/` layout."""
        importer = importer.resolve()
        cached = self._search_roots.get(importer)
        if cached is not None:
            return cached
        folder = importer.parent
        roots = self._sys_path_additions(importer) + [folder, self.root, self.root / "src"] + self._init_paths_roots()
        unique: List[Path] = []
        for root in roots:
            if root not in unique and root.is_dir() and self._inside(root):
                unique.append(root)
        self._search_roots[importer] = unique
        return unique

    def _init_paths_roots(self) -> List[Path]:
        """The folders the project's `_init_paths.py` modules put on sys.path (FairMOT's
        src/_init_paths.py adds src/lib): every entry script imports one first, so a module under
        lib/ imports its siblings from there whoever runs it; searched last."""
        if self._init_paths is None:
            self._init_paths = []
            for path in self.modules():
                if path.name == "_init_paths.py":
                    outline = self.outline(path)
                    if outline is not None:
                        self._init_paths += [p for p in outline.sys_path_additions if p not in self._init_paths]
        return self._init_paths

    def _sys_path_additions(self, importer: Path) -> List[Path]:
        """The folders `importer` adds to sys.path itself, or through a module of its own folder
        that it imports by a plain `import name` (`import _init_paths`)."""
        outline = self.outline(importer)
        if outline is None:
            return []
        added = list(outline.sys_path_additions)
        for local, (module, name, level) in outline.imports.items():
            if name is not None or level or "." in module:
                continue
            sibling = _resolved(importer.parent / f"{module}.py")
            if sibling is not None and sibling != importer and sibling.is_file():
                helper = self.outline(sibling)
                if helper is not None:
                    added += helper.sys_path_additions
        return added

    def resolve_module(self, importer: Path, module: str, level: int = 0,
                       entry_roots: Sequence[Path] = ()) -> Optional[Path]:
        """The project file `import module` (or `from .module import`) means in `importer`;
        None for anything outside the project (torch, numpy) or not found. `entry_roots`: the
        sys.path folders of the script that imports `importer`, searched after its own."""
        if level > 0:
            base = importer.resolve().parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        else:
            own = self.search_roots(importer)
            bases = own + [root for root in entry_roots if root not in own]
        parts = [part for part in module.split(".") if part]
        for base in bases:
            candidate = base.joinpath(*parts) if parts else base
            for path in (candidate.with_suffix(".py") if parts else None, candidate / "__init__.py"):
                if path is not None and path.is_file() and self._inside(path):
                    return _resolved(path)
        return None

    def namespace_package(self, root: Path, package: str) -> bool:
        """Is `root/package` a folder of the project holding Python modules (imported as a
        namespace package, with no `__init__.py`)?"""
        folder = root.joinpath(*package.split("."))
        if not folder.is_dir() or not self._inside(folder):
            return False
        try:
            return any(entry.suffix == ".py" for entry in folder.iterdir())
        except OSError:
            return False

    def _inside(self, path: Path) -> bool:
        resolved = _resolved(path)
        if resolved is None:
            return False
        try:
            resolved.relative_to(self.root)
        except ValueError:
            return False
        return True

    def modules(self) -> List[Path]:
        """Every Python file of the project (bounded by MAX_MODULES_SCANNED)."""
        if self._all_modules is None:
            found: List[Path] = []
            for folder, folders, files in os.walk(self.root):
                folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
                found.extend(Path(folder) / name for name in sorted(files) if name.endswith(".py"))
                if len(found) >= MAX_MODULES_SCANNED:
                    break
            # a link that loops (`loop.py -> loop.py`) or dangles names no module: skipped
            resolved = (_resolved(path) for path in found[:MAX_MODULES_SCANNED])
            self._all_modules = [path for path in resolved if path is not None]
        return self._all_modules

    # ---- what modules hold -------------------------------------------------------------------

    def outline(self, path: Path) -> Optional[ModuleOutline]:
        """The module's outline; None when it cannot be read or parsed."""
        path = path.resolve()
        try:
            stamp = path.stat()
            planned = planned_content(path)
            version = (stamp.st_mtime_ns, stamp.st_size, hash(planned) if planned is not None else None)
        except OSError:
            version = None
        cached = self._outlines.get(path)
        if cached is None or cached[0] != version:
            # a change set of this run may have rewritten the module since (main.py given the
            # Session config for one model module, then asked again for the next): read it anew
            if cached is not None:
                self._closures.clear()
            cached = self._outlines[path] = (version, _outline(path))
        return cached[1]

    def modules_training_when_called(self) -> Dict[Path, ModuleOutline]:
        """The project modules with a class whose forward() or __call__() trains (a backward()
        and an optimizer step), read once per run (EDSR's loss/adversarial.py; most have none)."""
        if self._training_when_called is None:
            self._training_when_called = {}
            for path in self.modules():
                try:  # a byte test first: most modules of a large tree are never outlined
                    data = current_bytes(path)
                except OSError:
                    continue
                if b".backward(" not in data or b".step(" not in data or (
                        b"def forward(" not in data and b"def __call__(" not in data):
                    continue
                outline = self.outline(path)
                if outline is not None and outline.trains_when_called:
                    self._training_when_called[path] = outline
        return self._training_when_called

    def unsafe_function_holders(self) -> Dict[Path, ModuleOutline]:
        """The project modules defining custom autograd Functions that break under autocast, read
        once per run (a repository has few, most have none)."""
        if self._unsafe_holders is None:
            self._unsafe_holders = {}
            for path in self.modules():
                outline = self.outline(path)
                if outline is not None and outline.unsafe_autograd_functions:
                    self._unsafe_holders[path] = outline
        return self._unsafe_holders

    def imported_closure(self, start: Path) -> List[Path]:
        """The project modules `start` imports, directly or through each other (bounded by
        MAX_IMPORTED_MODULES), in the order they are reached."""
        key = start.resolve()
        if key in self._closures:
            return self._closures[key]
        seen = {key}
        order: List[Path] = []
        queue = [key]
        # what the entry module puts on sys.path (`import _init_paths` adding lib/) holds for every
        # module it imports afterwards: faster-rcnn's lib/model/faster_rcnn/vgg16.py imports
        # `model.faster_rcnn.faster_rcnn` from lib/
        entry_roots = tuple(self.search_roots(key))
        while queue and len(order) < MAX_IMPORTED_MODULES:
            path = queue.pop(0)
            outline = self.outline(path)
            if outline is None:
                continue
            for target in self.import_targets(path, outline, entry_roots):
                if target is not None and target not in seen:
                    seen.add(target)
                    order.append(target)
                    queue.append(target)
        self._closures[key] = order
        return order

    def trainer_subclass_modules(self, path: Path) -> List[Path]:
        """Modules of `path`'s own folder that subclass a class of `path` whose methods train (a
        trainer base class, FairMOT's trains/base_trainer.py and trains/mot.py): their overrides (the
        loss, the forward pass) run in its training step. Only the folder is searched: that is where
        such subclasses sit, and a search of the whole project per module would cost a parse of
        every file."""
        path = path.resolve()
        cached = self._trainer_subclassers.get(path)
        if cached is not None:
            return cached
        outline = self.outline(path)
        found: List[Path] = []
        if outline is not None and outline.training_classes:
            spelled = [name.encode() for name in outline.training_classes]
            for sibling in sorted(path.parent.glob("*.py")):
                resolved = _resolved(sibling)
                if resolved is None or resolved == path:
                    continue
                try:
                    if not any(name in current_bytes(resolved) for name in spelled):
                        continue  # a byte test before any parse: most siblings never name the class
                except OSError:
                    continue
                shapes = self.outline(resolved)
                if shapes is None or not any(name in bases for name in outline.training_classes
                                             for bases, _ in shapes.class_shapes.values()):
                    continue
                if any(target == path for target in self.import_targets(resolved, shapes)):
                    found.append(resolved)
        self._trainer_subclassers[path] = found
        return found

    def import_targets(self, path: Path, outline: ModuleOutline,
                       entry_roots: Sequence[Path] = ()) -> List[Optional[Path]]:
        """The project modules the module at `path` imports by name (None where an import is not
        a project module), in the order its imports are written. `entry_roots`: what the script
        that imported it put on sys.path, searched after the module's own roots."""
        targets: List[Optional[Path]] = []
        for local, (module, name, level) in outline.imports.items():
            targets.append(self.resolve_module(path, module, level, entry_roots))
            if name is not None:  # `from pkg import module`
                targets.append(self.resolve_module(path, f"{module}.{name}" if module else name, level, entry_roots))
        targets += [self.resolve_module(path, module, level, entry_roots) for module, level in outline.star_imports]
        # `import structure.model` binds `structure`, and imports structure/model.py too (DB's
        # structure/builder.py reaches its model classes so: `getattr(structure.model, name)`)
        targets += [self.resolve_module(path, dotted, 0, entry_roots) for dotted in outline.dotted_imports]
        for module, name, level in outline.local_imports:
            targets.append(self.resolve_module(path, module, level, entry_roots))
            if name is not None:
                targets.append(self.resolve_module(path, f"{module}.{name}" if module else name, level, entry_roots))
        for package in outline.dynamic_imports:
            # a module of the package picked at run time: any of them may be the one
            init = self.resolve_module(path, package, 0, entry_roots)
            if init is not None and init.name == "__init__.py":
                targets += sorted(resolved for module in init.parent.glob("*.py") if module.name != "__init__.py"
                                  and (resolved := _resolved(module)) is not None)
        return targets

    def wrapper_steps(self) -> List[WrapperStep]:
        """The stepping methods of every optimizer wrapper class of the project (read once, and
        only when a training file calls a method ampify does not know after its backward)."""
        if self._wrapper_steps is None:
            found: List[WrapperStep] = []
            for path in self.modules():
                try:
                    data = current_bytes(path) if path.stat().st_size <= MAX_OUTLINE_BYTES else b""
                except OSError:
                    continue
                found += wrapper_steps(path, data)
            self._wrapper_steps = found
        return self._wrapper_steps

    def definitions(self, name: str) -> int:
        """How many `def <name>(` the project's modules hold (read as bytes, once per name)."""
        if name not in self._definitions:
            marker = f"def {name}(".encode()
            count = 0
            for path in self.modules():
                try:
                    count += current_bytes(path).count(marker)
                except OSError:
                    continue
            self._definitions[name] = count
        return self._definitions[name]

    def optimizer_methods(self, path: Path, method: str) -> List[Tuple[str, int, bool]]:
        """(class, line, builds its optimizer from self's parameters only) for every class of the
        module that defines `method`. Read only when asked (a rare
        question: outlines stay as cheap as they were), and only in files that define `method`."""
        key = (path.resolve(), method)
        if key not in self._optimizer_methods:
            self._optimizer_methods[key] = _optimizer_methods(path, method, self.outline(path))
        return self._optimizer_methods[key]

    def star_bound_imports(self, importer: Path, star_imports: Sequence[Tuple[str, int]]) -> Dict[str, str]:
        """Local name -> qualified import name for the names the star imports of `importer`
        bind to imports of their modules (`from utils import *` where utils does `import torch`
        binds `torch`), followed through the project's own modules only."""
        bound: Dict[str, str] = {}
        self._collect_star_imports(importer, star_imports, bound, set(), 0)
        return bound

    def _collect_star_imports(self, importer, star_imports, bound, seen, depth) -> None:
        if depth >= MAX_STAR_DEPTH:
            return
        for module, level in star_imports:
            path = self.resolve_module(importer, module, level)
            if path is None or path in seen:
                continue
            seen.add(path)
            outline = self.outline(path)
            if outline is None:
                continue
            for local, (imported, name, import_level) in outline.imports.items():
                if import_level == 0 and outline.exports(local) and local not in bound:
                    bound[local] = f"{imported}.{name}" if name else imported
            self._collect_star_imports(path, outline.star_imports, bound, seen, depth + 1)

    def star_imported_class(self, importer: Path, star_imports: Sequence[Tuple[str, int]],
                            name: str) -> Optional[Tuple[Path, str, int]]:
        """(module, class name, line) for the class `name` that the star imports of `importer`
        (`from model import *`) bind, defined in one of the project's own modules; None otherwise."""
        seen: Set[Path] = set()
        pending = [(importer, list(star_imports), 0)]
        while pending:
            here, stars, depth = pending.pop(0)
            if depth >= MAX_STAR_DEPTH:
                continue
            for module, level in stars:
                path = self.resolve_module(here, module, level)
                if path is None or path in seen:
                    continue
                seen.add(path)
                outline = self.outline(path)
                if outline is None or not outline.exports(name):
                    continue
                if name in outline.classes:
                    return path, name, outline.classes[name]
                pending.append((path, list(outline.star_imports), depth + 1))
        return None

    def function(self, importer: Path, dotted: str, imports: Dict[str, Tuple[str, Optional[str], int]],
                 trainer_classes: bool = False) -> Optional[Tuple[Path, FunctionOutline]]:
        """The project function a dotted call name reaches from `importer`, given its imports:
        `get_network` (from utils import get_network) or `utils.get_network` (import utils).
        `trainer_classes`: a class with a training step counts too (outlined as its constructor)."""
        target = self._module_and_name(importer, dotted, imports)
        if target is None:
            return None
        path, function_name = target
        outline = self.outline(path) if path is not None else None
        if outline is None:
            return None
        if function_name in outline.functions:
            return path, outline.functions[function_name]
        if trainer_classes and function_name in outline.training_classes:
            return path, outline.training_classes[function_name]
        return None

    def tf1_optimizer_class_line(self, path: Path, name: str, depth: int = 0) -> Optional[int]:
        """The line of class `name` of the module at `path` when it subclasses a TF1 optimizer
        (`class MpiAdamOptimizer(tf.train.AdamOptimizer)`, also through classes of its module) in
        a module that imports tensorflow and not torch; else None."""
        outline = self.outline(path)
        if outline is None or name not in outline.class_shapes or depth > 5:
            return None
        modules = {module.split(".")[0] for module, _, _ in outline.imports.values()}
        if "tensorflow" not in modules or "torch" in modules:
            return None
        bases, _ = outline.class_shapes[name]
        for base in bases:
            if is_tf1_optimizer_class(f"tensorflow.train.{base}") or (
                    base != name and self.tf1_optimizer_class_line(path, base, depth + 1) is not None):
                return outline.classes[name]
        return None

    def defining_function(self, importer: Path, dotted: str,
                          imports: Dict[str, Tuple[str, Optional[str], int]]) -> Optional[Tuple[Path, FunctionOutline]]:
        """As `function`, also through packages that re-export the function (`import torchprob as
        gan; gan.gradient_penalty(...)`, torchprob/__init__.py: `from torchprob.gan import *`)."""
        target = self._module_and_name(importer, dotted, imports)
        if target is not None:
            return self._reexported_function(importer, target[0], target[1], set(), 0)
        return self._star_imported_function(importer, dotted)

    def _star_imported_function(self, importer: Path, name: str) -> Optional[Tuple[Path, FunctionOutline]]:
        """The function of another project module that a plain name of `importer` binds through
        its star imports (ncsn's toy_runner.py: `from losses.sliced_sm import *`, then
        `sliced_score_estimation_vr(...)`); None when the importer defines the name itself."""
        outline = self.outline(importer)
        if outline is None or not outline.star_imports or "." in name or name in outline.functions \
                or name in outline.classes:
            return None
        for module, level in outline.star_imports:
            found = self._reexported_function(importer, self.resolve_module(importer, module, level), name, set(), 0)
            if found is not None and found[0] != importer.resolve():
                return found
        return None

    def _module_and_name(self, importer: Path, dotted: str, imports: Dict[str, Tuple[str, Optional[str], int]]
                         ) -> Optional[Tuple[Optional[Path], str]]:
        """(module path or None, name in it) that a dotted call name of `importer` reaches."""
        head, _, rest = dotted.partition(".")
        if head not in imports:
            return None
        module, name, level = imports[head]
        if name is None:  # `import utils` (or `import pkg.utils as utils`): rest is the function
            if not rest or "." in rest:
                return None
            return self.resolve_module(importer, module, level), rest
        if not rest:  # `from utils import get_network`
            return self.resolve_module(importer, module, level), name
        if "." not in rest:  # `from pkg import utils`; utils.get_network
            return self.resolve_module(importer, f"{module}.{name}" if module else name, level), rest
        return None

    def _reexported_function(self, importer: Path, path: Optional[Path], name: str, seen: Set[Path],
                             depth: int) -> Optional[Tuple[Path, FunctionOutline]]:
        if path is None or path in seen or depth > MAX_STAR_DEPTH:
            return None
        seen.add(path)
        outline = self.outline(path)
        if outline is None:
            return None
        if name in outline.functions:
            return path, outline.functions[name]

        def resolve(module: str, level: int) -> Optional[Path]:
            # an absolute import of the package resolves as the running script sees it (its
            # folder is on sys.path), then from the package's own place
            if level > 0:
                return self.resolve_module(path, module, level)
            return self.resolve_module(importer, module, 0) or self.resolve_module(path, module, 0)

        if name in outline.imports:
            module, imported, level = outline.imports[name]
            if imported is None:
                return None
            return self._reexported_function(importer, resolve(module, level), imported, seen, depth + 1)
        for module, level in outline.star_imports:
            found = self._reexported_function(importer, resolve(module, level), name, seen, depth + 1)
            if found is not None:
                return found
        return None

    def gradient_penalty_line(self, path: Path, function: FunctionOutline) -> int:
        """The line of `torch.autograd.grad(..., create_graph=True)` that `function` of module `path`
        runs, itself or through the functions of its module it calls by name; 0 if none."""
        outline = self.outline(path)
        pending, seen = [function], set()
        while pending:
            current = pending.pop()
            if current.name in seen:
                continue
            seen.add(current.name)
            if current.grad_with_graph:
                return current.grad_with_graph
            if outline is not None:
                pending.extend(outline.functions[name] for name in current.local_calls if name in outline.functions)
        return 0

    def project_class(self, importer: Path, local: str,
                      imports: Dict[str, Tuple[str, Optional[str], int]]) -> Optional[Tuple[Path, str, int]]:
        """(module, class name, line) for a class of another project module that `importer` binds
        by `from module import Class` (or `as local`); None otherwise."""
        if local not in imports:
            return None
        module, name, level = imports[local]
        if name is None:
            return None
        path = self.resolve_module(importer, module, level)
        outline = self.outline(path) if path is not None else None
        for _ in range(MAX_STAR_DEPTH):
            # a package that re-exports it (`models/__init__.py`: `from .dcgan import Discriminator`,
            # or pytorch-template's `base/__init__.py`: `from .base_trainer import *`)
            if outline is not None and name not in outline.classes and name not in outline.imports \
                    and outline.star_imports and path is not None:
                found = self.star_imported_class(path, outline.star_imports, name)
                if found is None or found[0] == importer.resolve():
                    return None
                return found
            if outline is None or name in outline.classes or name not in outline.imports:
                break
            module, imported, level = outline.imports[name]
            if imported is None:
                return None
            path = self.resolve_module(path, module, level)
            outline = self.outline(path) if path is not None else None
            name = imported
        if outline is None or name not in outline.classes or path == importer.resolve():
            return None
        return path, name, outline.classes[name]

    def module_class(self, importer: Path, dotted: str,
                     imports: Dict[str, Tuple[str, Optional[str], int]]) -> Optional[Tuple[Path, str, int]]:
        """(module, class name, line) for `module.Class` where `importer` binds `module` by `import
        module` (or `import package.module as module`) to a project module defining Class."""
        head, _, name = dotted.rpartition(".")
        if head not in imports or "." in name:
            return None
        module, imported, level = imports[head]
        if imported is not None:
            return None
        path = self.resolve_module(importer, module, level)
        outline = self.outline(path) if path is not None else None
        if outline is None or name not in outline.classes or path == importer.resolve():
            return None
        return path, name, outline.classes[name]

    def users_of(self, defining: Path, name: str, besides: Sequence[Path]) -> List[Path]:
        """Project modules other than `defining` and `besides` that may use `defining`'s `name`:
        they import it (or its module, or a module re-exporting it) and spell the name."""
        defining = defining.resolve()
        skipped = {defining} | {p.resolve() for p in besides}
        exposures = self.exposures(defining, name)
        found: List[Path] = []
        for path in self.modules():
            if path in skipped:
                continue
            outline = self.outline(path)
            if outline is None:
                continue
            if any(module == path for module, _ in exposures):
                if not _only_reexports(path, [exposed for module, exposed in exposures if module == path]):
                    found.append(path)  # a module re-exporting it that also uses it
                continue  # a package that only re-exports it: its users are found through it
            if not any(self._names_reaching(path, outline, module, exposed) for module, exposed in exposures):
                continue
            try:
                spelled = name.encode() in current_bytes(path)
            except OSError:
                spelled = True
            if spelled:
                found.append(path)
        return found

    def callers(self, defining: Path, function_name: str, through_registries: bool = False) -> Iterator[Call]:
        """Calls of `function_name` of module `defining` anywhere else in the project, through
        `from module import function`, `import module` / `module.function`,
        `from package import module` / `module.function` or `from module import *`, also where a
        package re-exports it (`utils/__init__.py`: `from .train_utils import train`)."""
        defining = defining.resolve()
        exposures = self.exposures(defining, function_name)
        seen: Set[Tuple[Path, int, int]] = set()
        for path in self.modules():
            if path == defining:
                continue
            outline = self.outline(path)
            if outline is None:
                continue
            for module, name in exposures:
                if module == path:
                    continue
                for called in self._names_reaching(path, outline, module, name):
                    found = outline.calls.get(called, [])
                    if through_registries:
                        found = found + outline.registry_calls.get(called, [])
                    for call in found:
                        if (call.path, call.line, call.column) not in seen:
                            seen.add((call.path, call.line, call.column))
                            yield call

    def exposures(self, defining: Path, function_name: str) -> List[Tuple[Path, str]]:
        """(module, name) for every module of the project that binds the function at module
        level: the one defining it, and those re-exporting it (`from .train_utils import train`,
        `from .train_utils import *`), followed through re-exports of re-exports."""
        found: List[Tuple[Path, str]] = [(defining.resolve(), function_name)]
        frontier = list(found)
        for _ in range(MAX_STAR_DEPTH):
            reached: List[Tuple[Path, str]] = []
            for path in self.modules():
                outline = self.outline(path)
                if outline is None:
                    continue
                for target, name in frontier:
                    if path == target:
                        continue
                    for local in self._rebinding(path, outline, target, name):
                        if (path, local) not in found and (path, local) not in reached:
                            reached.append((path, local))
            if not reached:
                break
            found += reached
            frontier = reached
        return found

    def _rebinding(self, path: Path, outline: ModuleOutline, target: Path, name: str) -> List[str]:
        """The module-level names `path` binds to `target.name` by importing it."""
        bound = [local for local, (module, imported, level) in outline.imports.items()
                 if imported == name and local not in outline.functions
                 and self.resolve_module(path, module, level) == target]
        target_outline = self.outline(target)
        if (name not in outline.functions and name not in outline.imports and target_outline is not None
                and target_outline.exports(name)
                and any(self.resolve_module(path, module, level) == target for module, level in outline.star_imports)):
            bound.append(name)
        return bound

    def _names_reaching(self, path: Path, outline: ModuleOutline, defining: Path, function_name: str) -> List[str]:
        names = []
        for local, (module, name, level) in outline.imports.items():
            if name is None:
                if self.resolve_module(path, module, level) == defining:
                    names.append(f"{local}.{function_name}")
            elif name == function_name and self.resolve_module(path, module, level) == defining:
                names.append(local)
            elif self.resolve_module(path, f"{module}.{name}" if module else name, level) == defining:
                names.append(f"{local}.{function_name}")
        for module in outline.dotted_imports:
            if self.resolve_module(path, module) == defining:
                names.append(f"{module}.{function_name}")
        names += [name for name in self._rebinding(path, outline, defining, function_name)
                  if name not in outline.imports]
        return names


def _in_a_package_of(path: Path, folder: Path) -> bool:
    """Is `path` a module of a package inside `folder` (`folder/loss/adversarial.py` with
    `folder/loss/__init__.py`), importable by a script of `folder`?"""
    if folder not in path.parents or path.parent == folder:
        return False
    package = path.parent
    while package != folder:
        if not (package / "__init__.py").is_file():
            return False
        package = package.parent
    return True


def _only_reexports(path: Path, names: Sequence[str]) -> bool:
    """Does the module spell `names` only in its imports (`from .dcgan import Discriminator` in a
    package's `__init__.py`) and in `__all__`, never using them?"""
    try:
        tree = parsed_tree(current_bytes(path))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return False
    wanted = set(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in wanted:
            return False
        if isinstance(node, ast.Attribute) and node.attr in wanted:
            return False
    return True


def _outline(path: Path) -> Optional[ModuleOutline]:
    try:
        if path.stat().st_size > MAX_OUTLINE_BYTES:
            return None
        data = current_bytes(path)
        tree = parsed_tree(data, filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    outline = ModuleOutline(path)
    tensorflow = b"tensorflow" in data
    # a Gram matrix needs a product and a flattening view/reshape (gram_matrix_functions.py)
    products = ((b"mm(" in data or b"matmul(" in data or b"@" in data) and (b"view(" in data or b"reshape(" in data)
                and (b"transpose(" in data or b".t()" in data or b".T" in data or b"permute(" in data or b".mT" in data))
    lines = data.split(b"\n") if products else []
    gram_names = torch_names(tree) if products else None
    outline.mixed_precision = any(marker in data for marker in (b"autocast", b"GradScaler", b"scale_loss"))
    module_level = set()
    for statement in _module_level(tree.body):
        module_level.add(id(statement))
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            outline.functions[statement.name] = _function_outline(
                statement, tensorflow, gram_names if products and _may_hold_a_gram_matrix(lines, statement) else None)
        elif isinstance(statement, ast.ClassDef):
            outline.classes[statement.name] = statement.lineno
            if products:
                outline.gram_matrix_methods += _gram_matrix_methods(statement, lines, gram_names)
            trainer = _training_class_outline(statement)
            if trainer is not None:
                outline.training_classes[statement.name] = trainer
                outline.trains_when_called += _training_call_methods(statement)
                outline.trainer_methods += _trainer_methods(statement)
            own_backward = loss_class_backward(statement)
            if own_backward is not None:
                outline.loss_backwards[statement.name] = own_backward
            outline.class_shapes[statement.name] = _class_shape(statement)
            if _averages_weights(statement):
                outline.weight_averages = outline.weight_averages | {statement.name}
            if b"create_graph" in data:
                outline.penalty_methods += _penalty_methods(statement)
            no_grad = no_grad_methods(statement)
            if no_grad:
                outline.no_grad_methods[statement.name] = no_grad
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.asname:
                    outline.imports[alias.asname] = (alias.name, None, 0)
                else:
                    top = alias.name.split(".")[0]
                    outline.imports.setdefault(top, (top, None, 0))
                    if "." in alias.name:
                        outline.dotted_imports.append(alias.name)
        elif isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if alias.name == "*":
                    outline.star_imports.append((statement.module or "", statement.level))
                else:
                    outline.imports[alias.asname or alias.name] = (statement.module or "", alias.name, statement.level)
        elif isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in statement.targets
        ):
            if isinstance(statement.value, (ast.List, ast.Tuple)) and all(
                isinstance(item, ast.Constant) and isinstance(item.value, str) for item in statement.value.elts
            ):
                outline.exported = tuple(item.value for item in statement.value.elts)
    if b"masked_fill" in data:
        outline.float16_overflows = _model_code_overflows(tree)
    if any(marker in data for marker in INPLACE_MARKERS):
        outline.inplace_products = inplace_product_lines(tree)
    if any(marker in data for marker in BCE_MARKERS):
        outline.bce_calls = bce_lines(tree)
    if b"Function" in data:
        outline.unsafe_autograd_functions = unsafe_autograd_functions(tree)
        outline.gradient_dropping_functions = gradient_dropping_functions(tree)
    if b"warpctc_pytorch" in data or b"warprnnt_pytorch" in data:
        outline.gradient_dropping_imports = gradient_dropping_imports(tree)
    outline.logs_complement = bool(_LOG_OF_COMPLEMENT.search(data))
    if (b"clamp" in data or b"clip" in data) and outline.logs_complement:
        outline.probability_clamps = probability_clamps(tree)
    elif b"clamp" in data or b"clip" in data:
        # a clamp helper (CenterNet's models/utils.py `_sigmoid`) whose clamp a focal loss of another
        # module takes the log of one minus (ProjectView.probability_clamps_imported)
        outline.clamp_helpers = clamp_helpers(tree)
    if b"igmoid" in data or b"expit" in data:
        outline.sigmoid_models = sigmoid_model_classes(tree)
        outline.may_log_a_sigmoid = b"log" in data
    old_torch_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _tests_for_old_torch(node.test)
                      for statement in node.body for inner in ast.walk(statement)} if b"__version__" in data else set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in module_level \
                and id(node) not in old_torch_only:
            if isinstance(node, ast.Import):
                outline.local_imports += [(alias.name, None, 0) for alias in node.names]
            else:
                outline.local_imports += [(node.module or "", alias.name if alias.name != "*" else None, node.level)
                                          for alias in node.names]
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
                outline.trains = True
            name = _dotted(node.func)
            if name in ("importlib.import_module", "import_module") and node.args:
                argument = node.args[0]
                if isinstance(argument, ast.Name):  # `module_file = "models.{}".format(...)` first
                    argument = next((n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                                     and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                                     and n.targets[0].id == argument.id), argument)
                package = _dynamic_import_package(argument)
                if package is not None and package not in outline.dynamic_imports:
                    outline.dynamic_imports.append(package)
            if name is not None:
                call = Call(path, node.lineno, node.col_offset,
                            tuple(k.arg for k in node.keywords if k.arg), sum(1 for a in node.args if not isinstance(a, ast.Starred)))
                outline.calls.setdefault(name, []).append(call)
    _registry_calls(tree, path, outline)
    if b"sys.path" in data:
        outline.sys_path_additions = _sys_path_additions(tree, path)
    return outline


def _dynamic_import_package(argument: ast.AST) -> Optional[str]:
    """"models" for `"models.{}".format(name)`, `f"models.{name}"`, `"models." + name` and
    `"models.%s" % name`: the package whose module is picked at run time; None otherwise."""
    text = None
    if isinstance(argument, ast.Call) and isinstance(argument.func, ast.Attribute) and argument.func.attr == "format" \
            and isinstance(argument.func.value, ast.Constant) and isinstance(argument.func.value.value, str):
        text = argument.func.value.value.split("{", 1)[0]
    elif isinstance(argument, ast.JoinedStr) and argument.values and isinstance(argument.values[0], ast.Constant):
        text = str(argument.values[0].value)
    elif isinstance(argument, ast.BinOp) and isinstance(argument.op, (ast.Add, ast.Mod)) \
            and isinstance(argument.left, ast.Constant) and isinstance(argument.left.value, str):
        text = argument.left.value.split("%", 1)[0]
    if not text or "." not in text:
        return None
    package = text.rsplit(".", 1)[0]
    return package if all(part.isidentifier() for part in package.split(".")) else None


def _sys_path_additions(tree: ast.Module, path: Path) -> List[Path]:
    """Folders the module's top level puts on sys.path (`sys.path.insert(0, p)`,
    `sys.path.append(p)`, or a module-level helper doing so with its parameter, `add_path(p)`),
    where p can be computed statically from `__file__`, string constants, names bound to such
    values, os.path's dirname/join/abspath/realpath/normpath and pathlib's `Path(...)`, `.parent`,
    `.resolve()` and `/`. A relative result is taken from the module's folder."""
    folder = path.resolve().parent
    values: Dict[str, str] = {}
    helpers: Dict[str, int] = {}
    found: List[Path] = []

    def value(node: Optional[ast.AST]) -> Optional[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return str(path.resolve()) if node.id == "__file__" else values.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            inner = value(node.value)
            return None if inner is None else os.path.dirname(inner)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = value(node.left), value(node.right)
            return None if left is None or right is None else os.path.join(left, right)
        if not isinstance(node, ast.Call):
            return None
        function = (_dotted(node.func) or "").split(".")[-1]
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute") and not node.args:
            return value(node.func.value)
        arguments = [value(argument) for argument in node.args]
        if node.keywords or any(argument is None for argument in arguments):
            return None
        if function == "dirname" and len(arguments) == 1:
            return os.path.dirname(arguments[0])
        if function in ("abspath", "realpath", "normpath", "str", "Path", "PurePath") and len(arguments) == 1:
            return arguments[0]
        if function == "join" and arguments:
            return os.path.join(*arguments)
        return None

    def add(node: ast.AST) -> None:
        computed = value(node)
        if computed is not None:
            candidate = Path(os.path.normpath(os.path.join(folder, computed)))
            if candidate not in found:
                found.append(candidate)

    def sys_path_argument(call: ast.Call) -> Optional[ast.AST]:
        name = _dotted(call.func) or ""
        if name == "sys.path.insert" and len(call.args) == 2:
            return call.args[1]
        if name == "sys.path.append" and len(call.args) == 1:
            return call.args[0]
        return None

    for statement in _module_level(tree.body):
        if isinstance(statement, ast.FunctionDef):
            parameters = [argument.arg for argument in statement.args.args]
            for node in ast.walk(statement):
                if isinstance(node, ast.Call):
                    argument = sys_path_argument(node)
                    if isinstance(argument, ast.Name) and argument.id in parameters:
                        helpers[statement.name] = parameters.index(argument.id)
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
            computed = value(statement.value)
            if computed is not None:
                values[statement.targets[0].id] = computed
            else:
                values.pop(statement.targets[0].id, None)
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            call = statement.value
            argument = sys_path_argument(call)
            if argument is not None:
                add(argument)
            elif isinstance(call.func, ast.Name) and call.func.id in helpers and len(call.args) > helpers[call.func.id]:
                add(call.args[helpers[call.func.id]])
    return found


def _registry_calls(tree: ast.Module, path: Path, outline: ModuleOutline) -> None:
    """`models = [GAN, CGAN, ...]` (one binding in the module) and `for model in models:` whose
    body calls `model(...)`: that call is recorded as a call of each listed name."""
    registries: Dict[str, List[Tuple[str, ...]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            members = tuple(e.id for e in value.elts if isinstance(e, ast.Name)) \
                if isinstance(value, (ast.List, ast.Tuple)) else ()
            if members and len(members) == len(value.elts):
                registries.setdefault(node.targets[0].id, []).append(members)
    if not registries:
        return
    for node in ast.walk(tree):
        if not (isinstance(node, ast.For) and isinstance(node.iter, ast.Name) and isinstance(node.target, ast.Name)):
            continue
        bound = registries.get(node.iter.id, [])
        if len(bound) != 1:
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == node.target.id:
                call = Call(path, inner.lineno, inner.col_offset, tuple(k.arg for k in inner.keywords if k.arg),
                            sum(1 for a in inner.args if not isinstance(a, ast.Starred)))
                for member in bound[0]:
                    outline.registry_calls.setdefault(member, []).append(call)


#: the largest finite float16 value: masked_fill with a bigger constant raises on float16 tensors
_FLOAT16_MAX = 65504.0


def _model_code_overflows(tree: ast.Module) -> List[Tuple[int, str]]:
    """masked_fill/masked_fill_ with a finite constant beyond float16 in model code: any method
    of a class, or a module-level function that a method of this module calls (the annotated
    transformer's `attention()`). Data utilities (DETR's `masks_to_boxes`) run outside autocast."""
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    methods = [item for node in tree.body if isinstance(node, ast.ClassDef)
               for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
    called = {_dotted(node.func) for method in methods for node in ast.walk(method) if isinstance(node, ast.Call)}
    model_code = methods + [function for name, function in functions.items() if name in called]
    found = []
    for function in model_code:
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("masked_fill", "masked_fill_")):
                continue
            value = next((k.value for k in node.keywords if k.arg == "value"), node.args[1] if len(node.args) > 1 else None)
            number = _constant_number(value)
            if number is not None and _FLOAT16_MAX < abs(number) < float("inf"):
                found.append((node.lineno, ast.unparse(value)))
    return sorted(set(found))


def _constant_number(node: Optional[ast.AST]) -> Optional[float]:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant_number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        try:
            return float(node.value)
        except OverflowError:
            return None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float" and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        try:
            return float(node.args[0].value)
        except ValueError:
            return None
    return None


def _module_level(statements: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, also those under a module-level if/try/with (`try: import x`);
    not those under a test for a torch older than mixed precision (`if torch.__version__.startswith('0'):`,
    HRNet's bn_helper.py importing its compiled InPlaceABN only there): that code never runs
    beside torch.amp."""
    for statement in statements:
        yield statement
        if isinstance(statement, (ast.If, ast.Try, ast.With)):
            for part in ("body", "orelse", "finalbody"):
                if part == "body" and isinstance(statement, ast.If) and _tests_for_old_torch(statement.test):
                    continue
                yield from _module_level(getattr(statement, part, []))
            for handler in getattr(statement, "handlers", []):
                yield from _module_level(handler.body)


def _tests_for_old_torch(test: ast.expr) -> bool:
    """`torch.__version__.startswith('0')` / `torch.__version__ < '1.0'`: true only on a torch
    without autocast (before 1.6)."""
    def is_version(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "__version__" and _dotted(node.value) == "torch"

    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "startswith" \
            and is_version(test.func.value) and len(test.args) == 1 and isinstance(test.args[0], ast.Constant):
        prefix = test.args[0].value
        return isinstance(prefix, str) and prefix.startswith("0")
    if isinstance(test, ast.Compare) and is_version(test.left) and len(test.ops) == 1 \
            and isinstance(test.ops[0], (ast.Lt, ast.LtE)) and isinstance(test.comparators[0], ast.Constant):
        bound = test.comparators[0].value
        return isinstance(bound, str) and bool(re.match(r"(0|1\.[0-5])(\.|$)", bound))
    return False


def loss_class_backward(klass: ast.ClassDef) -> Optional[Tuple[int, str]]:
    """(line, "self.acc_loss") when the class defines an instance method `backward` that calls
    `.backward()` on an attribute of self: a loss object whose instances training code calls
    `loss.backward()` on. None otherwise (autograd Functions' static backward included)."""
    for method in klass.body:
        if not (isinstance(method, ast.FunctionDef) and method.name == "backward" and method.args.args
                and method.args.args[0].arg == "self"):
            continue
        if any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in method.decorator_list):
            return None
        for node in ast.walk(method):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"
                    and isinstance(node.func.value, ast.Attribute) and isinstance(node.func.value.value, ast.Name)
                    and node.func.value.value.id == "self"):
                return method.lineno, f"self.{node.func.value.attr}"
    return None


def loss_classes_defining(shapes, owners, method: str, where=lambda path, line: f"line {line}"):
    """Of the loss classes with a backward() of their own (`owners`: (path, name, line, inner)),
    the one whose family (it and its subclasses among `shapes`: (path, name, bases, methods))
    defines `method`: (path, name, line, inner); None when none does; the reason when several do
    or a subclass has a backward() of its own. `where(path, line)` names a place in messages."""
    found = []
    for path, name, line, inner in owners:
        family, grown = {name}, True
        while grown:
            grown = False
            for _path, other, bases, _methods in shapes:
                if other not in family and family & set(bases):
                    family.add(other)
                    grown = True
        members = [(p, n, methods) for p, n, _bases, methods in shapes if n in family]
        if not any(method in methods for _p, _n, methods in members):
            continue
        overriding = [(p, n) for p, n, methods in members if n != name and "backward" in methods]
        found.append((path, name, line, inner, overriding))
    if not found:
        return None
    if len(found) > 1:
        listed = ", ".join(f"{name} ({where(path, line)})" for path, name, line, _inner, _o in found[:3])
        return f"several loss classes with a backward() of their own define {method}(): {listed}"
    path, name, line, inner, overriding = found[0]
    if overriding:
        other_path, other = overriding[0]
        return (f"{other} ({where(other_path, 0).rsplit(':', 1)[0]}), a subclass of {name}, has a backward() of "
                "its own, which would not take the GradScaler")
    return path, name, line, inner


def module_loss_classes(tree: ast.Module, path=""):
    """(shapes, owners) of one module's classes, for loss_classes_defining."""
    shapes, owners = [], []
    for statement in _module_level(tree.body):
        if isinstance(statement, ast.ClassDef):
            bases, methods = _class_shape(statement)
            shapes.append((path, statement.name, bases, methods))
            own = loss_class_backward(statement)
            if own is not None:
                owners.append((path, statement.name, own[0], own[1]))
    return shapes, owners


def _penalty_methods(klass: ast.ClassDef) -> List[Tuple[int, str]]:
    """(line, "Class.method") for each method of the class whose body takes a gradient penalty."""
    found = []
    for method in klass.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            line = next((node.lineno for node in ast.walk(method) if isinstance(node, ast.Call)
                         and _is_grad_with_graph(node)), 0)
            if line:
                found.append((line, f"{klass.name}.{method.name}"))
    return found


def _averages_weights(klass: ast.ClassDef) -> bool:
    """A class with no base but `object` whose `step()` neither reads `.grad` nor calls a `.step()`:
    it moves weights by itself (an EMA of another network's), it steps no optimizer."""
    if any(_dotted(base) != "object" for base in klass.bases):
        return False
    step = next((node for node in klass.body if isinstance(node, ast.FunctionDef) and node.name == "step"), None)
    if step is None:
        return False
    return not any((isinstance(node, ast.Attribute) and node.attr == "grad") or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step")
        for node in ast.walk(step))


def _class_shape(klass: ast.ClassDef) -> Tuple[Tuple[str, ...], FrozenSet[str]]:
    """(base names, method names) of a class: `class NLLLoss(loss.Loss)` -> (("Loss",), {...})."""
    bases = tuple(filter(None, (_dotted(base).rsplit(".", 1)[-1] if _dotted(base) else None for base in klass.bases)))
    methods = frozenset(node.name for node in klass.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return bases, methods


def no_grad_methods(klass: ast.ClassDef) -> FrozenSet[str]:
    """The methods of a class decorated `@torch.no_grad()` / `@torch.inference_mode()` (called or
    not, through any module alias): no value they return carries a gradient."""
    found = set()
    for node in klass.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = _dotted(target) or ""
            if name.rsplit(".", 1)[-1] in ("no_grad", "inference_mode") and not (
                    isinstance(decorator, ast.Call) and (decorator.args or decorator.keywords)):
                found.add(node.name)
    return frozenset(found)


def _training_class_outline(klass: ast.ClassDef) -> Optional[FunctionOutline]:
    """A class one of whose methods calls `.backward(...)`, as its constructor: None otherwise."""
    methods = [node for node in klass.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    trains = any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward"
                 for method in methods for node in ast.walk(method))
    if not trains:
        return None
    init = next((m for m in methods if m.name == "__init__"), None)
    params = tuple(a.arg for a in [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs][1:]) if init else ()
    return FunctionOutline(klass.name, klass.lineno, params, False, False, True, is_class=True)


def _training_call_methods(klass: ast.ClassDef) -> List[Tuple[int, str]]:
    """(line of the backward(), "Class.forward") when the class's forward() or __call__() calls
    `.backward(...)` and `.step(...)`: a module that trains a part each time it is called."""
    found = []
    for method in klass.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or method.name not in ("forward", "__call__"):
            continue
        calls = [node for node in ast.walk(method) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)]
        backward = next((node for node in calls if node.func.attr == "backward"), None)
        if backward is not None and any(node.func.attr == "step" for node in calls):
            found.append((backward.lineno, f"{klass.name}.{method.name}"))
    return found


def _trainer_methods(klass: ast.ClassDef) -> List[Tuple[int, str]]:
    """(line of the backward(), "Class.method") for each public method of `klass` but forward()
    and __call__() that runs `.backward(...)` and the `.step()` of an object (not of the class
    itself), in its own body or in the methods of the class it calls as `self.<method>(...)`."""
    methods = {node.name: node for node in klass.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    own: Dict[str, Tuple[Optional[int], bool, Set[str]]] = {}
    for name, method in methods.items():
        backward, steps, called = None, False, set()
        for node in ast.walk(method):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            receiver = node.func.value
            is_self = isinstance(receiver, ast.Name) and receiver.id == "self"
            if node.func.attr == "backward" and backward is None:
                backward = node.lineno
            elif node.func.attr == "step" and not is_self:
                steps = True
            if is_self and node.func.attr in methods:
                called.add(node.func.attr)
        own[name] = (backward, steps, called)
    found = []
    for name in methods:
        if name.startswith("_") or name in ("forward", "__call__"):
            continue
        seen, pending, backward, steps = {name}, [name], None, False
        while pending:
            line, stepped, called = own[pending.pop()]
            backward = backward or line
            steps = steps or stepped
            pending += [c for c in called - seen]
            seen |= called
        if backward is not None and steps:
            found.append((backward, f"{klass.name}.{name}"))
    return found


def _gram_matrix_methods(klass: ast.ClassDef, lines: List[bytes], names) -> List[Tuple[int, str]]:
    """(line, "Class.method") for the methods of `klass` computing a Gram matrix (`names`: the
    module's torch_names())."""
    found = []
    for method in klass.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and _may_hold_a_gram_matrix(lines, method):
            line = gram_matrix_line(method, names)
            if line:
                found.append((line, f"{klass.name}.{method.name}"))
    return found


def _may_hold_a_gram_matrix(lines: List[bytes], function) -> bool:
    """Does the function's own text flatten (view/reshape) and multiply matrices? (A cheap test
    before gram_matrix_line walks it.)"""
    text = b"\n".join(lines[function.lineno - 1:getattr(function, "end_lineno", None) or len(lines)])
    return (b"view(" in text or b"reshape(" in text) and (b"mm(" in text or b"matmul(" in text or b"@" in text)


def _function_outline(function, tensorflow: bool = False, gram_names=None) -> FunctionOutline:
    """`gram_names`: the module's torch_names() when the function may hold a Gram matrix, else None."""
    params = tuple(a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs])
    moved = set()
    wrapped: Dict[str, int] = {}  # name -> line of the DataParallel wrap assigned to it
    called_into: Dict[str, str] = {}  # name -> the module function whose result is assigned to it
    returns = []
    builds_optimizer = calls_backward = False
    grad_with_graph = tf_gradients = 0
    applies_gradients = touches_grad = False
    local_calls = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and node.attr == "grad":
            touches_grad = True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
            calls_backward = True
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                local_calls.add(node.func.id)
            if not grad_with_graph and _is_grad_with_graph(node):
                grad_with_graph = node.lineno
        if tensorflow and isinstance(node, ast.Call):
            called = _dotted(node.func) or ""
            builds_optimizer = builds_optimizer or called.rsplit(".", 1)[-1].endswith("Optimizer")
            if not tf_gradients and called.split(".")[0] in ("tf", "tensorflow") and called.endswith(".gradients"):
                tf_gradients = node.lineno
            applies_gradients = applies_gradients or called.rsplit(".", 1)[-1] in ("apply_gradients", "minimize")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if _is_parallel_wrap(node.value):
                wrapped.update((target, node.lineno) for target in targets)
            elif isinstance(node.value.func, ast.Name):
                called_into.update((target, node.value.func.id) for target in targets)
        if isinstance(node, ast.Assign) and _is_device_move(node.value):
            moved |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Expr) and _is_device_move(node.value):
            receiver = _dotted(node.value.func.value)
            if receiver is not None:
                moved.add(receiver)
        elif isinstance(node, ast.Return) and node.value is not None:
            returns.append(node.value)
    returns_moved = any(_is_device_move(value) or (isinstance(value, ast.Name) and value.id in moved) for value in returns)
    wrap_line = next((value.lineno if _is_parallel_wrap(value) else wrapped[value.id] for value in returns
                      if _is_parallel_wrap(value) or (isinstance(value, ast.Name) and value.id in wrapped)), 0)
    returned_calls = {value.func.id for value in returns if isinstance(value, ast.Call) and isinstance(value.func, ast.Name)}
    returned_calls |= {called_into[value.id] for value in returns if isinstance(value, ast.Name) and value.id in called_into}
    return FunctionOutline(function.name, function.lineno, params, returns_moved, builds_optimizer, calls_backward,
                           grad_with_graph=grad_with_graph, local_calls=tuple(sorted(local_calls)),
                           tf_gradients=tf_gradients, applies_gradients=applies_gradients,
                           gram_matrix=gram_matrix_line(function, gram_names) if gram_names is not None else 0,
                           touches_grad=touches_grad, returns_parallel_wrap=wrap_line,
                           returned_calls=tuple(sorted(returned_calls)))


def _is_parallel_wrap(node: ast.AST) -> bool:
    """`torch.nn.DataParallel(net, ...)`, `DistributedDataParallel(model, ...)`, also moved on (`.cuda()`)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("cuda", "to"):
        node = node.func.value
    return isinstance(node, ast.Call) and (_dotted(node.func) or "").rsplit(".", 1)[-1] in (
        "DataParallel", "DistributedDataParallel")


def _is_grad_with_graph(call: ast.Call) -> bool:
    """`torch.autograd.grad(..., create_graph=True)` (`autograd.grad`, `grad` imported from
    torch.autograd): create_graph given and not the constant False."""
    called = _dotted(call.func) or ""
    if not (called == "grad" or called.endswith("autograd.grad")):
        return False
    return any(
        k.arg == "create_graph" and not (isinstance(k.value, ast.Constant) and not k.value.value) for k in call.keywords)


def _optimizer_methods(path: Path, method: str, outline: Optional[ModuleOutline]) -> List[Tuple[str, int, bool]]:
    if outline is None:
        return []
    try:
        data = current_bytes(path)
        if f"def {method}(".encode() not in data:
            return []
        tree = parsed_tree(data, filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found = []
    for statement in _module_level(tree.body):
        if isinstance(statement, ast.ClassDef):
            for node in statement.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
                    # a method of that name that builds no optimizer ampify can see counts against
                    found.append((statement.name, node.lineno, bool(_optimizer_over_self(node, outline.imports))))
    return found


def _optimizer_over_self(method, imports: Dict[str, Tuple[str, Optional[str], int]]) -> Optional[bool]:
    """None when `method` builds no torch.optim optimizer; else whether it returns one built from
    its own object's parameters only (every `.parameters()` / `.named_parameters()` it calls is on
    `self`, an attribute of self, or a module `self.named_modules()` yields: minGPT's
    `configure_optimizers`, Lightning's convention)."""
    params = [*method.args.posonlyargs, *method.args.args]
    if not params or params[0].arg != "self":
        return None
    builds = returns = False
    only_self = True
    parameter_reads = 0
    # `for mn, m in self.named_modules():` makes m one of self's submodules
    own = {"self"}
    for node in ast.walk(method):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, ast.Call):
            source = _dotted(node.iter.func) or ""
            if source.split(".")[0] == "self" and source.rsplit(".", 1)[-1] in ("modules", "named_modules", "children",
                                                                                 "named_children"):
                targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
                own |= {t.id for t in targets[-1:] if isinstance(t, ast.Name)}
    for node in ast.walk(method):
        if isinstance(node, ast.Call):
            called = _dotted(node.func) or ""
            head, _, rest = called.partition(".")
            module = imports.get(head, ("", None, 0))
            qualified = (module[0] + ("." + module[1] if module[1] else "") + ("." + rest if rest else "")
                         if head in imports else called)
            if qualified.startswith("torch.optim.") and not qualified.startswith("torch.optim.lr_scheduler"):
                builds = True
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("parameters", "named_parameters"):
                parameter_reads += 1
                receiver = _dotted(node.func.value) or ""
                if receiver.split(".")[0] not in own:
                    only_self = False
        elif isinstance(node, ast.Return) and node.value is not None:
            returns = True
    if not builds:
        return None
    return returns and only_self and parameter_reads > 0


def _is_device_move(node: ast.AST) -> bool:
    """`x.cuda(...)` or `x.to(...)`, also chained on a constructor (`Net().cuda()`)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("cuda", "to")


class ProjectView:
    """The project as seen from one of its modules (transforms.base.ProjectFacts)."""

    def __init__(self, index: RepositoryIndex, path: Path, named: Sequence[Path] = ()) -> None:
        self.index = index
        self.path = path.resolve()
        #: what the user named on the command line: only files in these are written
        self.named = tuple(p.resolve() for p in named)
        self._training_closure: Optional[List[Path]] = None
        self._bce_of_entry_scripts_found: Optional[List[Tuple[Path, ModuleOutline, Path]]] = None

    def training_closure(self) -> List[Path]:
        """The project modules this module imports, directly or not, and those the modules of its
        folder subclassing its trainer class import (FairMOT's trains/mot.py builds the loss that
        base_trainer.py's step computes): the code its training step runs."""
        if self._training_closure is None:
            closure = list(self.index.imported_closure(self.path))
            for subclassing in self.index.trainer_subclass_modules(self.path):
                for path in [subclassing, *self.index.imported_closure(subclassing)]:
                    if path not in closure and path != self.path:
                        closure.append(path)
            self._training_closure = closure
        return self._training_closure

    def where(self, path: Path, line: int) -> str:
        """`engine.py:56`, relative to the project root."""
        try:
            shown = path.resolve().relative_to(self.index.root)
        except ValueError:
            shown = path
        return f"{shown.as_posix()}:{line}"

    def _own_outline(self) -> Optional[ModuleOutline]:
        return self.index.outline(self.path)

    def module_trains(self, key: str) -> bool:
        """Does the project module `key` call `.backward(...)` itself?"""
        outline = self.index.outline(Path(key))
        return bool(outline is not None and outline.trains)

    def is_project_package(self, package: str) -> bool:
        """Does `import package` in this module mean a module or package of the project? A folder
        without `__init__.py` on the module's sys.path is one too (a namespace package: HRNet's
        lib/core/function.py, imported as `core.function` once `_init_paths` adds lib/)."""
        if self.index.resolve_module(self.path, package) is not None:
            return True
        return any(self.index.namespace_package(root, package) for root in self.index.search_roots(self.path))

    def star_bound_imports(self, key: Optional[str] = None) -> Dict[str, str]:
        """Local name -> import the star imports of this module (or of the project module `key`)
        bind: `tf` where `from utils import *` brings utils' `import tensorflow as tf`."""
        path = Path(key).resolve() if key is not None else self.path
        outline = self.index.outline(path) if key is not None else self._own_outline()
        if outline is None or not outline.star_imports:
            return {}
        bound = self.index.star_bound_imports(path, outline.star_imports)
        return {name: target for name, target in bound.items() if name not in outline.imports}

    def returns_parallel_wrapped(self, dotted: str) -> Optional[str]:
        """"models/networks.py:56 init_net()" when the project function that `dotted` calls here
        returns its model wrapped in DataParallel / DistributedDataParallel, itself or through the
        functions of its module whose result it returns (pix2pix's define_G -> init_net); else None."""
        found = self._function_called(dotted)
        if found is None:
            return None
        path, function = found
        module = self.index.outline(path)
        seen: Set[str] = set()
        pending = [function]
        while pending:
            current = pending.pop()
            if current.name in seen:
                continue
            seen.add(current.name)
            if current.returns_parallel_wrap:
                return f"{self.where(path, current.returns_parallel_wrap)} {current.name}()"
            if module is not None:
                pending += [module.functions[name] for name in current.returned_calls if name in module.functions]
        return None

    def returns_device_moved(self, dotted: str) -> Optional[str]:
        found = self._function_called(dotted)
        if found is None or not found[1].returns_device_moved:
            return None
        path, function = found
        return f"{self.where(path, function.line)} {function.name}()"

    def _function_called(self, dotted: str) -> Optional[Tuple[Path, FunctionOutline]]:
        """The project function a call named `dotted` reaches from this module, or None."""
        outline = self._own_outline()
        return self.index.function(self.path, dotted, outline.imports) if outline is not None else None

    def training_functions_called(self) -> List[Tuple[str, str, str, bool]]:
        """(key, "engine.py:12", "engine.train_one_epoch", is a class) for each function of another project module
        this module calls that runs a training step itself (its body calls `.backward(`), or class with
        a method that does (`Trainer(model, data, optimizer)`), in a module that does not already use
        mixed precision."""
        found = []
        for path, function, dotted in self._project_functions_called():
            target = self.index.outline(path)
            if target is None or not function.calls_backward or target.mixed_precision:
                continue
            entry = (str(path), self.where(path, function.line), dotted, function.is_class)
            if entry not in found:
                found.append(entry)
        return found

    def tf1_optimizer_classes(self) -> Dict[str, str]:
        """{"MpiAdamOptimizer": "spinup/utils/mpi_tf.py:36"}: the names this module calls (as it
        calls them) that reach a class of another project module subclassing a TF1 optimizer."""
        outline = self._own_outline()
        found: Dict[str, str] = {}
        if outline is None:
            return found
        for dotted in outline.calls:
            if not dotted.rsplit(".", 1)[-1].endswith("Optimizer"):
                continue
            target = self.index._module_and_name(self.path, dotted, outline.imports)
            if target is None or target[0] is None or target[0] == self.path.resolve():
                continue
            line = self.index.tf1_optimizer_class_line(target[0], target[1])
            if line is not None:
                found[dotted] = self.where(target[0], line)
        return found

    def tf1_optimizer_builders(self) -> List[Tuple[str, str, str]]:
        """(key, "optimization.py:59", "optimization.create_optimizer") for each project function this
        module calls that builds a TF1 optimizer in its own module."""
        found = []
        for path, function, dotted in self._project_functions_called():
            entry = (str(path), self.where(path, function.line), dotted)
            if function.builds_tf1_optimizer and entry not in found:
                found.append(entry)
        return found

    def _project_functions_called(self) -> Iterator[Tuple[Path, FunctionOutline, str]]:
        """(module, function, the dotted name it is called through here) for each call of this
        module that reaches a function of another project module."""
        outline = self._own_outline()
        if outline is None:
            return
        for dotted in sorted(outline.calls):
            resolved = self.index.function(self.path, dotted, outline.imports, trainer_classes=True)
            if resolved is not None and resolved[0] != self.path:
                yield resolved[0], resolved[1], dotted

    def _star_imported_functions_called(self) -> Iterator[Tuple[Path, FunctionOutline, str]]:
        """(module, function, name) for each plain name this module calls that no definition or
        import of its own binds and that its star imports (`from utils import *`) reach in a
        function of another project module."""
        outline = self._own_outline()
        if outline is None or not outline.star_imports:
            return
        for name in sorted(outline.calls):
            if "." in name or name in outline.imports or name in outline.functions or name in outline.classes:
                continue
            for module, level in outline.star_imports:
                found = self.index._reexported_function(
                    self.path, self.index.resolve_module(self.path, module, level), name, set(), 0)
                if found is not None and found[0] != self.path.resolve():
                    yield found[0], found[1], name
                    break

    def tf_gradients_function(self, dotted: str) -> Optional[Tuple[str, str, str]]:
        """(key, display, function name) of the project function `dotted` (as this module calls it,
        also through re-exporting packages) of another module when it runs tf.gradients; else None."""
        outline = self._own_outline()
        if outline is None:
            return None
        found = self.index.defining_function(self.path, dotted, outline.imports)
        if found is None or found[0] == self.path or not found[1].tf_gradients:
            return None
        return str(found[0]), self.where(found[0], 0).rsplit(":", 1)[0], found[1].name

    def gradients_function(self, dotted: str) -> Optional[Tuple[str, str, str]]:
        """As tf_gradients_function, for a function that hands its gradients back rather than
        applying them itself (no apply_gradients or minimize, no optimizer built: spinningup's
        `core.flat_grad`, not BERT's `optimization.create_optimizer`)."""
        outline = self._own_outline()
        if outline is None:
            return None
        found = self.index.defining_function(self.path, dotted, outline.imports)
        if found is None or found[0] == self.path or not found[1].tf_gradients or found[1].applies_gradients \
                or found[1].builds_tf1_optimizer:
            return None
        return str(found[0]), self.where(found[0], 0).rsplit(":", 1)[0], found[1].name

    def calls_gradients_functions(self) -> bool:
        """Does this module call a function of another project module that hands back tf.gradients?"""
        outline = self._own_outline()
        return outline is not None and any(self.gradients_function(dotted) is not None for dotted in outline.calls)

    def touches_gradients(self, dotted: str) -> bool:
        """Is `dotted` (as this module calls it) a function of another project module whose body
        reads or changes `.grad` (`utils.updateBN(model, s)`)?"""
        outline = self._own_outline()
        if outline is None:
            return False
        found = self.index.defining_function(self.path, dotted, outline.imports)
        return found is not None and found[0] != self.path and found[1].touches_grad

    def gradient_penalty_function(self, dotted: str) -> Optional[Tuple[str, str, str]]:
        """(key, display, function name) of the project function `dotted` (as this module calls
        it, also through re-exporting packages) when it runs a gradient penalty; else None."""
        outline = self._own_outline()
        if outline is None:
            return None
        found = self.index.defining_function(self.path, dotted, outline.imports)
        if found is None or not self.index.gradient_penalty_line(*found):
            return None
        return str(found[0]), self.where(found[0], 0).rsplit(":", 1)[0], found[1].name

    def imported_module_sources(self) -> List[Tuple[str, str, bytes]]:
        """(key, "vae.py", source) for each project module this module imports, directly or
        through each other (not this module itself)."""
        found = []
        for path in self.training_closure():
            if path == self.path.resolve():
                continue
            source = self.source_of(str(path))
            if source is not None:
                found.append((str(path), self.where(path, 0).rsplit(":", 1)[0], source))
        return found

    def sigmoid_log_sources(self) -> List[Tuple[str, str, bytes]]:
        """(key, "loss.py", source) for the project modules this module imports, directly or not,
        that name a sigmoid and a log (ModuleOutline.may_log_a_sigmoid)."""
        found = []
        own = self.path.resolve()
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is None or path == own or not outline.may_log_a_sigmoid:
                continue
            source = self.source_of(str(path))
            if source is not None:
                found.append((str(path), self.where(path, 0).rsplit(":", 1)[0], source))
        return found

    def gram_matrix_functions_called(self) -> List[str]:
        """"neural_style/utils.py:25 gram_matrix()" for each function of another project module this
        module calls that computes a Gram matrix of a flattened feature map (AMP238 / AMP330), and
        "net.py:35 GramMatrix.forward()" for each such method of a class in the model code this module
        imports (directly or not)."""
        found = []
        for path, function, _ in [*self._project_functions_called(), *self._star_imported_functions_called()]:
            if function.gram_matrix:
                entry = f"{self.where(path, function.gram_matrix)} {function.name}()"
                if entry not in found:
                    found.append(entry)
        for path, line, method in self._gram_matrix_methods_imported():
            found.append(f"{self.where(path, line)} {method}()")
        return found

    def _gram_matrix_methods_imported(self) -> Iterator[Tuple[Path, int, str]]:
        own = self.path.resolve()
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is not None and path != own:
                for line, method in outline.gram_matrix_methods:
                    yield path, line, method

    def gram_matrix_modules(self) -> List[Tuple[str, str, Tuple[str, ...], bool]]:
        """(key, display, the function names, the module trains) for each project module holding
        a function of gram_matrix_functions_called(), to rewrite there (gram_matrix_float32.py)."""
        by_path: Dict[Path, List[str]] = {}
        for path, function, _ in [*self._project_functions_called(), *self._star_imported_functions_called()]:
            if function.gram_matrix and function.name not in by_path.setdefault(path, []):
                by_path[path].append(function.name)
        for path, _, method in self._gram_matrix_methods_imported():
            if method not in by_path.setdefault(path, []):
                by_path[path].append(method)
        found = []
        for path, functions in by_path.items():
            outline = self.index.outline(path)
            found.append((str(path), self.where(path, 0).rsplit(":", 1)[0], tuple(functions),
                          bool(outline is not None and outline.trains)))
        return found

    def penalty_methods_used(self) -> List[str]:
        """"models/Losses.py:206 LogisticGAN.R1Penalty()" for each method of a class of another
        project module that takes a gradient penalty, where this module or a module it imports
        builds that class (`Losses.LogisticGAN(self.dis)`) and the class's module has no training
        step of its own: the penalty then runs in this module's step, under its autocast."""
        own = self.path.resolve()
        closure = self.training_closure()
        found = []
        for path in closure:
            outline = self.index.outline(path)
            if outline is None or path == own or not outline.penalty_methods or outline.trains:
                continue
            classes = {name.split(".")[0] for _, name in outline.penalty_methods}
            built = {klass for klass in classes if any(
                self._names_a_holder(other, {klass}) for other in [own, *closure] if other != path)}
            found += [f"{self.where(path, line)} {name}()" for line, name in outline.penalty_methods
                      if name.split(".")[0] in built]
        return found

    def gradient_penalty_called(self, dotted: str) -> Optional[str]:
        outline = self._own_outline()
        if outline is None:
            return None
        found = self.index.defining_function(self.path, dotted, outline.imports)
        if found is None:
            return None
        line = self.index.gradient_penalty_line(*found)
        return self.where(found[0], line) if line else None

    def float16_overflows_imported(self) -> List[str]:
        """"transformer/Modules.py:25 masked_fill(..., -1e9)" for model code of the project
        modules this module imports, directly or through other project modules."""
        found = []
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is None or path == self.path.resolve():
                continue
            found += [f"{self.where(path, line)} masked_fill(..., {value})" for line, value in outline.float16_overflows]
        return found

    def unsafe_autograd_functions(self) -> List[str]:
        """"op/conv2d_gradfix.py:134 Conv2d: its backward() runs ..." for the custom autograd
        Functions of the project modules this module imports (directly or through each other) that
        fail or compute wrong values under autocast (autograd_functions.py)."""
        found = []
        own = self.path.resolve()
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is not None and path != own:
                found += [f"{self.where(path, line)} {name}: {why}" for line, name, why in outline.unsafe_autograd_functions]
        return found

    def unsafe_autograd_functions_run_beside(self) -> List[str]:
        """The Functions of unsafe_autograd_functions() in project modules this module's imports do
        not reach but a module that runs it does: an entry script importing this module (directly
        or through others) and, through its own imports, the model code holding them. CenterNet's
        trainer (trains/base_trainer.py) is handed its model; main.py builds it from
        models/networks/, whose DCNv2 Functions call a compiled extension."""
        index = self.index
        own = self.path.resolve()
        reached = set(index.imported_closure(self.path)) | {own}
        holders = {path: outline for path, outline in index.unsafe_function_holders().items() if path not in reached}
        if not holders:
            return []
        found: List[str] = []
        for entry in index.modules():
            if entry == own or entry in holders:
                continue
            closure = index.imported_closure(entry)
            if own not in closure:
                continue
            through = self.where(entry, 0).rsplit(":", 1)[0]
            for path, outline in holders.items():
                if path in closure:
                    found += [f"{self.where(path, line)} {name}: {why} (run beside this file by {through}, which "
                              "imports both)" for line, name, why in outline.unsafe_autograd_functions]
        return list(dict.fromkeys(found))

    def unsafe_autograd_function_modules(self) -> List[Tuple[str, str, Tuple[str, ...], bool]]:
        """(key, display, the Functions' class names, the module trains) for each project module this
        module imports with Functions of unsafe_autograd_functions(), to decorate there."""
        found = []
        own = self.path.resolve()
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is not None and path != own and outline.unsafe_autograd_functions:
                found.append((str(path), self.where(path, 0).rsplit(":", 1)[0],
                              tuple(dict.fromkeys(name for _, name, _ in outline.unsafe_autograd_functions)),
                              outline.trains))
        return found

    def gradient_dropping_functions(self) -> List[str]:
        """"ctc/ctc.py:11 _CTC: its backward() never reads ..." for the custom autograd Functions
        of this module and of the project modules it imports whose backward() drops the incoming
        gradient (autograd_functions.py)."""
        found = []
        for path in [self.path.resolve(), *self.training_closure()]:
            outline = self.index.outline(path)
            if outline is not None:
                found += [f"{self.where(path, line)} {name}: {why}" for line, name, why in outline.gradient_dropping_functions]
        return found

    def probability_clamps_imported(self) -> List[Tuple[str, str, float]]:
        """("retinanet/losses.py:49", "torch.clamp(...)", eps) for each probability clamp, in the
        project modules this module imports (directly or not), whose `1 - eps` bound a reduced precision may round
        to 1 (torch/probability_clamps.py)."""
        found = []
        own = self.path.resolve()
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is not None and path != own:
                found += [(self.where(path, line), text, eps) for line, text, eps in self._clamps_of(outline)]
        return found

    def _clamps_of(self, outline: ModuleOutline) -> List[Tuple[int, str, float]]:
        """A module's probability clamps, and its clamp helpers when a module of this file's import
        closure (or this file) takes `log(1 - ...)`."""
        if not outline.clamp_helpers:
            return outline.probability_clamps
        closure = [self.path.resolve(), *self.training_closure()]
        if any((o := self.index.outline(path)) is not None and o.logs_complement for path in closure):
            return [*outline.probability_clamps, *outline.clamp_helpers]
        return outline.probability_clamps

    def probability_models(self) -> Dict[str, str]:
        """The name a class is called by here (`Discriminator`, `models.Discriminator`) -> "models.py:12
        Discriminator", for each model class of another project module this module imports (by
        name, as a module, or through `from models import *`) whose forward() returns a sigmoid's
        probability (torch/sigmoid_models.py)."""
        outline = self._own_outline()
        if outline is None:
            return {}
        own = self.path.resolve()
        found: Dict[str, str] = {}

        def add(called: str, path: Optional[Path], name: str) -> None:
            target = self.index.outline(path) if path is not None and path != own else None
            if target is not None and name in target.sigmoid_models:
                found[called] = f"{self.where(path, target.sigmoid_models[name])} {name}"

        imports = dict(outline.imports)
        for module, name, level in outline.local_imports:
            # `from models import VariationalAutoencoder` inside main(): the model it builds there
            imports.setdefault(name or module.split(".")[0], (module if name else module.split(".")[0], name, level))
        for local, (module, name, level) in imports.items():
            if name is not None:
                located = self.index.project_class(self.path, local, imports)
                if located is not None:
                    add(local, located[0], located[1])
                continue
            path = self.index.resolve_module(self.path, module, level)
            target = self.index.outline(path) if path is not None and path != own else None
            for name in (target.sigmoid_models if target is not None else {}):
                add(f"{local}.{name}", path, name)
        for dotted in outline.dotted_imports:
            path = self.index.resolve_module(self.path, dotted, 0)
            target = self.index.outline(path) if path is not None and path != own else None
            for name in (target.sigmoid_models if target is not None else {}):
                add(f"{dotted}.{name}", path, name)
        for module, level in outline.star_imports:
            path = self.index.resolve_module(self.path, module, level)
            target = self.index.outline(path) if path is not None and path != own else None
            for name in (target.sigmoid_models if target is not None else {}):
                if target.exports(name) and name not in outline.imports and name not in outline.classes:
                    add(name, path, name)
        return found

    def probability_clamp_modules(self, max_eps: float) -> List[Tuple[str, str, bool]]:
        """(key, display, the module trains) for each project module this module imports, directly
        or not, with a probability clamp of eps up to `max_eps` (probability_clamps_imported), to
        rewrite there."""
        found = []
        own = self.path.resolve()
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is not None and path != own and any(eps <= max_eps for _, _, eps in self._clamps_of(outline)):
                found.append((str(path), self.where(path, 0).rsplit(":", 1)[0], outline.trains))
        return found

    def gradient_dropping_imports(self) -> List[Tuple[str, str]]:
        """("train.py:94", "warpctc_pytorch") for each import, in this module or the project
        modules it imports, of a binding whose backward() dropped the incoming gradient in some
        releases."""
        found = []
        for path in [self.path.resolve(), *self.training_closure()]:
            outline = self.index.outline(path)
            if outline is not None:
                found += [(self.where(path, line), package) for line, package in outline.gradient_dropping_imports]
        return found

    def inplace_product_modules(self) -> List[Tuple[str, str, bool]]:
        """(key, display, trains) of the project modules this module imports whose model code runs
        an in-place matrix product (torch/inplace_matmuls.py)."""
        return self._imported_modules_with(lambda outline: outline.inplace_products)

    def imports_a_bce(self) -> bool:
        """Does a project module this module imports (directly or not), or one an entry script
        running it imports (bce_of_entry_scripts), compute a BCE on probabilities in a function or
        method? (the cheap question before bce_modules)"""
        return bool(self._imported_modules_with(lambda outline: outline.bce_calls)) or bool(
            self._bce_of_entry_scripts())

    def entry_scripts(self) -> List[Path]:
        """The project modules that import this one (directly or not) and sit where a script that
        runs it sits: its own folder, a folder above it, or a folder at the top of the project
        (HRNet's tools/ beside lib/). Only those spelling this module's name, or a training class
        or function of it, are read (disentangling-vae's main.py: `from disvae import Trainer`)."""
        own = self.path
        outline = self._own_outline()
        if outline is None:
            return []
        spelled = {own.stem.encode()} | {name.encode() for name in outline.training_classes} | {
            name.encode() for name, function in outline.functions.items() if function.calls_backward}
        root = self.index.root
        folders = {folder for folder in [own.parent, *own.parent.parents] if folder == root or root in folder.parents}
        found = []
        for path in self.index.modules():
            if path == own or not (path.parent in folders or path.parent.parent == root):
                continue
            try:
                data = current_bytes(path)
            except OSError:
                continue
            if any(name in data for name in spelled) and own in self.index.imported_closure(path):
                found.append(path)
        return found

    def _bce_of_entry_scripts(self) -> List[Tuple[Path, ModuleOutline, Path]]:
        """The modules that compute a BCE on probabilities and that an entry script running this
        module imports and reaches (imports it, or a name of it,
        or another module it imports names the class or function holding the BCE): the loss or the
        model such a script hands this module's training step (disentangling-vae's main.py builds
        `loss_f = get_loss_f(...)` from disvae/models/losses.py and hands it to `Trainer`). The step
        may run it; whether it does cannot be read here. Each with the entry script that reaches it
        (the script itself when it builds the BCE)."""
        if self._bce_of_entry_scripts_found is None:
            own = self.path
            found: List[Tuple[Path, ModuleOutline, Path]] = []
            #: scripts that build the BCE themselves and hand it in (Structured-Self-Attention's
            #: classification.py: `loss = torch.nn.BCELoss()`, then `train(..., loss, optimizer)`)
            building: List[Tuple[Path, ModuleOutline, Path]] = []
            for entry in self.entry_scripts():
                reached = self.index.imported_closure(entry)
                holding = [(path, outline) for path in reached if path != own
                           and (outline := self.index.outline(path)) is not None and outline.bce_calls]
                outline = self.index.outline(entry)
                if outline is not None and outline.bce_calls:
                    building.append((entry, outline, entry))
                if not holding:
                    continue
                whole, names_from = ProjectView(self.index, entry)._imported_names()
                for path, outline in holding:
                    holders = {owners[0] for _, _, owners in outline.bce_calls if owners}
                    if path in whole or path in names_from or any(
                            self._names_a_holder(other, holders) for other in [entry, *reached] if other != path):
                        if all(path != known for known, _, _ in found):
                            found.append((path, outline, entry))
            # named as reached by another script when one does (manifold_mixup's mugan.py, which
            # task_launcher.py imports), else as the script's own
            found += [item for item in building if all(item[0] != known for known, _, _ in found)]
            self._bce_of_entry_scripts_found = found
        return self._bce_of_entry_scripts_found

    def bce_modules(self, called: Set[str]) -> List[Tuple[str, str, bool]]:
        """(key, display, trains) of the project modules this module imports whose functions or
        methods compute a BCE on probabilities (torch/bce_imported.py), where this module may run
        it: a module it imports whole (`import losses`), or one holding it in a function, class or
        method it imports by name (or one such function calls) or `called` names; or one an entry
        script running this module reaches (the loss it hands the step: _bce_of_entry_scripts)."""
        return [(str(path), self.where(path, 0).rsplit(":", 1)[0], outline.trains)
                for path, outline in self._bce_outlines(called)]

    def bce_imported(self, called: Set[str]) -> List[Tuple[str, Tuple[str, ...]]]:
        """("networks.py:65 F.binary_cross_entropy in Discriminator.calc_dis_loss()", its owners'
        names) for each BCE on probabilities of bce_modules(called)."""
        own = {path for path, _ in self._own_bce_outlines(called)}
        entries = {path: entry for path, _, entry in self._bce_of_entry_scripts() if path not in own}
        return [(f"{self.where(path, line)} {name} in {'.'.join(owners)}(){self._reached_by(entries.get(path), path)}",
                 owners)
                for path, outline in self._bce_outlines(called) for line, name, owners in outline.bce_calls]

    def _reached_by(self, entry: Optional[Path], path: Path) -> str:
        """", reached by main.py, which runs this file" for a module only an entry script reaches
        (", which runs this file" for the script itself)."""
        if entry is None:
            return ""
        if entry == path:
            return ", which runs this file"
        return f", reached by {self.where(entry, 0).rsplit(':', 1)[0]}, which runs this file"

    def _bce_outlines(self, called: Set[str]) -> List[Tuple[Path, ModuleOutline]]:
        """The modules of bce_modules(called), each with its outline: those this module reaches,
        then those only an entry script running it reaches."""
        found = self._own_bce_outlines(called)
        return found + [(path, outline) for path, outline, _ in self._bce_of_entry_scripts()
                        if all(path != known for known, _ in found)]

    def _own_bce_outlines(self, called: Set[str]) -> List[Tuple[Path, ModuleOutline]]:
        own = self.path.resolve()
        whole, names_from = self._imported_names()
        found = []
        closure = self.training_closure()
        for path in closure:
            imported = self.index.outline(path)
            if imported is None or path == own or not imported.bce_calls:
                continue
            if path in whole:
                found.append((path, imported))
                continue
            reached: Set[str] = set()
            pending = list(names_from.get(path, ()))
            while pending:  # the names imported from it, and the module's functions they call
                name = pending.pop()
                if name not in reached:
                    reached.add(name)
                    function = imported.functions.get(name)
                    pending += list(function.local_calls) if function is not None else []
            if any((reached | called) & set(owners) for _, _, owners in imported.bce_calls):
                found.append((path, imported))
                continue
            # reached through the modules this one imports: another module of the closure builds or
            # calls the class or function holding it (DeepDA: main.py -> models.py -> transfer_losses.py,
            # whose `AdversarialLoss(...)` comes from loss_funcs/adv.py through two star imports)
            holders = {owners[0] for _, _, owners in imported.bce_calls if owners}
            if holders and any(self._names_a_holder(other, holders) for other in closure if other not in (path, own)):
                found.append((path, imported))
        return found

    def _names_a_holder(self, path: Path, holders: Set[str]) -> bool:
        """Does the module's text call one of `holders` or reach an attribute of it (`AdversarialLoss(`,
        `AdversarialLoss.get_adversarial_result`)?"""
        try:
            data = current_bytes(path)
        except OSError:
            return False
        return any(re.search(rb"\b" + re.escape(name.encode()) + rb"\s*[(.]", data) for name in holders)

    def _imported_names(self) -> Tuple[Set[Path], Dict[Path, Set[str]]]:
        """(the project modules this module imports whole: `import m`, `from pkg import m`, a star
        import; the names it imports from each other module: `from m import a, b`)."""
        own = self.path.resolve()
        outline = self.index.outline(own)
        whole: Set[Path] = set()
        names_from: Dict[Path, Set[str]] = {}
        if outline is None:
            return whole, names_from
        roots = tuple(self.index.search_roots(own))
        for _, (module, name, level) in outline.imports.items():
            target = self.index.resolve_module(own, module, level, roots)
            if name is None:
                if target is not None:
                    whole.add(target)
                continue
            submodule = self.index.resolve_module(own, f"{module}.{name}" if module else name, level, roots)
            if submodule is not None:
                whole.add(submodule)
            elif target is not None:
                names_from.setdefault(target, set()).add(name)
        for module, level in outline.star_imports:
            target = self.index.resolve_module(own, module, level, roots)
            if target is not None:
                whole.add(target)
        return whole, names_from

    def float16_overflow_modules(self) -> List[Tuple[str, str, bool]]:
        """(key, display, trains) of the project modules this module imports whose model code
        has a masked_fill constant beyond float16 (see float16_overflows_imported)."""
        return self._imported_modules_with(lambda outline: outline.float16_overflows)

    def _imported_modules_with(self, holds) -> List[Tuple[str, str, bool]]:
        """(key, display, trains) of the project modules this module imports (directly or through
        other project modules) whose outline `holds(outline)` something."""
        found = []
        for path in self.training_closure():
            outline = self.index.outline(path)
            if outline is None or path == self.path.resolve() or not holds(outline):
                continue
            found.append((str(path), self.where(path, 0).rsplit(":", 1)[0], outline.trains))
        return found

    def wrapper_step(self, method: str, called: Collection[str] = ()) -> Optional[Tuple[str, str, WrapperStep, bool]]:
        """(key, display, the method, it is one of several) when an optimizer wrapper class of the
        project has a stepping method of this name (optimizer_wrappers.py); else None. When several
        classes have a `step()`, the one the training module builds (`called`: the last names of
        the callables it calls) is chosen; failing that, the first, marked as one of several (a
        name stepped may then be any of them: not converted through it)."""
        found = [step for step in self.index.wrapper_steps() if step.method == method]
        if not found:
            return None
        if method != "step" and (len(found) != 1 or self.index.definitions(method) != 1):
            return None  # another class of the project has a method of that name: a call may mean it
        several = len(found) > 1
        if several:
            built = [step for step in found if step.klass in called]
            if len({step.klass for step in built}) == 1:
                found, several = built, False
        return str(found[0].path), self.where(found[0].path, 0).rsplit(":", 1)[0], found[0], several

    def wrapper_steps_here(self) -> List[WrapperStep]:
        """The stepping methods of the wrapper classes of this module (read from this module only)."""
        try:
            data = current_bytes(self.path)
        except OSError:
            return []
        return wrapper_steps(self.path, data)

    def wrapper_step_methods(self) -> List[str]:
        """Names of the stepping methods of the project's optimizer wrapper classes."""
        return sorted({step.method for step in self.index.wrapper_steps()})

    def optimizer_method_over_self(self, method: str) -> Optional[str]:
        """"model.py:215 GPT.configure_optimizers()" when every class of the project that defines
        `method` builds a torch.optim optimizer from its own parameters only and returns it (and
        at least one does); else None."""
        found = []
        for path in self.index.modules():
            for klass, line, over_self in self.index.optimizer_methods(path, method):
                if not over_self:
                    return None
                found.append(f"{self.where(path, line)} {klass}.{method}()")
        return found[0] if len(found) == 1 else (f"{found[0]} and {len(found) - 1} more" if found else None)

    def loss_classes_with_backward(self) -> List[Tuple[str, str, str]]:
        """("loss/loss.py:78", class name, "self.acc_loss") for every class of the project (this
        module included) with a backward() of its own that runs `self.<attribute>.backward()`."""
        found = []
        for path in self.index.modules():
            outline = self.index.outline(path)
            if outline is None:
                continue
            for name, (line, inner) in sorted(outline.loss_backwards.items()):
                found.append((self.where(path, line), name, inner))
        return found

    def loss_class_filled_by(self, method: str) -> Union[None, str, Tuple[str, str, str, str]]:
        """The loss class with a backward() of its own whose instances `<loss>.<method>(...)` fills
        (pytorch-seq2seq: `loss.eval_batch(outputs, target)` fills an instance of a subclass of
        `Loss`, whose backward() runs `self.acc_loss.backward()`): (key of its module, "loss/loss.py:78",
        class name, "self.acc_loss"). None when no such class (or subclass of one) defines `method`;
        the reason when that cannot be told apart (several such classes define it) or a subclass
        has a backward() of its own, which the edit of the class's backward() would not reach."""
        shapes: List[Tuple[Path, str, Tuple[str, ...], FrozenSet[str]]] = []
        owners: List[Tuple[Path, str, int, str]] = []
        for path in self.index.modules():
            outline = self.index.outline(path)
            if outline is None:
                continue
            shapes.extend((path, name, bases, methods) for name, (bases, methods) in outline.class_shapes.items())
            owners.extend((path, name, line, inner) for name, (line, inner) in outline.loss_backwards.items())
        found = loss_classes_defining(shapes, owners, method, self.where)
        if isinstance(found, str) or found is None:
            return found
        path, name, line, inner = found
        return str(path), self.where(path, line), name, inner

    def torch_module_imported(self) -> Optional[str]:
        """"models/pix2pix_model.py" when a project module this module imports directly imports
        torch itself (the model and optimizers this module trains are PyTorch's); else None."""
        outline = self._own_outline()
        if outline is None:
            return None
        for target in self.index.import_targets(self.path, outline):
            imported = self.index.outline(target) if target is not None else None
            if imported is not None and target != self.path and any(
                    level == 0 and module.split(".")[0] == "torch" for module, _name, level in imported.imports.values()):
                return self.where(target, 0).rsplit(":", 1)[0]
        return None

    def call_sites_elsewhere(self, function_name: str, through_registries: bool = False) -> List[CallSite]:
        calls = sorted(self.index.callers(self.path, function_name, through_registries),
                       key=lambda call: (str(call.path), call.line))
        return [
            CallSite(str(call.path), self.where(call.path, call.line).rsplit(":", 1)[0], call.line, call.column)
            for call in calls
        ]

    def training_when_called_elsewhere(self) -> List[Tuple[str, str, str]]:
        """(key, "src/loss/adversarial.py:71", "Adversarial.forward") for each class of another
        project module whose forward() or __call__() trains (RepositoryIndex.modules_training_when_called)."""
        index = self.index
        own = self.path.resolve()
        holders = {path: outline for path, outline in index.modules_training_when_called().items() if path != own}
        if not holders:
            return []
        # linked to this file: in a package of its folder (EDSR's src/loss/ beside src/trainer.py,
        # loaded by import_module), imported by it, or imported with it by an entry script; a class
        # of a sibling script or of an unrelated corner of a large repository is not named
        reached = set(index.imported_closure(self.path))
        linked = {path for path in holders if path in reached or _in_a_package_of(path, own.parent)}
        if len(linked) < len(holders):
            for entry in index.modules():
                if entry == own or entry in holders:
                    continue
                closure = index.imported_closure(entry)
                if own in closure:
                    linked |= {path for path in holders if path in closure}
        return [(str(path), self.where(path, line), method)
                for path, outline in holders.items() if path in linked
                for line, method in outline.trains_when_called]

    def modules_spelling(self, marker: bytes, limit: int = 3) -> List[str]:
        """"models/base_model.py" for the first `limit` other project modules whose text holds
        `marker` (`amp.initialize(`), in the index's order."""
        found = []
        for path in self.index.modules():
            if path == self.path:
                continue
            try:
                if marker in current_bytes(path):
                    found.append(self.where(path, 0).rsplit(":", 1)[0])
            except OSError:
                continue
            if len(found) >= limit:
                break
        return found

    def trainers_used_from_elsewhere(self) -> List[Tuple[str, str, str]]:
        """(key, "cnn/architect.py:47", "Architect.step") for each class of another project module
        that this module imports and builds (`from architect import Architect` ... `Architect(model,
        args)`, or `architect.Architect(...)`) and one of whose public methods runs a backward()
        and an optimizer step (ModuleOutline.trainer_methods); a module that names a mixed
        precision API already is left out."""
        outline = self._own_outline()
        if outline is None:
            return []
        try:
            data = current_bytes(self.path)
        except OSError:
            return []
        found = []
        for local, (module, name, level) in outline.imports.items():
            candidates = []
            if name is not None:  # `from architect import Architect [as A]`
                candidates.append((self.index.resolve_module(self.path, module, level), name, local))
            else:  # `import architect`: `architect.Architect(...)`
                candidates.append((self.index.resolve_module(self.path, module, level), None, local))
            for target, class_name, spelled in candidates:
                if target is None or target.resolve() == self.path:
                    continue
                imported = self.index.outline(target)
                if imported is None or not imported.trainer_methods or imported.mixed_precision:
                    continue
                for line, method in imported.trainer_methods:
                    klass = method.split(".")[0]
                    call = (spelled if class_name == klass else f"{spelled}.{klass}" if class_name is None else None)
                    if call is not None and re.search(re.escape(call).encode() + rb"\s*\(", data):
                        found.append((str(target.resolve()), self.where(target, line), method))
        return sorted(set(found))

    def sessions_open_at_uses(self, name: str) -> List[Tuple[str, object]]:
        """("experiments/train.py", where) for each project module that uses this module's `name`
        (a TF1 class or function that builds an optimizer) inside a Session it opened first, with
        where (a caller_sessions.SessionBeforeUse: maddpg's `with U.single_threaded_session():`)."""
        from ampify.transforms.tf1.caller_sessions import session_before_use

        own = self.path.resolve()
        hits = []
        for path in self.index.modules():
            if path == own:
                continue
            try:  # a byte test first: the name and a Session spelled in the module
                data = current_bytes(path)
            except OSError:
                continue
            if name.encode() not in data or b"ession" not in data:
                continue
            hit = session_before_use(data, name)
            if hit is not None:
                hits.append((path, hit))
        if not hits:
            return []
        users = set(self.index.users_of(self.path, name, []))  # this module's `name`, not a namesake's
        return [(self.where(path, 0).rsplit(":", 1)[0], hit) for path, hit in hits if path in users]

    def source_of(self, key: str) -> Optional[bytes]:
        path = Path(key)
        if not self.index._inside(path):
            return None
        try:
            return current_bytes(path)
        except OSError:
            return None

    def is_this_module(self, key: str) -> bool:
        return Path(key).resolve() == self.path

    def in_this_run(self, key: str) -> bool:
        path = Path(key).resolve()
        return any(path == named or named in path.parents for named in self.named)

    def dependency_pins(self) -> Dict[str, Tuple[str, str]]:
        return dependency_pins(self.index.root)

    def imported_class(self, local: str) -> Optional[Tuple[str, str, str, int, bool]]:
        """(key, "models.py", class name, line, its module trains) for a class of another project
        module that this module imports as `local`, or reaches as `module.Class` through `import
        module` (znxlwm's pix2pix: `network.discriminator(...)`); None otherwise."""
        outline = self._own_outline()
        if outline is None:
            return None
        found = self.index.project_class(self.path, local, outline.imports)
        if found is None and "." in local:
            found = self.index.module_class(self.path, local, outline.imports)
        if found is None:
            return None
        path, name, line = found
        target = self.index.outline(path)
        return str(path), self.where(path, 0).rsplit(":", 1)[0], name, line, bool(target is not None and target.trains)

    def host_model_class(self, local: str) -> Optional[str]:
        """"model.py:12" for a class of another project module bound here as `local` (imported by
        name or through `from model import *`) whose module never names a device or CUDA
        (`.cuda()`, `.to(...)`, `device`, `set_default_...`): what it builds stays on the CPU.
        None otherwise."""
        outline = self._own_outline()
        if outline is None:
            return None
        found = self.index.project_class(self.path, local, outline.imports)
        if found is None and local not in outline.imports and outline.star_imports:
            found = self.index.star_imported_class(self.path, outline.star_imports, local)
        if found is None:
            return None
        path, _, line = found
        source = self.source_of(str(path))
        if source is None or _NAMES_A_DEVICE.search(source):
            return None
        return self.where(path, line)

    def project_class(self, local: str) -> Optional[Tuple[str, str, bool, bool]]:
        """(key, class name, it subclasses an optimizer, it only averages weights) for the class of
        another project module that this module imports as `local`, or reaches as `module.Class`
        (`class Lookahead(Optimizer)` is an optimizer, seq2seq's wrapper `class Optimizer(object)`
        and a scheduler `class FindLR(_LRScheduler)` are not; self-ensemble's
        `optim_weight_ema.EMAWeightOptimizer` averages weights); None when `local` is no such class."""
        found = self._imported_class(local)
        if found is None and "." in local:
            outline = self._own_outline()
            imports = dict(outline.imports) if outline is not None else {}
            for module, name, level in (outline.local_imports if outline is not None else []):
                # `import optim_weight_ema` inside the experiment function: seen where no module-level import binds it
                imports.setdefault(name or module.split(".")[0], (module if name else module.split(".")[0], name, level))
            located = self.index.module_class(self.path, local, imports)
            if located is not None:
                found = located[0], located[1], self.index.outline(located[0])
        if found is None:
            return None
        path, name, target = found
        shape = target.class_shapes.get(name) if target is not None else None
        return str(path), name, shape is not None and any(
            base.endswith("Optimizer") and "sched" not in base.lower() for base in shape[0]), \
            target is not None and name in target.weight_averages

    def no_grad_method(self, local: str, method: str) -> bool:
        """Is `method` of the class this module imports from another project module as `local`
        decorated `@torch.no_grad()` there (what it returns carries no gradient)?"""
        found = self._imported_class(local)
        return found is not None and found[2] is not None and method in found[2].no_grad_methods.get(found[1], frozenset())

    def _imported_class(self, local: str) -> Optional[Tuple[Path, str, Optional[ModuleOutline]]]:
        """(its module's path, class name, that module's outline) for the class of another project
        module this module imports as `local`; None when `local` is no such class."""
        outline = self._own_outline()
        found = self.index.project_class(self.path, local, outline.imports) if outline is not None else None
        if found is None:
            return None
        path, name, _ = found
        return path, name, self.index.outline(path)

    def inherited_attribute(self, base: str, attribute: str) -> Optional[InheritedAttribute]:
        """What the base class this module's classes name as `base` (a class of this module, or of
        another project module imported by name, through a package's re-exports, by `module.Class`
        or a star import) does with `self.<attribute>`; None when `base` is no project class or
        never sets it (inherited_optimizers.py)."""
        outline = self._own_outline()
        if outline is None:
            return None
        if base in outline.classes:
            found: Optional[Tuple[Path, str, int]] = (self.path, base, outline.classes[base])
        else:
            found = self.index.project_class(self.path, base, outline.imports)
            if found is None and "." in base:
                found = self.index.module_class(self.path, base, outline.imports)
            if found is None and base not in outline.imports and outline.star_imports:
                found = self.index.star_imported_class(self.path, outline.star_imports, base)
        if found is None:
            return None
        path, name, _ = found
        source = self.source_of(str(path))
        target = self.index.outline(path)
        try:
            tree = parsed_tree(source) if source is not None else None
        except (SyntaxError, ValueError):
            tree = None
        klass = class_named(tree, name) if tree is not None else None
        if klass is None or target is None:
            return None
        return inherited_attribute(klass, attribute, target.imports, lambda line: self.where(path, line))

    def only_inspects_parameter(self, dotted: str, position: Optional[int], keyword: Optional[str],
                                allowed: Sequence[str]) -> bool:
        """Does the project function `dotted` (as this module calls it) use the argument passed at
        `position` (or as `keyword`) only through the attributes `allowed` (`net.parameters()`) or
        by printing it (`print(net)`)? A model handed to `utils.print_network(self.D)` is then
        never called there."""
        outline = self._own_outline()
        found = self.index.function(self.path, dotted, outline.imports) if outline is not None else None
        if found is None:
            return False
        path, function = found
        try:
            tree = parsed_tree(current_bytes(path))
        except (OSError, SyntaxError, ValueError):
            return False
        definition = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function.name), None)
        if definition is None or definition.args.vararg or definition.args.kwarg:
            return False
        params = [a.arg for a in definition.args.posonlyargs + definition.args.args]
        if keyword is not None:
            parameter = keyword if keyword in params + [a.arg for a in definition.args.kwonlyargs] else None
        else:
            parameter = params[position] if position is not None and position < len(params) else None
        if parameter is None:
            return False
        parents = {id(child): node for node in ast.walk(definition) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(definition):
            if not (isinstance(node, ast.Name) and node.id == parameter):
                continue
            holder = parents.get(id(node))
            if isinstance(holder, ast.Attribute) and holder.value is node and holder.attr in allowed:
                continue
            if isinstance(holder, ast.Call) and node in holder.args and isinstance(holder.func, ast.Name) \
                    and holder.func.id == "print":
                continue
            return False
        return True

    def attribute_spelled_elsewhere(self, class_name: str, attribute: str) -> Optional[str]:
        """"main.py" when a project module that may use this module's class `class_name` spells
        `.attribute` (`gan.D(x)`); None when none does."""
        pattern = re.compile(rb"\." + re.escape(attribute.encode()) + rb"\b")
        for path in self.index.users_of(self.path, class_name, []):
            try:
                data = current_bytes(path)
            except OSError:
                return self.where(path, 0).rsplit(":", 1)[0]
            if pattern.search(data):
                return self.where(path, 0).rsplit(":", 1)[0]
        return None

    def attribute_calls_elsewhere(self, class_name: str, attribute: str, method: str) -> List[str]:
        """"worker.py:49" for every `<name>.attribute.method(` in a project module that may use this
        module's class `class_name`, `<name>` not `self` (a subclass using what it inherits);
        "worker.py:0" for such a module that cannot be read."""
        pattern = re.compile(rb"(\w+)\s*\.\s*" + re.escape(attribute.encode()) + rb"\s*\.\s*"
                             + re.escape(method.encode()) + rb"\s*\(")
        found = []
        for path in self.index.users_of(self.path, class_name, []):
            try:
                data = current_bytes(path)
            except OSError:
                found.append(self.where(path, 0))
                continue
            found += [self.where(path, data.count(b"\n", 0, match.start()) + 1) for match in pattern.finditer(data)
                      if match.group(1) != b"self"]
        return found

    def class_users_elsewhere(self, key: str, name: str) -> List[str]:
        """"test.py" for every project module besides this one and `key` that may use the class."""
        return [self.where(path, 0).rsplit(":", 1)[0] for path in self.index.users_of(Path(key), name, [self.path])]

    def class_user_sources(self, name: str) -> List[bytes]:
        """The sources of the project modules besides this one that may use its class `name`."""
        found = []
        for path in self.index.users_of(self.path, name, []):
            source = self.source_of(str(path))
            if source is not None:
                found.append(source)
        return found

    def callers_elsewhere(self, function_name: str) -> List[str]:
        calls = sorted(self.index.callers(self.path, function_name), key=lambda call: (str(call.path), call.line))
        return [self.where(call.path, call.line) for call in calls]


#: one index per project root, per process (workers are forked: each keeps its own)
_INDEXES: Dict[Path, RepositoryIndex] = {}


def project_view(path: Path, named: Sequence[Path] = ()) -> ProjectView:
    """The project `path` belongs to, as seen from it; the index is shared by the files of one
    project within a process. `named`: the paths the user gave (only those are written)."""
    root = find_root(path)
    if not any((root / marker).exists() for marker in _ROOT_MARKERS):
        # no project marker above the file (a downloaded archive, no .git): the outermost folder
        # the user named that holds it is the project (`ampify Speech-Transformer/` reads all of it)
        resolved = path.resolve()
        holders = [p.resolve() for p in named if p.is_dir() and p.resolve() in resolved.parents]
        if holders:
            root = min(holders, key=lambda p: len(p.parts))
    index = _INDEXES.get(root)
    if index is None:
        index = _INDEXES[root] = RepositoryIndex(root)
    return ProjectView(index, path, named)
