"""Custom autograd Functions that break under autocast, made to run in float32 (PyTorch's recipe).

A Function whose backward() mixes the float16 gradient with the float32 tensors it saved, or whose
forward() runs a compiled extension written for float32 (autograd_functions.py, AMP241), gets the
decorators PyTorch's AMP documentation gives for exactly this case:

    class SpecialSpmmFunction(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
        def forward(ctx, indices, values, shape, b):
            ...

        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad_output):
            ...

Under CUDA autocast, custom_fwd casts the floating-point CUDA tensors forward() receives to float32
and runs it with autocast off; custom_bwd runs backward() with the same autocast state: the Function
computes in float32, as in the fp32 script, and outside autocast both decorators do nothing. The
decorators name CUDA; when the training file may run on the CPU too (a "cpu" literal: `torch.device(
"cuda" if torch.cuda.is_available() else "cpu")`, where its autocast region is the CPU's), a second
pair for "cpu" follows each (stacked, each acts only under its own device's autocast), so the CPU run
does not raise where the fp32 script ran.

Only a Function whose forward() (and backward(), when it has one) is a `@staticmethod` of a class
with a name no other class of the module has is decorated; autograd_functions.py does not count a
Function whose forward() has custom_fwd, so a second run changes nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.positions import Positions
from ampify.transforms.torch.companion_modules import ModuleRewrite, plan_companion_rewrites
from ampify.transforms.torch.torch_import import add_import_torch, module_level_aliases


#: a "cpu" string literal: the training file may pick the CPU, where its autocast region is the CPU's
_CPU_LITERAL = re.compile(r"""["']cpu["']""")


@dataclass
class Float32Functions:
    """The module with its Functions decorated, and (class name, line) of each."""

    module: cst.Module
    decorated: List[Tuple[str, int]] = field(default_factory=list)
    devices: Tuple[str, ...] = ("cuda",)

    def describe(self, where: str = "") -> str:
        place = f"{where}: " if where else ""
        shown = ", ".join(f"{name} (line {line})" for name, line in self.decorated)
        many = len(self.decorated) != 1
        kinds = " and ".join(device.upper() for device in self.devices)
        types = " and ".join(f'"{device}"' for device in self.devices)
        return (f"{place}the custom autograd Function{'s' if many else ''} {shown} now run{'' if many else 's'} in "
                f"float32 under {kinds} autocast: forward() decorated with `torch.amp.custom_fwd(device_type=..., "
                f"cast_inputs=torch.float32)`, backward() with `torch.amp.custom_bwd(device_type=...)`, for {types}")


def float32_functions(module: cst.Module, names: Sequence[str],
                      devices: Tuple[str, ...] = ("cuda",)) -> Tuple[Optional[Float32Functions], Optional[str]]:
    """Decorate the Functions `names` (classes of `module`) to run in float32 under autocast on
    `devices`. Returns (the result, None); (None, None) when every one is decorated already;
    (None, the reason) when one cannot be."""
    collector = _Classes()
    module.visit(collector)
    torch_names = module_level_aliases(module, "torch")
    torch_name = "torch" if "torch" in torch_names else (sorted(torch_names)[0] if torch_names else "torch")
    positions = Positions(module)
    replacements: Dict[int, cst.ClassDef] = {}
    decorated: List[Tuple[str, int]] = []
    for name in dict.fromkeys(names):
        found = collector.classes.get(name, [])
        if len(found) != 1:
            return None, (f"{len(found)} classes are named {name}, so ampify cannot tell which to decorate" if found
                          else f"class {name} is not found")
        klass = found[0]
        methods = {item.name.value: item for item in klass.body.body if isinstance(item, cst.FunctionDef)} \
            if isinstance(klass.body, cst.IndentedBlock) else {}
        forward, backward = methods.get("forward"), methods.get("backward")
        if forward is None:
            return None, f"{name} has no forward() of its own"
        if _has_decorator(forward, "custom_fwd"):
            continue
        for method in (forward, backward):
            if method is not None and not _has_decorator(method, "staticmethod"):
                return None, (f"{name}.{method.name.value}() is no @staticmethod (a legacy Function), which "
                              "torch.amp.custom_fwd / custom_bwd do not decorate")
        if backward is not None and _has_decorator(backward, "custom_bwd"):
            return None, f"{name}.backward() has custom_bwd but its forward() no custom_fwd"
        new_methods = {id(forward): _decorated(forward, [
            f'{torch_name}.amp.custom_fwd(device_type="{device}", cast_inputs={torch_name}.float32)'
            for device in devices], module)}
        if backward is not None:
            new_methods[id(backward)] = _decorated(
                backward, [f'{torch_name}.amp.custom_bwd(device_type="{device}")' for device in devices], module)
        body = [new_methods.get(id(item), item) for item in klass.body.body]
        replacements[id(klass)] = klass.with_changes(body=klass.body.with_changes(body=body))
        decorated.append((name, positions[klass.name].start.line))
    if not replacements:
        return None, None
    new = module.visit(_Replace(replacements))
    if not torch_names:
        new = add_import_torch(new)
    return Float32Functions(new, sorted(decorated, key=lambda item: item[1]), tuple(devices)), None


def _has_decorator(function: cst.FunctionDef, last_name: str) -> bool:
    for decorator in function.decorators:
        target = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
        name = target.attr.value if isinstance(target, cst.Attribute) else target.value if isinstance(
            target, cst.Name) else ""
        if name == last_name:
            return True
    return False


def _decorated(function: cst.FunctionDef, decorators: List[str], module: cst.Module) -> cst.FunctionDef:
    """`function` with `@decorator`s right above its `def` (below @staticmethod), in order."""
    added = [cst.Decorator(decorator=cst.parse_expression(text, config=module.config_for_parsing))
             for text in decorators]
    return function.with_changes(decorators=[*function.decorators, *added])


class _Classes(cst.CSTVisitor):
    """Every class of the module, also nested in functions (conv2d_gradfix builds its Functions
    in a cached function), by name."""

    def __init__(self) -> None:
        self.classes: Dict[str, List[cst.ClassDef]] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.setdefault(node.name.value, []).append(node)


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: Dict[int, cst.ClassDef]) -> None:
        self.replacements = replacements

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        return self.replacements.get(id(original_node), updated_node)


def autocast_devices(source: str) -> Tuple[str, ...]:
    """("cuda", "cpu") when the training source names the CPU in a string literal (it may autocast
    there), else ("cuda",)."""
    return ("cuda", "cpu") if _CPU_LITERAL.search(source) else ("cuda",)


def plan_float32_functions(project, here: str, code: str,
                           devices: Tuple[str, ...] = ("cuda",)) -> Tuple[List[CompanionChange], List[str], Optional[str]]:
    """The training module `here` imports model code with custom autograd Functions that break
    under autocast: each such module gets them decorated, as companions of this module's change
    (one change set). Returns (companions, one line per module for this module's report, None), or
    ([], [], the reason it cannot be done)."""
    found = project.unsafe_autograd_function_modules()
    names_of = {key: names for key, _, names, _ in found}

    def rewrite(key: str, display: str, source: bytes, module: cst.Module):
        functions, refused = float32_functions(module, names_of[key], devices)
        if refused is not None:
            return f"in {display}, {refused}"
        if functions is None:
            return None  # decorated already, by the change set of another training file of this run
        return ModuleRewrite(functions.module, functions.decorated[0][1], functions.describe(),
                             functions.describe(display))

    return plan_companion_rewrites(
        project, here, [(key, display, trains) for key, display, _, trains in found], rewrite, code,
        "its custom autograd Functions run in float32 under autocast, so that the float16 training step of that "
        "file runs them as written", verb="decorates")
