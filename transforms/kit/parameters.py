"""Adding a parameter to a function in the function's own layout."""

from __future__ import annotations

from typing import Optional

import libcst as cst


def with_parameter(params: cst.Parameters, name: str, default: Optional[str] = None) -> cst.Parameters:
    """`params` with a new parameter `name` (`name=default` when given): positional after the
    others, keyword-only where a positional one cannot go (after `*args`, keyword-only ones, or a
    required one after parameters with defaults). One parameter per line with a trailing comma
    stays so."""
    new = cst.Param(cst.Name(name))
    if default is not None:
        new = new.with_changes(
            default=cst.parse_expression(default),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
        )
    positional = list(params.posonly_params) + list(params.params)
    needs_keyword_only = (
        params.star_arg is not cst.MaybeSentinel.DEFAULT
        or params.kwonly_params
        or (default is None and any(p.default is not None for p in positional))
    )
    if not needs_keyword_only:
        return params.with_changes(params=append_with_comma(list(params.params), new))
    star = params.star_arg
    if star is cst.MaybeSentinel.DEFAULT:
        star = cst.ParamStar()
        listed = list(params.params)
        if listed and not params.kwonly_params and params.star_kwarg is None and isinstance(listed[-1].comma, cst.Comma):
            # one parameter per line with a trailing comma: `*, scaler` goes on a line of
            # its own, and the new parameter takes the trailing comma over
            separator = separator_like(listed, len(listed) - 1)
            new = new.with_changes(comma=listed[-1].comma)
            listed[-1] = listed[-1].with_changes(comma=separator)
            star = cst.ParamStar(comma=separator)
            params = params.with_changes(params=listed)
    kwonly = append_with_comma(list(params.kwonly_params), new)
    if params.star_kwarg is not None and kwonly[-1].comma is cst.MaybeSentinel.DEFAULT:
        kwonly[-1] = kwonly[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return params.with_changes(star_arg=star, kwonly_params=kwonly)


def separator_like(elements, position):
    """The comma used between earlier elements (to keep one-per-line layouts), else `, `."""
    for element in elements[:position]:
        if isinstance(element.comma, cst.Comma):
            return element.comma
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def append_with_comma(items: list, new):
    """Append `new` to a comma-separated list, keeping a trailing comma where there was one."""
    if not items:
        return [new]
    last = items[-1]
    if isinstance(last.comma, cst.Comma):
        # a trailing comma: the new item takes it over (with any line break before the closing
        # bracket), the old last item gets the separator the earlier items use
        separator = separator_like(items, len(items) - 1)
        return items[:-1] + [last.with_changes(comma=separator), new.with_changes(comma=last.comma)]
    field = "whitespace_after_param" if isinstance(last, cst.Param) else "whitespace_after_arg"
    after = getattr(last, field, None)
    if isinstance(after, cst.ParenthesizedWhitespace):
        # `device\n):` -> `device, scaler\n):`: the closing bracket keeps its own line
        separator = separator_like(items, len(items) - 1)
        return items[:-1] + [
            last.with_changes(comma=separator, **{field: cst.SimpleWhitespace("")}),
            new.with_changes(**{field: after}),
        ]
    return items + [new]
