"""BCE of a sigmoid in the code a training file imports, fused there (NVlabs/MUNIT's networks.py,
whose discriminator computes its own loss):

    # networks.py, MsImageDis.calc_dis_loss(), run by trainer.py's dis_update()
    loss += torch.mean(F.binary_cross_entropy(F.sigmoid(out0), all0))
      -> loss += torch.mean(F.binary_cross_entropy_with_logits(out0, all0))

CUDA autocast refuses `F.binary_cross_entropy` / `nn.BCELoss` (and apex O1 too): once the training
step runs under autocast, such a loss in a module it imports raises on the first batch, though the
training file itself names no BCE. BCE with logits of the sigmoid's input is the same loss,
computed stably, so the module is rewritten as a companion of the training file's change (one
change set) when every BCE of that module takes a sigmoid it applies itself (bce_in_step.py's
shape). Otherwise, when the training file calls the function, method or class holding the BCE by
name, its training is left unconverted (AMP210 / AMP310: the step would raise); else it is
converted with a warning naming the BCE (AMP252 / AMP343), "changed, incomplete": the module may be
imported without this step ever running that loss.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.torch.bce_in_step import fuse_sigmoid_in_step
from ampify.transforms.torch.companion_modules import ModuleRewrite, plan_companion_rewrites
from ampify.transforms.torch.sigmoid_models import resolve_torch_name, torch_aliases

#: the bytes a module holding a BCE on probabilities contains (with_logits forms contain them too)
BCE_MARKERS = (b"binary_cross_entropy", b"BCELoss")
_BCE_FUNCTION = "torch.nn.functional.binary_cross_entropy"
_BCE_CLASS = "torch.nn.BCELoss"


def bce_lines(tree: ast.Module) -> List[Tuple[int, str, Tuple[str, ...]]]:
    """(line, "F.binary_cross_entropy", owners) for each BCE on probabilities that a function or
    method of the module runs (stdlib ast, for the repository outline): a call of
    torch.nn.functional.binary_cross_entropy or a construction of torch.nn.BCELoss, through any
    alias this module imports. `owners`: the names a caller reaches it through (the function; the
    class, and the method unless it is `forward` or a dunder)."""
    aliases = torch_aliases(tree)
    read = _names_read(tree)
    found: List[Tuple[int, str, Tuple[str, ...]]] = []
    for statement in tree.body:
        # `self.x` is read within its class; any other name anywhere in the module
        read_here = _names_read(statement) if isinstance(statement, ast.ClassDef) else set()
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            holders = [(statement, (statement.name,))]
        elif isinstance(statement, ast.ClassDef):
            # a method is reached by its own name, unless every call of it goes through the class
            # (`__init__`, `forward`: `EncNetLoss(...)`, `criterion(...)`) or its name says nothing
            holders = [(method, (statement.name,) if method.name.startswith("__") or method.name == "forward"
                        else (statement.name, method.name)) for method in statement.body
                       if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))]
        else:
            continue
        for holder, owners in holders:
            for node in ast.walk(holder):
                if isinstance(node, ast.Call) and resolve_torch_name(node.func, aliases) in (_BCE_FUNCTION, _BCE_CLASS):
                    found.append((node.lineno, ast.unparse(node.func), owners))
            for node in ast.walk(holder):
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)
                        and resolve_torch_name(node.value.func, aliases) == _BCE_CLASS):
                    continue
                target = node.targets[0]
                unread = (target.id not in read if isinstance(target, ast.Name) else
                          target.attr not in read_here if isinstance(target, ast.Attribute)
                          and isinstance(target.value, ast.Name) and target.value.id == "self" else False)
                if unread:  # `self.bceloss = nn.BCELoss()` that its class never calls: no BCE runs
                    found.remove((node.value.lineno, ast.unparse(node.value.func), owners))
    return sorted(found)


def _names_read(tree: ast.AST) -> Set[str]:
    """Every name and attribute read under `tree` (`x`, `obj.x`): a criterion bound to a name
    outside this set is never called there."""
    read = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            read.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            read.add(node.attr)
    return read


def logits_bce(module: cst.Module) -> Tuple[Optional[cst.Module], Optional[str]]:
    """(the module with each BCE of a sigmoid fused to BCE with logits, None); (None, None) when
    it computes no BCE on probabilities (fused already); (None, why) when one of its BCEs does not
    take a sigmoid it applies itself."""
    imports = ImportMap.from_module(module)
    fused = fuse_sigmoid_in_step(module, imports)
    if fused is not None:
        return fused[0], None
    try:
        left = bce_lines(ast.parse(module.code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None, "it does not parse as Python 3"
    if not left:
        return None, None
    return None, "a BCE there does not take a sigmoid it applies itself (inline, or through names read once)"


def _describe(before: List[Tuple[int, str]], where: str = "") -> str:
    place = f"{where}: " if where else ""
    shown = ", ".join(f"line {line} {name}" for line, name in before[:3]) + (
        f" and {len(before) - 3} more" if len(before) > 3 else "")
    many = len(before) != 1
    return (f"{place}the BCE{'s' if many else ''} of a sigmoid ({shown}) now take{'' if many else 's'} the "
            "sigmoid's input as logits (`binary_cross_entropy_with_logits` / `BCEWithLogitsLoss`): the same loss, "
            "computed stably, which autocast runs (it refuses BCE on probabilities)")


def plan_imported_bce(project, here: str, code: str, called: Set[str]):
    """The training module `here` imports code that computes BCE on probabilities: each such
    module gets its BCE fused with the sigmoid before it, as a companion of this module's change
    (one change set): each module it imports directly, or whose function, class or method holding
    the BCE it calls (`called`: the names this module calls). Returns (companions, one line per
    module, None), or ([], [], the reason it cannot be done)."""

    def rewrite(key: str, display: str, source: bytes, module: cst.Module):
        fused, refused = logits_bce(module)
        if refused is not None:
            return f"in {display}, {refused}"
        if fused is None:
            return None  # fused already, by the change set of another training file of this run
        before = [(line, name) for line, name, _ in bce_lines(ast.parse(module.code))]
        return ModuleRewrite(fused, before[0][0], _describe(before), _describe(before, display))

    return plan_companion_rewrites(
        project, here, project.bce_modules(called), rewrite, code,
        "its BCE of a sigmoid takes the logits (BCE with logits, the same loss), so that the training step of that "
        "file runs under autocast")
