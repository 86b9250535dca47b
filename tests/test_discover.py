"""Discovery over trees with links, junk folders and unreadable folders (no conversion)."""

import os
from pathlib import Path

import pytest

from ampify.discover import discover


def _touch(root: Path, relative: str, text: str = "x = 1\n") -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_walk_order_links_and_junk(tmp_path):
    tree = tmp_path / "tree"
    for relative in ("b.py", "a.py", "notes.txt", "pkg/z.py", "pkg/sub/y.py", "pkg/sub/data.json",
                     "build/gen.py", "thing.egg-info/x.py", "aa/first.py"):
        _touch(tree, relative)
    outside = _touch(tmp_path / "outside", "far.py")
    (tree / "alias.py").symlink_to(tree / "pkg" / "z.py")  # same file twice: converted once
    (tree / "far_link.py").symlink_to(outside)
    (tree / "linked_dir").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tree / "dir_named.py").mkdir()  # a folder named *.py is not a file

    found = discover([tree], respect_gitignore=False)

    displays = [c.display for c in found.candidates]
    rel = [os.path.relpath(d, tree) for d in displays]
    # os.walk order: a folder's files (sorted), then its subfolders (sorted), depth first.
    # alias.py and pkg/z.py are one real file: it is listed once, under the name met first,
    # with its real path (a write replaces the file, never the link).
    assert rel == ["a.py", "alias.py", "b.py", "aa/first.py", "pkg/sub/y.py"]
    assert found.candidates[1].path == (tree / "pkg" / "z.py").resolve()
    assert found.candidates[0].path == tree / "a.py"
    skipped = {os.path.relpath(d, tree): reason for d, reason in found.skipped}
    assert skipped == {"far_link.py": "symlink points outside the tree, not followed"}


def test_link_to_in_tree_file_is_kept_when_the_target_is_excluded(tmp_path):
    tree = tmp_path / "tree"
    _touch(tree, "real/train.py")
    (tree / "train_link.py").symlink_to(tree / "real" / "train.py")
    found = discover([tree], excludes=["real/"], respect_gitignore=False)
    assert [(os.path.relpath(c.display, tree), c.path) for c in found.candidates] == [
        ("train_link.py", (tree / "real" / "train.py").resolve())
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_unreadable_folder_is_passed_over(tmp_path):
    tree = tmp_path / "tree"
    _touch(tree, "ok.py")
    locked = tree / "locked"
    _touch(tree, "locked/hidden.py")
    locked.chmod(0)
    try:
        found = discover([tree], respect_gitignore=False)
    finally:
        locked.chmod(0o755)
    assert [os.path.relpath(c.display, tree) for c in found.candidates] == ["ok.py"]


def test_exclude_patterns_raise_no_deprecation_warning_from_pathspec(tmp_path):
    """pathspec deprecated its 'gitwildmatch' name; ampify asks for 'gitignore' where it exists."""
    import warnings

    from ampify.discover import discover as discover_paths

    (tmp_path / "keep.py").write_text("x = 1\n")
    (tmp_path / "drop.py").write_text("x = 1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = discover_paths([tmp_path], ["drop.py"], respect_gitignore=False)
    assert [c.path.name for c in found.candidates] == ["keep.py"]


def test_python_scripts_without_an_extension_are_walked(tmp_path):
    """aitorzip/PyTorch-CycleGAN trains with `./train` (`#!/usr/bin/python3`, no .py): a folder
    walk that left it out would report the repository as having nothing to convert."""
    tree = tmp_path / "tree"
    _touch(tree, "train", "#!/usr/bin/python3\nimport torch\n")
    _touch(tree, "run", "#!/usr/bin/env python\nx = 1\n")
    _touch(tree, "build.sh", "#!/bin/bash\necho\n")
    _touch(tree, "Makefile", "all:\n\techo\n")
    _touch(tree, "LICENSE", "MIT\n")
    _touch(tree, "bin/serve", "#!/bin/sh\nexec python serve.py\n")  # a shell script that runs python
    _touch(tree, "notes.python", "#!/usr/bin/python3\n")  # has an extension: not a script without one
    (tree / "empty").write_bytes(b"")

    found = discover([tree], respect_gitignore=False)

    assert sorted(os.path.relpath(c.display, tree) for c in found.candidates) == ["run", "train"]
