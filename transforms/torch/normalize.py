"""Put the statements of a training step into the shape the conversion works on, without changing
what they do:

- `loss_fn(model(x), y).backward()` -> `loss = loss_fn(model(x), y)` then `loss.backward()`: the
  loss needs a name to be scaled (`scaler.scale(loss)`, `amp.scale_loss(loss, ...)`) and its
  forward pass a statement of its own to go under autocast;
- `if args.clip: clip_grad_norm_(params, args.clip)` -> the same `if` with an indented body, so
  that `scaler.unscale_(optimizer)` can go before the clipping inside it;
- `optimizer.zero_grad(); loss = f(x); loss.backward(); optimizer.step()` -> one statement per
  line.

Only statements that hold a training call (backward, step, zero_grad, clipping) are touched. The
result is used only when the step is converted (the file changes anyway); `LineMap` takes the
findings' line numbers back to the lines of the file as it was.
"""

from __future__ import annotations

import ast

from dataclasses import replace
from typing import Callable, List, Optional, Set, Union

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.base import TransformResult, Verdict
from ampify.transforms.torch.bce_functional import fuse_functional_bce, fuse_imported_functional_bce
from ampify.transforms.torch.bce_in_step import fuse_sigmoid_in_step
from ampify.transforms.torch.inplace_matmuls import products_in_their_receivers_dtype
from ampify.transforms.torch.bce_logits import fuse_bce_after_sigmoid, fuse_imported_sigmoid_model, fuse_logged_sigmoid
from ampify.transforms.torch.masked_fill_limits import FillLimits, float16_safe_fills
from ampify.transforms.torch.probability_clamps_float32 import Float32Clamps, float32_clamps
from ampify.transforms.torch.sigmoid_float32 import Float32Sigmoids, float32_sigmoids
from ampify.transforms.torch.autograd_functions import unsafe_autograd_functions
from ampify.transforms.torch.gram_matrix_float32 import Float32Grams, float32_gram_functions
from ampify.transforms.torch.gram_matrix_functions import gram_matrix_line, torch_names
from ampify.transforms.torch.autograd_functions_float32 import Float32Functions, autocast_devices, float32_functions
from ampify.transforms.torch.autocast_regions import LOSS_REDUCTIONS
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.module_names import names_in
from ampify.transforms.kit.pruned_visit import visit_only
from ampify.transforms.kit.line_map import LineMap

#: calls that make a statement part of a training step's structure
_TRAINING_CALLS = {"backward", "step", "zero_grad", "clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "unscale_"}


def _holds_training_call(node: cst.CSTNode) -> bool:
    found = False

    class _Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> Optional[bool]:
            nonlocal found
            func = call.func
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
            if name in _TRAINING_CALLS:
                found = True
                return False
            return True

    walk(node, _Finder())
    return found


class _Normalize(cst.CSTTransformer):
    def __init__(self, taken: Set[str]) -> None:
        super().__init__()
        self.taken = taken
        self.changed = False

    def _fresh(self) -> str:
        for name in ("loss", "loss_value", "step_loss", "ampify_loss"):
            if name not in self.taken:
                self.taken.add(name)
                return name
        index = 2
        while f"loss_{index}" in self.taken:
            index += 1
        self.taken.add(f"loss_{index}")
        return f"loss_{index}"

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.SimpleStatementLine, cst.FlattenSentinel]:
        smalls = list(updated_node.body)
        if len(smalls) > 1 and _holds_training_call(updated_node):
            self.changed = True
            lines = []
            for index, small in enumerate(smalls):
                line = cst.SimpleStatementLine(body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
                if index == 0:
                    line = line.with_changes(leading_lines=updated_node.leading_lines)
                if index == len(smalls) - 1:
                    line = line.with_changes(trailing_whitespace=updated_node.trailing_whitespace)
                lines.extend(self._bound_loss(line))
            return cst.FlattenSentinel(lines)
        lines = self._bound_loss(updated_node)
        return lines[0] if len(lines) == 1 else cst.FlattenSentinel(lines)

    def _bound_loss(self, line: cst.SimpleStatementLine) -> List[cst.SimpleStatementLine]:
        """`f(x).backward(...)` as a statement of its own -> `loss = f(x)` + `loss.backward(...)`."""
        if len(line.body) != 1 or not isinstance(line.body[0], cst.Expr):
            return [line]
        call = line.body[0].value
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"):
            return [line]
        receiver = call.func.value
        if not isinstance(receiver, cst.Call) or _reduces_a_name(receiver):
            return [line]
        self.changed = True
        name = self._fresh()
        bind = line.with_changes(
            body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=receiver.with_changes(lpar=[], rpar=[]))],
            trailing_whitespace=cst.TrailingWhitespace(),
        )
        backward = cst.SimpleStatementLine(
            body=[line.body[0].with_changes(value=call.with_changes(func=call.func.with_changes(value=cst.Name(name))))],
            trailing_whitespace=line.trailing_whitespace,
        )
        return [bind, backward]

    def _expanded(self, suite: cst.BaseSuite) -> cst.BaseSuite:
        if not isinstance(suite, cst.SimpleStatementSuite) or not _holds_training_call(suite):
            return suite
        self.changed = True
        lines: List[cst.BaseStatement] = []
        for index, small in enumerate(suite.body):
            line = cst.SimpleStatementLine(body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
            if index == len(suite.body) - 1:
                line = line.with_changes(trailing_whitespace=suite.trailing_whitespace)
            lines.extend(self._bound_loss(line))
        return cst.IndentedBlock(body=lines)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        return updated_node.with_changes(body=self._expanded(updated_node.body))

    def leave_Else(self, original_node: cst.Else, updated_node: cst.Else) -> cst.Else:
        return updated_node.with_changes(body=self._expanded(updated_node.body))

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        return updated_node.with_changes(body=self._expanded(updated_node.body))

    def leave_While(self, original_node: cst.While, updated_node: cst.While) -> cst.While:
        return updated_node.with_changes(body=self._expanded(updated_node.body))

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        return updated_node.with_changes(body=self._expanded(updated_node.body))


def _reduces_a_name(node: cst.BaseExpression) -> bool:
    """`loss.mean()`, `output.sum()`, `self.loss.float().mean()`: the analysis follows these as
    they are (the loss is the name), so they are not rebound."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in LOSS_REDUCTIONS:
        node = node.func.value
    return isinstance(node, (cst.Name, cst.Attribute))


def normalize_training_statements(module: cst.Module) -> cst.Module:
    """The module with its training statements in the shape above; the same object when nothing
    needed it (the common case: a cheap check, no rebuild). Only the statements reshaped and the
    blocks holding them are rebuilt."""
    targets = _to_reshape(module)
    if not targets:
        return module  # a read-only walk (cheap) instead of a transform (about a parse)
    transformer = _Normalize(names_in(module))
    normalized = visit_only(module, transformer, targets)
    return normalized if transformer.changed else module


def _to_reshape(module: cst.Module) -> List[int]:
    """ids of the statements the transformer would touch: the same tests, read-only."""
    found: List[int] = []

    class _Finder(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> Optional[bool]:
            if len(node.body) > 1 and _holds_training_call(node):
                found.append(id(node))
            elif len(node.body) == 1 and isinstance(node.body[0], cst.Expr) and _backward_of_a_call(node.body[0].value):
                found.append(id(node))
            return False  # a line holds no other statement

        def _suite_owner(self, node: cst.CSTNode) -> None:
            if isinstance(node.body, cst.SimpleStatementSuite) and _holds_training_call(node.body):
                found.append(id(node))

        def visit_If(self, node: cst.If) -> None:
            self._suite_owner(node)

        def visit_Else(self, node: cst.Else) -> None:
            self._suite_owner(node)

        def visit_For(self, node: cst.For) -> None:
            self._suite_owner(node)

        def visit_While(self, node: cst.While) -> None:
            self._suite_owner(node)

        def visit_With(self, node: cst.With) -> None:
            self._suite_owner(node)

        def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> Optional[bool]:
            return False

        def visit_Expr(self, node: cst.Expr) -> Optional[bool]:
            return False  # expressions hold no statements

    walk(module, _Finder())
    return found


def _backward_of_a_call(value: cst.BaseExpression) -> bool:
    return (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "backward"
        and isinstance(value.func.value, cst.Call) and not _reduces_a_name(value.func.value)
    )


def converted_in_shape(
    module: cst.Module, convert: Callable[[cst.Module], TransformResult], imports=None, context=None,
    products_code: str = "",
) -> TransformResult:
    """Run `convert` on the module, and on its reshaped form where a refused step may convert
    that way (see `_converted_in_shape`); findings always name the lines of `module` as it was.
    With `imports`, a BCE loss after a model's Sigmoid is fused (bce_logits.py) when the BCE
    warning stopped the module and the fused module converts."""
    if imports is not None and products_code:
        products = products_in_their_receivers_dtype(module)
        if products is not None:
            # in-place matrix products of the file's own model code (a triplet loss's
            # `dist.addmm_(inputs, inputs.t())`) take matrices of their receiver's dtype; the rest
            # converts as it would (the rewrite adds no line)
            with_products = converted_in_shape(products.module, convert, imports, context, products_code)
            if with_products.verdict is Verdict.CONVERTED:
                with_products.findings = sorted(
                    [*with_products.findings, Finding(products_code, products.describe(), products.rewritten[0][0], 0,
                                                      Severity.INFO)],
                    key=lambda f: (f.line, f.column, f.code))
                return with_products
    result = _converted_in_shape(module, convert)
    if imports is not None and any(f.code in _FILL_REFUSALS for f in result.findings):
        limited = float16_safe_fills(module, imports)
        if limited is not None:
            limited_result = converted_in_shape(limited.module, convert, imports)
            if not any(f.code in _FILL_REFUSALS for f in limited_result.findings) and limited_result.verdict in (
                    Verdict.CONVERTED, Verdict.NOTHING_TO_DO):
                return _with_fill_limits(module, limited, limited_result)
    clamp_code = next((_CLAMP_REFUSALS[f.code] for f in result.findings if f.code in _CLAMP_REFUSALS), None)
    if imports is not None and clamp_code is not None:
        clamps = float32_clamps(module)
        if clamps is not None and clamps.rewritten and not clamps.left:
            fixed = _converted_without(clamps.module, _CLAMP_REFUSALS, convert, imports, context)
            if fixed is not None:
                return _with_float32_copies(module, clamps, clamp_code, fixed)
    if imports is not None and any(f.code in _GRAM_REFUSALS for f in result.findings):
        names = _own_gram_matrix_functions(module)
        grams, why = float32_gram_functions(module, names) if names else (None, None)
        if why is not None:
            result.findings = _with_reason(result.findings, _GRAM_REFUSALS, "rewrite", why)
        fixed = _converted_without(grams.module, _GRAM_REFUSALS, convert, imports, context) if grams else None
        if fixed is not None:
            return _with_float32_grams(module, grams, fixed)
    if imports is not None and any(f.code in _FUNCTION_REFUSALS for f in result.findings):
        names = _own_unsafe_function_names(module)
        functions, why = float32_functions(module, names, autocast_devices(module.code)) if names else (None, None)
        if why is not None:
            result.findings = _with_reason(result.findings, _FUNCTION_REFUSALS, "decorate", why)
        fixed = _converted_without(functions.module, _FUNCTION_REFUSALS, convert, imports, context) if functions else None
        if fixed is not None:
            return _with_float32_functions(module, functions, fixed)
    if imports is not None and any(f.code == "AMP229" for f in result.findings) \
            and not any(f.code in _BCE_REFUSALS for f in result.findings):
        # the training code takes the log of its model's probability itself: the sigmoid is taken
        # in float32 from the model's logits where a log reads it (bce_logits.fuse_logged_sigmoid)
        project = context.project if context is not None else None
        fused = fuse_logged_sigmoid(module, imports, project)
        if fused is not None:
            fused_result = _converted_in_shape(fused[0], convert)
            if fused_result.verdict is Verdict.CONVERTED and not any(f.code == "AMP229" for f in fused_result.findings):
                return _with_fusion(module, fused[0], fused[1], fused_result)
    log_code = next((_LOG_REFUSALS[f.code] for f in result.findings if f.code in _LOG_REFUSALS), None)
    if imports is not None and log_code is not None and not any(f.code in _BCE_REFUSALS for f in result.findings):
        # the log of a sigmoid written out (mimicry's `p = torch.sigmoid(logits)` then
        # `torch.log(p + 1e-8)`): the sigmoid takes a float32 copy of the logits (sigmoid_float32.py)
        sigmoids = float32_sigmoids(module)
        if sigmoids is not None:
            fixed = _converted_without(sigmoids.module, _LOG_REFUSALS, convert, imports, context)
            if fixed is not None:
                return _with_float32_copies(module, sigmoids, log_code, fixed)
    if imports is not None and any(f.code in _BCE_REFUSALS for f in result.findings):
        # only files the BCE hazard stopped pay for the attempt
        project = context.project if context is not None else None
        fused = (fuse_bce_after_sigmoid(module, imports, project) or fuse_functional_bce(module, imports)
                 or fuse_sigmoid_in_step(module, imports))
        if fused is not None:
            fused_result = _converted_in_shape(fused[0], convert)
            if fused_result.verdict is Verdict.CONVERTED:
                return _with_fusion(module, fused[0], fused[1], fused_result)
            still = next((f.message for f in fused_result.findings if f.code in _STEP_REFUSALS), None)
            if still is not None:
                # the BCE is not the only obstacle: say what else is, or the user fixes the BCE in vain
                shifted = fused[0].code.count("\n") != module.code.count("\n")
                lines = " (line numbers of the fused file)" if shifted else ""
                result.findings = _with_note_on_bce(
                    result.findings, f"ampify can fuse this BCE itself, but the training step would still be refused{lines}: {still}")
        elif context is not None and context.project is not None:
            # the model is a class of another module of the project (models.py): its sigmoid is
            # dropped there, in the same change set
            imported = (fuse_imported_sigmoid_model(module, imports, context.project, context.display)
                        or fuse_imported_functional_bce(module, imports, context.project, context.display))
            if isinstance(imported, str):
                result.findings = _with_note_on_bce(result.findings, imported)
            elif imported is not None:
                fused_module, fusion, companion = imported
                fused_result = _converted_in_shape(fused_module, convert)
                if fused_result.verdict is Verdict.CONVERTED:
                    converted = _with_fusion(module, fused_module, fusion, fused_result)
                    converted.companions = [*converted.companions, companion]
                    return converted
    return result


def _converted_without(fixed: cst.Module, codes, convert, imports, context) -> Optional[TransformResult]:
    """The module converted again after a local fix of its own (float32 clamps, Gram matrices or
    Functions): kept when it converts with none of the refusals `codes` left."""
    fixed_result = converted_in_shape(fixed, convert, imports, context)
    if fixed_result.verdict is Verdict.CONVERTED and not any(f.code in codes for f in fixed_result.findings):
        return fixed_result
    return None


def _with_reason(findings, codes, verb: str, why: str):
    """The refusals `codes` also say why ampify did not fix the hazard itself."""
    left = "; the training steps of this file were left unconverted"
    return [replace(f, message=f.message.replace(left, f"; ampify did not {verb} it: {why}{left}", 1))
            if f.code in codes else f for f in findings]


def _with_note_on_bce(findings, note: str):
    """The BCE warnings also say where the sigmoid is and how to have it fused."""
    return [replace(f, message=f"{f.message}; {note}") if f.code in _BCE_REFUSALS else f for f in findings]


#: the masked_fill overflow warnings of the two backends
_FILL_REFUSALS = ("AMP213", "AMP313")

#: the probability clamp warnings of the two backends -> the code reporting the clamps rewritten
_CLAMP_REFUSALS = {"AMP244": "AMP246", "AMP337": "AMP339"}

#: the log-of-a-sigmoid warnings of the two backends -> the code reporting the sigmoids rewritten
_LOG_REFUSALS = {"AMP229": "AMP256", "AMP331": "AMP346"}

#: the native warning on Gram matrices (apex's amp.disable_casts() raises before amp.initialize)
_GRAM_REFUSALS = ("AMP238",)

#: the native warning on custom autograd Functions that break under autocast (apex O1 ignores the
#: decorators that fix them)
_FUNCTION_REFUSALS = ("AMP241",)

#: the BCE warnings of the two backends
_BCE_REFUSALS = ("AMP210", "AMP310")


#: findings that say a training step was refused, with the reason
_STEP_REFUSALS = ("AMP215", "AMP317")

#: refusals a reshape answers (the loss bound to a name, a one-line compound statement expanded)
_SHAPE_REFUSALS = ("the loss is computed inside the backward() call itself", "inside a one-line compound statement")

#: findings that say a training step (or a backward) was refused: a reshape may change those
_REFUSALS = ("AMP215", "AMP220", "AMP317", "AMP316")


def _refusals(result: TransformResult) -> int:
    return sum(1 for f in result.findings if f.code in _REFUSALS)


def _converted_in_shape(module: cst.Module, convert: Callable[[cst.Module], TransformResult]) -> TransformResult:
    """The module as it is first; reshaped only when a step was refused and a statement could be
    reshaped, and then kept only when the reshaped module converts with fewer refusals."""
    result = convert(module)
    if not _refusals(result):
        return result
    normalized = normalize_training_statements(module)
    if normalized is module:
        return result
    shaped = convert(normalized)
    if shaped.verdict is not Verdict.CONVERTED or (
        result.verdict is Verdict.CONVERTED and _refusals(shaped) >= _refusals(result)
    ):
        still = next((f.message for f in shaped.findings if f.code in _STEP_REFUSALS
                      and not any(shape in f.message for shape in _SHAPE_REFUSALS)), None)
        if still is not None and shaped.verdict is not Verdict.CONVERTED:
            # jacobgil/pytorch-pruning: `self.criterion(self.model(input), label).backward()` is bound
            # to a name by the reshape, and the step is refused all the same: say why, or the user
            # binds the loss in vain
            lines = LineMap(module.code, normalized.code)
            note = f"ampify binds it itself, but the step would still be refused: {lines.in_message(still)}"
            result.findings = [replace(f, message=f"{f.message} ({note})")
                               if any(shape in f.message for shape in _SHAPE_REFUSALS) else f for f in result.findings]
        return result
    lines = LineMap(module.code, normalized.code)
    shaped.findings = sorted(
        (replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message)) for f in shaped.findings),
        key=lambda f: (f.line, f.column, f.code),
    )
    return shaped


def _with_fusion(original: cst.Module, fused: cst.Module, fusion, result: TransformResult) -> TransformResult:
    lines = LineMap(original.code, fused.code)
    findings = [replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message)) for f in result.findings]
    wrapped = sorted(set(fusion.wrapped))
    where = f"; torch.sigmoid(...) added where its output is read as a probability (line{'s' if len(wrapped) != 1 else ''} " \
        + ", ".join(map(str, wrapped)) + ")" if wrapped else ""
    logged = sorted(set(fusion.float_wrapped))
    if logged and fusion.code == "AMP248":
        where += (f", from a float32 copy of the logits where a log reads it (line{'s' if len(logged) != 1 else ''} "
                  + ", ".join(map(str, logged)) + "): the probability the fp32 script computed, so 1 - p and its log "
                  "stay finite")
    description = fusion.description or (
        f"BCE after a Sigmoid fused: nn.Sigmoid() at line {fusion.sigmoid_line} dropped from the model, the criterion at "
        f"line {fusion.criterion_line} is nn.BCEWithLogitsLoss (the same loss, computed from logits)")
    findings.append(Finding(
        fusion.code,
        f"{description}{where}",
        fusion.criterion_line, 0, Severity.INFO,
    ))
    result.findings = sorted(findings, key=lambda f: (f.line, f.column, f.code))
    return result


def _with_float32_copies(original: cst.Module, rewrite: Union[Float32Clamps, Float32Sigmoids], code: str,
                         result: TransformResult) -> TransformResult:
    """The module converted after its own probability clamps, or logged sigmoids, took float32 copies."""
    lines = LineMap(original.code, rewrite.module.code)
    findings = [replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message)) for f in result.findings]
    findings.append(Finding(code, rewrite.describe(), rewrite.rewritten[0][0], 0, Severity.INFO))
    result.findings = sorted(findings, key=lambda f: (f.line, f.column, f.code))
    return result


def _own_gram_matrix_functions(module: cst.Module) -> List[str]:
    """The module-level functions (`gram_matrix`) and methods of module-level classes
    (`GramMatrix.forward`) of the module that compute a Gram matrix (gram_matrix_functions.py)."""
    try:
        tree = ast.parse(module.code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found = []
    names = torch_names(tree)
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and gram_matrix_line(statement, names):
            found.append(statement.name)
        elif isinstance(statement, ast.ClassDef):
            found += [f"{statement.name}.{method.name}" for method in statement.body
                      if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and gram_matrix_line(method, names)]
    return found


def _with_float32_grams(original: cst.Module, grams: Float32Grams, result: TransformResult) -> TransformResult:
    """The module converted after its own Gram matrix functions were made to compute in float32."""
    lines = LineMap(original.code, grams.module.code)
    findings = [replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message)) for f in result.findings]
    findings.append(Finding("AMP245", grams.describe(), lines.original_line(grams.rewritten[0][1]), 0, Severity.INFO))
    result.findings = sorted(findings, key=lambda f: (f.line, f.column, f.code))
    return result


def _own_unsafe_function_names(module: cst.Module) -> List[str]:
    """The class names of the module's own Functions that break under autocast (autograd_functions.py)."""
    try:
        tree = ast.parse(module.code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return list(dict.fromkeys(name for _, name, _ in unsafe_autograd_functions(tree)))


def _with_float32_functions(original: cst.Module, functions: Float32Functions,
                            result: TransformResult) -> TransformResult:
    """The module converted after its own custom autograd Functions were decorated to run in float32."""
    lines = LineMap(original.code, functions.module.code)
    findings = [replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message)) for f in result.findings]
    name, line = functions.decorated[0]
    findings.append(Finding("AMP247", functions.describe(), lines.original_line(line), 0, Severity.INFO))
    result.findings = sorted(findings, key=lambda f: (f.line, f.column, f.code))
    return result


def _with_fill_limits(original: cst.Module, limited: FillLimits, result: TransformResult) -> TransformResult:
    """The module converted after its masked_fill constants became the scores' dtype minimum; a
    module with no training of its own (attention code a training file imports) is changed by
    that alone."""
    lines = LineMap(original.code, limited.module.code)
    findings = [replace(f, line=lines.original_line(f.line), message=lines.in_message(f.message)) for f in result.findings]
    line, column = limited.rewritten[0][:2]
    findings.append(Finding("AMP232", limited.describe(), line, column, Severity.INFO))
    result.findings = sorted(findings, key=lambda f: (f.line, f.column, f.code))
    if result.verdict is Verdict.NOTHING_TO_DO:
        result.verdict = Verdict.CONVERTED
        result.module = limited.module
        result.reason = ""
    return result
