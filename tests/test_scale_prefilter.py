"""The two tests before parsing are sound: when a transform's `may_apply` (bytes) or its
`screen` (names, read with the stdlib parser) says no, running the transform anyway changes
nothing and reports nothing.

`may_apply` is what keeps ampify fast on big trees (no LibCST parse for files that cannot
concern a transform), and a wrong "no" would be a silent false negative. So every transform
is forced through parse + imports + apply on files its tests reject: the fixtures (inputs
and expected outputs, all backends) and small real files that do import the framework. A file
the screen rejects must also keep the status it would have had: "not applicable" (never
"already mixed precision" or "unconverted").
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import libcst as cst
import pytest

from ampify.options import Options
from ampify.registry import ALL_TRANSFORMS
from ampify.transforms.base import Verdict
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.source_facts import SourceFacts
from installed_trees import compiles, installed_files

REPO = Path(__file__).resolve().parent.parent
PER_TREE = 15
MAX_BYTES = 30_000
OPTION_SETS = [Options(), Options(backend="apex"), Options(dtype="bfloat16")]


def fixture_files() -> List[Path]:
    """The fixtures this Python compiles: one that does not (PyTorch 0.3's `.cuda(async=True)`) is
    never screened, every transform reads it (the conversion renames the argument first)."""
    return sorted(path for path in (REPO / "fixtures").rglob("*.py") if compiles(path))


def framework_files(package: str, marker: bytes) -> List[Path]:
    """Small files of an installed package that mention the framework, in a fixed order."""
    return installed_files(
        package, lambda p: p.stat().st_size <= MAX_BYTES and marker in p.read_bytes(), PER_TREE
    )


def forced_outcome(transform, source: bytes, options: Options):
    """(changed?, findings, verdict) of running `transform` whatever its tests say."""
    try:
        module = cst.parse_module(source)
    except (cst.ParserSyntaxError, RecursionError, UnicodeDecodeError, LookupError, SyntaxError):
        return False, [], Verdict.NOT_APPLICABLE
    imports = ImportMap.from_module(module)
    if not transform.concerns(imports, options):
        return False, [], Verdict.NOT_APPLICABLE
    result = transform.apply(module, imports, options)
    return result.module.code != module.code, list(result.findings), result.verdict


def byte_test_passing_files(package: str) -> List[Path]:
    """Small files of an installed package that pass some transform's byte test: the ones the
    screen decides on."""

    def passes_a_byte_test(path: Path) -> bool:
        if path.stat().st_size > MAX_BYTES:
            return False
        source = path.read_bytes()
        return any(t.may_apply(source, o) for o in OPTION_SETS for t in ALL_TRANSFORMS)

    return installed_files(package, passes_a_byte_test, 2 * PER_TREE)


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
                changed, findings, _verdict = forced_outcome(transform, source, options)
                assert not changed, f"{transform.name} would change {path} but its may_apply said no"
                assert findings == [], (
                    f"{transform.name} would report {[f.code for f in findings]} on {path} but its may_apply said no"
                )
    assert rejected > 0, "nothing was rejected: the check checked nothing"


SCREEN_CORPORA = {
    "fixtures": fixture_files,
    "torch": lambda: byte_test_passing_files("torch"),
    "tensorflow": lambda: byte_test_passing_files("tensorflow"),
}


def byte_test_passes(files: List[Path]):
    """(path, transform, options, screen's answer) for every transform whose byte test passes on
    a file the stdlib parser reads."""
    for path in files:
        source = path.read_bytes()
        facts = SourceFacts.from_source(source)
        if facts is None:
            continue
        for options in OPTION_SETS:
            for transform in ALL_TRANSFORMS:
                if transform.may_apply(source, options):
                    yield path, transform, options, transform.screen(facts, options)


@pytest.mark.parametrize("corpus", sorted(SCREEN_CORPORA))
def test_files_the_screen_rejects_would_not_have_been_touched(corpus):
    screened_out = 0
    for path, transform, options, passed in byte_test_passes(SCREEN_CORPORA[corpus]()):
        if passed:
            continue
        screened_out += 1
        changed, findings, verdict = forced_outcome(transform, path.read_bytes(), options)
        assert not changed, f"{transform.name} would change {path} but its screen said no"
        assert findings == [], (
            f"{transform.name} would report {[f.code for f in findings]} on {path} but its screen said no"
        )
        assert verdict in (Verdict.NOT_APPLICABLE, Verdict.NOTHING_TO_DO), (
            f"{transform.name} would say {verdict.value!r} of {path} but its screen said no"
        )
    if corpus != "fixtures":
        # Library code that names the framework mostly holds no training step: the screen must
        # rule some of it out, or it is not doing its job.
        assert screened_out > 0, "the screen ruled nothing out: the check checked nothing"


def test_every_fixture_that_converts_passes_the_screen():
    """The screen lets through every fixture a transform changes or reports on (the converse
    of the check above, stated directly so a too-narrow screen fails with a clear message)."""
    checked = 0
    for path, transform, options, passed in byte_test_passes(fixture_files()):
        changed, findings, _verdict = forced_outcome(transform, path.read_bytes(), options)
        if changed or findings:
            assert passed, f"{transform.name}'s screen rejects {path}"
            checked += 1
    assert checked >= 20
