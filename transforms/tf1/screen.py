"""The TF1 graph rewrite's screen: names a module must use for the rewrite to change or report
anything (see `Transform.screen`).

Each test mirrors one way the rewrite finds work, and is derived from the same tables, so a
name added there widens the screen too:

- an optimizer built or named: any `*Optimizer` name (TF1 classes, wrappers, foreign and
  file-defined subclasses), a Keras optimizer module, an optimizer class table or factory,
  `getattr(<train module>, name)`, a string naming an optimizer class;
- an optimizer built inside TensorFlow (optimize_loss, canned Estimators);
- `apply_gradients` (the tf.gradients analysis runs only when something is applied);
- a call named like an optimizer factory (`optimization.create_optimizer(...)`): the optimizer
  may be built by a helper of the project, which the rewrite then names;
- a mixed precision API, policy or env var (the "already mixed precision" verdict).
Without any of them the rewrite can only answer "not applicable" / "nothing to do", unchanged
and without findings; `tests/test_scale_prefilter.py` checks exactly that on real files.
"""

from __future__ import annotations

import re

from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.tf1.names import (
    KERAS_OPTIMIZER_PREFIXES,
    MIXED_PRECISION_IDENTIFIERS,
    MIXED_PRECISION_STRINGS,
    OPTIMIZER_BUILT_INSIDE_TF,
    TF1_OPTIMIZER_CLASS_FACTORIES,
    TF1_OPTIMIZER_CLASS_TABLES,
    TF1_OPTIMIZER_MODULES,
)


def _last_parts(qualified_names) -> frozenset:
    return frozenset(name.rstrip(".").rsplit(".", 1)[-1] for name in qualified_names)


#: a use of any of these names may build, pick or hand off an optimizer, or skip loss scaling
_OPTIMIZER_NAMES = (
    _last_parts(KERAS_OPTIMIZER_PREFIXES)
    | _last_parts(TF1_OPTIMIZER_CLASS_TABLES)
    | _last_parts(TF1_OPTIMIZER_CLASS_FACTORIES)
    | _last_parts(OPTIMIZER_BUILT_INSIDE_TF)
    | {"apply_gradients"}
)
#: `getattr(tf.train, name)(lr)`: the module's last name is used as well
_OPTIMIZER_MODULE_NAMES = _last_parts(TF1_OPTIMIZER_MODULES)
#: matches every string the survey takes for an optimizer class name, and more
_OPTIMIZER_CLASS_STRING = re.compile(r"Optimizer$")

SCREENED_OUT_REASON = (
    "no optimizer, apply_gradients or mixed precision API in the code: nothing for the TF1 graph rewrite"
)


def may_concern_tf1_graph_rewrite(facts: SourceFacts) -> bool:
    """Could the TF1 graph rewrite change or report anything in a module with these facts?"""
    if not facts.imports("tensorflow") and not (facts.star_import and {"tf", "train"} <= facts.identifiers):
        return False  # the rewrite looks only at modules that import tensorflow (or get `tf` from a star import)
    identifiers = facts.identifiers
    if identifiers & MIXED_PRECISION_IDENTIFIERS or facts.strings & MIXED_PRECISION_STRINGS:
        return True
    if any("mixed_precision" in name for name in identifiers):
        return True  # a policy function reached through a mixed_precision module
    if identifiers & _OPTIMIZER_NAMES:
        return True
    if any(name.endswith("Optimizer") for name in identifiers):
        return True
    if any("optimizer" in name.lower() for name in facts.call_names):
        return True  # `optimization.create_optimizer(...)`: a project helper may build it (see graph_rewrite)
    if "getattr" in facts.call_names and identifiers & _OPTIMIZER_MODULE_NAMES:
        return True
    return any(_OPTIMIZER_CLASS_STRING.search(value) for value in facts.strings)
