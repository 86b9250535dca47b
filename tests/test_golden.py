"""Every golden fixture pair: exact expected output, compiles, findings as listed, idempotent."""

from __future__ import annotations

import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus
from golden import UPDATE, discover_cases, findings_rows, update_expected

CASES = discover_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden_case(case):
    source = case.input_path.read_bytes()
    conversion = convert_source(source, case.options, filename=str(case.input_path))
    output = conversion.converted if conversion.converted is not None else source
    if UPDATE:
        update_expected(case, output, conversion)

    assert output.decode() == case.expected_output().decode()
    compile(output, str(case.output_path), "exec", dont_inherit=True)

    expected_findings = case.expected_findings()
    if expected_findings is not None:
        assert findings_rows(conversion) == expected_findings

    again = convert_source(output, case.options, filename=str(case.output_path))
    assert again.converted is None, "a second run changed the file again (not idempotent)"
    if conversion.status is FileStatus.CHANGED:
        assert again.status is FileStatus.ALREADY_MIXED_PRECISION, again.reason


def test_every_fixture_group_has_cases():
    groups = {case.group for case in CASES}
    assert {"tf1", "torch_native", "torch_apex"} <= groups, groups


def test_no_input_is_copied_into_another_group():
    """One input, several option sets: `<case>.<variant>.options.json` (tests/golden.py)."""
    import hashlib

    seen = {}
    for case in CASES:
        if case.variant:
            continue
        digest = hashlib.sha256(case.input_path.read_bytes()).hexdigest()
        assert digest not in seen, f"{case.id} repeats {seen[digest]}: make it a variant instead"
        seen[digest] = case.id
    assert any(case.variant == "apex" for case in CASES) and any(case.variant == "bf16" for case in CASES)
