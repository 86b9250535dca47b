"""Defaults from the target repository's `pyproject.toml`, under `[tool.ampify]`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from ampify.registry import declared_options


class ConfigError(Exception):
    """`[tool.ampify]` is malformed; the message names the file and the key."""


@dataclass
class Config:
    """Settings from `[tool.ampify]`; None means "not set there"."""

    source: Optional[Path] = None
    exclude: List[str] = field(default_factory=list)
    jobs: Optional[int] = None
    #: the targets' own options (see TargetOption), by Options field; absent means not set
    target_options: Dict[str, Any] = field(default_factory=dict)
    respect_gitignore: Optional[bool] = None
    #: seconds, 0 for no limit
    file_timeout: Optional[float] = None
    #: megabytes, 0 for no limit
    max_file_size: Optional[float] = None
    #: rule codes or prefixes to report only / not to report
    select: List[str] = field(default_factory=list)
    ignore: List[str] = field(default_factory=list)


#: the keys of ampify itself; each target adds its own (TargetOption.config_key)
_RUN_KEYS = {
    "exclude": list,
    "jobs": int,
    "respect-gitignore": bool,
    "file-timeout": (int, float),
    "max-file-size": (int, float),
    "select": list,
    "ignore": list,
}


_TARGET_KEYS = {option.config_key: option for option in declared_options()}
_KEYS = {**_RUN_KEYS, **{key: (str if option.choices else bool) for key, option in _TARGET_KEYS.items()}}


def find_pyproject(paths: Sequence[Path]) -> Optional[Path]:
    """The nearest pyproject.toml at or above the first path given (as ruff and black do)."""
    if not paths:
        return None
    start = paths[0].resolve()
    folder = start if start.is_dir() else start.parent
    for candidate in [folder, *folder.parents]:
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            return pyproject
    return None


def load_config(paths: Sequence[Path]) -> Config:
    """Read `[tool.ampify]` from the nearest pyproject.toml; an empty Config when none."""
    pyproject = find_pyproject(paths)
    if pyproject is None:
        return Config()
    try:
        document = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: cannot read [tool.ampify]: {error}") from None
    table = document.get("tool", {}).get("ampify")
    if table is None:
        return Config(source=pyproject)
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.ampify] must be a table")
    config = Config(source=pyproject)
    for key, value in table.items():
        expected = _KEYS.get(key)
        if expected is None:
            raise ConfigError(
                f"{pyproject}: unknown key {key!r} in [tool.ampify] (known: {', '.join(sorted(_KEYS))})"
            )
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            kind = "number" if isinstance(expected, tuple) else expected.__name__
            raise ConfigError(f"{pyproject}: [tool.ampify] {key} must be a {kind}")
        if isinstance(expected, tuple) and value < 0:
            raise ConfigError(f"{pyproject}: [tool.ampify] {key} must be 0 (no limit) or more")
        if key in _TARGET_KEYS:
            option = _TARGET_KEYS[key]
            if option.choices and value not in option.choices:
                raise ConfigError(f"{pyproject}: [tool.ampify] {key} must be one of {', '.join(option.choices)}")
            config.target_options[option.field] = value
        else:
            setattr(config, key.replace("-", "_"), value)
    for key in ("exclude", "select", "ignore"):
        if not all(isinstance(item, str) for item in getattr(config, key)):
            raise ConfigError(f"{pyproject}: [tool.ampify] {key} must be a list of strings")
    if config.jobs is not None and config.jobs < 1:
        raise ConfigError(f"{pyproject}: [tool.ampify] jobs must be at least 1")
    return config
