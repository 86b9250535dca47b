"""Why an old training script is not valid Python 3 any more, in words its owner can act on.

Real training repositories keep files from before Python 3.7 and from Python 2: PyTorch 0.3's
`x.cuda(async=True)` (`async` became a keyword in 3.7; PyTorch 0.4 renamed the argument
`non_blocking`), `print "epoch", i`, `except IOError, e:`. Python's own message for most of them
is a bare "invalid syntax"; the hint says what the line is and what to do first. ampify never
rewrites such a file: it converts what runs on the Python it runs on."""

from __future__ import annotations

import re
from typing import Optional

_ASYNC_AS_NAME = re.compile(r"(?:\basync\s*=(?!=)|\.\s*async\b|\bdef\s+async\b)")
_AWAIT_AS_NAME = re.compile(r"(?:\bawait\s*=(?!=)|\.\s*await\b|\bdef\s+await\b)")

#: Python 2 statements and literals, matched on the line Python 3 stops at
_PYTHON2_FORMS = (
    (re.compile(r"^\s*print\s+(?![\s(=.,)\]}]|$)"), "a print statement"),
    (re.compile(r"^\s*print\s*$"), "a print statement"),
    (re.compile(r"^\s*exec\s+[\"'\w]"), "an exec statement"),
    (re.compile(r"^\s*except\s+[\w.]+\s*,\s*\w+\s*:"), "`except E, name:`"),
    (re.compile(r"^\s*except\s+\([^)]*\)\s*,\s*\w+\s*:"), "`except (E1, E2), name:`"),
    (re.compile(r"^\s*raise\s+[\w.]+\s*,"), "`raise E, message`"),
    (re.compile(r"<>"), "the `<>` operator"),
    (re.compile(r"`[^`]+`"), "backquotes for repr()"),
    (re.compile(r"(?<![\w.])0[0-7]*[1-7][0-7]*[lL]?\b"), "an octal literal written 0777"),
    (re.compile(r"(?<![\w.])\d+[lL]\b"), "a long literal (123L)"),
    (re.compile(r"(?<!\w)[uU][rR][\"']"), "a ur'' string"),
)


def legacy_syntax_hint(line: Optional[str]) -> Optional[str]:
    """What outdated syntax the line Python stopped at holds, and the fix; None when it holds none."""
    if not line:
        return None
    code = _without_strings_and_comment(line)
    if _ASYNC_AS_NAME.search(code):
        if re.search(r"\basync\s*=", code):
            return ("`async` is a keyword since Python 3.7: `.cuda(async=True)` / `.to(device, async=True)` is "
                    "PyTorch 0.3's spelling of `non_blocking=True`; rename it, then run ampify again")
        return "`async` is a keyword since Python 3.7 and cannot name anything; rename it, then run ampify again"
    if _AWAIT_AS_NAME.search(code):
        return "`await` is a keyword since Python 3.7 and cannot name anything; rename it, then run ampify again"
    for pattern, form in _PYTHON2_FORMS:
        if pattern.search(code):
            return (f"Python 2 code ({form}): ampify converts Python 3 code only; port the file first "
                    "(2to3, or by hand), then run ampify again")
    return None


def _without_strings_and_comment(line: str) -> str:
    """The line with string literals emptied and its comment dropped, so words inside them match nothing."""
    line = re.sub(r"(\"\"\"|''')(?:.*?)\1|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'", '""', line)
    return line.split("#", 1)[0]
