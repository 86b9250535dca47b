"""Why an old training script is not valid Python 3 any more, in words its owner can act on.

Real training repositories keep files from before Python 3.7 and from Python 2: PyTorch 0.3's
`x.cuda(async=True)` (`async` became a keyword in 3.7; PyTorch 0.4 renamed the argument
`non_blocking`), `print "epoch", i`, `except IOError, e:`. Python's own message for most of them
is a bare "invalid syntax"; the hint says what the line is and what to do first. ampify converts
what runs on the Python it runs on, with one exception: PyTorch 0.3's `async=` argument of
`.cuda()` / `.to()` is renamed `non_blocking=` (rename_async_arguments) in a file ampify converts,
since that file runs on no current PyTorch otherwise."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import List, Optional, Tuple, Union

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


#: the calls whose `async=` argument PyTorch 0.4 renamed `non_blocking=`
_NON_BLOCKING_CALLS = frozenset({"cuda", "to"})


def rename_async_arguments(source: Union[str, bytes]) -> Optional[Tuple[Union[str, bytes], List[int]]]:
    """PyTorch 0.3's `x.cuda(async=True)` / `x.to(device, async=True)` with the argument PyTorch
    0.4 renamed it to, `non_blocking=True` (the same call; `async` is a keyword since Python 3.7,
    so the file runs on no Python that runs a current PyTorch). Only a keyword argument written
    directly in a `.cuda(...)` or `.to(...)` call is renamed (DeepRL's `ReplayWrapper(...,
    async=True)` is its own parameter, left alone). (new source, renamed lines), or None when
    there is none. Bytes keep their encoding, BOM and newlines."""
    raw = source if isinstance(source, bytes) else source.encode("utf-8")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        text = raw.decode(encoding)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, UnicodeDecodeError, LookupError, tokenize.TokenError, IndentationError):
        return None
    renamed: List[Tuple[int, int]] = []
    # one entry per open bracket: does it open a `.cuda(` / `.to(` call?
    stack: List[bool] = []
    for index, token in enumerate(tokens):
        if token.type == tokenize.OP and token.string in "([{":
            opens_call = (token.string == "(" and index >= 2 and tokens[index - 1].type == tokenize.NAME
                          and tokens[index - 1].string in _NON_BLOCKING_CALLS
                          and tokens[index - 2].type == tokenize.OP and tokens[index - 2].string == ".")
            stack.append(opens_call)
        elif token.type == tokenize.OP and token.string in ")]}":
            if stack:
                stack.pop()
        elif (token.type == tokenize.NAME and token.string == "async" and stack and stack[-1]
              and index + 1 < len(tokens) and tokens[index + 1].string == "="
              and tokens[index - 1].string in ("(", ",")):
            renamed.append(token.start)
    if not renamed:
        return None
    lines = text.splitlines(keepends=True)
    for row, column in reversed(renamed):
        line = lines[row - 1]
        lines[row - 1] = line[:column] + "non_blocking" + line[column + len("async"):]
    new_text = "".join(lines)
    new = new_text.encode(encoding) if isinstance(source, bytes) else new_text
    return new, sorted({row for row, _ in renamed})


def parsed_tree(data: Union[str, bytes], filename: str = "<unknown>") -> ast.Module:
    """ast.parse(data), reading PyTorch 0.3's `.cuda(async=True)` as the `non_blocking=True` it is
    (rename_async_arguments: the same lines): such a module converts, and its imports, classes
    and calls are the repository's like any other's. SyntaxError otherwise."""
    try:
        return ast.parse(data, filename=filename)
    except SyntaxError:
        renamed = rename_async_arguments(data) if (b"async" if isinstance(data, bytes) else "async") in data else None
        if renamed is None:
            raise
        return ast.parse(renamed[0], filename=filename)
