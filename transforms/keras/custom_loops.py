"""Keras custom training loops: loss scaling around a `tf.GradientTape` step.

    optimizer = keras.optimizers.Adam(1e-3)
      -> optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
        scaled_loss = <scaled by the optimizer>          # added: the scaling must be taped
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    <unscaled in Keras 2>                                 # added
    optimizer.apply_gradients(zip(grads, model.trainable_variables))

Keras 3's LossScaleOptimizer has `scale_loss` and unscales in `apply_gradients`; Keras 2's has
`get_scaled_loss` / `get_unscaled_gradients` and does not. `import tf_keras` is Keras 2; `import
keras` and `tf.keras` are Keras 3 today but Keras 2 in older environments (and `tf.keras` with
TF_USE_LEGACY_KERAS=1), and the imports cannot tell: there the form that works on both is written,
choosing by the optimizer's own methods (`hasattr`), and the finding says so.

Only this shape is converted: a tape bound by `with tf.GradientTape() as tape:`, one
`grads = tape.gradient(loss, variables)` of a name the tape's block assigns, and
`optimizer.apply_gradients(...)` of those gradients, where `optimizer` is built once in this file
by a Keras optimizer class. Anything else is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.module_names import fresh_name, names_in
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.keras.survey import keras_member, keras_optimizer_alias, keras_root_of

from ampify.transforms.keras.keras_version import EITHER, KERAS_2, KERAS_3, keras_api


@dataclass
class LoopStep:
    tape_block: cst.With
    loss: str
    gradient_call: cst.Call
    gradient_statement: cst.SimpleStatementLine
    grads: str
    optimizer: str
    constructor: cst.Call


@dataclass
class LoopPlan:
    steps: List[LoopStep] = field(default_factory=list)
    obstacle: Optional[Tuple[cst.CSTNode, str]] = None
    api: str = EITHER
    #: why this API was chosen (the import, or the repository's version pin)
    api_reason: str = ""


class _Collector(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.stack: List[cst.CSTNode] = []
        self.tapes: Dict[str, cst.With] = {}
        #: (tape.gradient call, its ancestors, the `with` that bound the tape's name last before it:
        #: two tapes named `g` one after the other in a GAN step each serve their own gradient)
        self.gradient_calls: List[Tuple[cst.Call, Tuple[cst.CSTNode, ...], Optional[cst.With]]] = []
        self.apply_calls: List[cst.Call] = []
        self.constructors: Dict[str, List[cst.Call]] = {}
        self.names: Set[str] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Name):
            self.names.add(node.value)
        if isinstance(node, cst.With):
            for item in node.items:
                if (isinstance(item.item, cst.Call) and (self.imports.resolve(item.item.func) or "").endswith("GradientTape")
                        and item.asname is not None and isinstance(item.asname.name, cst.Name)):
                    self.tapes[item.asname.name.value] = node
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value == "gradient":
                tape = dotted_name(node.func.value)
                self.gradient_calls.append((node, tuple(reversed(self.stack)), self.tapes.get(tape or "")))
            elif node.func.attr.value == "apply_gradients":
                self.apply_calls.append(node)
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call):
            qualified = keras_optimizer_alias(self.imports.resolve(node.value.func))
            target = dotted_name(node.targets[0].target)
            if target and keras_root_of(qualified) and keras_member(qualified).startswith("optimizers."):
                self.constructors.setdefault(target, []).append(node.value)
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.stack and self.stack[-1] is original_node:
            self.stack.pop()


def _assigned_names(block: cst.BaseSuite) -> Set[str]:
    names: Set[str] = set()

    class _Targets(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            if isinstance(node.target, cst.Name):
                names.add(node.target.value)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Name):
                names.add(node.target.value)

    walk(block, _Targets())
    return names


_MODEL_VARIABLES = ("trainable_variables", "trainable_weights", "variables", "weights")


def raw_variable_training(module: cst.Module) -> Optional[Tuple[cst.CSTNode, str]]:
    """(tape.gradient call, its sources) when a tape differentiates with respect to variables
    that are not a Keras model's (`[W, b]`, `weights.values()`): the mixed precision policy casts
    what Keras layers compute, never raw `tf.matmul` on raw `tf.Variable`s, so nothing would run
    in reduced precision. Sources read through `<model>.trainable_variables` (also summed, or
    through one local) are a model's."""
    bound: Dict[str, List[cst.BaseExpression]] = {}
    gradients: List[cst.Call] = []

    class _Find(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    bound.setdefault(target.target.value, []).append(node.value)

        def visit_Call(self, node: cst.Call) -> None:
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "gradient":
                gradients.append(node)

    walk(module, _Find())
    for call in gradients:
        positional = [arg.value for arg in call.args if arg.keyword is None]
        sources = next((arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value == "sources"),
                       positional[1] if len(positional) > 1 else None)
        if sources is None:
            continue
        values = bound.get(sources.value, []) if isinstance(sources, cst.Name) else [sources]
        if not values:
            continue  # a parameter or a name from elsewhere: not known to be raw
        if not all(_reads_model_variables(value) for value in values):
            return call, cst.Module(body=[]).code_for_node(sources)
    return None


def _reads_model_variables(expression: cst.BaseExpression) -> bool:
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if node.attr.value in _MODEL_VARIABLES:
                found.append(node)

    walk(expression, _Find())
    return bool(found)


def plan_custom_loops(module: cst.Module, imports: ImportMap, roots: List[str],
                      pins: Optional[Dict[str, Tuple[str, str]]] = None) -> LoopPlan:
    """`pins`: the repository's dependency pins (ProjectFacts.dependency_pins), which decide the
    Keras API where the imports cannot."""
    collector = _Collector(imports)
    walk(module, collector)
    api, reason = keras_api(roots, pins or {})
    plan = LoopPlan(api=api, api_reason=reason)
    used_optimizers: Set[str] = set()
    for call, ancestors, block in collector.gradient_calls:
        if block is None:
            continue  # not a GradientTape's gradient (or a tape bound another way: reported below)
        statement = ancestors[1] if len(ancestors) > 1 else None
        if any(ancestor is block for ancestor in ancestors):
            plan.obstacle = (call, "tape.gradient is called inside the tape's own `with` block")
            return plan
        assign = ancestors[0] if ancestors else None
        positional = [arg.value for arg in call.args if arg.keyword is None]
        if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name) and isinstance(statement, cst.SimpleStatementLine)
                and positional and isinstance(positional[0], cst.Name)):
            plan.obstacle = (call, "`grads = tape.gradient(loss, variables)` is not in its plain form")
            return plan
        loss, grads = positional[0].value, assign.targets[0].target.value
        if loss not in _assigned_names(block.body):
            plan.obstacle = (call, f"the loss `{loss}` is not computed inside the tape's `with` block")
            return plan
        applying = [c for c in collector.apply_calls if grads in names_in(c)]
        if len(applying) != 1 or not isinstance(applying[0].func, cst.Attribute):
            plan.obstacle = (call, f"the gradients `{grads}` do not reach exactly one optimizer.apply_gradients")
            return plan
        optimizer = dotted_name(applying[0].func.value)
        constructors = collector.constructors.get(optimizer or "", [])
        if len(constructors) != 1:
            plan.obstacle = (applying[0], f"the optimizer `{optimizer}` is not built once in this file by a Keras "
                                          "optimizer class (it needs a LossScaleOptimizer around it)")
            return plan
        plan.steps.append(LoopStep(block, loss, call, statement, grads, optimizer, constructors[0]))
        used_optimizers.add(optimizer)
    if not plan.steps:
        plan.obstacle = (module, "no `tape.gradient(...)` of a `with tf.GradientTape() as tape:` block")
    elif len(plan.steps) != len(collector.apply_calls):
        plan.obstacle = (plan.steps[0].gradient_call, "an apply_gradients call whose gradients ampify cannot follow")
    return plan


class LoopRewriter(cst.CSTTransformer):
    """Writes a LoopPlan: the wrapped optimizers, the taped scaling, the unscaling."""

    def __init__(self, plan: LoopPlan, mixed_precision: str, taken: Set[str]) -> None:
        super().__init__()
        self.plan = plan
        self.mixed_precision = mixed_precision  # "keras.mixed_precision", "mixed_precision"...
        self.scaled: Dict[int, str] = {}
        for step in plan.steps:
            name = fresh_name(taken, "scaled_loss")
            taken.add(name)
            self.scaled[id(step.tape_block)] = name
        self.by_block = {id(s.tape_block): s for s in plan.steps}
        self.by_gradient = {id(s.gradient_call): s for s in plan.steps}
        self.by_statement = {id(s.gradient_statement): s for s in plan.steps}
        self.constructors = {id(s.constructor) for s in plan.steps}

    def _scale_expression(self, step: LoopStep) -> str:
        if self.plan.api == KERAS_2:
            return f"{step.optimizer}.get_scaled_loss({step.loss})"
        if self.plan.api == KERAS_3:
            return f"{step.optimizer}.scale_loss({step.loss})"
        return (f'{step.optimizer}.scale_loss({step.loss}) if hasattr({step.optimizer}, "scale_loss") '
                f"else {step.optimizer}.get_scaled_loss({step.loss})")

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        step = self.by_block.get(id(original_node))
        if step is None or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        line = cst.parse_statement(f"{self.scaled[id(original_node)]} = {self._scale_expression(step)}\n")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[*updated_node.body.body, line]))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        step = self.by_gradient.get(id(original_node))
        if step is not None:
            args = list(updated_node.args)
            args[0] = args[0].with_changes(value=cst.Name(self.scaled[id(step.tape_block)]))
            return updated_node.with_changes(args=args)
        if id(original_node) in self.constructors:
            return cst.Call(cst.parse_expression(f"{self.mixed_precision}.LossScaleOptimizer"),
                            args=[cst.Arg(updated_node)])
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        step = self.by_statement.get(id(original_node))
        if step is None or self.plan.api == KERAS_3:
            return updated_node
        unscale = f"{step.grads} = {step.optimizer}.get_unscaled_gradients({step.grads})\n"
        if self.plan.api == EITHER:
            unscale = (f'if hasattr({step.optimizer}, "get_unscaled_gradients"):  # Keras 2; Keras 3 unscales in '
                       f"apply_gradients\n    {unscale}")
        return cst.FlattenSentinel([updated_node, cst.parse_statement(unscale)])


def wrap_tape_check(plan: LoopPlan) -> Optional[str]:
    """A short reason when the plan cannot be written, else None."""
    for step in plan.steps:
        if not isinstance(step.tape_block.body, cst.IndentedBlock):
            return "a one-line `with tf.GradientTape() as tape:` block"
    return None
