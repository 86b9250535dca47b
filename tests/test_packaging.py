"""The wheel installs `transforms/` as `ampify.transforms`, never as a top-level `transforms`:
training repositories have their own `transforms.py`, and `verify` runs inside them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_maps_transforms_under_ampify(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stderr
    [wheel] = tmp_path.glob("ampify-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"ampify", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    # every module of the transforms tree, the target folders included (a folder missing from
    # pyproject's package list would install nothing but work in an editable checkout)
    for module in (ROOT / "transforms").rglob("*.py"):
        assert f"ampify/transforms/{module.relative_to(ROOT / 'transforms').as_posix()}" in names, module
    assert "ampify/verify/probes/_ampify_probe_main.py" in names
    assert "ampify/py.typed" in names  # type checkers read ampify's annotations
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Classifier: Programming Language :: Python :: 3.11" in metadata
    assert "Classifier: License :: OSI Approved :: Apache Software License" in metadata
    # the license the project declares, its text shipped in the wheel
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names), names
    entry_points = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))
    ).decode()
    assert "ampify = ampify.cli:main" in entry_points
