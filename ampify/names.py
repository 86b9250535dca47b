"""File names as they may be shown: a repository can name a file anything, escape sequences and
newlines included, and none of that may reach a terminal, split a report line or break a patch.

- `for_terminal`: as git shows names (`git status`): a name with a control character, a quote,
  a backslash or bytes that are not UTF-8 is put in double quotes with C escapes; others as is.
- `for_diff_header`: the same quoting, which `git apply` and `patch` read back.
- `json_fields`: `path` as text (undecodable bytes as U+FFFD) plus `path_bytes` (base64 of the
  exact name) when the text alone cannot give the name back.
"""

from __future__ import annotations

import base64
import os
from typing import Dict

_C_ESCAPES = {
    0x07: "\\a", 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0B: "\\v", 0x0C: "\\f", 0x0D: "\\r",
    0x22: '\\"', 0x5C: "\\\\",
}


def _raw(name: str) -> bytes:
    """The name's bytes on disk (os.fsdecode turned undecodable bytes into lone surrogates)."""
    return os.fsencode(name)


def needs_quoting(name: str) -> bool:
    raw = _raw(name)
    if any(byte < 0x20 or byte == 0x7F or byte in (0x22, 0x5C) for byte in raw):
        return True
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    # C1 controls and other non-printable characters (bidi overrides included) are escaped too.
    return not all(char.isprintable() or char == " " for char in text)


def quote(name: str) -> str:
    """`"..."` with C escapes, octal for every byte that is not printable ASCII (git's quoting)."""
    out = []
    for byte in _raw(name):
        if byte in _C_ESCAPES:
            out.append(_C_ESCAPES[byte])
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def for_terminal(name: str) -> str:
    """The name as safe to print: quoted and escaped only when it has to be."""
    return quote(name) if needs_quoting(name) else name


def for_diff_header(prefix: str, name: str) -> str:
    """`a/name` or `"a/na\\nme"`, as git writes diff headers."""
    return quote(prefix + name) if needs_quoting(name) else prefix + name


def json_fields(name: str) -> Dict[str, str]:
    """{"path": text} and, when the text cannot give the exact name back, {"path_bytes": base64}."""
    raw = _raw(name)
    try:
        return {"path": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {
            "path": raw.decode("utf-8", errors="replace"),
            "path_bytes": base64.b64encode(raw).decode("ascii"),
        }
