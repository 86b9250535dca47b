"""NVIDIA's NGC-only switch `TF_ENABLE_AUTO_MIXED_PRECISION=1`, migrated to the upstream API.

Only NVIDIA's container builds of TensorFlow 1.x read `TF_ENABLE_AUTO_MIXED_PRECISION` (and
`..._GRAPH_REWRITE`); upstream TensorFlow ignores it, so outside those containers such a script
trains in float32 while its author believes it is mixed precision. Where the switch is set
unconditionally, as a statement of its own (`os.environ["TF_ENABLE_AUTO_MIXED_PRECISION"] = "1"`,
`os.environ.setdefault(...)`, `os.putenv(...)`), the file is converted as float32 code (its
optimizers wrapped with `enable_mixed_precision_graph_rewrite`, which works in both builds) and
the switch is removed, so that an NGC run never gets two loss scales. Anything else (a value
read from a flag, the name in a dict or a subprocess environment) cannot be told on or off from
the code: the file is left as it is, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Set

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.base import TransformResult, Verdict
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.positions import Positions
from ampify.transforms.tf1.names import NGC_AUTO_MIXED_PRECISION_STRINGS

REMOVED = "AMP104"
NOT_MIGRATED = "AMP122"

_SETTERS = ("os.environ.setdefault", "os.putenv")
_ON_VALUES = ("1", "true", "True")


@dataclass
class NgcSwitch:
    """One place the NGC switch appears; `statement` is set where it is removable."""

    name: str
    line: int
    column: int
    statement: Optional[cst.SimpleStatementLine] = None


def _string(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:
            return None
        return value if isinstance(value, str) else None
    return None


class _Finder(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        #: (statement line, the key string node) of removable settings
        self.settings: List[tuple] = []
        self.mentions: List[cst.SimpleString] = []

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if _string(node) in NGC_AUTO_MIXED_PRECISION_STRINGS:
            self.mentions.append(node)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1:
            return
        key = self._unconditional_setting(node.body[0])
        if key is not None:
            self.settings.append((node, key))

    def _unconditional_setting(self, small: cst.BaseSmallStatement) -> Optional[cst.SimpleString]:
        """The key node of `os.environ[KEY] = "1"` / `os.environ.setdefault(KEY, "1")` /
        `os.putenv(KEY, "1")` with KEY an NGC switch, else None."""
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if (isinstance(target, cst.Subscript) and self.imports.resolve(target.value) == "os.environ"
                    and len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index)):
                key = target.slice[0].slice.value
                if _string(key) in NGC_AUTO_MIXED_PRECISION_STRINGS and _string(small.value) in _ON_VALUES:
                    return key
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            if self.imports.resolve(call.func) in _SETTERS and len(call.args) == 2 and not any(
                    arg.keyword or arg.star for arg in call.args):
                key = call.args[0].value
                if _string(key) in NGC_AUTO_MIXED_PRECISION_STRINGS and _string(call.args[1].value) in _ON_VALUES:
                    return key
        return None


def ngc_switches(module: cst.Module, imports: ImportMap, source: bytes = b"") -> List[NgcSwitch]:
    """Every appearance of the NGC switch's name, with its statement where it is removable.
    `source`: the bytes the module was parsed from (generating them again costs half a parse)."""
    source = source or module.bytes
    if b"TF_ENABLE_AUTO_MIXED_PRECISION" not in source:
        return []
    finder = _Finder(imports)
    walk(module, finder)
    if not finder.mentions:
        return []
    positions = Positions(module)
    removable = {id(key): statement for statement, key in finder.settings}
    switches = []
    for mention in finder.mentions:
        start = positions[mention].start
        switches.append(NgcSwitch(_string(mention), start.line, start.column, removable.get(id(mention))))
    return switches


def past_ngc_switches(
    module: cst.Module,
    switches: List[NgcSwitch],
    convert_as_float32: Callable[[], TransformResult],
    convert_as_it_is: Callable[[], TransformResult],
) -> TransformResult:
    """Convert the file as float32 code and remove the switch, or say why not."""
    fixed = [s for s in switches if s.statement is not None]
    if len(fixed) < len(switches):
        result = convert_as_it_is()
        warnings = [_warning(
            s, f"{s.name} is honoured only by NVIDIA's NGC builds of TensorFlow 1.x; upstream TensorFlow ignores "
            "it, so elsewhere this script trains in float32. It is not set unconditionally here (a flag, a dict, "
            "another process's environment), so ampify cannot tell when mixed precision is meant: wrap the optimizer "
            "with tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite where it is meant to be on, "
            "and drop the switch") for s in switches if s.statement is None]
        return TransformResult(module, Verdict.UNCONVERTED, [*warnings, *result.findings],
                               f"NGC-only {switches[0].name} set conditionally (line {warnings[0].line})")
    result = convert_as_float32()
    if result.verdict is Verdict.CONVERTED:
        notes = [Finding(
            REMOVED, f"removed {s.name}: only NVIDIA's NGC builds of TensorFlow 1.x read it (upstream TensorFlow "
            "trains in float32 with it); the optimizers are wrapped with the mixed precision graph rewrite instead, "
            "which works in both, and an NGC run gets one loss scale, not two", s.line, s.column) for s in fixed]
        findings = sorted([*notes, *result.findings], key=lambda f: (f.line, f.column, f.code))
        new_module = result.module.visit(_Remover({_code(s.statement) for s in fixed}))
        return TransformResult(new_module, Verdict.CONVERTED, findings, result.reason, result.companions)
    if result.verdict is Verdict.ALREADY_MIXED_PRECISION:
        return convert_as_it_is()  # mixed precision by other means as well: judged as before
    warnings = [_warning(
        s, f"{s.name} is honoured only by NVIDIA's NGC builds of TensorFlow 1.x; upstream TensorFlow ignores it, "
        "so elsewhere this script trains in float32, and no TF1 optimizer is built in this file to wrap instead: "
        "wrap it where it is built (ampify converts that file) and then drop this switch, so an NGC run does not "
        "get two loss scales") for s in switches]
    return TransformResult(module, Verdict.UNCONVERTED, warnings,
                           f"NGC-only {switches[0].name} (line {warnings[0].line}) and no optimizer here to wrap")


def _warning(switch: NgcSwitch, message: str) -> Finding:
    return Finding(NOT_MIGRATED, message, switch.line, switch.column, Severity.WARNING)


def _code(statement: cst.SimpleStatementLine) -> str:
    return cst.Module(body=[]).code_for_node(statement.with_changes(leading_lines=[]))


class _Remover(cst.CSTTransformer):
    """Drops the switch statements with the comments right above them; a block left empty
    gets `pass`."""

    def __init__(self, codes: Set[str]) -> None:
        super().__init__()
        self.codes = codes

    def _without(self, body):
        kept, carried = [], []
        for statement in body:
            if isinstance(statement, cst.SimpleStatementLine) and _code(statement) in self.codes:
                # comments right above the switch describe it and go with it; blank lines before
                # them keep the paragraph apart
                for line in statement.leading_lines:
                    if line.comment is not None:
                        break
                    carried.append(line)
                continue
            if carried:
                if not statement.leading_lines:  # else it is set apart already
                    statement = statement.with_changes(leading_lines=carried)
                carried = []
            kept.append(statement)
        if not kept:
            kept.append(cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=carried))
        return kept

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._without(updated_node.body))

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node.with_changes(body=self._without(updated_node.body))
