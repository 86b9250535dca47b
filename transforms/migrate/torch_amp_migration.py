"""Migrate deprecated `torch.cuda.amp` / `torch.cpu.amp` code to `torch.amp`.

The analysis and the per-use rewrites are in `migrate/deprecated_torch_amp.py`; this module is
the Transform: it asks for the plan, refuses the whole file when a use has no exact equivalent,
and otherwise applies every rewrite in one pass and reports one finding per use.
"""

from __future__ import annotations

from typing import Dict, List

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.options import Options
from ampify.transforms.base import Transform, TransformResult, UnitContext, Verdict
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.positions import Positions
from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.migrate.deprecated_torch_amp import (
    AMP_CALLABLES,
    DEPRECATED_MODULES,
    PARENT_MODULES,
    ImportEdit,
    MigrationPlan,
    Use,
    bare_decorator_call,
    keyword_value,
    may_have_deprecated_uses,
    may_use_deprecated_amp,
    plan_migration,
    rewritten_call,
    uses_current_api,
)
from ampify.transforms.migrate.apex_migration import migrate_apex
from ampify.transforms.migrate.apex_removal import uses_apex_amp
from ampify.transforms.torch.torch_import import add_import_torch, module_level_aliases

MIGRATED = "AMP401"
IMPORT_MIGRATED = "AMP402"
NOT_MIGRATED = "AMP410"


class TorchAmpMigration(Transform):
    name = "torch-amp-migration"
    description = "deprecated torch.cuda.amp / torch.cpu.amp and apex amp -> torch.amp"
    internal_error_code = "AMP400"
    screened_out_reason = "no deprecated torch.cuda.amp / torch.cpu.amp use"

    def may_apply(self, source: bytes, options: Options) -> bool:
        return options.migrate and (may_use_deprecated_amp(source) or (options.backend == "native" and b"apex" in source))

    def screen(self, facts: SourceFacts, options: Options) -> bool:
        # a migrated file (torch.amp.autocast(...)) is screened in too, to be called "already"
        identifiers = facts.identifiers
        if options.backend == "native" and facts.imports("apex") and "amp" in identifiers:
            return True
        return (
            (facts.imports("torch") or facts.star_import) and "amp" in identifiers
            and ("cuda" in identifiers or "cpu" in identifiers or not identifiers.isdisjoint(AMP_CALLABLES))
        )

    def concerns(self, imports: ImportMap, options: Options) -> bool:
        return options.migrate and (imports.uses("torch") or imports.uses("apex"))

    def apply(self, module: cst.Module, imports: ImportMap, options: Options,
              context: UnitContext = UnitContext()) -> TransformResult:
        if options.backend == "native" and uses_apex_amp(imports):
            # --backend apex asks for apex: only the native backend migrates away from it
            migrated = migrate_apex(module, imports, options, context)
            if migrated is not None:
                return migrated
        source = context.source or module.bytes
        if not may_have_deprecated_uses(source, imports):
            # no walk: most files that name `amp` use torch.amp, or something else called amp
            if uses_current_api(source, imports):
                return TransformResult(module, Verdict.ALREADY_MIXED_PRECISION, reason="uses torch.amp")
            return TransformResult(module, Verdict.NOTHING_TO_DO)
        plan = plan_migration(module, imports, module_level_aliases(module, "torch"))
        if not plan.uses and not plan.imports and not plan.obstacles:
            if plan.uses_current_api:
                return TransformResult(module, Verdict.ALREADY_MIXED_PRECISION, reason="uses torch.amp")
            return TransformResult(module, Verdict.NOTHING_TO_DO)
        positions = Positions(module)
        if plan.last_node is not None:
            # code generated only up to the last node reported: every earlier position comes with it
            positions.get(plan.last_node)
        if plan.obstacles:
            findings = [
                Finding(NOT_MIGRATED, f"{obstacle.reason}; the deprecated API is left as it is in this file "
                        "(it still runs, with a FutureWarning)", *_place(positions, obstacle.node), Severity.WARNING)
                for obstacle in plan.obstacles
            ]
            first = findings[0]
            return TransformResult(
                module, Verdict.UNCONVERTED, findings,
                f"deprecated torch.cuda.amp / torch.cpu.amp use that cannot be migrated exactly (line {first.line})",
            )
        findings = [self._use_finding(use, positions) for use in plan.uses]
        findings.extend(self._import_finding(edit, positions) for edit in plan.imports)
        new_module = module.visit(_Rewriter(plan))
        if plan.needs_import_torch:
            new_module = add_import_torch(new_module)
        return TransformResult(new_module, Verdict.CONVERTED, findings)

    @staticmethod
    def _use_finding(use: Use, positions: Positions) -> Finding:
        return Finding(
            MIGRATED,
            f"migrated deprecated {use.old_spelling} to {use.new_spelling} (same behaviour, no FutureWarning"
            f"{'; old positional arguments passed by name' if use.call is not None and _has_positional(use.call) else ''})",
            *_place(positions, use.node),
        )

    @staticmethod
    def _import_finding(edit: ImportEdit, positions: Positions) -> Finding:
        return Finding(IMPORT_MIGRATED, f"import rewritten: {edit.describe()}", *_place(positions, edit.node))


def _without(aliases, indexes) -> List[cst.ImportAlias]:
    """The aliases not at `indexes`: each keeps its own comma (line breaks in a parenthesised
    import stay), the last takes the old last one's (a trailing comma stays, a dangling one goes)."""
    aliases = list(aliases)
    kept = [alias for i, alias in enumerate(aliases) if i not in indexes]
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    result = [alias if isinstance(alias.comma, cst.Comma) else alias.with_changes(comma=comma) for alias in kept[:-1]]
    return result + [kept[-1].with_changes(comma=aliases[-1].comma)]


def _has_positional(call: cst.Call) -> bool:
    return any(arg.keyword is None and not arg.star for arg in call.args)


def _place(positions: Positions, node: cst.CSTNode):
    position = positions.get(node)
    if position is None:
        return 0, 0
    return position.start.line, position.start.column


class _Rewriter(cst.CSTTransformer):
    """Applies a MigrationPlan; every edit is keyed by the identity of the node it replaces."""

    def __init__(self, plan: MigrationPlan) -> None:
        super().__init__()
        self.respelled: Dict[int, cst.BaseExpression] = {
            id(use.node): use.respelled for use in plan.uses if use.respelled is not None}
        self.keyword_values: Dict[int, Use] = {id(use.node): use for use in plan.uses if use.keyword_value}
        self.calls: Dict[int, Use] = {id(use.call): use for use in plan.uses if use.call is not None}
        self.decorators: Dict[int, Use] = {id(use.decorator): use for use in plan.uses if use.decorator is not None}
        self.imports: Dict[int, ImportEdit] = {id(edit.node): edit for edit in plan.imports}
        self.paths = plan.paths

    def on_visit(self, node: cst.CSTNode) -> bool:
        # only the statements that hold an edit are rebuilt (a 10 000-line module with one
        # deprecated call costs a walk down to it, not a transform of the whole tree)
        if id(node) not in self.paths:
            return False
        return super().on_visit(node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return self._reference(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._reference(original_node, updated_node)

    def _reference(self, original_node, updated_node) -> cst.BaseExpression:
        new = self.respelled.get(id(original_node), updated_node)
        use = self.keyword_values.get(id(original_node))
        return keyword_value(use, new) if use is not None else new

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        use = self.calls.get(id(original_node))
        return rewritten_call(updated_node, use) if use is not None else updated_node

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        use = self.decorators.get(id(original_node))
        if use is None:
            return updated_node
        return updated_node.with_changes(decorator=bare_decorator_call(use, updated_node.decorator))

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        edit = self.imports.get(id(original_node))
        if edit is None:
            return updated_node
        if edit.new_module is not None:
            return updated_node.with_changes(module=cst.parse_expression(edit.new_module))
        return updated_node.with_changes(names=_without(updated_node.names, edit.split_aliases))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        added = self._split_imports(original_node)
        if not added:
            return updated_node
        # `from torch.cuda import amp, is_available` -> that line keeps is_available, and
        # `from torch import amp` follows on a line of its own
        return cst.FlattenSentinel([updated_node, *(cst.SimpleStatementLine(body=[new]) for new in added)])

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        body = []
        for original, updated in zip(original_node.body, updated_node.body):
            body.append(updated)
            body.extend(self._split_imports_of(original))
        return updated_node.with_changes(body=body)

    def _split_imports(self, line: cst.SimpleStatementLine) -> List[cst.ImportFrom]:
        added: List[cst.ImportFrom] = []
        for small in line.body:
            added.extend(self._split_imports_of(small))
        return added

    def _split_imports_of(self, small: cst.CSTNode) -> List[cst.ImportFrom]:
        edit = self.imports.get(id(small))
        if edit is None or not edit.split_aliases:
            return []
        moved = [small.names[i] for i in edit.split_aliases]
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        names = [alias.with_changes(comma=comma) for alias in moved[:-1]]
        names.append(moved[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT))
        return [cst.ImportFrom(module=cst.Name("torch"), names=names)]

    def leave_Import(self, original_node: cst.Import, updated_node: cst.Import) -> cst.Import:
        edit = self.imports.get(id(original_node))
        if edit is None:
            return updated_node
        names = list(updated_node.names)
        for index, dotted in edit.renamed_aliases.items():
            names[index] = names[index].with_changes(name=cst.parse_expression(dotted))
        return updated_node.with_changes(names=names)


__all__ = ["TorchAmpMigration", "DEPRECATED_MODULES", "PARENT_MODULES"]
