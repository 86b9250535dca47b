"""Model classes whose forward() returns a sigmoid's probability, found in a module's syntax tree.

A training file that writes its cross entropy out, of a model defined in another module:

    # models.py
    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(nn.Linear(784, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1), nn.Sigmoid())

        def forward(self, x):
            return self.main(x).view(-1)

    # train.py
    from models import Discriminator
    D = Discriminator().cuda()
    d_loss = -torch.mean(torch.log(D(real)) + torch.log(1 - D(fake)))

takes the log of a probability the sigmoid computed in float16 under autocast: `1 - D(fake)` is 0
once the logit passes about 8.4, the log -inf, and every step is skipped (kit/log_of_sigmoid.py,
which follows the models of the training file itself; this module finds those of the modules it
imports, for repository.py's outline).

A class counts when every return of its forward() is a probability: the result of a sigmoid
function (`torch.sigmoid(h)`, `F.sigmoid(h)`, `torch.special.expit(h)`, `h.sigmoid()`), of a call
of an attribute bound to `nn.Sigmoid()` or to an `nn.Sequential(...)` ending in one, through shape
operations (`.view(-1)`, `.squeeze(1)`, later casts), or a name of forward() bound to one; the call of an
attribute bound to another such class of the module counts too (`self.decoder = Decoder(...)`). A sigmoid
taken of a float32 or float64 copy (`self.sig(self.linear(h).double())`, locuslab/TCN's poly_music)
is no hazard: it runs in that dtype under autocast, and is not counted.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set

from ampify.transforms.kit.ast_names import ast_dotted, own_nodes

#: the last name of a sigmoid function (`torch.sigmoid`, `F.sigmoid`, `torch.special.expit`)
_SIGMOID_FUNCTIONS = {"sigmoid", "expit"}
#: methods that keep a probability a probability (or only widen it after it was computed)
_THROUGH_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous", "view_as", "clamp",
                    "clamp_min", "clamp_max", "clip", "float", "double", "detach", "to", "permute", "transpose"}
_THROUGH_FUNCTIONS = {"squeeze", "flatten", "clamp", "clip", "reshape", "unsqueeze"}
#: casts to a float32 or float64 copy: a sigmoid taken of one runs in that dtype under autocast
_WIDENING_METHODS = {"float", "double"}
_WIDE_DTYPES = {"float32", "float64", "float", "double"}


def sigmoid_model_classes(tree: ast.Module) -> Dict[str, int]:
    """Module-level class name -> line, for each class whose forward() returns a sigmoid's
    probability computed in the model's own precision."""
    torch_roots = torch_aliases(tree)
    if not torch_roots:
        return {}
    found: Dict[str, int] = {}
    classes = [statement for statement in tree.body if isinstance(statement, ast.ClassDef)]
    # to a fixpoint: a model whose forward() returns what a submodule of such a class returns
    # (semi-supervised-pytorch's VariationalAutoencoder: `return self.decoder(z)`, its Decoder
    # ending in `self.output_activation = nn.Sigmoid()`) counts too
    for _ in range(len(classes)):
        grown = False
        for statement in classes:
            if statement.name in found:
                continue
            methods = [s for s in statement.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
            forward = next((m for m in methods if m.name == "forward"), None)
            if forward is None:
                continue
            judge = _Judge(torch_roots, _sigmoid_attributes(methods, torch_roots, set(found)), forward)
            returns = [node for node in _own_nodes(forward) if isinstance(node, ast.Return)]
            if returns and all(r.value is not None and judge.is_probability(r.value, r.lineno) for r in returns):
                found[statement.name] = statement.lineno
                grown = True
        if not grown:
            break
    return found


def torch_aliases(tree: ast.Module) -> Dict[str, str]:
    """Local name -> the torch module or name it is bound to (`F` -> torch.nn.functional,
    `Sigmoid` -> torch.nn.Sigmoid), for the module's imports of torch."""
    aliases: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch" or alias.name.startswith("torch."):
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        aliases["torch"] = "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "torch" or node.module.startswith("torch.")):
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def resolve_torch_name(node: ast.AST, torch_roots: Dict[str, str]) -> Optional[str]:
    """`torch.nn.functional.sigmoid` for `F.sigmoid` when F is torch's; None for other names."""
    dotted = ast_dotted(node)
    if dotted is None:
        return None
    root, _, rest = dotted.partition(".")
    if root not in torch_roots:
        return None
    return torch_roots[root] + ("." + rest if rest else "")


def _is_sigmoid_layer(node: ast.AST, torch_roots: Dict[str, str]) -> bool:
    """`nn.Sigmoid()`, or `nn.Sequential(..., nn.Sigmoid())`."""
    if not isinstance(node, ast.Call):
        return False
    name = resolve_torch_name(node.func, torch_roots) or ""
    if name.rsplit(".", 1)[-1] == "Sigmoid":
        return True
    if name.rsplit(".", 1)[-1] == "Sequential" and node.args and not node.keywords:
        last = node.args[-1]
        return not isinstance(last, ast.Starred) and isinstance(last, ast.Call) and (
            (resolve_torch_name(last.func, torch_roots) or "").rsplit(".", 1)[-1] == "Sigmoid")
    return False


def _sigmoid_attributes(methods: List[ast.AST], torch_roots: Dict[str, str], models: Set[str]) -> Set[str]:
    """`main` for `self.main = nn.Sequential(..., nn.Sigmoid())`, `sig` for `self.sig = nn.Sigmoid()`,
    `decoder` for `self.decoder = Decoder(...)` where Decoder is one of `models` (classes of the
    module already found to return a probability), in any method of the class."""
    found = set()
    for method in methods:
        for node in ast.walk(method):
            if isinstance(node, ast.Assign) and (_is_sigmoid_layer(node.value, torch_roots) or (
                    isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                    and node.value.func.id in models)):
                for target in node.targets:
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self"):
                        found.add(target.attr)
    return found


def _own_nodes(function: ast.AST):
    """The nodes of `function`'s body, not of the functions and classes defined in it."""
    return own_nodes(function.body)


class _Judge:
    def __init__(self, torch_roots: Dict[str, str], sigmoid_attributes: Set[str], forward: ast.AST) -> None:
        self.torch_roots = torch_roots
        self.sigmoid_attributes = sigmoid_attributes
        #: name -> [(line, value)] of forward()'s plain assignments, in source order
        self.bindings: Dict[str, List[tuple]] = {}
        for node in _own_nodes(forward):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.bindings.setdefault(node.targets[0].id, []).append((node.lineno, node.value))
        for values in self.bindings.values():
            values.sort(key=lambda item: item[0])

    def _binding_before(self, name: str, line: int) -> Optional[ast.AST]:
        earlier = [value for bound_at, value in self.bindings.get(name, []) if bound_at < line]
        return earlier[-1] if earlier else None

    def is_probability(self, node: ast.AST, line: int, depth: int = 0) -> bool:
        if depth > 20:
            return False
        if isinstance(node, ast.Subscript):
            return self.is_probability(node.value, line, depth + 1)
        if isinstance(node, ast.Name):
            bound = self._binding_before(node.id, line)
            return bound is not None and self.is_probability(bound, self._line_of(node.id, line), depth + 1)
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        resolved = resolve_torch_name(func, self.torch_roots)
        if resolved is not None:
            last = resolved.rsplit(".", 1)[-1]
            if last in _SIGMOID_FUNCTIONS:
                return bool(node.args) and not self.is_wide(node.args[0], line, depth + 1)
            if last in _THROUGH_FUNCTIONS and node.args:
                return self.is_probability(node.args[0], line, depth + 1)
            return False
        if not isinstance(func, ast.Attribute):
            return False
        if (isinstance(func.value, ast.Name) and func.value.id == "self" and func.attr in self.sigmoid_attributes
                and node.args):
            return not self.is_wide(node.args[0], line, depth + 1)
        if func.attr in ("sigmoid", "sigmoid_") and not node.args:
            return not self.is_wide(func.value, line, depth + 1)
        if func.attr in _THROUGH_METHODS:
            return self.is_probability(func.value, line, depth + 1)
        return False

    def _line_of(self, name: str, line: int) -> int:
        """The line of `name`'s binding read at `line` (its value is judged as of there)."""
        earlier = [bound_at for bound_at, _ in self.bindings.get(name, []) if bound_at < line]
        return earlier[-1] if earlier else line

    def is_wide(self, node: ast.AST, line: int, depth: int = 0) -> bool:
        """A float32 or float64 copy: `h.double()`, `h.float()`, `h.to(torch.float64)`, or a name bound to one."""
        if depth > 20:
            return False
        if isinstance(node, ast.Name):
            bound = self._binding_before(node.id, line)
            return bound is not None and self.is_wide(bound, self._line_of(node.id, line), depth + 1)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return False
        method = node.func.attr
        if method in _WIDENING_METHODS and not node.args:
            return True
        if method in ("to", "type"):
            dtypes = [*node.args, *(k.value for k in node.keywords if k.arg == "dtype")]
            return any((resolve_torch_name(d, self.torch_roots) or "").rsplit(".", 1)[-1] in _WIDE_DTYPES for d in dtypes)
        return False
