"""BCE after a sigmoid the training step applies itself, fused (LeeJunHyun/Image_Segmentation's
solver, segmentation and GAN loops that keep the model's output as logits):

    SR = self.unet(images)                                   SR = self.unet(images)
    SR_probs = F.sigmoid(SR)                         ->      SR_probs = SR
    SR_flat = SR_probs.view(SR_probs.size(0), -1)            SR_flat = SR_probs.view(SR_probs.size(0), -1)
    loss = self.criterion(SR_flat, GT_flat)                  loss = self.criterion(SR_flat, GT_flat)
    ...
    self.criterion = torch.nn.BCELoss()              ->      self.criterion = torch.nn.BCEWithLogitsLoss()

CUDA autocast and apex refuse `nn.BCELoss`; `BCEWithLogitsLoss` of the logits is the same loss,
computed stably. Done only when every call of the criterion (or of `F.binary_cross_entropy`) gets
its input from a sigmoid this way: the sigmoid inline, or through names of one function, each bound
once and read once (by the next step of the chain), with shape operations between (`view`,
`reshape`, `flatten`, `squeeze`, `unsqueeze`, `contiguous`, which commute with an elementwise
sigmoid). Anything else leaves the file as it was (the BCE warning stays).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.kit.positions import Positions
from ampify.transforms.torch.bce_logits import Fusion

_SIGMOIDS = ("torch.sigmoid", "torch.nn.functional.sigmoid")
_SHAPE_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "contiguous"}
#: reads of a tensor that a sigmoid does not change
_SHAPE_READS = {"size", "shape", "dim", "ndim", "numel", "device"}
#: factories that read only a tensor's shape, dtype and device
_LIKE_FACTORIES = {f"torch.{name}_like" for name in ("ones", "zeros", "full", "empty", "rand", "randn")}
_BCE_CLASS = "torch.nn.BCELoss"
_BCE_FUNCTION = "torch.nn.functional.binary_cross_entropy"


class _NotFollowed(Exception):
    pass


def fuse_sigmoid_in_step(module: cst.Module, imports: ImportMap) -> Optional[Tuple[cst.Module, Fusion]]:
    """(fused module, Fusion) when the shape above holds for every BCE of the file; else None.
    Parents and positions are computed only for a file that builds or calls a BCE loss (a big
    test module that merely mentions one pays one walk)."""
    nodes, parents = _nodes_and_parents(module)
    if not any(isinstance(n, cst.Call) and imports.resolve(n.func) in (_BCE_CLASS, _BCE_FUNCTION) for n in nodes):
        return None
    try:
        return _Fuser(module, imports, parents, Positions(module), nodes).fuse()
    except _NotFollowed:
        return None


class _Fuser:
    def __init__(self, module, imports, parents, positions, nodes) -> None:
        self.nodes = nodes
        self.module = module
        self.imports = imports
        self.parents = parents
        self.positions = positions
        self.replacements: Dict[int, cst.CSTNode] = {}
        self.sigmoid_lines: List[int] = []

    def fuse(self) -> Optional[Tuple[cst.Module, Fusion]]:
        nodes = self.nodes
        criteria = self._criteria(nodes)
        functional = [n for n in nodes if isinstance(n, cst.Call) and self.imports.resolve(n.func) == _BCE_FUNCTION]
        if not criteria and not functional:
            return None
        criterion_line = None
        for target, construction in criteria:
            if not isinstance(construction.func, cst.Attribute):
                raise _NotFollowed  # `BCELoss()` imported by name: its logits twin would need an import
            uses = [n for n in nodes if isinstance(n, (cst.Name, cst.Attribute)) and dotted_name(n) == target
                    and not self._is_binding_target(n) and self._same_owner(n, construction, target)]
            if not uses:
                continue  # built and never called: no BCE runs, the construction stays as it is
            for use in uses:
                call = self.parents.get(use)
                if not isinstance(call, cst.Call) or call.func is not use:
                    raise _NotFollowed  # the criterion is passed on or read otherwise
                self._follow_input(call)
            self.replacements[id(construction.func)] = construction.func.with_changes(
                attr=cst.Name("BCEWithLogitsLoss"))
            criterion_line = criterion_line or self.positions[construction].start.line
        for call in functional:
            if not isinstance(call.func, cst.Attribute):
                raise _NotFollowed
            self._follow_input(call)
            self.replacements[id(call.func)] = call.func.with_changes(attr=cst.Name("binary_cross_entropy_with_logits"))
            criterion_line = criterion_line or self.positions[call].start.line
        if not self.sigmoid_lines:
            return None  # every BCE criterion is built and never called
        fused = self.module.visit(_Replace(self.replacements))
        first = min(self.sigmoid_lines)
        description = (
            f"BCE after a sigmoid fused: the sigmoid the step applies at line{'s' if len(set(self.sigmoid_lines)) > 1 else ''} "
            f"{', '.join(map(str, sorted(set(self.sigmoid_lines))))} dropped (its output, used only by the loss, is now "
            f"the logits), the loss at line {criterion_line} is BCE with logits (the same loss, computed stably)")
        return fused, Fusion(criterion_line, first, [], description)

    def _criteria(self, nodes) -> List[Tuple[str, cst.Call]]:
        """(name, construction) for every `criterion = nn.BCELoss(...)` (`self.criterion = ...`),
        each name bound exactly once in the module (a `self.` name once in its class)."""
        found = []
        for node in nodes:
            if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Call):
                continue
            if self.imports.resolve(node.value.func) != _BCE_CLASS:
                continue
            if len(node.targets) != 1:
                raise _NotFollowed
            target = dotted_name(node.targets[0].target)
            if target is None:
                raise _NotFollowed
            found.append((target, node.value))
        owners = [(self._owner(construction, target), target) for target, construction in found]
        if len(set(owners)) != len(owners):
            raise _NotFollowed
        for target, construction in found:
            bindings = [n for n in nodes if isinstance(n, (cst.Name, cst.Attribute)) and dotted_name(n) == target
                        and self._is_binding_target(n) and self._same_owner(n, construction, target)]
            if len(bindings) != 1:
                raise _NotFollowed
        return found

    def _owner(self, node: cst.CSTNode, target: str) -> Optional[int]:
        """Where a criterion name lives: `self.bceloss` in its class (two loss classes of a module
        may each have one), any other name in the module."""
        if not target.startswith("self."):
            return None
        current = self.parents.get(node)
        while current is not None and not isinstance(current, cst.ClassDef):
            current = self.parents.get(current)
        return id(current) if current is not None else None

    def _same_owner(self, node: cst.CSTNode, construction: cst.CSTNode, target: str) -> bool:
        return self._owner(node, target) == self._owner(construction, target)

    def _is_binding_target(self, node: cst.CSTNode) -> bool:
        parent = self.parents.get(node)
        return isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and parent.target is node

    def _follow_input(self, call: cst.Call) -> None:
        """The loss's first argument comes from a sigmoid: mark that sigmoid for removal."""
        if not call.args or call.args[0].keyword is not None or call.args[0].star:
            raise _NotFollowed
        self._follow(call.args[0].value, call, depth=0)

    def _follow(self, expression: cst.BaseExpression, use: cst.CSTNode, depth: int) -> None:
        if depth > 8:
            raise _NotFollowed
        while (isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute)
               and expression.func.attr.value in _SHAPE_METHODS):
            expression = expression.func.value
        sigmoid_input = self._sigmoid_input(expression)
        if sigmoid_input is not None:
            if id(expression) in self.replacements:
                raise _NotFollowed  # one sigmoid feeding two losses: followed once only
            self.replacements[id(expression)] = sigmoid_input
            self.sigmoid_lines.append(self.positions[expression].start.line)
            return
        if not isinstance(expression, cst.Name):
            raise _NotFollowed
        function = self._function_of(use)
        name = expression.value
        # a script's module level counts as one scope with every function in it (a local of the
        # same name in a function makes the chain refused: conservative)
        scope = function.body if function is not None else self.module
        occurrences = [n for n in _nodes_and_parents(scope)[0] if isinstance(n, cst.Name) and n.value == name]
        bindings = [n for n in occurrences if self._is_binding_target(n)]
        other_bindings = [n for n in occurrences if not self._is_binding_target(n) and self._binds_otherwise(n)]
        reads = [n for n in occurrences if not self._is_binding_target(n) and not self._binds_otherwise(n)
                 and not self._reads_shape_only(n)]
        if len(bindings) != 1 or other_bindings or len(reads) != 1 or reads[0] is not expression:
            raise _NotFollowed  # bound again, or its probability is read elsewhere too
        if function is not None and any(p.name.value == name for p in _params(function)):
            raise _NotFollowed
        assign = self.parents.get(bindings[0])
        assign = self.parents.get(assign)
        if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
            raise _NotFollowed
        self._follow(assign.value, assign, depth + 1)

    def _sigmoid_input(self, expression: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        if not isinstance(expression, cst.Call):
            return None
        if self.imports.resolve(expression.func) in _SIGMOIDS:
            if len(expression.args) == 1 and expression.args[0].keyword is None and not expression.args[0].star:
                return expression.args[0].value
            raise _NotFollowed
        if (isinstance(expression.func, cst.Attribute) and expression.func.attr.value == "sigmoid"
                and not expression.args and self.imports.resolve(expression.func) is None):
            return expression.func.value  # `logits.sigmoid()`
        return None

    def _reads_shape_only(self, node: cst.Name) -> bool:
        """`probs.size(0)`, `probs.shape`, `torch.ones_like(probs)`: the same for the logits (the
        sigmoid is elementwise, and keeps the dtype and device)."""
        parent = self.parents.get(node)
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in _SHAPE_READS:
            return True
        call = self.parents.get(parent) if isinstance(parent, cst.Arg) and parent.value is node else None
        return (isinstance(call, cst.Call) and call.args and call.args[0] is parent and parent.keyword is None
                and self.imports.resolve(call.func) in _LIKE_FACTORIES)

    def _binds_otherwise(self, node: cst.Name) -> bool:
        """A for/with/comprehension target, a walrus, a tuple unpacking, an import: a binding
        `_is_binding_target` does not see."""
        parent = self.parents.get(node)
        if isinstance(parent, (cst.For, cst.CompFor)) and parent.target is node:
            return True
        if isinstance(parent, cst.AsName) or isinstance(parent, cst.NamedExpr) and parent.target is node:
            return True
        if isinstance(parent, cst.Element):
            holder = self.parents.get(parent)
            container = self.parents.get(holder)
            return isinstance(container, (cst.AssignTarget, cst.For, cst.CompFor))
        return False

    def _function_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        """The function holding `node`; None at module level. A lambda or class body: not followed."""
        current = node
        while current is not None:
            current = self.parents.get(current)
            if isinstance(current, cst.FunctionDef):
                return current
            if isinstance(current, (cst.Lambda, cst.ClassDef)):
                raise _NotFollowed
        return None


def _params(function: cst.FunctionDef) -> List[cst.Param]:
    p = function.params
    return [*p.posonly_params, *p.params, *p.kwonly_params,
            *([p.star_arg] if isinstance(p.star_arg, cst.Param) else []),
            *([p.star_kwarg] if p.star_kwarg is not None else [])]


def _nodes_and_parents(root: cst.CSTNode) -> Tuple[List[cst.CSTNode], Dict[cst.CSTNode, cst.CSTNode]]:
    """Every code node under root (root included), in source order, and each one's parent."""
    found: List[cst.CSTNode] = []

    class _Every(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            found.append(node)
            return True

    parents: Dict[cst.CSTNode, cst.CSTNode] = {}
    walk(root, _Every(), parents)
    return found, parents


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: Dict[int, cst.CSTNode]) -> None:
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        if id(original_node) not in self.replacements:
            return updated_node
        if isinstance(original_node, cst.Call):
            # a sigmoid: its argument (or the receiver of `.sigmoid()`), as updated inside it
            inner = updated_node.args[0].value if updated_node.args else updated_node.func.value
            if not isinstance(inner, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not inner.lpar:
                inner = inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return inner
        return updated_node.with_changes(attr=self.replacements[id(original_node)].attr)
