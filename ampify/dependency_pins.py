"""The versions a repository pins for its dependencies, read from its requirement files.

Read: `requirements*.txt` (and `requirements/*.txt`) at the project root, `setup.py`'s and
`setup.cfg`'s install requirements, `pyproject.toml`'s `[project] dependencies`, conda's
`environment.yml`. Only the requirement strings are read (a regular expression over each line):
nothing is imported or run. A transform that needs a version (which Keras `tf.keras` is) asks
through ProjectFacts.dependency_pins.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

#: `tensorflow==2.12.0`, `tensorflow-gpu>=2.4,<2.16`, "keras~=3.0", tf-keras
_REQUIREMENT = re.compile(
    r"""(?:^|["'\s,\[])(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*"""
    r"""(?P<spec>(?:(?:==|>=|<=|~=|!=|<|>|=)\s*[0-9][0-9A-Za-z.*+!-]*\s*,?\s*)+)"""
)
_FILES = ("requirements*.txt", "requirements/*.txt", "setup.py", "setup.cfg", "pyproject.toml", "environment.yml",
          "environment.yaml")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_lines(root: Path) -> Iterator[Tuple[Path, int, str]]:
    for pattern in _FILES:
        for path in sorted(root.glob(pattern)):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                line = line.split("#", 1)[0]
                if line.strip():
                    yield path, number, line


@functools.lru_cache(maxsize=256)
def dependency_pins(root: Path) -> Dict[str, Tuple[str, str]]:
    """Normalised package name -> (its version specifier, "requirements.txt:3"), the first place
    each package is pinned."""
    found: Dict[str, Tuple[str, str]] = {}
    for path, number, line in _requirement_lines(root):
        for match in _REQUIREMENT.finditer(line):
            name = _normalise(match.group("name"))
            spec = re.sub(r"\s+", "", match.group("spec")).rstrip(",")
            if name not in found:
                found[name] = (spec, f"{path.relative_to(root).as_posix()}:{number}")
    return found


def _version(text: str) -> Tuple[int, ...]:
    parts: List[int] = []
    for part in text.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group(0)))
    return tuple(parts)


def allowed_range(spec: str) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """(lowest, highest-excluded) versions a specifier lets in, as tuples; () / (999,) when open."""
    low: Tuple[int, ...] = ()
    high: Tuple[int, ...] = (999,)
    for clause in spec.split(","):
        match = re.match(r"(==|>=|<=|~=|!=|<|>|=)(.+)", clause)
        if match is None:
            continue
        operator, version = match.group(1), _version(match.group(2).rstrip(".*"))
        if not version:
            continue
        just_above = version[:-1] + (version[-1] + 1,)
        if operator in ("==", "=") and not match.group(2).endswith("*"):
            low, high = max(low, version), min(high, just_above)
        elif operator in ("==", "=", "~="):
            prefix = version[:-1] if operator == "~=" else version
            low = max(low, version)
            high = min(high, prefix[:-1] + (prefix[-1] + 1,)) if prefix else high
        elif operator in (">=", ">"):
            low = max(low, version)
        elif operator == "<":
            high = min(high, version)
        elif operator == "<=":
            high = min(high, just_above)
    return low, high
