"""The statement-only import walk of `ImportMap.from_module` finds exactly what a full LibCST
visit finds (the visit is kept here as the reference), on generated programs, on real stdlib
and torch files, and on imports nested in every kind of block."""

from __future__ import annotations

import sysconfig
import textwrap
import zlib
from pathlib import Path

import hypothesmith
import libcst as cst
from hypothesis import HealthCheck, assume, given, settings

from ampify.transforms.kit.imports import ImportMap, _ImportCollector


def reference(module: cst.Module) -> ImportMap:
    collector = _ImportCollector()
    module.visit(collector)
    return collector.result


def same(a: ImportMap, b: ImportMap) -> bool:
    return (a.aliases, a.modules, a.star_modules) == (b.aliases, b.modules, b.star_modules)


NESTED = textwrap.dedent(
    """\
    import a0
    if x:
        import a1
    elif y:
        import a2 as b2
    else:
        from a3 import c3
    try:
        import a4
    except ImportError:
        import a5
    else:
        from a6 import *
    finally:
        import a7.sub
    for i in range(2): import a8
    else:
        import a9
    while False:
        import a10
    else:
        import a11
    with open(f) as h:
        import a12
    class K:
        import a13
        def m(self):
            import a14; from a15 import d15 as e15
    async def g():
        async with h:
            import a16
        async for i in h:
            import a17
    match v:
        case 1:
            import a18
        case _:
            from . import local
            import a19
    import a1 as b2
    lambda: __import__("not_an_import")
    """
)


def test_imports_in_every_kind_of_block():
    module = cst.parse_module(NESTED)
    imports = ImportMap.from_module(module)
    assert same(imports, reference(module))
    assert {f"a{i}" for i in range(20) if i not in (3, 6, 15)} <= set(imports.aliases.values()) | imports.modules
    assert imports.aliases["b2"] == "a1"  # the later import wins, in source order
    assert imports.aliases["e15"] == "a15.d15" and imports.star_modules == {"a6"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=hypothesmith.from_grammar())
def test_same_as_a_full_visit_on_generated_programs(program):
    try:
        module = cst.parse_module(program)
    except (cst.ParserSyntaxError, RecursionError):
        assume(False)
    assert same(ImportMap.from_module(module), reference(module))


def test_same_as_a_full_visit_on_real_files():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in stdlib.glob("*.py")), key=lambda p: zlib.crc32(p.name.encode()))[:15]
    assert len(files) == 15
    for path in files:
        module = cst.parse_module(path.read_bytes())
        assert same(ImportMap.from_module(module), reference(module)), path
