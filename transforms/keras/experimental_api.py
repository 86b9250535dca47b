"""Keras's experimental mixed precision API (TF 2.1-2.3) migrated to the current one.

`tf.keras.mixed_precision.experimental` is gone from current TensorFlow and from Keras 3, so
scripts written for it fail at import or at the first call:

    mixed_precision.experimental.set_policy("mixed_float16")   -> mixed_precision.set_global_policy(...)
    mixed_precision.experimental.Policy("mixed_float16")       -> mixed_precision.Policy(...)
    mixed_precision.experimental.global_policy()               -> mixed_precision.global_policy()
    mixed_precision.experimental.LossScaleOptimizer(opt, "dynamic") -> mixed_precision.LossScaleOptimizer(opt)
    from tensorflow.keras.mixed_precision import experimental as mixed_precision
                                                          -> from tensorflow.keras import mixed_precision

Anything else is left with the reason: a Policy with its own loss scale, LossScale objects, and a
static loss scale (`LossScaleOptimizer(opt, 1024)`: Keras 2 spells it `dynamic=False,
initial_scale=1024`, which Keras 3 refuses; there it is `loss_scale_factor` on the inner optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name

EXPERIMENTAL = ".mixed_precision.experimental"
RENAMED = {"set_policy": "set_global_policy", "Policy": "Policy", "global_policy": "global_policy",
           "LossScaleOptimizer": "LossScaleOptimizer"}


@dataclass
class ExperimentalPlan:
    #: id of a node -> its replacement
    replacements: Dict[int, cst.CSTNode] = field(default_factory=dict)
    #: (node, what was done) for the findings
    done: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    obstacle: Optional[Tuple[cst.CSTNode, str]] = None


def _member(qualified: str) -> Optional[Tuple[str, str]]:
    """("tensorflow.keras.mixed_precision", "set_policy") for an experimental API name."""
    head, marker, tail = qualified.partition(EXPERIMENTAL)
    if not marker or (tail and not tail.startswith(".")):
        return None
    return head + ".mixed_precision", tail.lstrip(".")


class _Finder(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.stack: List[cst.CSTNode] = []
        self.references: List[Tuple[cst.CSTNode, str, Optional[cst.CSTNode]]] = []
        self.import_froms: List[cst.ImportFrom] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.ImportFrom):
            self.import_froms.append(node)
            return False
        if isinstance(node, cst.Import):
            return False
        parent = self.stack[-1] if self.stack else None
        if isinstance(node, (cst.Name, cst.Attribute)) and not (
                isinstance(parent, cst.Attribute) and (parent.value is node or parent.attr is node)):
            qualified = self.imports.resolve(node)
            if qualified and _member(qualified):
                self.references.append((node, qualified, parent))
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.stack and self.stack[-1] is original_node:
            self.stack.pop()


def plan_experimental_migration(module: cst.Module, imports: ImportMap) -> Optional[ExperimentalPlan]:
    """The plan, or None when the module does not use the experimental API."""
    finder = _Finder(imports)
    walk(module, finder)
    plan = ExperimentalPlan()
    aliased = {local for local, q in imports.aliases.items() if q.endswith(EXPERIMENTAL)}
    for node in finder.import_froms:
        module_name = dotted_name(node.module) if node.module is not None else None
        if isinstance(node.names, cst.ImportStar) or not module_name:
            continue
        for alias in node.names:
            if f"{module_name}.{dotted_name(alias.name)}".endswith(EXPERIMENTAL):
                if len(node.names) != 1:
                    plan.obstacle = (node, "`experimental` imported with other names on one line")
                    return plan
                # from tensorflow.keras.mixed_precision import experimental as mp -> from tensorflow.keras import mixed_precision as mp
                local = alias.asname.name.value if alias.asname else "experimental"
                parent = module_name.rsplit(".", 1)[0] if module_name.endswith(".mixed_precision") else None
                if parent is None:
                    plan.obstacle = (node, "an import of the experimental API ampify does not know")
                    return plan
                new_alias = "" if local == "mixed_precision" else f" as {local}"
                plan.replacements[id(node)] = cst.parse_statement(
                    f"from {parent} import mixed_precision{new_alias}\n").body[0]
                plan.done.append((node, f"`from {module_name} import experimental` -> `from {parent} import "
                                        f"mixed_precision{new_alias}`"))
    for node, qualified, parent in finder.references:
        base, member = _member(qualified)
        if member not in RENAMED:
            plan.obstacle = (node, f"{qualified} has no current equivalent that ampify writes")
            return plan
        head = node
        while isinstance(head, cst.Attribute):
            head = head.value
        through_alias = isinstance(head, cst.Name) and head.value in aliased
        if through_alias:
            spelled = f"{head.value}.{RENAMED[member]}"
        else:
            code = cst.Module(body=[]).code_for_node(node)
            spelled = code.replace(".experimental.", ".", 1).rsplit(".", 1)[0] + "." + RENAMED[member]
        new = cst.parse_expression(spelled)
        if member == "LossScaleOptimizer" and isinstance(parent, cst.Call) and parent.func is node:
            call = _loss_scale_optimizer(parent, new)
            if call is None:
                plan.obstacle = (parent, "experimental LossScaleOptimizer with a static loss scale or a LossScale "
                                     "object: Keras 2 spells a static scale dynamic=False, initial_scale=N, which "
                                     "Keras 3 refuses (it takes loss_scale_factor on the inner optimizer); migrate by hand")
                return plan
            plan.replacements[id(parent)] = call
        elif member == "Policy" and isinstance(parent, cst.Call) and parent.func is node and len(parent.args) > 1:
            plan.obstacle = (parent, "experimental Policy with its own loss scale: the current Policy has none")
            return plan
        else:
            plan.replacements[id(node)] = new
        plan.done.append((node, f"{qualified} -> {base}.{RENAMED[member]}"))
    return plan if plan.done or plan.obstacle else None


def _loss_scale_optimizer(call: cst.Call, func: cst.BaseExpression) -> Optional[cst.Call]:
    """LossScaleOptimizer(opt, loss_scale) -> the current signature (dynamic / initial_scale)."""
    positional = [arg for arg in call.args if arg.keyword is None]
    keywords = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
    if not positional or set(keywords) - {"loss_scale"} or len(positional) > 2:
        return None
    scale = positional[1].value if len(positional) == 2 else (keywords["loss_scale"].value if keywords else None)
    optimizer = positional[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    if scale is None or (isinstance(scale, cst.SimpleString) and scale.evaluated_value == "dynamic"):
        return cst.Call(func, args=[optimizer])
    # a static scale has no form both Kerases take: Keras 2 wants dynamic=False, initial_scale=N;
    # Keras 3's LossScaleOptimizer is dynamic only (loss_scale_factor on the inner optimizer)
    return None


class ExperimentalRewriter(cst.CSTTransformer):
    def __init__(self, plan: ExperimentalPlan) -> None:
        super().__init__()
        self.replacements = plan.replacements

    def on_leave(self, original_node, updated_node):
        updated_node = super().on_leave(original_node, updated_node)
        return self.replacements.get(id(original_node), updated_node)
