"""The byte prefilter is sound: when a transform's `may_apply` says no, running the transform
anyway changes nothing and reports nothing.

`may_apply` is what keeps ampify fast on big trees (no LibCST parse for files that cannot
concern a transform), and a wrong "no" would be a silent false negative. So every transform
is forced through parse + imports + apply on files its byte test rejects: the fixtures (inputs
and expected outputs, all backends) and small real files that do import the framework.
"""

from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path
from typing import List

import libcst as cst
import pytest

from ampify.options import Options
from ampify.registry import ALL_TRANSFORMS
from ampify.transforms.imports import ImportMap

REPO = Path(__file__).resolve().parent.parent
PER_TREE = 15
MAX_BYTES = 30_000
OPTION_SETS = [Options(), Options(backend="apex"), Options(dtype="bfloat16")]


def fixture_files() -> List[Path]:
    return sorted((REPO / "fixtures").rglob("*.py"))


def framework_files(package: str, marker: bytes) -> List[Path]:
    """Small files of an installed package that mention the framework, in a fixed order."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0])
    files = sorted(root.rglob("*.py"), key=lambda p: zlib.crc32(str(p.relative_to(root)).encode()))
    picked = []
    for path in files:
        if path.stat().st_size <= MAX_BYTES and marker in path.read_bytes():
            picked.append(path)
        if len(picked) >= PER_TREE:
            break
    return picked


def forced_outcome(transform, source: bytes, options: Options):
    """(changed?, findings) of running `transform` whatever its byte test says."""
    try:
        module = cst.parse_module(source)
    except (cst.ParserSyntaxError, RecursionError, UnicodeDecodeError, LookupError, SyntaxError):
        return False, []
    imports = ImportMap.from_module(module)
    if not transform.concerns(imports, options):
        return False, []
    result = transform.apply(module, imports, options)
    return result.module.code != module.code, list(result.findings)


CORPORA = {
    "fixtures": fixture_files,
    "torch": lambda: framework_files("torch", b"torch"),
    "tensorflow": lambda: framework_files("tensorflow", b"tensorflow"),
}


@pytest.mark.parametrize("corpus", sorted(CORPORA))
def test_rejected_files_would_not_have_been_touched(corpus):
    files = CORPORA[corpus]()
    if corpus == "fixtures":
        assert len(files) >= 20, "the fixtures are part of this check"
    rejected = 0
    for path in files:
        source = path.read_bytes()
        for options in OPTION_SETS:
            for transform in ALL_TRANSFORMS:
                if transform.may_apply(source, options):
                    continue
                rejected += 1
                changed, findings = forced_outcome(transform, source, options)
                assert not changed, f"{transform.name} would change {path} but its may_apply said no"
                assert findings == [], (
                    f"{transform.name} would report {[f.code for f in findings]} on {path} but its may_apply said no"
                )
    assert rejected > 0, "nothing was rejected: the check checked nothing"
