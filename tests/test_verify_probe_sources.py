"""The probe files run inside the user's training interpreter: stdlib only, old Pythons, unique names."""
import ast
import sys

import pytest

from ampify.verify.runner import PROBE_DIRECTORY

PROBE_FILES = sorted(p for p in PROBE_DIRECTORY.glob("*.py") if p.name != "__init__.py")
ALLOWED_NON_STDLIB = {"torch", "tensorflow", "mxnet"}  # imported only inside functions, after the script did


@pytest.mark.parametrize("path", PROBE_FILES, ids=[p.name for p in PROBE_FILES])
def test_probe_file_is_stdlib_only_and_parses_as_python_3_6(path):
    assert path.name.startswith("_ampify_probe_")
    tree = ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 6))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [(node.module or "").split(".")[0]]
        else:
            continue
        for root in roots:
            assert root != "ampify", "%s imports ampify" % path.name
            assert (
                root in sys.stdlib_module_names or root.startswith("_ampify_probe_") or root in ALLOWED_NON_STDLIB
            ), "%s imports %s" % (path.name, root)


def test_framework_imports_happen_only_inside_functions():
    for path in PROBE_FILES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] in ALLOWED_NON_STDLIB for n in names), path.name
