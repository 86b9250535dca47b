"""Statement-level edits keyed by node identity, applied in one LibCST pass.

The PyTorch backends plan their changes against the nodes the analysis returned (insert a
statement after this one, wrap these statements in a `with`, add a keyword to this call) and
hand the plan to `apply_edits`, which rebuilds only the blocks and nodes that change, so the
rest of the file keeps its formatting and comments byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.kit.parameters import append_with_comma, separator_like, with_parameter
from ampify.transforms.kit.pruned_visit import visit_only


@dataclass
class StatementEdits:
    """Planned changes; statement code is source text parsed with the module's own config."""

    before: Dict[int, List[str]] = field(default_factory=dict)
    after: Dict[int, List[str]] = field(default_factory=dict)
    #: id(first statement) -> (id(last statement), `with ...:` header)
    wraps: Dict[int, Tuple[int, str]] = field(default_factory=dict)
    calls: Dict[int, cst.BaseExpression] = field(default_factory=dict)
    parameters: Dict[int, str] = field(default_factory=dict)
    keywords: Dict[int, List[Tuple[str, str]]] = field(default_factory=dict)
    dict_elements: Dict[int, List[Tuple[str, str]]] = field(default_factory=dict)
    #: statements to drop (a statement that moves: removed here, inserted elsewhere as code)
    removed: Set[int] = field(default_factory=set)
    #: id(Assign) -> dtype expression: `x[i] = v` becomes `x[i] = (v).to(<dtype>)`
    casts: Dict[int, str] = field(default_factory=dict)
    #: id(Call) of calls whose first argument `x` becomes `x.float()`
    float_first_arguments: Set[int] = field(default_factory=set)
    #: bookkeeping for callers: statements after which a scaler is already created
    created_scalers: Set[int] = field(default_factory=set)

    def copy(self) -> "StatementEdits":
        """An independent copy, to plan a unit tentatively and drop it if the unit is refused."""
        return StatementEdits(
            before={k: list(v) for k, v in self.before.items()},
            after={k: list(v) for k, v in self.after.items()},
            wraps=dict(self.wraps),
            calls=dict(self.calls),
            parameters=dict(self.parameters),
            keywords={k: list(v) for k, v in self.keywords.items()},
            dict_elements={k: list(v) for k, v in self.dict_elements.items()},
            removed=set(self.removed),
            casts=dict(self.casts),
            float_first_arguments=set(self.float_first_arguments),
            created_scalers=set(self.created_scalers),
        )

    def nodes(self) -> Set[int]:
        """ids of every node an edit names (the applier changes no other node itself)."""
        return {
            *self.before, *self.after, *self.wraps, *(last for last, _ in self.wraps.values()), *self.calls,
            *self.parameters, *self.keywords, *self.dict_elements, *self.removed, *self.casts,
            *self.float_first_arguments,
        }

    def remove_statement(self, statement: cst.CSTNode) -> None:
        """Drop `statement` from its block (edits planned before/after it still apply)."""
        self.removed.add(id(statement))

    def insert_before(self, statement: cst.CSTNode, code: str) -> None:
        """Insert statement(s) `code` right before `statement`, in its block."""
        self.before.setdefault(id(statement), []).append(code)

    def insert_after(self, statement: cst.CSTNode, code: str) -> None:
        """Insert statement(s) `code` right after `statement`, in its block (once per code)."""
        planned = self.after.setdefault(id(statement), [])
        if code not in planned:
            planned.append(code)

    def wrap(self, first: cst.CSTNode, last: cst.CSTNode, header: str) -> None:
        """Put the statements first..last (one block) into `header` (e.g. `with x:`)."""
        self.wraps[id(first)] = (id(last), header)

    def replace_call(self, call: cst.Call, new: cst.BaseExpression) -> None:
        """Replace one call expression."""
        self.calls[id(call)] = new

    def add_parameter(self, function: cst.FunctionDef, name: str, default: Optional[str] = None) -> None:
        """Add a parameter, required unless `default` is given (keyword-only where a positional
        one cannot go)."""
        self.parameters[id(function)] = (name, default)

    def add_keyword(self, call: cst.Call, keyword: str, value: str) -> None:
        """Append `keyword=value` to a call (once, however often it is asked for)."""
        planned = self.keywords.setdefault(id(call), [])
        if (keyword, value) not in planned:
            planned.append((keyword, value))

    def cast_first_argument_to_float(self, call: cst.Call) -> None:
        """`loss(x, y)` becomes `loss(x.float(), y)`."""
        self.float_first_arguments.add(id(call))

    def cast_assigned_value(self, assign: cst.Assign, dtype: str) -> None:
        """`target = value` becomes `target = (value).to(<dtype>)`."""
        self.casts[id(assign)] = dtype

    def add_dict_element(self, element: cst.DictElement, key: str, value: str) -> None:
        """Insert `"key": value` right after `element` (same quotes and spacing)."""
        self.dict_elements.setdefault(id(element), []).append((key, value))


def apply_edits(module: cst.Module, edits: StatementEdits) -> cst.Module:
    """The module with every planned edit applied (the input module is not changed); only the
    edited nodes and the blocks holding them are rebuilt."""
    return visit_only(module, _EditApplier(module, edits), edits.nodes())


class _EditApplier(cst.CSTTransformer):
    def __init__(self, module: cst.Module, edits: StatementEdits) -> None:
        super().__init__()
        self.edits = edits
        self.config = module.config_for_parsing

    def _parse(self, code: str) -> List[cst.BaseStatement]:
        parsed = cst.parse_module(code + "\n", config=self.config)
        return list(parsed.body)

    def _rebuild(self, original: List[cst.BaseStatement], updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
        if not any(
            id(o) in self.edits.before or id(o) in self.edits.after or id(o) in self.edits.wraps
            or id(o) in self.edits.removed
            for o in original
        ):
            return updated
        expanded: List[Tuple[int, cst.BaseStatement]] = []  # (id of original or 0, statement)
        for o, u in zip(original, updated):
            for code in self.edits.before.get(id(o), []):
                expanded.extend((0, s) for s in self._parse(code))
            if id(o) not in self.edits.removed:
                expanded.append((id(o), u))
            for code in self.edits.after.get(id(o), []):
                expanded.extend((0, s) for s in self._parse(code))
        result: List[cst.BaseStatement] = []
        index = 0
        while index < len(expanded):
            key, statement = expanded[index]
            wrap = self.edits.wraps.get(key) if key else None
            if wrap is None:
                result.append(statement)
                index += 1
                continue
            last_id, header = wrap
            end = index
            while end < len(expanded) and expanded[end][0] != last_id:
                end += 1
            inner = [s for _, s in expanded[index : end + 1]]
            result.append(self._wrapped(inner, header))
            index = end + 1
        return result

    def _wrapped(self, inner: List[cst.BaseStatement], header: str) -> cst.BaseStatement:
        template = self._parse(f"{header}\n{self.config.default_indent}pass")[0]
        assert isinstance(template, cst.With)
        leading = inner[0].leading_lines
        inner[0] = inner[0].with_changes(leading_lines=[])
        # a line continued with a backslash keeps its own indentation (LibCST holds it as text):
        # indent it with the block, as the lines of brackets are
        deeper = _ContinuationIndent(self.config.default_indent)
        inner = [statement.visit(deeper) for statement in inner]
        body = template.body.with_changes(body=inner)
        return template.with_changes(body=body, leading_lines=leading)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._rebuild(list(original_node.body), list(updated_node.body))
        return updated_node.with_changes(body=body) if body is not updated_node.body else updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._rebuild(list(original_node.body), list(updated_node.body))
        return updated_node.with_changes(body=body)

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        dtype = self.edits.casts.get(id(original_node))
        if dtype is None:
            return updated_node
        value = updated_node.value
        if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not value.lpar:
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        cast = cst.Call(
            func=cst.Attribute(value=value, attr=cst.Name("to")),
            args=[cst.Arg(cst.parse_expression(dtype))],
        )
        return updated_node.with_changes(value=cast)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        replacement = self.edits.calls.get(id(original_node))
        if replacement is not None:
            return replacement
        if id(original_node) in self.edits.float_first_arguments:
            first = updated_node.args[0]
            value = first.value
            if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not value.lpar:
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            cast = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("float")))
            updated_node = updated_node.with_changes(args=[first.with_changes(value=cast), *updated_node.args[1:]])
        keywords = self.edits.keywords.get(id(original_node))
        if keywords:
            args = list(updated_node.args)
            for keyword, value in keywords:
                new = cst.Arg(
                    value=cst.parse_expression(value),
                    keyword=cst.Name(keyword),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                )
                args = append_with_comma(args, new)
            return updated_node.with_changes(args=args)
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        planned = self.edits.parameters.get(id(original_node))
        if planned is None:
            return updated_node
        name, default = planned
        params = with_parameter(updated_node.params, name, default)
        return updated_node.with_changes(params=params)

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.Dict:
        if not any(id(e) in self.edits.dict_elements for e in original_node.elements):
            return updated_node
        elements = list(updated_node.elements)
        result = []
        for position, (o, u) in enumerate(zip(original_node.elements, elements)):
            additions = self.edits.dict_elements.get(id(o), [])
            if not additions:
                result.append(u)
                continue
            assert isinstance(u, cst.DictElement) and isinstance(u.key, cst.SimpleString)
            quote = u.key.quote
            is_last = position == len(elements) - 1
            current = u
            for key, value in additions:
                new = cst.DictElement(
                    key=cst.SimpleString(f"{quote}{key}{quote}"),
                    value=cst.parse_expression(value),
                    whitespace_before_colon=u.whitespace_before_colon,
                    whitespace_after_colon=u.whitespace_after_colon,
                    comma=current.comma,
                )
                if is_last:
                    separator = separator_like(elements, position)
                    current = current.with_changes(comma=separator)
                result.append(current)
                current = new
            result.append(current)
        return updated_node.with_changes(elements=result)


class _ContinuationIndent(cst.CSTTransformer):
    """Indents the lines a backslash continues by one more level."""

    def __init__(self, indent: str) -> None:
        super().__init__()
        self.indent = indent

    def leave_SimpleWhitespace(self, original_node: cst.SimpleWhitespace,
                               updated_node: cst.SimpleWhitespace) -> cst.SimpleWhitespace:
        value = updated_node.value
        if "\\" not in value:
            return updated_node
        lines = value.split("\n")
        return updated_node.with_changes(value="\n".join(lines[:1] + [self.indent + line for line in lines[1:]]))
