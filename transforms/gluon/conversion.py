"""MXNet Gluon training loops in automatic mixed precision (`mxnet.contrib.amp`, MXNet 1.6-1.9).

    from mxnet.contrib import amp                  after the imports, with
    amp.init()                                     before any network is built or hybridized
    trainer = gluon.Trainer(..., update_on_kvstore=False)
    amp.init_trainer(trainer)                      dynamic loss scaling for each trainer
    with amp.scale_loss(loss, trainer) as scaled_loss:
        scaled_loss.backward()                     inside the record block (training_step.py)
    amp.unscale(trainer)                           before the gradients are clipped or read

A graph hybridized before `amp.init()` stays float32 without a word, so the call goes right
after the module's imports, before any code. With `--dtype bfloat16` only
`amp.init(target_dtype="bfloat16")` is written: bfloat16 needs no loss scaling.

Refused with the reason: MXNet 2.0 numpy-interface code (its AMP is `mxnet.amp`), the symbolic Module API (`amp.init_trainer` takes only a Gluon Trainer),
Horovod's DistributedTrainer, a trainer or backward pass ampify cannot pair, MXNet imported
only inside functions. A network cast by hand (`net.cast("float16")`) or `mxnet.contrib.amp`
already in use is "already mixed precision". The rewrite never imports MXNet.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.base import Transform, TransformResult, UnitContext, Verdict
from ampify.transforms.gluon.survey import GluonSurvey, TrainerBuild, survey_gluon
from ampify.transforms.gluon.training_step import StepPlan, plan_steps
from ampify.transforms.kit.arguments import with_keyword
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.module_names import after_imports, fresh_name, names_in, top_level_imports
from ampify.transforms.kit.positions import Positions
from ampify.transforms.kit.source_facts import SourceFacts

AMP_INIT = "AMP601"
TRAINER_INIT = "AMP602"
LOSS_SCALED = "AMP603"
UNSCALED = "AMP604"
NOT_SCALABLE = "AMP610"
NO_MODULE_MXNET = "AMP611"
MODULE_API = "AMP612"
HOROVOD = "AMP613"
KVSTORE_UPDATE = "AMP614"
MXNET2 = "AMP615"

_NOT_GLUON = "no MXNet Gluon training step"
#: Trainer(params, optimizer, optimizer_params, kvstore, compression_params, update_on_kvstore)
_UPDATE_ON_KVSTORE_POSITION = 5
_KVSTORE_POSITION = 3


class GluonMixedPrecision(Transform):
    name = "gluon-amp"
    description = "MXNet Gluon training loops: amp.init, amp.init_trainer, amp.scale_loss, amp.unscale"
    internal_error_code = "AMP600"
    screened_out_reason = _NOT_GLUON

    def may_apply(self, source: bytes, options: Options) -> bool:
        return b"mxnet" in source

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        return facts.imports("mxnet") and bool({"backward", "Trainer", "DistributedTrainer", "Module", "fit"}
                                                & (facts.call_names | facts.identifiers))

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return imports.uses("mxnet")

    def apply(self, module: cst.Module, imports: ImportMap, options: Options,
              context: UnitContext = UnitContext()) -> TransformResult:
        survey = survey_gluon(module, imports)
        positions = Positions(module)
        if survey.amp_use is not None:
            return TransformResult(module, Verdict.ALREADY_MIXED_PRECISION, reason=f"uses {survey.amp_use[0]}")
        if survey.hand_cast is not None:
            return TransformResult(module, Verdict.ALREADY_MIXED_PRECISION, reason=(
                f"casts the network by hand ({module.code_for_node(survey.hand_cast)} at line "
                f"{_place(positions, survey.hand_cast)[0]}): a reduced precision path of its own"))
        if survey.mxnet2 is not None and survey.is_training():
            return _refuse(module, positions, survey.mxnet2[1], MXNET2, f"MXNet 2.0's numpy interface "
                           f"({survey.mxnet2[0]}): its AMP is `mxnet.amp`, with other calls than the MXNet 1.x "
                           "mxnet.contrib.amp this target writes; not converted", "MXNet 2.0 code")
        if survey.module_api is not None:
            return _refuse(module, positions, survey.module_api, MODULE_API,
                           "the symbolic Module API: amp.init_trainer takes only a Gluon Trainer, so its loss cannot be "
                           "scaled; port the training loop to gluon.Trainer (or use amp.convert_model for inference); "
                           "not converted", "symbolic Module API")
        if not survey.is_training():
            return TransformResult(module, Verdict.NOT_APPLICABLE, reason=_NOT_GLUON)
        found = _amp_spelling(module, imports)
        if found is None:
            node = survey.backwards[0].call if survey.backwards else survey.trainers[0].call
            return _refuse(module, positions, node, NO_MODULE_MXNET,
                           "MXNet is not imported at module level: amp.init() must run before the network is built, "
                           "at the top of the module; not converted", "MXNet imported only in functions")
        binding_index, import_line, amp = found
        bfloat16 = options.dtype == "bfloat16"
        findings: List[Finding] = []
        plan = StepPlan()
        trainer_edits: Dict[int, TrainerBuild] = {}
        if not bfloat16:
            refusal = self._plan_scaling(module, imports, survey, positions, findings, trainer_edits, found[2])
            if isinstance(refusal, TransformResult):
                return refusal
            plan = refusal
        init = f'{amp}.init(target_dtype="bfloat16")' if bfloat16 else f"{amp}.init()"
        insert_at = after_imports(module, binding_index)
        findings.append(Finding(AMP_INIT, f"{init} after the imports, before any network is built or hybridized (a graph "
                                "cached before it stays float32)" + (" (bfloat16 needs no loss scaling: the trainers and "
                                                                     "backward passes stay as they are)" if bfloat16 else ""),
                                *_line_after(positions, module, insert_at)))
        taken = names_in(module)
        scaled_name = fresh_name(taken, "scaled_loss")
        writer = _Writer(module, plan, trainer_edits, amp, scaled_name)
        top = [cst.parse_statement(import_line)] + [cst.parse_statement(init + "\n")]
        if insert_at < len(module.body):
            writer.before.setdefault(id(module.body[insert_at]), []).extend(top)
        else:
            writer.at_end = top
        for scaled in plan.scaled:
            where = "moved into the autograd.record() block before it" if scaled.move_into is not None else (
                "under an autograd.record() block of its own" if scaled.own_record else "inside the record block")
            assumption = (f"; `{scaled.trainer}` is taken to be the one gluon.Trainer this file builds "
                          f"({survey.trainers[0].name}), on which amp.init_trainer is called" if scaled.assumed else "")
            findings.append(Finding(LOSS_SCALED, f"backward pass of `{module.code_for_node(scaled.loss)}` scaled with "
                                    f"{amp}.scale_loss(..., {scaled.trainer}), {where} (the scaling must be recorded)"
                                    + assumption, *_place(positions, scaled.backward.call)))
        for statement, trainers in plan.unscale_before.values():
            findings.append(Finding(UNSCALED, f"{', '.join(f'{amp}.unscale({t})' for t in trainers)} before the gradients "
                                    "are read (clipping needs the true gradients)", *_place(positions, statement)))
        new_module = module.visit(writer)
        findings.sort(key=lambda f: (f.line, f.column, f.code))
        return TransformResult(new_module, Verdict.CONVERTED, findings)

    def _plan_scaling(self, module, imports, survey: GluonSurvey, positions, findings, trainer_edits, amp: str):
        """The float16 loss scaling: a StepPlan, or the refusal (a TransformResult)."""
        if survey.horovod_trainer is not None:
            return _refuse(module, positions, survey.horovod_trainer, HOROVOD,
                           "Horovod's DistributedTrainer: ampify does not know how its gradient averaging combines with "
                           "amp's loss scale; add amp.init_trainer and amp.scale_loss by hand; not converted",
                           "Horovod DistributedTrainer")
        unnamed = next((build for build in survey.trainers if build.name is None), None)
        if unnamed is not None:
            return _refuse(module, positions, unnamed.call, NOT_SCALABLE,
                           "a gluon.Trainer not assigned to one name: amp.init_trainer needs it; not converted",
                           "Trainer without a name")
        if not survey.backwards:
            return _refuse(module, positions, survey.trainers[0].call, NOT_SCALABLE,
                           "a gluon.Trainer is built here but no backward pass is in this file: convert the file that "
                           "holds the training step; not converted", "no backward pass in this file")
        for build in survey.trainers:
            kvstore = _argument(build.call, "kvstore", _KVSTORE_POSITION)
            if isinstance(kvstore, cst.SimpleString) and "async" in str(kvstore.evaluated_value):
                return _refuse(module, positions, build.call, NOT_SCALABLE,
                               "an async kvstore: it needs update_on_kvstore=True, and amp's overflow check needs False; "
                               "not converted", "async kvstore")
        plan = plan_steps(survey, {build.name for build in survey.trainers}, module.code_for_node,
                          _autograd_spelling(imports, "backward"), _autograd_spelling(imports, "record"))
        if plan.obstacle is not None:
            node, reason = plan.obstacle
            return _refuse(module, positions, node, NOT_SCALABLE, f"{reason}: its loss cannot be scaled; not converted",
                           "backward pass that cannot be scaled")
        for build in survey.trainers:
            trainer_edits[id(build.call)] = build
            update = _argument(build.call, "update_on_kvstore", _UPDATE_ON_KVSTORE_POSITION)
            what = ""
            if update is None:
                what = "update_on_kvstore=False (amp skips a step whose gradients overflow, which needs the update here) "
            elif not (isinstance(update, cst.Name) and update.value == "False"):
                findings.append(Finding(KVSTORE_UPDATE, f"update_on_kvstore={module.code_for_node(update)} kept as "
                                        "written: amp's dynamic loss scaling needs False (a step whose gradients overflow "
                                        "is applied on the kvstore before amp can skip it)", *_place(positions, build.call),
                                        Severity.WARNING))
            findings.append(Finding(TRAINER_INIT, f"{what}and {amp}.init_trainer({build.name}) for dynamic loss scaling"
                                    if what else f"{amp}.init_trainer({build.name}) for dynamic loss scaling",
                                    *_place(positions, build.call)))
        return plan


def _refuse(module, positions, node, code, message, reason) -> TransformResult:
    return TransformResult(module, Verdict.UNCONVERTED, [Finding(code, message, *_place(positions, node), Severity.WARNING)],
                           reason)


def _place(positions: Positions, node: cst.CSTNode):
    position = positions.get(node)
    return (position.start.line, position.start.column) if position else (0, 0)


def _line_after(positions: Positions, module: cst.Module, index: int):
    if index == 0 or index > len(module.body):
        return 1, 0
    position = positions.get(module.body[index - 1])
    return (position.end.line, 0) if position else (0, 0)


def _argument(call: cst.Call, keyword: str, position: int) -> Optional[cst.BaseExpression]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    return positional[position].value if len(positional) > position else None


def _autograd_spelling(imports: ImportMap, member: str) -> Optional[str]:
    """How this module spells `mxnet.autograd.<member>`: `autograd.backward`, `ag.record`..."""
    candidates = []
    for local, qualified in imports.aliases.items():
        if qualified == f"mxnet.autograd.{member}":
            candidates.append((0, local))
        elif qualified == "mxnet.autograd":
            candidates.append((1, f"{local}.{member}"))
        elif qualified == "mxnet":
            candidates.append((2, f"{local}.autograd.{member}"))
    return sorted(candidates)[0][1] if candidates else None


def _amp_spelling(module: cst.Module, imports: ImportMap) -> Optional[Tuple[int, str, str]]:
    """(body index of the module-level MXNet import, the import line to add, the name amp gets),
    or None when no module-level statement imports MXNet."""
    binding = next((index for index, statement_imports in top_level_imports(module)
                    if any(q == "mxnet" or q.startswith("mxnet.") for q in statement_imports.aliases.values())), None)
    if binding is None:
        return None
    taken = names_in(module) | set(imports.aliases)
    name = "amp" if "amp" not in taken else fresh_name(taken, "mxnet_amp")
    line = "from mxnet.contrib import amp\n" if name == "amp" else f"from mxnet.contrib import amp as {name}\n"
    return binding, line, name


class _Writer(cst.CSTTransformer):
    """Writes the plan in one pass; edits are keyed by the identity of the original nodes."""

    def __init__(self, module: cst.Module, plan: StepPlan, trainers: Dict[int, TrainerBuild], amp: str,
                 scaled_name: str) -> None:
        super().__init__()
        self.module = module
        self.trainers = trainers
        self.before: Dict[int, List[cst.BaseStatement]] = {}
        self.after: Dict[int, List[cst.BaseStatement]] = {}
        self.replace: Dict[int, List[cst.BaseStatement]] = {}
        self.append: Dict[int, List[cst.BaseStatement]] = {}
        self.at_end: List[cst.BaseStatement] = []
        for build in trainers.values():
            self.after.setdefault(id(build.statement), []).append(cst.parse_statement(f"{amp}.init_trainer({build.name})\n"))
        for statement, names in plan.unscale_before.values():
            self.before.setdefault(id(statement), []).extend(
                cst.parse_statement(f"{amp}.unscale({name})\n") for name in names)
        for scaled in plan.scaled:
            block = self._scaling(scaled, amp, scaled_name)
            if scaled.move_into is not None:
                self.replace[id(scaled.unit)] = []
                self.append.setdefault(id(scaled.move_into), []).append(block)
            else:
                self.replace[id(scaled.unit)] = [block]

    def _scaling(self, scaled, amp: str, name: str) -> cst.BaseStatement:
        code = self.module.code_for_node
        call = scaled.backward.call
        if scaled.functional is not None:
            rest = "".join(", " + code(arg).rstrip(", ") for arg in call.args[1:]) if scaled.backward.functional else ""
            inner = f"{scaled.functional}({name}{rest})"
        else:
            args = ", ".join(code(arg).rstrip(", ") for arg in call.args)
            inner = f"{name}.backward({args})"
        head = f"with {scaled.own_record}(), " if scaled.own_record else "with "
        text = f"{head}{amp}.scale_loss({code(scaled.loss)}, {scaled.trainer}) as {name}:\n    {inner}\n"
        statement = cst.parse_statement(text)
        comments = getattr(scaled.unit, "leading_lines", ())
        return statement.with_changes(leading_lines=comments) if comments else statement

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        build = self.trainers.get(id(original_node))
        if build is None or _argument(original_node, "update_on_kvstore", _UPDATE_ON_KVSTORE_POSITION) is not None:
            return updated_node
        return with_keyword(updated_node, "update_on_kvstore", cst.Name("False"))

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        added = self.append.get(id(original_node))
        if not added:
            return updated_node
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[*body.body, *added]))

    def _statements(self, original, updated) -> List[cst.BaseStatement]:
        result: List[cst.BaseStatement] = []
        for old, new in zip(original, updated):
            key = id(old)
            result.extend(self.before.get(key, ()))
            result.extend(self.replace.get(key, [new]))
            result.extend(self.after.get(key, ()))
        return result

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self._statements(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._statements(original_node.body, updated_node.body) + self.at_end)

