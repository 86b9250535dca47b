"""Line numbers of a rewritten module mapped back to the module as it was.

A transform that reshapes a module before converting it (terse steps expanded, apex removed
before the native conversion) reports its findings on the lines the user sees.
"""

from __future__ import annotations

import difflib
import re

_LINE_MENTION = re.compile(r"\b(lines? )(\d+(?:-\d+)?)")


class LineMap:
    """Line numbers of the normalized module -> lines of the module as it was."""

    def __init__(self, original: str, normalized: str) -> None:
        old, new = original.splitlines(), normalized.splitlines()
        self._map = {}
        matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
        for tag, a0, a1, b0, b1 in matcher.get_opcodes():
            for offset, line in enumerate(range(b0, b1)):
                if tag == "equal":
                    self._map[line + 1] = a0 + offset + 1
                else:
                    self._map[line + 1] = min(a0 + offset, max(a1 - 1, a0)) + 1

    def original_line(self, line: int) -> int:
        return self._map.get(line, line) if line else line

    def in_message(self, message: str) -> str:
        """"(line 9)", "lines 9-10", "before line 12" in a message, as lines of the original.
        A message about another file ("main.py:14 ...") keeps its numbers: they are that file's."""
        if ".py:" in message:
            return message
        return _LINE_MENTION.sub(
            lambda m: m.group(1) + "-".join(str(self.original_line(int(n))) for n in m.group(2).split("-")), message
        )
