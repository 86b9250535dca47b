"""The one list of targets, in the order their transforms run, and the options they declare."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from ampify.options import Options
from ampify.transforms.base import Target, TargetOption, Transform
from ampify.transforms.gluon.target import GLUON_TARGET
from ampify.transforms.keras.target import KERAS_TARGET
from ampify.transforms.migrate.target import MIGRATE_TARGET
from ampify.transforms.tf1.target import TF1_TARGET
from ampify.transforms.torch.target import APEX_TARGET, NATIVE_TARGET

#: every target ampify has; a new target is a folder under transforms/ and one entry here
TARGETS: List[Target] = [TF1_TARGET, KERAS_TARGET, MIGRATE_TARGET, NATIVE_TARGET, APEX_TARGET, GLUON_TARGET]

#: every transform ampify has, whatever the options
ALL_TRANSFORMS: List[Transform] = [target.transform for target in TARGETS]


def transforms_for(options: Options) -> List[Transform]:
    """The transforms that run for these options (the PyTorch backend picks one of two)."""
    return [target.transform for target in TARGETS if target.runs_when(options)]


def declared_options() -> List[TargetOption]:
    """Every option the targets declare, once each (two targets may share one: `--backend`)."""
    seen: Dict[str, TargetOption] = {}
    for target in TARGETS:
        for option in target.options:
            seen.setdefault(option.field, option)
    return list(seen.values())


def options_from(flags: Mapping[str, Any], config: Mapping[str, Any]) -> Options:
    """Options from the command line's values (by field; None: not given) over `[tool.ampify]`'s
    (by field; absent: not set) over the defaults. A switch given on the command line turns its
    field off. Raises ValueError for a value outside an option's choices."""
    values: Dict[str, Any] = {}
    for option in declared_options():
        given = flags.get(option.field)
        if option.choices:
            value = given if given is not None else config.get(option.field)
        else:
            value = False if given else config.get(option.field)
        if value is not None:
            values[option.field] = value
    return Options(**values)
