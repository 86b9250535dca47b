"""Adding a keyword argument to a call in the call's own layout."""

from __future__ import annotations

import libcst as cst


def with_keyword(call: cst.Call, keyword: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `keyword=value` after its last argument. One argument per line with a trailing
    comma stays so: the new argument takes the last one's line break, the last one takes the break
    between the arguments before it."""
    args = list(call.args)
    new = cst.Arg(value, keyword=cst.Name(keyword),
                  equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        between = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else last.comma
        args[-1] = last.with_changes(comma=between)
        args.append(new.with_changes(comma=last.comma))
        return call.with_changes(args=args)
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    args.append(new)
    return call.with_changes(args=args)
