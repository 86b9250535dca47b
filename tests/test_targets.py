"""Targets as units: each target declares its transform, options, rule codes, verify target and
fixtures in one place (transforms/<target>/target.py), and everything else is derived from it."""

import subprocess
import sys
from pathlib import Path

import pytest

from ampify.config import ConfigError, load_config
from ampify.options import Options
from ampify.registry import TARGETS, declared_options, options_from, transforms_for
from ampify.rules import RULES
from ampify.verify.runner import PROBE_DIRECTORY
from ampify.verify.targets import VERIFY_TARGETS

ROOT = Path(__file__).resolve().parent.parent


#: targets whose scripts `ampify verify` cannot judge yet (README, "Limits worth knowing")
NOT_VERIFIED_YET = set()


def test_every_target_is_declared_whole():
    fixture_groups = {path.name for path in (ROOT / "fixtures").iterdir() if path.is_dir()}
    for target in TARGETS:
        assert target.transform.internal_error_code == target.rule_prefix + "00", target.name
        owned = [rule.code for rule in RULES if rule.code.startswith(target.rule_prefix)]
        assert len(owned) > 1, f"{target.name} owns no rule codes"
        assert target.fixtures in fixture_groups, f"{target.name}: fixtures/{target.fixtures} is missing"
        assert list((ROOT / "fixtures" / target.fixtures).glob("*.in.py")), target.name
        verify = VERIFY_TARGETS[target.verify]
        if target.verify == "unknown":
            # no verify evidence of its own yet (Keras): verify decides such scripts by what they import
            assert target.name in NOT_VERIFIED_YET, target.name
            continue
        assert (PROBE_DIRECTORY / f"{verify.probe}.py").is_file(), f"{target.name}: probe {verify.probe} missing"
    # every fixtures folder but verify's scripts, the golden repositories and the notebooks (a source
    # format every target converts, tests/test_notebooks.py) belongs to a target
    assert fixture_groups - {t.fixtures for t in TARGETS} == {"verify", "repositories", "notebooks"}


def test_the_backend_option_picks_one_pytorch_target():
    for backend in ("native", "apex"):
        names = {t.name for t in TARGETS if t.runs_when(Options(backend=backend))}
        assert names == {"tf1", "keras", "torch-migrate", f"torch-{backend}", "gluon"}
        assert [t.transform for t in TARGETS if t.runs_when(Options(backend=backend))] == transforms_for(Options(backend=backend))


def test_every_declared_option_has_its_flag_and_its_config_key(tmp_path):
    help_text = subprocess.run(
        [sys.executable, "-m", "ampify", "--help"], capture_output=True, text=True, env={"COLUMNS": "200", "PATH": ""}
    ).stdout
    for option in declared_options():
        assert option.flag in help_text, option.flag
        default = getattr(Options(), option.field)
        if option.choices:
            assert default in option.choices
            for choice in option.choices:
                assert choice in help_text
            other = next(choice for choice in option.choices if choice != default)
            value, expected = f'"{other}"', other
        else:
            value, expected = "false", False
        (tmp_path / "pyproject.toml").write_text(f"[tool.ampify]\n{option.config_key} = {value}\n")
        config = load_config([tmp_path])
        assert getattr(options_from({}, config.target_options), option.field) == expected, option.field
        if option.choices:
            (tmp_path / "pyproject.toml").write_text(f'[tool.ampify]\n{option.config_key} = "nonsense"\n')
            with pytest.raises(ConfigError, match=option.config_key):
                load_config([tmp_path])


def test_the_command_line_wins_over_the_config_and_the_config_over_the_defaults():
    config = {"dtype": "bfloat16", "backend": "apex", "tf_ignore_performance": False}
    options = options_from({"dtype": "float16", "backend": None, "tf_ignore_performance": False}, config)
    assert (options.dtype, options.backend, options.tf_ignore_performance) == ("float16", "apex", False)
    assert options_from({}, {}) == Options()
    with pytest.raises(ValueError):
        options_from({"dtype": "float64"}, {})
