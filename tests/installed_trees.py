"""Samples of real installed code (torch, tensorflow) for tests that check ampify against it."""

from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path
from typing import Callable, List


def installed_files(package: str, accept: Callable[[Path], bool], count: int) -> List[Path]:
    """Up to `count` files of an installed package that `accept` takes, in a fixed order that
    does not follow the tree's layout (a hash of the relative path); [] when not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0])
    files = sorted(root.rglob("*.py"), key=lambda p: zlib.crc32(str(p.relative_to(root)).encode()))
    picked: List[Path] = []
    for path in files:
        if accept(path):
            picked.append(path)
            if len(picked) >= count:
                break
    return picked


def compiles(path) -> bool:
    """Does this Python compile the file? (A fixture of PyTorch 0.3 code, `.cuda(async=True)`, does not.)"""
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError:
        return False
    return True
