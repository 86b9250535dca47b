"""Keras compile/fit scripts: a mixed precision policy set before the model is built, the model's
output in float32.

    keras.mixed_precision.set_global_policy("mixed_float16")   after the module's imports
    layers.Dense(10, activation="softmax", dtype="float32")    the output layer of each model

`compile` wraps the optimizer in a LossScaleOptimizer by itself under mixed_float16 (Keras 2
and 3 alike), so `fit` needs nothing more. A policy set after a model is built silently does
nothing, so the call goes right after the imports at the top of the module, before any code.

Refused with the reason: a custom GradientTape loop (its loss scaling differs between Keras 2 and
3: not written yet), Keras imported only inside functions, TF1 graph code (the TF1 target's).
"""

from __future__ import annotations

import re
from typing import List, Optional

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.base import Transform, TransformResult, UnitContext, Verdict
from ampify.transforms.kit.arguments import with_keyword
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.module_names import after_imports, names_in, top_level_imports
from ampify.transforms.kit.positions import Positions
from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.keras.custom_loops import (
    EITHER,
    KERAS_2,
    KERAS_3,
    LoopPlan,
    LoopRewriter,
    plan_custom_loops,
    raw_variable_training,
    wrap_tape_check,
)
from ampify.transforms.keras.hazards import float16_losses, keras_hazards
from ampify.transforms.keras.experimental_api import ExperimentalRewriter, plan_experimental_migration
from ampify.transforms.keras.survey import KERAS_ROOTS, keras_root_of, survey_keras

POLICY_SET = "AMP501"
OUTPUT_FLOAT32 = "AMP502"
SCALED_LOOP = "AMP503"
EXPERIMENTAL_MIGRATED = "AMP504"
EXPERIMENTAL_NOT_MIGRATED = "AMP514"
CUSTOM_LOOP = "AMP510"
NO_MODULE_KERAS = "AMP511"
OUTPUT_NOT_FOUND = "AMP512"
LEGACY_KERAS = "AMP513"

#: names only multi-backend Keras (before 2.4) has: no mixed precision API there
_LEGACY_KERAS = re.compile(rb"\b(?:Convolution[123]D|np_utils|visualize_util|nb_epoch|MaxoutDense|TimeDistributedDense|"
                           rb"AtrousConvolution[12]D|keras\.layers\.merge|from keras\.layers import[^\n]*\bMerge\b)")

_NOT_KERAS = "no Keras model trained with compile/fit"


class KerasMixedPrecision(Transform):
    name = "keras-mixed-precision"
    description = "Keras compile/fit scripts: set_global_policy before the model is built, float32 outputs"
    internal_error_code = "AMP500"
    screened_out_reason = _NOT_KERAS

    def may_apply(self, source: bytes, options: Options) -> bool:
        return b"keras" in source and (b"compile" in source or b"GradientTape" in source)

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        keras = facts.imports("keras") or facts.imports("tf_keras") or "keras" in facts.identifiers
        return keras and ("compile" in facts.call_names or "GradientTape" in facts.identifiers)

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return any(keras_root_of(q) for q in imports.aliases.values()) or imports.uses("tensorflow")

    def apply(self, module: cst.Module, imports: ImportMap, options: Options,
              context: UnitContext = UnitContext()) -> TransformResult:
        survey = survey_keras(module, imports)
        custom_loop = survey.gradient_tape is not None and survey.apply_gradients
        if not custom_loop and (not survey.compile_calls or not (survey.models or survey.subclassed_models)):
            return TransformResult(module, Verdict.NOT_APPLICABLE, reason=_NOT_KERAS)
        if survey.tf1_marker is not None:
            return TransformResult(module, Verdict.NOT_APPLICABLE, reason="TF1 graph code: the TF1 target's")
        if survey.mixed_precision is not None:
            experimental = plan_experimental_migration(module, imports)
            if experimental is not None:
                return _migrated_experimental_api(module, experimental)
            return TransformResult(module, Verdict.ALREADY_MIXED_PRECISION,
                                   reason=f"uses {survey.mixed_precision[0]}")
        positions = Positions(module)
        loops: Optional[LoopPlan] = None
        raw = raw_variable_training(module) if custom_loop else None
        if raw is not None:
            return self._refuse(module, positions, raw[0], CUSTOM_LOOP,
                                f"a custom tf.GradientTape loop that differentiates raw variables ({raw[1]}), not a Keras "
                                "model's: the mixed precision policy casts what Keras layers compute, never raw tf ops "
                                "on tf.Variables, so nothing would run in reduced precision; build the model from Keras "
                                "layers, or cast by hand; not converted", "custom GradientTape loop over raw variables")
        if custom_loop and options.dtype != "bfloat16":
            pins = context.project.dependency_pins() if context.project is not None else {}
            loops = plan_custom_loops(module, imports, survey.roots, pins)
            problem = loops.obstacle[1] if loops.obstacle else wrap_tape_check(loops)
            if problem is not None:
                node = loops.obstacle[0] if loops.obstacle else survey.gradient_tape
                return self._refuse(module, positions, node, CUSTOM_LOOP,
                                    f"a custom tf.GradientTape training loop that ampify cannot scale: {problem}; it needs "
                                    "a LossScaleOptimizer and a scaled loss (Keras 3: optimizer.scale_loss; Keras 2: "
                                    "get_scaled_loss / get_unscaled_gradients); not converted", "custom GradientTape loop")
        source = context.source or module.bytes
        legacy = _LEGACY_KERAS.search(source)
        if legacy is not None:
            return self._refuse(module, positions, _first_training_node(survey), LEGACY_KERAS,
                                f"multi-backend Keras (it uses {legacy.group(0).decode()}, gone since Keras 2.4): it has "
                                "no mixed precision API, which Keras 2.4 / tf.keras in TensorFlow 2.4 add; port the script "
                                "to tf.keras or Keras 3 first; not converted", "multi-backend Keras")
        found = _policy_spelling(module, imports)
        if found is None:
            return self._refuse(module, positions, _first_training_node(survey), NO_MODULE_KERAS,
                                "Keras is not imported at module level: the policy must be set before the model is "
                                "built, at the top of the module; not converted", "Keras imported only in functions")
        spelling, binding_index, import_line = found
        insert_at = after_imports(module, binding_index)
        policy_name = "mixed_bfloat16" if options.dtype == "bfloat16" else "mixed_float16"
        statement = cst.parse_statement(f'{spelling}.set_global_policy("{policy_name}")\n')
        findings = [Finding(POLICY_SET, f'{spelling}.set_global_policy("{policy_name}") after the '
                            "imports, before any model is built (a policy set later does nothing; the API needs Keras >= 2.4 "
                            "or TensorFlow >= 2.4)" + ("; compile wraps the optimizer in a LossScaleOptimizer by itself"
                                                        if survey.compile_calls and policy_name == "mixed_float16" else "")
                            + (" (mixed_bfloat16 needs no loss scale)" if policy_name == "mixed_bfloat16" else ""),
                            *_line_after(positions, module, insert_at))]
        outputs = _output_layers(survey)
        edits = {}
        for build, layer in outputs:
            if layer is None:
                findings.append(Finding(OUTPUT_NOT_FOUND, f"{build.reason or 'the output layer is not found'}; the "
                                        "model's output stays in the policy's float16: cast it to float32 (an Activation('linear', "
                                        "dtype='float32') after it) for a stable loss", *_place(positions, build.call),
                                        Severity.WARNING))
                continue
            if any(arg.keyword is not None and arg.keyword.value == "dtype" for arg in layer.args):
                continue  # the author chose its dtype
            edits[id(layer)] = layer
            findings.append(Finding(OUTPUT_FLOAT32, 'dtype="float32" on the model\'s output layer (outputs and loss '
                                    "in float32, as the Keras mixed precision guide recommends)",
                                    *_place(positions, layer)))
        for klass in survey.subclassed_models:
            findings.append(Finding(OUTPUT_NOT_FOUND, f"subclassed model {klass.name.value}: cast the output of call() "
                                    "to float32 (tf.cast or an Activation('linear', dtype='float32') layer)",
                                    *_place(positions, klass), Severity.WARNING))
        if loops is not None:
            for step in loops.steps:
                findings.append(Finding(SCALED_LOOP, f"custom loop: {step.optimizer} wrapped in a LossScaleOptimizer, "
                                        f"`{step.loss}` scaled inside the tape and the gradients unscaled before "
                                        f"apply_gradients ({_API_WORDS[loops.api]}: {loops.api_reason})",
                                        *_place(positions, step.gradient_call)))
        elif custom_loop:
            findings.append(Finding(SCALED_LOOP, "custom loop: mixed_bfloat16 needs no loss scaling, the tape and the "
                                    "optimizer stay as they are", *_place(positions, survey.gradient_tape)))
        for node, code, message in keras_hazards(module, imports, policy_name):
            findings.append(Finding(code, message, *_place(positions, node), Severity.WARNING))
        if loops is not None:
            for node, code, message in float16_losses(loops, _reduced_output_models(survey, outputs)):
                findings.append(Finding(code, message, *_place(positions, node), Severity.WARNING))
        taken = names_in(module)
        new_module = module.visit(_Writer(loops or LoopPlan(), spelling, taken, edits))
        body = list(new_module.body)
        body.insert(insert_at, statement)
        if import_line is not None:
            body.insert(insert_at, cst.parse_statement(import_line))
        new_module = new_module.with_changes(body=body)
        findings.sort(key=lambda f: (f.line, f.column, f.code))
        return TransformResult(new_module, Verdict.CONVERTED, findings)

    @staticmethod
    def _refuse(module, positions, node, code, message, reason) -> TransformResult:
        finding = Finding(code, message, *_place(positions, node), Severity.WARNING)
        return TransformResult(module, Verdict.UNCONVERTED, [finding], reason)


def _place(positions: Positions, node: cst.CSTNode):
    position = positions.get(node)
    return (position.start.line, position.start.column) if position else (0, 0)


def _policy_spelling(module: cst.Module, imports: ImportMap):
    """(the callee's module: `keras.mixed_precision`, `tf.keras.mixed_precision`, `mixed_precision`...,
    the body index of the import it needs, an import statement to add or None), or None when only
    functions import Keras."""
    candidates = []
    for index, statement_imports in top_level_imports(module):
        for local, qualified in statement_imports.aliases.items():
            if qualified in KERAS_ROOTS:
                candidates.append((0, index, f"{local}.mixed_precision", None))
            elif qualified == "tensorflow":
                candidates.append((1, index, f"{local}.keras.mixed_precision", None))
            elif keras_root_of(qualified) and "mixed_precision" not in imports.aliases:
                # `from tensorflow.keras.layers import Dense` only: import the API beside it
                root = keras_root_of(qualified)
                candidates.append((2, index, "mixed_precision", f"from {root} import mixed_precision\n"))
    if not candidates:
        return None
    _, index, spelling, import_line = sorted(candidates)[0]
    return spelling, index, import_line


def _line_after(positions: Positions, module: cst.Module, index: int):
    if index == 0 or index > len(module.body):
        return 1, 0
    position = positions.get(module.body[index - 1])
    return (position.end.line, 0) if position else (0, 0)


def _output_layers(survey) -> List:
    result = []
    receivers = list(survey.last_added)
    for build in survey.models:
        layer: Optional[cst.Call] = build.output_layer
        if layer is None and build.kind == "Sequential" and build.sequential_name is None and len(receivers) == 1 \
                and not [b for b in survey.models if b is not build and b.kind == "Sequential"] \
                and [added for receiver, added, _ in survey.adds if receiver == receivers[0]][-1] is not None:
            # one Sequential not bound to a plain name (`self.model = Sequential()`), one receiver of
            # add() calls, the last of them a layer built there
            layer = survey.last_added[receivers[0]]
            build.reason = ""
        result.append((build, layer))
    return result


def _reduced_output_models(survey, outputs) -> List[str]:
    """Names bound to models whose output stays in reduced precision: instances of subclassed
    models, and built models whose output layer was not found."""
    classes = {klass.name.value for klass in survey.subclassed_models}
    names = []
    for name, value in survey.assigned_calls:
        if isinstance(value.func, cst.Name) and value.func.value in classes:
            names.append(name)
    unfound = {id(build.call) for build, layer in outputs if layer is None}
    names += [name for name, value in survey.assigned_calls if id(value) in unfound]
    return names


_API_WORDS = {
    KERAS_2: "Keras 2 API",
    KERAS_3: "Keras 3 API",
    EITHER: "written for Keras 2 and 3 alike, chosen by the optimizer's own methods",
}


def _migrated_experimental_api(module: cst.Module, plan) -> TransformResult:
    """TF 2.1-2.3's mixed_precision.experimental rewritten to the current API (all or nothing)."""
    positions = Positions(module)
    if plan.obstacle is not None:
        node, reason = plan.obstacle
        finding = Finding(EXPERIMENTAL_NOT_MIGRATED, f"{reason}; the experimental API (gone from current TensorFlow "
                          "and Keras 3) is left as it is", *_place(positions, node), Severity.WARNING)
        return TransformResult(module, Verdict.UNCONVERTED, [finding], "experimental mixed precision API")
    findings = [Finding(EXPERIMENTAL_MIGRATED, f"experimental mixed precision API migrated: {what}",
                        *_place(positions, node)) for node, what in plan.done]
    findings.sort(key=lambda f: (f.line, f.column, f.code))
    return TransformResult(module.visit(ExperimentalRewriter(plan)), Verdict.CONVERTED, findings)


def _first_training_node(survey) -> cst.CSTNode:
    return survey.compile_calls[0] if survey.compile_calls else survey.gradient_tape


class _Writer(LoopRewriter):
    """The loop rewrites and `dtype="float32"` on the output layers, in one pass (edits are keyed
    by the identity of the nodes of the module as it was)."""

    def __init__(self, loops, spelling, taken, layers) -> None:
        super().__init__(loops, spelling, taken)
        self.layers = layers

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if id(original_node) not in self.layers:
            return super().leave_Call(original_node, updated_node)
        # the call's own quote style: `activation='softmax'` gets `dtype='float32'`
        quote = next((arg.value.quote for arg in updated_node.args if isinstance(arg.value, cst.SimpleString)
                      and arg.value.quote in ("'", '"')), '"')
        return with_keyword(updated_node, "dtype", cst.SimpleString(f"{quote}float32{quote}"))
