"""Find the Python files to convert under the paths the user named.

Directories are walked recursively for `*.py`, Jupyter notebooks (`*.ipynb`) and Python scripts without an
extension (a `train` whose first line is `#!/usr/bin/env python3`); common junk folders are skipped; inside a git
checkout `.gitignore` is honoured (through `git ls-files`, which knows every ignore rule git
knows); `--exclude` globs use .gitignore syntax. Symlinks are never followed out of the tree,
and a file reached twice (through a link) is converted once.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Set, Tuple

import pathspec

#: pathspec's name for .gitignore patterns: "gitignore" in newer releases, "gitwildmatch" (deprecated there,
#: with a DeprecationWarning) before
try:
    pathspec.PathSpec.from_lines("gitignore", [])
    _GITIGNORE_PATTERNS = "gitignore"
except (LookupError, ValueError):
    _GITIGNORE_PATTERNS = "gitwildmatch"

from ampify.source_io import TEMP_SUFFIX, is_abandoned_temp_file

#: the files a folder walk converts: Python modules and Jupyter notebooks (their code cells)
SOURCE_SUFFIXES = (".py", ".ipynb")

#: folders never walked into (the user can still name a file inside one explicitly)
JUNK_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".venv", "venv", "site-packages", "build", "dist", "__pycache__",
        ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules", ".eggs",
        ".ipynb_checkpoints",
    }
)


@dataclass(frozen=True)
class Candidate:
    """A file to convert: where it really is, and how to show it to the user."""

    path: Path
    display: str


@dataclass
class Discovery:
    candidates: List[Candidate] = field(default_factory=list)
    #: (display path, reason) for entries that were seen but will not be read
    skipped: List[tuple] = field(default_factory=list)
    #: `*.py` files left out because .gitignore excludes them
    ignored_by_gitignore: int = 0
    #: temporary files of an ampify run that was killed before it could rename them
    abandoned_temp_files: List[Path] = field(default_factory=list)


def discover(
    paths: Sequence[Path], excludes: Sequence[str] = (), respect_gitignore: bool = True
) -> Discovery:
    """The files under `paths`, in a stable order, with the ones skipped and why."""
    exclude_spec = pathspec.PathSpec.from_lines(_GITIGNORE_PATTERNS, excludes) if excludes else None
    result = Discovery()
    seen: Set[Path] = set()
    for root in paths:
        if root.is_dir() and not root.is_symlink():
            base = root.resolve()
            for relative, is_link in _walk_python_files(root, respect_gitignore, result):
                if exclude_spec is not None and exclude_spec.match_file(relative):
                    continue
                # The walk does not enter symlinked folders, so a regular file's real path is
                # base/relative: no realpath (one lstat per path component) per file.
                _add(result, seen, root / relative, _display(root, relative), boundary=base,
                     known_regular_at=None if is_link else base / relative)
        elif root.is_dir():
            # A symlinked folder named on the command line is the user's explicit choice.
            for relative, _ in _walk_python_files(root, respect_gitignore, result):
                if exclude_spec is None or not exclude_spec.match_file(relative):
                    _add(result, seen, root / relative, _display(root, relative), boundary=root.resolve())
        else:
            # A file named explicitly is converted whatever its extension, but the
            # excludes still apply, as with ruff and black.
            if exclude_spec is not None and exclude_spec.match_file(str(root)):
                continue
            _add(result, seen, root, str(root), boundary=None)
    return result


def _display(root: Path, relative: str) -> str:
    return os.path.normpath(os.path.join(str(root), relative))


def _add(
    result: Discovery,
    seen: Set[Path],
    path: Path,
    display: str,
    boundary: Optional[Path],
    known_regular_at: Optional[Path] = None,
) -> None:
    """Add `path` once. `known_regular_at`: the walk saw a plain file (no link) whose real
    path is this, so no stat is needed; otherwise links are resolved and checked."""
    is_link = known_regular_at is None and path.is_symlink()
    if known_regular_at is not None:
        real = known_regular_at
    elif is_link:
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            result.skipped.append((display, "broken symlink or symlink loop"))
            return
        if boundary is not None and not _is_within(real, boundary):
            result.skipped.append((display, "symlink points outside the tree, not followed"))
            return
        if not real.is_file():
            result.skipped.append((display, "symlink to something that is not a file"))
            return
    else:
        real = path.resolve()
        if not path.exists():
            result.skipped.append((display, "no such file"))
            return
    if real in seen:
        return
    seen.add(real)
    result.candidates.append(Candidate(real if is_link else path, display))


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.relative_to(folder)
        return True
    except ValueError:
        return False


def _walk_python_files(root: Path, respect_gitignore: bool, result: Discovery) -> List[Tuple[str, bool]]:
    """(relative path, is a symlink) of the `*.py` and `*.ipynb` files under `root`, junk folders pruned,
    gitignore applied (the files it leaves out are counted in `result.ignored_by_gitignore`).

    Order and pruning are those of `os.walk(root, followlinks=False)` with sorted names; the
    directory entries already say which names are links, so regular files cost no stat."""
    tracked_or_unignored = _git_visible_files(root) if respect_gitignore else None
    found: List[Tuple[str, bool]] = []
    pending = [(str(root), "")]
    while pending:
        folder, rel_folder = pending.pop()
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue  # unreadable or vanished folder: os.walk skips it too
        subfolders = []
        for entry in entries:
            name = entry.name
            relative = name if not rel_folder else os.path.join(rel_folder, name)
            try:
                is_folder = entry.is_dir()  # follows links, as os.walk does when it sorts names
            except OSError:
                is_folder = False
            if is_folder:
                if not entry.is_symlink() and name not in JUNK_DIRS and not name.endswith(".egg-info"):
                    subfolders.append((entry.path, relative))
                continue
            if not name.endswith(SOURCE_SUFFIXES) and not _is_python_script(entry):
                if name.endswith(TEMP_SUFFIX):
                    _note_abandoned_temp_file(entry, result)
                continue
            if tracked_or_unignored is not None and relative not in tracked_or_unignored:
                result.ignored_by_gitignore += 1
                continue
            found.append((relative, entry.is_symlink()))
        pending.extend(reversed(subfolders))
    return found


#: how much of an extensionless file is read to find a `#!...python` first line
_SHEBANG_PEEK = 128


def _is_python_script(entry: os.DirEntry) -> bool:
    """An executable-style Python script with no extension (`train`, `run_experiment`): a plain
    file whose name has no dot and whose first line is a shebang naming python."""
    if "." in entry.name:
        return False
    try:
        if not entry.is_file(follow_symlinks=False):
            return False
        with open(entry.path, "rb") as handle:
            head = handle.read(_SHEBANG_PEEK)
    except OSError:
        return False
    first_line = head.split(b"\n", 1)[0]
    return first_line.startswith(b"#!") and b"python" in first_line


def _note_abandoned_temp_file(entry: os.DirEntry, result: Discovery) -> None:
    try:
        mtime = entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return
    if entry.is_file(follow_symlinks=False) and is_abandoned_temp_file(Path(entry.path), mtime, time.time()):
        result.abandoned_temp_files.append(Path(entry.path))


def _git_visible_files(root: Path) -> Optional[Set[str]]:
    """Files git does not ignore under `root` (relative to it), or None outside a checkout."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True, text=True, timeout=30,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        ignored_itself = subprocess.run(
            ["git", "-C", str(root), "check-ignore", "-q", "."], capture_output=True, timeout=30
        )
        if ignored_itself.returncode == 0:
            # The user named a folder git ignores as a whole (a pyenv's lib, a vendored copy):
            # that is an explicit request, so its contents are not filtered by .gitignore.
            return None
        listing = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            capture_output=True, timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if listing.returncode != 0:
        return None
    return set(_decode_git_paths(listing.stdout.split(b"\0")))


def _decode_git_paths(raw: Iterable[bytes]) -> Iterable[str]:
    for item in raw:
        if item:
            yield os.path.normpath(os.fsdecode(item))
