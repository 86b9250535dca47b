"""The device a training step runs on, spelled as an expression valid where autocast and the
GradScaler need it: the script's own device (`device.type`, `self.device.type`,
`torch.device(device).type`, a `.to(...)` argument) when one is visible there, else "cuda"."""

from __future__ import annotations

import re

from typing import List, Optional

import libcst as cst

from ampify.transforms.kit.imports import dotted_name
from ampify.transforms.torch import names as names
from ampify.transforms.torch import statements as statements
from ampify.transforms.torch.training_loop import Scope, TrainingStructure, names_passed_for


#: what a function naming a device, or CUDA, contains
_NAMES_A_DEVICE = re.compile(r"cuda|device|\.to\(|set_default_|DataParallel")
#: names that show the script may put tensors on a GPU without a .cuda()/.to() of its own
#: (`torch.set_default_device`, `torch.cuda.FloatTensor`, a `device` it hands elsewhere)
_DEFAULT_DEVICE_SETTERS = {"set_default_device", "set_default_tensor_type", "device", "cuda"}
#: `torch.cuda` calls that ask or seed and move nothing
_CUDA_QUERIES = re.compile(r"\btorch\s*\.\s*cuda\s*\.\s*(?:is_available|manual_seed_all|manual_seed|device_count|"
                           r"empty_cache|get_device_name)\b")


class DeviceChoice:
    """Finds the script's device expression; says once per file when it had to assume "cuda"."""

    def __init__(self, structure: TrainingStructure, torch: str, report, project=None) -> None:
        self.structure = structure
        self.torch = torch
        #: where findings go (the conversion: `info`, `warn`, `findings`)
        self.report = report
        #: the repository around the file (ProjectFacts), when ampify reads one
        self.project = project

    def device_for(self, scope: Scope, before_line: int, node: cst.CSTNode) -> str:
        """The script's own device, as a string expression valid in `scope` at `before_line`;
        "cuda" (said once per file) when the script names none."""
        device = self.expression(scope, before_line)
        if device is not None:
            return device
        if self.structure.uses_cuda_method:
            if not any(f.code in ("AMP207", "AMP216") for f in self.report.findings):
                self.report.info(
                    "AMP207",
                    'device "cuda" taken from the script\'s .cuda() calls (no device variable found)',
                    node,
                )
            return '"cuda"'
        if any(f.code in ("AMP207", "AMP216", "AMP228") for f in self.report.findings):
            return '"cuda"'  # said once per file is enough
        host_modules = self._models_built_here()
        if host_modules is not None and not self._may_set_a_device():
            # no .cuda(), no .to(...), no torch.device, no default device: the tensors stay on the
            # CPU, where autocast("cuda") and GradScaler("cuda") switch themselves off
            neither = f" (nor does {', '.join(host_modules)}, where its model class is defined)" if host_modules else ""
            self.report.warn(
                "AMP228",
                f'nothing in this file moves the model or the data to a device (no .cuda(), .to(device), '
                f'torch.device(...)){neither}: it trains on the CPU, where autocast("cuda") and GradScaler("cuda") switch '
                'themselves off and every op stays float32; move the model and the batches to the GPU (the '
                'converted step then runs in float16), or pass --dtype bfloat16 and use the CPU by hand',
                node,
            )
            return '"cuda"'
        self.report.warn(
            "AMP216",
            'no device expression found in the script (torch.device(...), args.device, .to(device)): '
            '"cuda" assumed; change device_type/GradScaler("cuda") if this script trains elsewhere',
            node,
        )
        return '"cuda"'

    def _may_set_a_device(self) -> bool:
        """Does the file name what could put its tensors on a GPU (`torch.set_default_device`, a
        `device`, `cuda`)? `torch.cuda.is_available()` and `torch.cuda.manual_seed(...)` alone
        (splitcross.py's self-test seeds CUDA when there is one, and trains on the CPU) do not."""
        found = self.structure.all_names & _DEFAULT_DEVICE_SETTERS
        if found != {"cuda"}:
            return bool(found)
        return bool(re.search(r"\bcuda\b", _CUDA_QUERIES.sub("", self.structure.module.code)))

    def _device_set_by_users(self, class_name: str) -> bool:
        """May the modules that build this file's class `class_name` put it on a GPU? True when
        one of them names a device, or when none is known (a class of a library); False when every
        user is seen and none does (ikostrikov's DDPG, built by a main.py that never names one)."""
        sources = self.project.class_user_sources(class_name) if self.project is not None else []
        if not sources:
            return True
        return any(_NAMES_A_DEVICE.search(source.decode("utf-8", "replace")) for source in sources)

    def _models_built_here(self) -> Optional[List[str]]:
        """Are the models this file's optimizers train all built here, on the CPU, from torch.nn /
        torchvision, a class of this file, or a class of another project module that names no
        device? (A model from another module's factory, such as CUT's `networks.define_G(opt)`,
        may come back on the GPU.) The places of those other modules' classes when so, else None."""
        s = self.structure
        local_classes = {node.name.value for node in s.module.body if isinstance(node, cst.ClassDef)}
        # a factory of this file that names no device (`def build_model(...)`: a Sequential built and returned)
        local_classes |= {node.name.value for node in s.module.body if isinstance(node, cst.FunctionDef)
                          and not _NAMES_A_DEVICE.search(s.module.code_for_node(node))}
        models = set()
        self._drawn_calls: List[cst.Call] = []
        own_instances = False  # some optimizer trains `self`, an instance of a class of this file built here
        for binding in s.bindings:
            if binding.qualified_call and names.is_optimizer_qualname(binding.qualified_call) and binding.value is not None:
                tensors = self._tensors_optimized(binding)
                if tensors is False:
                    return None
                if tensors:
                    # `SGD([opt_img], lr=1e4)`: an input image optimized, made here on no device
                    own_instances = True
                    continue
                for call in statements.calls_within(binding.value):
                    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("parameters", "named_parameters"):
                        model = dotted_name(call.func.value) or ""
                        if not model.startswith("self."):
                            model = model.split(".")[0]  # `model.module.parameters()`: the model
                        if model == "self":
                            # `optim.Adam(self.parameters())` in a module class of this file (minimalRL's
                            # QNet): the model is an instance of that class, built in this file
                            if binding.klass is None or binding.klass.name.value not in local_classes:
                                return None
                            built = [b for b in s.bindings if _built_by(b, binding.klass.name.value)]
                            if not built:
                                return None
                            own_instances = True
                            continue
                        if model.startswith("self.") and binding.klass is not None and not any(
                                _built_by(b, binding.klass.name.value) for b in s.bindings) \
                                and self._device_set_by_users(binding.klass.name.value):
                            # `Adam(self.dis.parameters())` in a class another module builds (EDSR's
                            # adversarial loss, moved with `.to(device)` by its user): its device is set there
                            return None
                        models.add((model, binding.scope))
            elif isinstance(binding.value, (cst.ListComp, cst.GeneratorExp)) and binding.statement is not None:
                # `opts = [torch.optim.Adam(net.parameters(), lr=LR) for net in nets]` (MorvanZhou's
                # batch-norm comparison): the models are the elements of `nets`
                drawn = self._models_drawn_by(binding)
                if drawn is None:
                    continue
                if drawn is False:
                    return None
                models.update(drawn)
        if any(model == "" for model, _ in models):
            return None
        if not models:
            return [] if own_instances else None
        elsewhere: List[str] = []
        for model, scope in models:
            if model == _DRAWN:
                for value in self._drawn_calls:
                    called = dotted_name(value.func) or ""
                    qualified = s.imports.resolve(value.func) or called
                    if not (qualified.startswith(("torch.nn.", "torchvision.models.")) or called in local_classes):
                        return None
                continue
            # the model's bindings seen where the optimizer is built (not a `q = self.fc_q(x)` of a method)
            built = s.bindings_visible(model, scope)
            if built and all(b.kind == "parameter" for b in built):
                passed = names_passed_for(s, model, built[0].scope)
                if passed is not None:
                    # `def train(model): ...` called as `train(net_batchnorm)`: what the callers hand in
                    built = [b for name, _, caller in passed for b in s.bindings_visible(name, caller)]
                    if len(built) < len(passed):
                        return None
                else:
                    # a function's parameter (`def train(global_model, rank)`): what this file binds
                    # the name to outside its classes' methods (`global_model = ActorCritic()` in main)
                    built = [b for b in s.bindings if b.name == model and b.statement is not None
                             and s.class_of(b.scope) is None]
            if not built or any(b.statement is None for b in built):
                return None
            for binding in built:
                value = _value_of(binding)
                if not isinstance(value, cst.Call):
                    return None
                called = binding.qualified_call or dotted_name(value.func) or ""
                if called.startswith(("torch.nn.", "torchvision.models.")) or called in local_classes:
                    continue
                # by the name it is bound to here (`Model` of `from model import Model`, which
                # resolves to model.Model: Pytorch-DPPO's ppo.py)
                local = dotted_name(value.func) or ""
                place = self.project.host_model_class(local) if self.project is not None and "." not in local else None
                if place is None:
                    return None
                if place not in elsewhere:
                    elsewhere.append(place)
        return elsewhere

    def _tensors_optimized(self, binding):
        """For an optimizer built over a list of tensors (`SGD([opt_img], lr=1e4)`: an image
        optimized, utkuozbulak's inverted representation, deep dream): True when each is made here
        by a torch factory naming no device (`Variable(1e-1 * torch.randn(1, 3, 224, 224),
        requires_grad=True)`, `torch.zeros(..., requires_grad=True)`), False when one is made
        otherwise (loaded, moved, handed in), None when the optimizer is built over no such list."""
        s = self.structure
        value = binding.value
        first = value.args[0].value if isinstance(value, cst.Call) and value.args and value.args[0].keyword is None \
            else None
        if not isinstance(first, (cst.List, cst.Tuple)) or not first.elements:
            return None
        for element in first.elements:
            if isinstance(element, cst.StarredElement) or not isinstance(element.value, cst.Name):
                return None if not isinstance(element.value, cst.Name) else False
            made = [b for b in s.bindings_visible(element.value.value, binding.scope) if b.statement is not None]
            if not made or any(not _made_on_no_device(b.value, s.imports) for b in made):
                return False
        return True

    def _models_drawn_by(self, binding):
        """For optimizers built in a comprehension over a list of models: {(model, scope)} naming
        the list's elements' bindings through a stand-in for each, or False when it cannot be
        followed; None when the comprehension builds no optimizer."""
        s = self.structure
        comprehension = binding.value
        element = comprehension.elt
        if not (isinstance(element, cst.Call) and names.is_optimizer_qualname(s.imports.resolve(element.func) or "")):
            return None
        loop = comprehension.for_in
        if loop.inner_for_in is not None or not isinstance(loop.target, cst.Name) or not isinstance(loop.iter, cst.Name):
            return False
        parameters = [call for call in statements.calls_within(element) if isinstance(call.func, cst.Attribute)
                      and call.func.attr.value in ("parameters", "named_parameters")]
        if not parameters or any(dotted_name(call.func.value) != loop.target.value for call in parameters):
            return False
        lists = s.bindings_visible(loop.iter.value, binding.scope)
        if not lists or any(not isinstance(b.value, (cst.List, cst.Tuple)) for b in lists):
            return False
        elements = [element.value for b in lists for element in b.value.elements]
        if not elements or any(isinstance(e, cst.StarredElement) or not isinstance(e, cst.Call) for e in elements):
            return False
        self._drawn_calls += elements
        return {(_DRAWN, binding.scope)}

    def expression(self, scope: Scope, before_line: int) -> Optional[str]:
        """The device expression the script itself makes visible in `scope` at `before_line`, or None."""
        s = self.structure
        torch = self.torch
        chain = s.enclosing_scopes(scope)
        for candidate_scope in chain:
            for binding in s.device_bindings:
                if binding.scope is not candidate_scope or "." in binding.name:
                    continue
                if candidate_scope is scope and s.line(binding.statement) >= before_line:
                    continue
                if s.bindings_visible(binding.name, scope) and s.bindings_visible(binding.name, scope)[0].scope is candidate_scope:
                    return f"{binding.name}.type"
        klass = s.class_of(scope)
        if klass is not None:
            for binding in s.device_bindings:
                if binding.name.startswith("self.") and binding.klass is klass and self._set_before(binding, scope, before_line):
                    return f"{binding.name}.type"
        for candidate_scope in chain:
            if isinstance(candidate_scope, cst.FunctionDef):
                for param in statements.all_params(candidate_scope):
                    if param.name.value == "device" and not _defaults_to_none(param):
                        return f"{torch}.device(device).type"
        # `.to("cpu")` mostly brings a result back to the host (`.to("cpu").numpy()`, StyleGAN2's
        # projector saving images while it trains on `device = "cuda"`): the training device only
        # when no other device is named
        found = [self._visible_device_argument(argument, scope, before_line) for argument, _ in s.to_device_arguments]
        found = [text for text in found if text is not None]
        return next((text for text in found if text != '"cpu"'), found[0] if found else None)

    def _set_before(self, binding, scope: Scope, before_line: int) -> bool:
        """Is the attribute `binding` sets (`self.device = ...`) already set when code at
        `before_line` in `scope` runs? In the same method: only if bound above that line. From
        another method: yes, except in __init__, which runs before any other method."""
        if binding.scope is scope:
            return binding.statement is not None and self.structure.line(binding.statement) < before_line
        return not (isinstance(scope, cst.FunctionDef) and scope.name.value == "__init__")

    def _visible_device_argument(self, argument: cst.BaseExpression, scope: Scope, before_line: int) -> Optional[str]:
        s = self.structure
        if isinstance(argument, cst.SimpleString):
            value = argument.evaluated_value
            if isinstance(value, str) and value.split(":")[0] in ("cuda", "cpu", "mps", "xpu", "hpu", "npu", "xla"):
                return f'"{value.split(":")[0]}"'
            return None
        name = dotted_name(argument)
        if name is None or not names.looks_like_device_name(name):
            return None  # `.to(dtype)`, `.to(other_tensor)`: not a device
        base = name.split(".")[0]
        if base == "self" and self._device_of_held_object(name, scope, before_line):
            return f"{name}.type"
        if base == "self":
            if not any(self._set_before(b, scope, before_line) for b in s.bindings_visible(name, scope)):
                return None
        else:
            bindings = s.bindings_visible(base, scope)
            if not bindings:
                return None
            if any(b.kind == "parameter" and isinstance(b.scope, cst.FunctionDef) and _param_defaults_to_none(b.scope, base)
                   for b in bindings):
                return None  # `.to(device)` with device=None moves nothing; torch.device(None) raises
            if bindings[0].scope is scope and all(
                b.statement is not None and s.line(b.statement) >= before_line for b in bindings
            ):
                return None
        device_names = {b.name for b in s.device_bindings}
        if name in device_names:
            return f"{name}.type"
        if _names_a_device_index(name):
            # `.to(args.gpu)`, `.to(local_rank)`: a CUDA device ordinal, often None on some runs
            # (moco's `--gpu` default; the call sits under `if args.gpu is not None`), and
            # torch.device(None) raises where autocast runs unguarded
            return '"cuda"'
        return f"{self.torch}.device({name}).type"

    def _device_of_held_object(self, name: str, scope: Scope, before_line: int) -> bool:
        """`self.Q_eval.device`: is `self.Q_eval` set (before `before_line`, seen from `scope`) only
        to instances of one class of this file whose __init__ sets `self.device` to a device? (phil
        tabor's networks build their optimizer and device themselves; the agent holds them.)"""
        s = self.structure
        parts = name.split(".")
        if len(parts) != 3:
            return False
        owner = f"self.{parts[1]}"
        bindings = s.bindings_visible(owner, scope)
        if not bindings or not all(isinstance(b.value, cst.Call) and isinstance(b.value.func, cst.Name) for b in bindings):
            return False
        if not any(self._set_before(b, scope, before_line) for b in bindings):
            return False
        classes = {b.value.func.value for b in bindings}
        if len(classes) != 1:
            return False
        klass = next((node for node in s.module.body if isinstance(node, cst.ClassDef)
                      and node.name.value == next(iter(classes))), None)
        if klass is None:
            return False
        devices = [b for b in s.device_bindings if b.klass is klass and b.name == f"self.{parts[2]}"]
        return bool(devices) and all(isinstance(b.scope, cst.FunctionDef) and b.scope.name.value == "__init__"
                                     for b in devices)


#: the models of a comprehension's list, checked call by call (see _models_drawn_by)
_DRAWN = "<the list's models>"


def _value_of(binding) -> Optional[cst.BaseExpression]:
    """The value a binding gives its name, also for `a, b = X(), Y()` (the matching element)."""
    if binding.kind != "tuple":
        return binding.value
    statement = binding.statement
    line = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    if not isinstance(line, cst.Assign) or len(line.targets) != 1:
        return None
    target, value = line.targets[0].target, line.value
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(value, (cst.Tuple, cst.List)):
        return None
    if len(target.elements) != len(value.elements):
        return None
    for element, assigned in zip(target.elements, value.elements):
        if isinstance(element, cst.StarredElement) or isinstance(assigned, cst.StarredElement):
            return None
        if dotted_name(element.value) == binding.name:
            return assigned.value
    return None


def _built_by(binding, class_name: str) -> bool:
    """Does this binding give its name an instance of `class_name` (a plain call of it)?"""
    if binding.statement is None:
        return False
    value = _value_of(binding)
    return isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == class_name


def _defaults_to_none(param: cst.Param) -> bool:
    """`device=None`: a call may leave it out, and torch.device(None) raises."""
    return isinstance(param.default, cst.Name) and param.default.value == "None"


def _param_defaults_to_none(function: cst.FunctionDef, name: str) -> bool:
    return any(param.name.value == name and _defaults_to_none(param) for param in statements.all_params(function))


def _names_a_device_index(name: str) -> bool:
    """`args.gpu`, `local_rank`, `self.gpu_id`, `device_id`: an integer CUDA ordinal (or None), not a
    torch.device or a device string."""
    return bool(_DEVICE_INDEX.search(name.rsplit(".", 1)[-1]))


_DEVICE_INDEX = re.compile(r"gpu|rank|ordinal|dev(ice)?_?(id|idx|index)", re.IGNORECASE)


#: torch factories of a new tensor (on the default device unless given `device=`)
_TENSOR_FACTORIES = {"randn", "rand", "zeros", "ones", "empty", "full", "tensor", "randint", "normal", "linspace",
                     "arange", "eye", "from_numpy"}
#: wrappers and methods that keep a tensor where it is
_KEEPING = {"torch.autograd.Variable", "torch.nn.Parameter", "torch.nn.parameter.Parameter"}
_KEEPING_METHODS = {"requires_grad_", "float", "double", "clone", "detach", "normal_", "uniform_", "zero_", "fill_",
                    "view", "reshape", "unsqueeze", "squeeze"}


def _made_on_no_device(value, imports) -> bool:
    """Is `value` a tensor made by a torch factory with no `device=` (through arithmetic with
    numbers, Variable/Parameter and methods that keep it where it is)?"""
    if isinstance(value, cst.BinaryOperation):
        sides = [value.left, value.right]
        tensors = [side for side in sides if not isinstance(side, (cst.Integer, cst.Float, cst.Name, cst.Attribute))]
        return bool(tensors) and all(_made_on_no_device(side, imports) for side in tensors)
    if not isinstance(value, cst.Call):
        return False
    if any(arg.keyword is not None and arg.keyword.value == "device" for arg in value.args):
        return False
    qualified = imports.resolve(value.func) or ""
    if qualified in _KEEPING:
        return bool(value.args) and _made_on_no_device(value.args[0].value, imports)
    if qualified.startswith("torch.") and qualified.rsplit(".", 1)[-1] in _TENSOR_FACTORIES and qualified.count(".") == 1:
        return True
    if isinstance(value.func, cst.Attribute) and qualified == "" and value.func.attr.value in _KEEPING_METHODS:
        return _made_on_no_device(value.func.value, imports)
    return False
