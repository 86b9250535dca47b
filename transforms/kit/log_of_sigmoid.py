"""The log of a sigmoid's probability, taken by the training code itself (PyTorch and TF1).

    D = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 1), nn.Sigmoid())
    D_real, D_fake = D(X), D(G(z))
    D_loss = -torch.mean(torch.log(D_real + 1e-8) + torch.log(1 - D_fake + 1e-8))

wiseodd/generative-models' GANs (and many tutorial GANs, VAEs with a hand-written Bernoulli
likelihood, Bernoulli policies) write the cross entropy out. Under autocast (or apex O1) the
Linear before the sigmoid runs in float16, so the sigmoid does too: `1 - p` is 0 once the logit
passes about 7.6 (float16 has 11 bits next to 1; bfloat16 8 bits, about 5.5), `p` is 0 below
about -16.6, the `+ 1e-8` is lost in float16, and the log is -inf. The loss is inf, GradScaler
skips the step and halves its scale, and keeps doing so while the discriminator stays confident:
training stops without an error. autocast refuses `nn.BCELoss` for this very reason; the written-out
form gets no such error, so ampify refuses the file with the reason instead. TF1's graph rewrite
runs `tf.nn.sigmoid` in float16 alike (its infer list), and `tf.log(1 - D_fake + 1e-8)` is -inf
there too (the TENSORFLOW vocabulary: `tf.log`, `tf.nn.sigmoid`, `activation=tf.nn.sigmoid`).

A probability is the output of a model of this file that ends in a sigmoid (an `nn.Sequential`
whose last layer is `nn.Sigmoid()`, or a class whose forward() returns a sigmoid or such a
Sequential's output, through shape operations), or of `torch.sigmoid` / `F.sigmoid` / `.sigmoid()`
called in the step; a name bound to one is one too. So is the output of a model class of another
project module the file imports whose forward() returns a probability (`imported_models`, found by
torch/sigmoid_models.py through the repository's outline). A log is `torch.log`, `torch.log2`,
`torch.log10`, `torch.log1p`, `x.log()`, or a function of this file that returns one of those of
its parameter (`def log(x): return torch.log(x + 1e-8)`). The log's argument is followed through
arithmetic, clamping and shape operations to a probability. `torch.log(p + 1e-3)` is left alone:
an epsilon of 1e-4 or more is a normal float16 number, the log stays finite; so is a log taken
under `torch.no_grad()` (or in a function decorated with it), which feeds no loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Dict, FrozenSet, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name



@dataclass(frozen=True)
class Vocabulary:
    """A framework's names for the shapes above (resolved, after `prefixes` are rewritten)."""

    sigmoid_functions: FrozenSet[str]
    log_functions: FrozenSet[str]
    #: calls that keep a probability a probability (clamps, reshapes)
    through_functions: FrozenSet[str]
    sigmoid_modules: FrozenSet[str] = frozenset()
    sequentials: FrozenSet[str] = frozenset()
    #: (prefix, replacement) applied to resolved names: tensorflow.compat.v1.nn.sigmoid -> tensorflow.nn.sigmoid
    prefixes: Tuple[Tuple[str, str], ...] = ()
    #: a layer call's output is a probability when its `activation=` is a sigmoid (`tf.layers.dense`)
    activation_keyword: bool = False
    #: contexts (and decorators) under which nothing is backpropagated: a log there feeds no loss
    #: (GAIL's `predict_reward()`, run from the rollout loop, outside the training step's autocast)
    no_grad: FrozenSet[str] = frozenset()


TORCH = Vocabulary(
    sigmoid_functions=frozenset({"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"}),
    log_functions=frozenset({"torch.log", "torch.log2", "torch.log10", "torch.log1p"}),
    through_functions=frozenset({"torch.clamp", "torch.clip", "torch.squeeze", "torch.flatten"}),
    sigmoid_modules=frozenset({"torch.nn.Sigmoid", "torch.nn.modules.activation.Sigmoid"}),
    sequentials=frozenset({"torch.nn.Sequential", "torch.nn.modules.container.Sequential"}),
    no_grad=frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                       "torch.autograd.grad_mode.no_grad"}),
)

TENSORFLOW = Vocabulary(
    sigmoid_functions=frozenset({"tensorflow.sigmoid", "tensorflow.nn.sigmoid", "tensorflow.math.sigmoid",
                                 "tensorflow.keras.activations.sigmoid"}),
    log_functions=frozenset({"tensorflow.log", "tensorflow.math.log", "tensorflow.log1p", "tensorflow.math.log1p"}),
    through_functions=frozenset({"tensorflow.clip_by_value", "tensorflow.squeeze", "tensorflow.reshape",
                                 "tensorflow.maximum", "tensorflow.minimum", "tensorflow.math.maximum",
                                 "tensorflow.math.minimum", "tensorflow.identity"}),
    prefixes=(("tensorflow.compat.v1.", "tensorflow."), ("tensorflow.compat.v2.", "tensorflow.")),
    activation_keyword=True,
)

_LOG_METHODS = {"log", "log2", "log10", "log1p"}
#: calls that keep a probability a probability (or move it no further from 0 and 1 than float16 can)
_THROUGH_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous", "view_as", "clamp",
                    "clamp_min", "clamp_max", "clip", "float", "double", "detach", "to"}
#: moving a model keeps what its forward returns
_MODEL_MOVES = {"to", "cuda", "cpu", "float", "double", "train", "eval"}
#: the smallest epsilon added inside a log that keeps it finite in float16 (its smallest normal is 6.1e-5)
_SAFE_EPSILON = 1e-4


def log_of_probability_calls(module: cst.Module, imports: ImportMap, vocabulary: Vocabulary = TORCH,
                             imported_models: Collection[str] = ()) -> List[Tuple[cst.Call, str]]:
    """(log call, the probability it takes the log of, as written) for every such log in `module`.
    `imported_models`: the names (`Discriminator`, `models.Discriminator`) of model classes of other
    modules, imported here, whose forward() returns a probability (torch/sigmoid_models.py)."""
    imports = _Names(imports, vocabulary)
    index = _Index(imports, frozenset(imported_models))
    walk(module, index)
    if not index.sigmoid_seen:
        return []
    models = index.sigmoid_models()
    helpers = index.log_helpers()
    constants = index.module_constants()
    found = []
    for scope, calls in index.calls_by_scope.items():
        judge = _Judge(imports, models)
        judge.probabilities = _probability_names(index.assignments_by_scope.get(scope, []), judge)
        clamped = _float32_clamped_names(index.assignments_by_scope.get(scope, []), imports)
        for call in calls:
            if id(call) in index.without_grad:
                continue
            argument = _log_argument(call, imports, helpers, constants)
            if argument is None:
                continue
            if clamped and any(isinstance(node, cst.Name) and node.value in clamped
                               for node in _subexpressions(argument)):
                continue  # `p = torch.clamp(p.float(), eps, 1 - eps)`: float32 keeps the bound, the log is finite
            source = judge.probability_in(argument)
            if source is None and index.sigmoid_producers:
                # `log(1 - x)` of a value ampify cannot follow (`D['model'](X)`, models picked from a
                # list) in a file whose model ends in a sigmoid: a probability all the same, unless
                # x is a random draw (`u = x.new(n).uniform_(1e-5, 1 - 1e-5)`, logistic sampling)
                drawn = _random_draw_names(index.assignments_by_scope.get(scope, []))
                source = _one_minus(argument, drawn)
            if source is not None:
                found.append((call, source))
    return found


class _Names:
    """An ImportMap whose resolved names are rewritten by the vocabulary's prefixes."""

    def __init__(self, imports: ImportMap, vocabulary: Vocabulary) -> None:
        self.imports = imports
        self.vocabulary = vocabulary

    def resolve(self, node: cst.BaseExpression) -> Optional[str]:
        name = self.imports.resolve(node)
        if name is not None:
            for prefix, replacement in self.vocabulary.prefixes:
                if name.startswith(prefix):
                    return replacement + name[len(prefix):]
        return name


class _Index(cst.CSTVisitor):
    """One walk: classes, assignments and calls by scope (a function, or the module)."""

    def __init__(self, imports: "_Names", imported_models: FrozenSet[str] = frozenset()) -> None:
        self.imports = imports
        self.imported_models = imported_models
        self.sigmoid_seen = False
        self.classes: Dict[str, cst.ClassDef] = {}
        self.functions: Dict[str, cst.FunctionDef] = {}
        self.scopes: List[cst.CSTNode] = [None]
        self.class_stack: List[cst.ClassDef] = []
        self.calls_by_scope: Dict[object, List[cst.Call]] = {}
        self.assignments_by_scope: Dict[object, List[cst.Assign]] = {}
        #: "self.main" / "D" -> the Sequential ending in a sigmoid bound to it; "self.sigmoid" -> nn.Sigmoid()
        self.sequentials: Dict[Tuple[object, str], cst.Call] = {}
        self.sigmoid_layers: Dict[Tuple[object, str], cst.Call] = {}
        #: per function (the module first): inside how many no-grad contexts the walk is
        self.no_grad_depth: List[int] = [0]
        self.no_grad_withs: Set[int] = set()
        #: ids of calls made with gradients off
        self.without_grad: Set[int] = set()
        #: an nn.Sigmoid layer is built or a sigmoid function called
        self.sigmoid_producers = False
        #: the return statements of each function (not of the functions inside it)
        self.returns_by_scope: Dict[object, List[cst.Return]] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if len(self.scopes) == 1:
            self.classes[node.name.value] = node
        self.class_stack.append(node)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.class_stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if len(self.scopes) == 1 and not self.class_stack:
            self.functions[node.name.value] = node
        self.scopes.append(node)
        self.no_grad_depth.append(int(any(self._is_no_grad(d.decorator) for d in node.decorators)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scopes.pop()
        self.no_grad_depth.pop()

    def visit_Return(self, node: cst.Return) -> None:
        self.returns_by_scope.setdefault(self.scopes[-1], []).append(node)

    def visit_With(self, node: cst.With) -> None:
        if any(self._is_no_grad(item.item) for item in node.items):
            self.no_grad_depth[-1] += 1
            self.no_grad_withs.add(id(node))

    def leave_With(self, original_node: cst.With) -> None:
        if id(original_node) in self.no_grad_withs:
            self.no_grad_depth[-1] -= 1

    def _is_no_grad(self, node: cst.BaseExpression) -> bool:
        """`torch.no_grad()`, `@torch.no_grad()`, `@torch.no_grad`, `torch.inference_mode()`."""
        target = node.func if isinstance(node, cst.Call) else node
        return self.imports.resolve(target) in self.imports.vocabulary.no_grad

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("sigmoid", "Sigmoid", "expit"):
            self.sigmoid_seen = True

    def visit_Call(self, node: cst.Call) -> None:
        if self.no_grad_depth[-1]:
            self.without_grad.add(id(node))
        self.calls_by_scope.setdefault(self.scopes[-1], []).append(node)
        words = self.imports.vocabulary
        if self.imports.resolve(node.func) in words.sigmoid_functions | words.sigmoid_modules:
            self.sigmoid_producers = True
        elif self.imported_models and dotted_name(node.func) in self.imported_models:
            # a model of another module ending in a sigmoid is built here
            self.sigmoid_seen = self.sigmoid_producers = True

    def visit_Assign(self, node: cst.Assign) -> None:
        self.assignments_by_scope.setdefault(self.scopes[-1], []).append(node)
        if len(node.targets) != 1:
            return
        target = dotted_name(node.targets[0].target)
        if target is None:
            return
        owner = self.class_stack[-1] if target.startswith("self.") and self.class_stack else None
        qualified = self.imports.resolve(node.value.func) if isinstance(node.value, cst.Call) else None
        if qualified in self.imports.vocabulary.sigmoid_modules:
            self.sigmoid_layers[(owner, target)] = node.value
        elif qualified in self.imports.vocabulary.sequentials and _ends_in_sigmoid(node.value, self.imports):
            self.sequentials[(owner, target)] = node.value

    def module_constants(self) -> Dict[str, float]:
        """`eps = 1e-3` at module level, bound once."""
        values: Dict[str, List[Optional[float]]] = {}
        for assign in self.assignments_by_scope.get(None, []):
            for target in assign.targets:
                if isinstance(target.target, cst.Name):
                    values.setdefault(target.target.value, []).append(_number(assign.value))
        return {name: found[0] for name, found in values.items() if len(found) == 1 and found[0] is not None}

    def sigmoid_models(self) -> Dict[str, Optional[FrozenSet[int]]]:
        """Names (`D`, `self.netD`) bound to a model whose output is a probability (None), or whose
        output is a tuple with probabilities at some positions (`return D_gan(h), D_aux(h)`)."""
        classes = {name for name, klass in self.classes.items() if self._returns_probability(klass)}
        classes |= {name for name in self.imported_models if name not in self.classes}
        models: Dict[str, Optional[FrozenSet[int]]] = {
            target: None for (owner, target) in self.sequentials if owner is None}
        for assignments in self.assignments_by_scope.values():
            for assign in assignments:
                if len(assign.targets) != 1:
                    continue
                target = dotted_name(assign.targets[0].target)
                built = _moved_model(assign.value)
                if target is None or not isinstance(built, cst.Call):
                    continue
                called = dotted_name(built.func)
                if called in classes or (called in models and models[called] is None):
                    models[target] = None
                elif (self.imports.resolve(built.func) in self.imports.vocabulary.sequentials
                      and _ends_in_sigmoid(built, self.imports)):
                    models[target] = None
        # functions of the module returning a model's output (`def D(X, z): return D_(torch.cat([X, z], 1))`)
        changed = True
        while changed:
            changed = False
            for name, function in self.functions.items():
                if name in models:
                    continue
                found, positions = self._returned_probabilities(function, models)
                if found:
                    models[name] = positions
                    changed = True
        return models

    def _returned_probabilities(self, function: cst.FunctionDef, models) -> Tuple[bool, Optional[FrozenSet[int]]]:
        """(True, None) when every return of `function` is a probability; (True, positions) when
        every return is a tuple with probabilities at those positions; (False, None) otherwise."""
        judge = _Judge(self.imports, models)
        judge.probabilities = _probability_names(self.assignments_by_scope.get(function, []), judge)
        returns = [r.value for r in self.returns_by_scope.get(function, [])]
        if not returns or any(value is None for value in returns):
            return False, None
        if all(judge.is_probability(value) for value in returns):
            return True, None
        if not all(isinstance(value, cst.Tuple) for value in returns):
            return False, None
        positions = None
        for value in returns:
            here = frozenset(i for i, element in enumerate(value.elements) if judge.is_probability(element.value))
            positions = here if positions is None else positions & here
        return bool(positions), positions or None

    def _returns_probability(self, klass: cst.ClassDef) -> bool:
        forward = next((s for s in klass.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "forward"),
                       None)
        if forward is None:
            return False
        attributes = {target: None for (owner, target) in self.sequentials if owner is klass}
        attributes.update({target: None for (owner, target) in self.sigmoid_layers if owner is klass})
        return self._returned_probabilities(forward, attributes) == (True, None)

    def log_helpers(self) -> Set[str]:
        """Module functions whose every return is a log of an expression of their first parameter."""
        helpers = set()
        constants = self.module_constants()
        for name, function in self.functions.items():
            params = function.params.params
            if not params:
                continue
            first = params[0].name.value
            returns = self.returns_by_scope.get(function, [])
            if returns and all(r.value is not None and _is_log_of(r.value, first, self.imports, constants)
                               for r in returns):
                helpers.add(name)
        return helpers


def _ends_in_sigmoid(sequential: cst.Call, imports: "_Names") -> bool:
    positional = [a for a in sequential.args if a.keyword is None and not a.star]
    if not positional or len(positional) != len(sequential.args):
        return False
    last = positional[-1].value
    return isinstance(last, cst.Call) and imports.resolve(last.func) in imports.vocabulary.sigmoid_modules


def _moved_model(value: cst.BaseExpression) -> cst.BaseExpression:
    """`Discriminator().to(device)` -> `Discriminator()`."""
    while (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
           and value.func.attr.value in _MODEL_MOVES and isinstance(value.func.value, cst.Call)):
        value = value.func.value
    return value


def _log_argument(call: cst.Call, imports: "_Names", helpers: Set[str],
                  constants: Dict[str, float]) -> Optional[cst.BaseExpression]:
    """What `call` takes the log of (None: not a log, or one kept finite by its epsilon)."""
    qualified = imports.resolve(call.func)
    argument = None
    if qualified in imports.vocabulary.log_functions or (isinstance(call.func, cst.Name) and call.func.value in helpers):
        first = call.args[0] if call.args else None
        if first is not None and first.keyword is None and not first.star:
            argument = first.value  # (log1p(-p) is log(1 - p))
    elif (qualified is None and isinstance(call.func, cst.Attribute) and call.func.attr.value in _LOG_METHODS
            and not call.args):
        argument = call.func.value
    if argument is None or _safe_epsilon(argument, constants):
        return None
    return argument


def _safe_epsilon(argument: cst.BaseExpression, constants: Dict[str, float]) -> bool:
    """`x + 1e-3` (or `x + eps`, `eps = 1e-3` in the module): a positive constant a float16 log
    stays finite with."""
    if not (isinstance(argument, cst.BinaryOperation) and isinstance(argument.operator, cst.Add)):
        return False
    for side in (argument.left, argument.right):
        value = constants.get(side.value) if isinstance(side, cst.Name) else _number(side)
        if value is not None and value >= _SAFE_EPSILON:
            return True
    return _safe_epsilon(argument.left, constants)


def _number(node: cst.BaseExpression) -> Optional[float]:
    if isinstance(node, (cst.Float, cst.Integer)):
        return float(node.evaluated_value)
    return None


#: functions whose result is no sigmoid's probability and runs in float32 under autocast and the
#: TF graph rewrite alike (their float32 lists): `log(1 - exp(-x))` is not the hazard
_FLOAT32_RESULTS = {"exp", "softmax", "log_softmax", "expm1"}


def _float32_copy(node: cst.BaseExpression) -> bool:
    """`x.float()`, `x.double()`, `x.to(torch.float32)`: a copy in float32 (or wider)."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
        return False
    method = node.func.attr.value
    if method in ("float", "double") and not node.args:
        return True
    return method == "to" and len(node.args) == 1 and (dotted_name(node.args[0].value) or "").rsplit(".", 1)[-1] in (
        "float32", "float", "float64", "double")


def _float32_sigmoid(node: cst.BaseExpression) -> bool:
    """`torch.sigmoid(x.float())` or `x.float().sigmoid()`."""
    if not isinstance(node, cst.Call) or _last_name(node.func) != "sigmoid":
        return False
    if isinstance(node.func, cst.Attribute) and not node.args:
        return _float32_copy(node.func.value)
    return bool(node.args) and _float32_copy(node.args[0].value)


def _one_minus(argument: cst.BaseExpression, drawn: Collection[str] = ()) -> Optional[str]:
    """`1 - x` (`1. - x + 1e-8`) within the log's argument, as written; not `1 - torch.exp(-x)`,
    nor `1 - torch.sigmoid(x.float())` (a float32 probability), nor `1 - u` of a name in `drawn`."""
    if isinstance(argument, cst.BinaryOperation):
        if isinstance(argument.operator, cst.Subtract) and _number(argument.left) == 1.0:
            subtracted = argument.right
            if isinstance(subtracted, cst.Call) and _last_name(subtracted.func) in _FLOAT32_RESULTS:
                return None
            if _float32_sigmoid(subtracted) or dotted_name(subtracted) in drawn:
                return None
            return _code(argument)
        return _one_minus(argument.left, drawn) or _one_minus(argument.right, drawn)
    return None


#: methods and functions that fill a tensor with random numbers (no model output)
_RANDOM_DRAWS = frozenset({"uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_",
                           "log_normal_", "cauchy_", "rand", "rand_like", "uniform", "random_sample"})


def _random_draw_names(assignments: List[cst.Assign]) -> Set[str]:
    """Names one scope binds to random numbers or float32 probabilities only: `u =
    x.new(n).uniform_(1e-5, 1 - 1e-5)`, `u = torch.rand_like(x)`, `u = np.random.uniform(size=n)`,
    `p = torch.sigmoid(logits.float())`; a name bound anywhere else in the scope too is left out."""
    drawn: Set[str] = set()
    other: Set[str] = set()
    for assign in assignments:
        for target in assign.targets:
            name = dotted_name(target.target)
            if name is None:
                continue
            value = assign.value
            is_draw = isinstance(value, cst.Call) and (_last_name(value.func) in _RANDOM_DRAWS or _float32_sigmoid(value))
            (drawn if is_draw else other).add(name)
    return drawn - other


def _last_name(node: cst.BaseExpression) -> str:
    """`exp` for `torch.exp`, `np.exp`, `x.exp`."""
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return node.value if isinstance(node, cst.Name) else ""


def _is_log_of(value: cst.BaseExpression, parameter: str, imports: "_Names", constants: Dict[str, float]) -> bool:
    if not isinstance(value, cst.Call):
        return False
    argument = _log_argument(value, imports, set(), constants)
    return argument is not None and any(
        isinstance(node, cst.Name) and node.value == parameter for node in _subexpressions(argument))


def _subexpressions(node: cst.CSTNode):
    yield node
    for child in node.children:
        yield from _subexpressions(child)


def _probability_names(assignments: List[cst.Assign], judge: "_Judge") -> Set[str]:
    """Names of one scope bound to a probability (`D_fake = D(G(z))`, `D_real, C_real = D(X)`),
    to a fixed point."""
    names: Set[str] = set()
    judge.probabilities = names
    changed = True
    while changed:
        changed = False
        for assign in assignments:
            for target in assign.targets:
                for name in _probability_targets(target.target, assign.value, judge):
                    if name not in names:
                        names.add(name)
                        changed = True
    return names


def _probability_targets(target: cst.BaseExpression, value: cst.BaseExpression, judge: "_Judge"):
    """Names `target` binds to a probability: `a = p`, `self.a = p`, `a, b = p, q` and
    `a, b = D(X)` of a model returning a tuple with a probability first."""
    name = dotted_name(target)
    if name is not None:
        if judge.is_probability(value):
            yield name
        return
    if not isinstance(target, (cst.Tuple, cst.List)):
        return
    if isinstance(value, (cst.Tuple, cst.List)) and len(target.elements) == len(value.elements):
        for element, item in zip(target.elements, value.elements):
            yield from _probability_targets(element.value, item.value, judge)
        return
    positions = judge.tuple_positions(value)
    for position in positions:
        if position < len(target.elements):
            name = dotted_name(target.elements[position].value)
            if name is not None:
                yield name


class _Judge:
    def __init__(self, imports: "_Names", models: Dict[str, Optional[FrozenSet[int]]]) -> None:
        self.imports = imports
        self.models = models
        self.probabilities: Set[str] = set()

    def tuple_positions(self, value: cst.BaseExpression) -> FrozenSet[int]:
        """Positions of the probabilities in what a model returning a tuple returns."""
        if isinstance(value, cst.Call):
            positions = self.models.get(dotted_name(value.func) or "")
            if positions is not None:
                return positions
        return frozenset()

    def is_probability(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Subscript):
            return self.is_probability(node.value)
        if isinstance(node, (cst.Name, cst.Attribute)):
            return dotted_name(node) in self.probabilities
        if not isinstance(node, cst.Call):
            return False
        qualified = self.imports.resolve(node.func)
        words = self.imports.vocabulary
        if qualified in words.sigmoid_functions:
            # `torch.sigmoid(logits.float())`: a float32 probability, as in the fp32 script
            return not (node.args and _float32_copy(node.args[0].value))
        if words.activation_keyword and any(
                a.keyword is not None and a.keyword.value == "activation" and _is_sigmoid_activation(a.value, self.imports)
                for a in node.args):
            return True
        called = dotted_name(node.func)
        if called in self.models and self.models[called] is None:
            return True
        if isinstance(node.func, cst.Attribute) and qualified is None:
            method = node.func.attr.value
            if method in ("sigmoid", "sigmoid_") and not node.args:
                return not _float32_copy(node.func.value)
            if method in _THROUGH_METHODS:
                return self.is_probability(node.func.value)
        if qualified in self.imports.vocabulary.through_functions and node.args:
            return self.is_probability(node.args[0].value)
        return False

    def probability_in(self, node: cst.BaseExpression) -> Optional[str]:
        """The probability the log's argument is made of (arithmetic, clamps, shape operations),
        as written; None when there is none."""
        if self.is_probability(node):
            return _code(node)
        if isinstance(node, cst.BinaryOperation):
            return self.probability_in(node.left) or self.probability_in(node.right)
        if isinstance(node, cst.UnaryOperation):
            return self.probability_in(node.expression)
        if isinstance(node, cst.Call):
            qualified = self.imports.resolve(node.func)
            if qualified in self.imports.vocabulary.through_functions and node.args:
                return self.probability_in(node.args[0].value)
            if qualified is None and isinstance(node.func, cst.Attribute) and node.func.attr.value in _THROUGH_METHODS:
                return self.probability_in(node.func.value)
        return None


def _float32_clamped_names(assignments: List[cst.Assign], imports: "_Names") -> Set[str]:
    """Names bound (every time, in one scope) to a clamp of a float32 copy below 1:
    `p = torch.clamp(p.float(), 1e-7, 1 - 1e-7)`, `p = p.float().clamp(min=eps, max=1 - eps)`
    (probability_clamps_float32.py writes them)."""
    bound: Dict[str, bool] = {}
    for assign in assignments:
        if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
            name = assign.targets[0].target.value
            bound[name] = bound.get(name, True) and _is_float32_clamp(assign.value, imports)
    return {name for name, clamped in bound.items() if clamped}


def _is_float32_clamp(value: cst.BaseExpression, imports: "_Names") -> bool:
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("clamp", "clip")):
        return False
    receiver = value.func.value
    # `torch.clamp(p.float(), ...)` (torch under any alias) takes the tensor first; `p.float().clamp(...)` is its receiver
    method = imports.resolve(value.func) not in imports.vocabulary.through_functions
    clamped = receiver if method else (value.args[0].value if value.args else None)
    if not (isinstance(clamped, cst.Call) and isinstance(clamped.func, cst.Attribute)
            and clamped.func.attr.value in ("float", "double") and not clamped.args):
        return False
    positional = [a.value for a in value.args if a.keyword is None][0 if method else 1:]
    upper = positional[1] if len(positional) > 1 else next(
        (a.value for a in value.args if a.keyword is not None and a.keyword.value == "max"), None)
    if isinstance(upper, cst.BinaryOperation) and isinstance(upper.operator, cst.Subtract):
        gap = _number(upper.right)
        return _number(upper.left) == 1.0 and gap is not None and gap > 0
    number = _number(upper) if upper is not None else None
    return number is not None and number < 1.0


def _is_sigmoid_activation(value: cst.BaseExpression, names: "_Names") -> bool:
    """`activation=tf.nn.sigmoid` / `activation="sigmoid"`."""
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value == "sigmoid"
    return names.resolve(value) in names.vocabulary.sigmoid_functions


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
