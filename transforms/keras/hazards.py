"""What a mixed precision policy does not fix by itself in a Keras module, warned with the line.

- a custom layer that makes a `tf.Variable` by hand: unlike `add_weight`'s variables it is not
  cast to the layer's float16 compute dtype, so mixing it with the layer's inputs fails with a
  dtype error (or, cast by hand, computes in float32);
- `tf.cast(..., float32)` inside a custom layer's `call`: everything after it runs in float32;
- TPU code under mixed_float16: TPUs compute in bfloat16 (`--dtype bfloat16` writes
  mixed_bfloat16).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.keras.survey import keras_member, keras_root_of

HAND_MADE_VARIABLE = "AMP515"
FLOAT32_CAST = "AMP516"
TPU_FLOAT16 = "AMP517"

_TPU = ("tensorflow.distribute.TPUStrategy", "tensorflow.distribute.experimental.TPUStrategy",
        "tensorflow.distribute.cluster_resolver.TPUClusterResolver", "tensorflow.tpu.experimental.initialize_tpu_system")
_FLOAT32 = ("tensorflow.float32", "tensorflow.dtypes.float32")

Hazard = Tuple[cst.CSTNode, str, str]  # node, code, message


class _Walker(cst.CSTVisitor):
    def __init__(self, imports: ImportMap, policy: str) -> None:
        super().__init__()
        self.imports = imports
        self.policy = policy
        self.layers: List[cst.ClassDef] = []
        self.methods: List[str] = []
        self.found: List[Hazard] = []
        self.tpu: Optional[cst.CSTNode] = None

    def _is_layer(self, node: cst.ClassDef) -> bool:
        for base in node.bases:
            qualified = self.imports.resolve(base.value)
            if keras_root_of(qualified) and keras_member(qualified) in ("layers.Layer", "engine.base_layer.Layer"):
                return True
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.layers.append(node if self._is_layer(node) else None)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.layers.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.methods.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.methods.pop()

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.imports.resolve(node.func)
        if qualified in _TPU and self.tpu is None:
            self.tpu = node
        layer = self.layers[-1] if self.layers else None
        if layer is None:
            return
        if qualified == "tensorflow.Variable":
            reduced = "bfloat16" if "bfloat16" in self.policy else "float16"
            self.found.append((node, HAND_MADE_VARIABLE,
                               f"custom layer {layer.name.value} makes a tf.Variable by hand: unlike self.add_weight's "
                               f"variables it is not cast to the layer's {reduced} compute dtype, so using it with the "
                               "layer's inputs fails with a dtype error; create it with self.add_weight"))
        elif qualified == "tensorflow.cast" and self.methods and self.methods[-1] == "call" and len(node.args) > 1:
            target = node.args[1].value
            literal = target.evaluated_value if isinstance(target, cst.SimpleString) else None
            if self.imports.resolve(target) in _FLOAT32 or literal == "float32":
                self.found.append((node, FLOAT32_CAST,
                                   f"custom layer {layer.name.value} casts to float32 in call(): the ops after the cast "
                                   "run in float32, not in the policy's reduced precision; fine where deliberate "
                                   "(a softmax, a norm), else cast to self.compute_dtype"))


def keras_hazards(module: cst.Module, imports: ImportMap, policy: str) -> List[Hazard]:
    walker = _Walker(imports, policy)
    walk(module, walker)
    found = list(walker.found)
    if walker.tpu is not None and policy == "mixed_float16":
        found.append((walker.tpu, TPU_FLOAT16, "TPU code under mixed_float16: TPUs compute in bfloat16, which needs no "
                      "loss scale; run ampify with --dtype bfloat16 for mixed_bfloat16"))
    return found


FLOAT16_LOSS = "AMP518"


def _calls_or_names(node: cst.CSTNode) -> Tuple[set, set, bool]:
    """(names called, names read, whether a tf.cast appears) in an expression."""
    called, read = set(), set()
    casts = []

    class _Visitor(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if isinstance(call.func, cst.Name):
                called.add(call.func.value)
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "cast":
                casts.append(call)

        def visit_Name(self, name: cst.Name) -> None:
            read.add(name.value)

    walk(node, _Visitor())
    return called, read, bool(casts)


def float16_losses(loops, reduced_models: List[str]) -> List[Hazard]:
    """A custom loop's loss computed from the output of a model that stays in the policy's reduced
    precision (a subclassed model, or one whose output layer ampify did not find): the loss is
    then float16 too, outside any model."""
    found: List[Hazard] = []
    models = set(reduced_models)
    if not models:
        return found
    for step in loops.steps:
        tainted: dict = {}  # name -> the model whose output it holds
        for statement in getattr(step.tape_block.body, "body", ()):
            if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                    and isinstance(statement.body[0], cst.Assign) and len(statement.body[0].targets) == 1
                    and isinstance(statement.body[0].targets[0].target, cst.Name)):
                continue
            assign = statement.body[0]
            name = assign.targets[0].target.value
            called, read, cast = _calls_or_names(assign.value)
            if cast:
                continue
            sources = sorted(called & models) or sorted(tainted[n] for n in read if n in tainted)
            if sources:
                tainted[name] = sources[0]
                if name == step.loss:
                    found.append((statement, FLOAT16_LOSS,
                                  f"the loss `{name}` is computed from {sources[0]}'s output, which stays in the "
                                  "policy's reduced precision (its output layer is not cast to float32): the loss is "
                                  "float16 outside the model; cast the output with tf.cast(..., tf.float32) first"))
    return found
