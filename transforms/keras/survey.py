"""One walk over a Keras module: what the mixed precision policy conversion needs to decide.

Which Keras the imports name (`keras`, `tensorflow.keras`, `tf_keras`), whether the module
already uses a mixed precision API, trains with compile/fit or with its own GradientTape loop,
looks like TF1 graph code (then it is the TF1 target's), where its models are built and which
layer call makes each model's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name

#: the packages that are Keras, as the imports resolve them
KERAS_ROOTS = ("keras", "tensorflow.keras", "tensorflow.python.keras", "tf_keras")
#: TF1 graph code: this module belongs to the TF1 target
TF1_MARKERS = ("tensorflow.compat.v1", "tensorflow.Session", "tensorflow.placeholder", "tensorflow.train.",
               "tensorflow.get_variable", "tensorflow.estimator", "tensorflow.contrib")


def keras_root_of(qualified: Optional[str]) -> Optional[str]:
    """"tensorflow.keras" for "tensorflow.keras.layers.Dense", else None."""
    if not qualified:
        return None
    for root in KERAS_ROOTS:
        if qualified == root or qualified.startswith(root + "."):
            # `tensorflow.keras` before `keras`: KERAS_ROOTS is checked longest-prefix by the
            # dotted boundary, and "keras" never prefixes "tensorflow.keras"
            return root
    return None


def keras_optimizer_alias(qualified: Optional[str]) -> Optional[str]:
    """`tf.optimizers.SGD` is `tf.keras.optimizers.SGD` in TensorFlow 2 (Keras 2 and 3 alike):
    "tensorflow.optimizers.SGD" -> "tensorflow.keras.optimizers.SGD"; other names unchanged."""
    if qualified and qualified.startswith("tensorflow.optimizers."):
        return "tensorflow.keras." + qualified[len("tensorflow."):]
    return qualified


def keras_member(qualified: str) -> str:
    """"layers.Dense" for "tensorflow.keras.layers.Dense"."""
    root = keras_root_of(qualified) or ""
    return qualified[len(root) + 1:]


@dataclass
class ModelBuild:
    """A model construction and the layer call that makes its output (None when not found)."""

    call: cst.Call
    kind: str  # "Sequential", "Model", "application", "subclass"
    output_layer: Optional[cst.Call] = None
    reason: str = ""  # why the output layer was not found
    #: name -> layer call, as bound when the build runs (`outputs` rebound by a later cell is
    #: another model's output layer)
    layer_outputs: Dict[str, cst.Call] = field(default_factory=dict)
    #: a Sequential built empty and bound to a name: (that name, the block it is built in, how many
    #: `add()` calls the module made before it), to find the layers added to it afterwards
    sequential_name: Optional[Tuple[str, int, int]] = None


@dataclass
class KerasSurvey:
    roots: List[str] = field(default_factory=list)
    #: (what, node) of a mixed precision API already used
    mixed_precision: Optional[Tuple[str, cst.CSTNode]] = None
    #: a GradientTape training loop
    gradient_tape: Optional[cst.CSTNode] = None
    tf1_marker: Optional[cst.CSTNode] = None
    compile_calls: List[cst.Call] = field(default_factory=list)
    #: `optimizer.apply_gradients(...)` calls (a custom training loop, with a GradientTape)
    apply_gradients: List[cst.Call] = field(default_factory=list)
    fit_calls: List[cst.Call] = field(default_factory=list)
    models: List[ModelBuild] = field(default_factory=list)
    #: Name -> the layer Call that produced it (`outputs = layers.Dense(10)(x)`): its call's func
    layer_outputs: Dict[str, cst.Call] = field(default_factory=dict)
    #: receiver name -> the last `receiver.add(Layer(...))` call's layer
    last_added: Dict[str, cst.Call] = field(default_factory=dict)
    #: every `receiver.add(...)`, in order: (receiver, the layer call or None when the argument is
    #: no layer built there, such as a pretrained `conv_base`, id of its block)
    adds: List[Tuple[str, Optional[cst.Call], int]] = field(default_factory=list)
    #: classes that derive from keras Model
    subclassed_models: List[cst.ClassDef] = field(default_factory=list)
    #: (name, call) of every `name = Call(...)` (models built and bound to a name)
    assigned_calls: List[Tuple[str, cst.Call]] = field(default_factory=list)


#: what sets mixed precision up (reading `global_policy()` does not)
MIXED_PRECISION_SETTERS = frozenset({"set_global_policy", "set_policy", "Policy", "DTypePolicy", "LossScaleOptimizer",
                                     "experimental"})


def _sets_mixed_precision(qualified: str) -> bool:
    parts = qualified.split(".")
    return "mixed_precision" in parts and parts[-1] in MIXED_PRECISION_SETTERS


def _is_layer_construction(call: cst.CSTNode, imports: ImportMap) -> bool:
    """`layers.Dense(...)`, `keras.layers.Activation(...)`, `Dense(...)` imported from Keras layers."""
    if not isinstance(call, cst.Call):
        return False
    qualified = imports.resolve(call.func)
    return qualified is not None and keras_member(qualified).startswith("layers.") if keras_root_of(qualified) else False


class _Walker(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.survey = KerasSurvey(roots=sorted({r for q in imports.aliases.values() if (r := keras_root_of(q))}))
        #: the blocks the walk is in, innermost last (0: the module's body)
        self._blocks: List[int] = [0]

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._blocks.append(id(node))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self._blocks.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            member = keras_member(self.imports.resolve(base.value) or "") if keras_root_of(
                self.imports.resolve(base.value)) else ""
            if member in ("Model", "models.Model"):
                self.survey.subclassed_models.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        qualified = self.imports.resolve(node)
        if qualified is None:
            return
        if _sets_mixed_precision(qualified) and self.survey.mixed_precision is None:
            self.survey.mixed_precision = (qualified, node)
        if qualified.startswith("tensorflow.GradientTape") and self.survey.gradient_tape is None:
            self.survey.gradient_tape = node
        if self.survey.tf1_marker is None and any(
                qualified == m or qualified.startswith(m if m.endswith(".") else m + ".") or qualified == m.rstrip(".")
                for m in TF1_MARKERS):
            if not qualified.startswith("tensorflow.train.Checkpoint"):
                self.survey.tf1_marker = node

    def visit_Name(self, node: cst.Name) -> None:
        qualified = self.imports.aliases.get(node.value)
        if qualified and _sets_mixed_precision(qualified) and self.survey.mixed_precision is None:
            self.survey.mixed_precision = (qualified, node)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if node.value.strip("'\"") in ("mixed_float16", "mixed_bfloat16") and self.survey.mixed_precision is None:
            self.survey.mixed_precision = (node.value, node)

    def visit_Assign(self, node: cst.Assign) -> None:
        # outputs = layers.Dense(10, activation="softmax")(x)
        value = node.value
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and isinstance(value, cst.Call):
            self.survey.assigned_calls.append((node.targets[0].target.value, value))
        if (len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and isinstance(value, cst.Call)
                and _is_layer_construction(value.func, self.imports)):
            self.survey.layer_outputs[node.targets[0].target.value] = value.func

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            name = func.attr.value
            if name == "compile":
                self.survey.compile_calls.append(node)
            elif name == "fit":
                self.survey.fit_calls.append(node)
            elif name == "apply_gradients":
                self.survey.apply_gradients.append(node)
            elif name == "add" and node.args:
                receiver = dotted_name(func.value)
                layer = node.args[0].value if _is_layer_construction(node.args[0].value, self.imports) else None
                if receiver and layer is not None:
                    self.survey.last_added[receiver] = layer
                if receiver:
                    self.survey.adds.append((receiver, layer, self._blocks[-1]))
        qualified = self.imports.resolve(func)
        if not keras_root_of(qualified):
            return
        member = keras_member(qualified)
        if member in ("Sequential", "models.Sequential"):
            bound = [name for name, value in self.survey.assigned_calls if value is node]
            self.survey.models.append(ModelBuild(node, "Sequential", sequential_name=(
                bound[0], self._blocks[-1], len(self.survey.adds)) if bound else None))
        elif member in ("Model", "models.Model"):
            self.survey.models.append(ModelBuild(node, "Model", layer_outputs=dict(self.survey.layer_outputs)))
        elif member.startswith("applications."):
            self.survey.models.append(ModelBuild(node, "application"))


def survey_keras(module: cst.Module, imports: ImportMap) -> KerasSurvey:
    walker = _Walker(imports)
    walk(module, walker)
    survey = walker.survey
    for build in survey.models:
        _find_output_layer(build, survey)
    return survey


def _last_layer_added(build: ModelBuild, survey: KerasSurvey) -> Optional[cst.Call]:
    """The layer of the last `model.add(Layer(...))` after `model = Sequential()` and before the
    name is bound to another Sequential (a notebook builds several, one per cell), when every add
    to it in between sits in the block the model is built in (an add under an `if` or in a loop
    may not be the last one to run); None otherwise."""
    if build.sequential_name is None:
        return None
    name, block, start = build.sequential_name
    end = min((other.sequential_name[2] for other in survey.models
               if other.sequential_name is not None and other.sequential_name[0] == name
               and other.sequential_name[2] > start), default=len(survey.adds))
    added = [(layer, where) for receiver, layer, where in survey.adds[start:end] if receiver == name]
    if not added or any(where != block for _, where in added):
        return None
    return added[-1][0]  # None when the last thing added is no layer built there (a pretrained model)


def _find_output_layer(build: ModelBuild, survey: KerasSurvey) -> None:
    if build.kind == "application":
        build.reason = "a keras.applications model: its output layer is built inside Keras"
        return
    if build.kind == "Sequential":
        layers = next((arg.value for arg in build.call.args if arg.keyword is None or arg.keyword.value == "layers"),
                      None)
        if isinstance(layers, (cst.List, cst.Tuple)) and layers.elements:
            last = layers.elements[-1].value
            if isinstance(last, cst.Call):
                build.output_layer = last
                return
            build.reason = "the Sequential model's last layer is not built in its list"
            return
        build.reason = "layers added with model.add(...)"  # resolved below from the add() calls
        layer = _last_layer_added(build, survey)
        if layer is not None:
            build.output_layer, build.reason = layer, ""
        return
    outputs = next((arg.value for arg in build.call.args if arg.keyword is not None and arg.keyword.value == "outputs"),
                   None)
    if outputs is None:
        positional = [arg.value for arg in build.call.args if arg.keyword is None]
        outputs = positional[1] if len(positional) > 1 else None
    if isinstance(outputs, cst.Name) and outputs.value in build.layer_outputs:
        build.output_layer = build.layer_outputs[outputs.value]
        return
    build.reason = "the model's outputs are not one layer call of this file"
