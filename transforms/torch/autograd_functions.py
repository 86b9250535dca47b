"""Custom autograd Functions that break under autocast (or apex O1), found in a module's syntax tree.

Autocast casts the ops a Function's forward() runs, but its backward() runs with autocast off: a
backward that convolves or multiplies the float16 gradient with a float32 tensor it saved (StyleGAN2's
`conv2d_gradfix`, hand-written conv/linear layers) raises "Input type (Half) and weight type (Float)
should be the same" at the first step. A compiled extension (`fused = load("fused", sources=[...])`,
`import DCN_cuda`) is handed float16 activations it was not written for, and an extension that reads
its arguments by the first one's dtype computes garbage silently. PyTorch's fix is
`@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` on forward() and
`@torch.amp.custom_bwd(device_type=...)` on backward(): the Function then runs in float32. A Function
whose forward() already has custom_fwd is safe; so is one whose code is dtype-agnostic (a gradient
reversal layer's `grad_output.neg() * alpha`, a straight-through estimator's `grad_output.clone()`).

Loss scaling (GradScaler, apex) multiplies the loss and relies on every backward() multiplying by the
gradient it receives. A backward() that never reads it, returning the gradient its forward() computed
(warp-ctc's `return ctx.grads, None, ...`, vendored CTC and RNN-T losses), drops the scale: the layers
before it get unscaled gradients, which the scaler then divides by the scale, silently. Such a
Function is certain to break float16 training; the binding packages that did so in some releases
(SeanNaren's warpctc_pytorch before August 2020, warprnnt_pytorch) can only be named for the user to
check.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Set, Tuple

from ampify.transforms.kit.ast_names import ast_dotted as _dotted
from ampify.transforms.torch.names import AUTOCAST_LOWER_PRECISION_OPS

#: torch.nn.grad's hand-written convolution gradients, which backward() implementations call
_GRADIENT_OPS = frozenset({"conv1d_input", "conv1d_weight", "conv2d_input", "conv2d_weight", "conv3d_input",
                           "conv3d_weight"})
#: the last part of a module name that says it is compiled code (`DCN_cuda`, `_C`, `correlation_ext`)
_EXTENSION_SUFFIXES = ("_cuda", "_C", "_ext", "_cpp", "_kernel", "_kernels", "_backend")
#: what builds an extension at import time (torch.utils.cpp_extension)
_EXTENSION_LOADERS = frozenset({"load", "load_inline"})


def unsafe_autograd_functions(tree: ast.Module) -> List[Tuple[int, str, str]]:
    """(line, class name, why) for each torch.autograd.Function subclass of the module that fails
    or computes wrong values under autocast: see the module docstring."""
    extensions = _extension_names(tree)
    found = []
    for node in _function_classes(tree):
        methods = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
        forward, backward = methods.get("forward"), methods.get("backward")
        if forward is None or any(_last(_decorator_target(d)) == "custom_fwd" for d in forward.decorator_list):
            continue
        why = _extension_call(forward, extensions, "forward")
        if why is None and backward is not None:
            why = _extension_call(backward, extensions, "backward") or _backward_mixing_dtypes(backward)
        if why is not None:
            found.append((node.lineno, node.name, why))
    return sorted(found)


def gradient_dropping_functions(tree: ast.Module) -> List[Tuple[int, str, str]]:
    """(line, class name, why) for each torch.autograd.Function subclass of the module whose
    backward() never reads the gradient it receives but returns one: the loss scale stops there."""
    found = []
    for node in _function_classes(tree):
        backward = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "backward"),
                        None)
        if backward is None:
            continue
        positional = [*backward.args.posonlyargs, *backward.args.args]
        incoming = [arg.arg for arg in positional[1:]]  # after ctx
        if backward.args.vararg is not None:
            incoming.append(backward.args.vararg.arg)
        if not incoming:
            continue
        read = {n.id for n in ast.walk(backward) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        if read & set(incoming) or not _returns_a_gradient(backward):
            continue
        found.append((node.lineno, node.name,
                      f"its backward() never reads the incoming gradient ({', '.join(incoming)}) and returns the one "
                      "its forward() computed, so the loss scale stops there: the layers before it get unscaled "
                      "gradients, which the scaler then divides by the scale"))
    return sorted(found)


#: binding packages whose Function's backward() ignored the incoming gradient in some releases
GRADIENT_DROPPING_PACKAGES = {
    "warpctc_pytorch": "the releases of SeanNaren/warp-ctc's binding before August 2020 (commit 11ecadd) return "
                       "`ctx.grads` without multiplying by grad_output",
    "warprnnt_pytorch": "some releases of HawkAaron/warp-transducer's binding return `ctx.grads` without "
                        "multiplying by grad_output",
}


def gradient_dropping_imports(tree: ast.Module) -> List[Tuple[int, str]]:
    """(line, package) for each import of a GRADIENT_DROPPING_PACKAGES package, anywhere in the module
    (also inside a function or an `if opt.baiduCTC:` branch)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            if top in GRADIENT_DROPPING_PACKAGES and (node.lineno, top) not in found:
                found.append((node.lineno, top))
    return sorted(found)


def _function_classes(tree: ast.Module) -> List[ast.ClassDef]:
    """The module's `class X(Function)` / `class X(torch.autograd.Function)` definitions, found in one
    walk and kept on the tree (both checks above read them)."""
    found = getattr(tree, "_ampify_function_classes", None)
    if found is None:
        found = [node for node in ast.walk(tree)
                 if isinstance(node, ast.ClassDef) and any(_last(base) == "Function" for base in node.bases)]
        tree._ampify_function_classes = found
    return found


def _returns_a_gradient(backward: ast.FunctionDef) -> bool:
    """Does some `return` of backward() hand back something other than None (alone or in a tuple)?"""
    for node in ast.walk(backward):
        if isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any(not (isinstance(v, ast.Constant) and v.value is None) for v in values):
                return True
    return False


def _backward_mixing_dtypes(backward: ast.FunctionDef) -> Optional[str]:
    for node in ast.walk(backward):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func) or ""
        last = name.rsplit(".", 1)[-1]
        if last in AUTOCAST_LOWER_PRECISION_OPS or last in _GRADIENT_OPS:
            return (f"its backward() runs {last}() with autocast off, on the float16 gradient and the float32 "
                    "tensors it saved (a dtype mismatch that raises)")
        if isinstance(node.func, ast.Attribute) and node.func.attr == "apply":
            return (f"its backward() runs {name or 'another Function.apply'}() with autocast off, on the float16 "
                    "gradient and the float32 tensors it saved")
        if name.startswith("torch.ops."):
            return f"its backward() calls {name}() with autocast off, on the float16 gradient and float32 tensors"
    for node in ast.walk(backward):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return "its backward() multiplies matrices (`@`) with autocast off, on the float16 gradient and float32 tensors"
    return None


def _extension_call(method: ast.FunctionDef, extensions: Set[str], which: str) -> Optional[str]:
    for node in ast.walk(method):
        if isinstance(node, ast.Call):
            name = _dotted(node.func) or ""
            if name.split(".")[0] in extensions:
                return (f"its {which}() calls the compiled extension {name}(), which autocast does not cast for: it "
                        "gets float16 activations beside float32 weights")
    return None


def _extension_names(tree: ast.Module) -> Set[str]:
    """Module-level names bound to compiled code: `fused = load("fused", sources=[...])`,
    `import DCN_cuda`, `from . import _C`, `import correlation_cuda as corr`."""
    names: Set[str] = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call) \
                and _last(statement.value.func) in _EXTENSION_LOADERS:
            names |= {target.id for target in statement.targets if isinstance(target, ast.Name)}
        elif isinstance(statement, ast.Import):
            for alias in statement.names:
                if alias.name.rsplit(".", 1)[-1].endswith(_EXTENSION_SUFFIXES):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(statement, ast.ImportFrom):
            compiled_module = (statement.module or "").rsplit(".", 1)[-1].endswith(_EXTENSION_SUFFIXES)
            for alias in statement.names:
                if compiled_module or alias.name.endswith(_EXTENSION_SUFFIXES):
                    names.add(alias.asname or alias.name)
    return names


def _decorator_target(decorator: ast.expr) -> ast.expr:
    return decorator.func if isinstance(decorator, ast.Call) else decorator


def _last(node: ast.expr) -> str:
    name = _dotted(node)
    return name.rsplit(".", 1)[-1] if name else ""
