"""Discovery and comparison of golden fixture cases, shared by the golden tests.

Layout (as TorchFix does it): `fixtures/<group>/<case>.in.py` is the input,
`<case>.out.py` the expected output (absent: the file must stay unchanged), and
`<case>.findings.txt` (optional) the expected status and findings, one `LINE:COL CODE` a row
after a first `status: <status>` row. `fixtures/<group>/options.json` (optional) holds the
Options for every case of the group.

One input, several option sets: `<case>.<variant>.options.json` beside the input adds a case
run with those options on top of the group's, expected in `<case>.<variant>.out.py` and
`<case>.<variant>.findings.txt` (the same input is never copied into another group).

Set AMPIFY_UPDATE_GOLDEN=1 to (re)write the expected files from the current output; then
read every changed file before committing it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from ampify.convert import Conversion
from ampify.options import Options

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
UPDATE = os.environ.get("AMPIFY_UPDATE_GOLDEN") == "1"


@dataclass
class GoldenCase:
    group: str
    name: str
    input_path: Path
    #: "" for the group's options, else the name in `<case>.<variant>.options.json`
    variant: str = ""

    @property
    def id(self) -> str:
        return f"{self.group}/{self.name}" + (f"[{self.variant}]" if self.variant else "")

    @property
    def _stem(self) -> str:
        return f"{self.name}.{self.variant}" if self.variant else self.name

    @property
    def output_path(self) -> Path:
        return self.input_path.with_name(f"{self._stem}.out.py")

    @property
    def findings_path(self) -> Path:
        return self.input_path.with_name(f"{self._stem}.findings.txt")

    @property
    def options(self) -> Options:
        settings = {}
        options_file = self.input_path.parent / "options.json"
        if options_file.exists():
            settings.update(json.loads(options_file.read_text()))
        if self.variant:
            settings.update(json.loads(self.input_path.with_name(f"{self._stem}.options.json").read_text()))
        return Options(**settings)

    def expected_output(self) -> bytes:
        if self.output_path.exists():
            return self.output_path.read_bytes()
        return self.input_path.read_bytes()

    def expected_findings(self) -> Optional[List[str]]:
        if not self.findings_path.exists():
            return None
        return [line for line in self.findings_path.read_text().splitlines() if line.strip()]


def discover_cases(group_prefix: str = "") -> List[GoldenCase]:
    cases = []
    for path in sorted(FIXTURES.glob("*/*.in.py")):
        group = path.parent.name
        if group_prefix and not group.startswith(group_prefix):
            continue
        name = path.name[: -len(".in.py")]
        cases.append(GoldenCase(group, name, path))
        for variant_file in sorted(path.parent.glob(f"{name}.*.options.json")):
            variant = variant_file.name[len(name) + 1 : -len(".options.json")]
            cases.append(GoldenCase(group, name, path, variant))
    return cases


def findings_rows(conversion: Conversion) -> List[str]:
    rows = [f"status: {conversion.status.value}"]
    rows += [f"{f.line}:{f.column} {f.code}" for f in conversion.findings]
    return rows


def update_expected(case: GoldenCase, output: bytes, conversion: Conversion) -> None:
    if output != case.input_path.read_bytes():
        case.output_path.write_bytes(output)
    elif case.output_path.exists():
        case.output_path.unlink()
    case.findings_path.write_text("\n".join(findings_rows(conversion)) + "\n")
