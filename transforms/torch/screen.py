"""The PyTorch transforms' screen (both backends): names a module must use for them to change
or report anything (see `Transform.screen`).

The analysis (`torch/training_loop.py`) finds work only through: a `.backward()` call (or
`torch.autograd.backward`), a `.step()` call (optimizer steps, closures, wrapper classes), a
hazard it reports on its own (BCELoss / binary_cross_entropy, `create_graph=`, `masked_fill`),
or a mixed precision API (the "already mixed precision" verdict: torch.amp, apex amp, FSDP's
`mixed_precision=` / `mp_policy=` policy), or a torch.optim optimizer built and handed to the
training function of another module (a driver: see driver.py). Unlike the byte test, the
screen looks at code only: `def backward` in an autograd Function, "step" in a docstring or a
`step` variable do not count. `tests/test_scale_prefilter.py` checks the screen on real files.
"""

from __future__ import annotations

from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.torch.names import (
    BCE_FUNCTIONS,
    BCE_LOSS_CLASSES,
    FSDP_POLICY_KEYWORDS,
    MIXED_PRECISION_PREFIXES,
    TORCH_OPTIMIZER_CLASS_NAMES,
)

#: calls that train, or that the analysis reports as hazards
_CALLS = frozenset({"backward", "step", "masked_fill", "masked_fill_"})
#: any name under a mixed precision prefix uses that prefix's last name; BCE as class or function
_NAMES = frozenset(
    name.rsplit(".", 1)[-1] for name in (*MIXED_PRECISION_PREFIXES, *BCE_LOSS_CLASSES, *BCE_FUNCTIONS)
) | {"create_graph", *FSDP_POLICY_KEYWORDS}

SCREENED_OUT_REASON = (
    "no backward(), optimizer step or mixed precision API in the code: no PyTorch training step here"
)


def may_concern_torch_training_code(facts: SourceFacts) -> bool:
    """Could a PyTorch transform change or report anything in a module with these facts?"""
    return bool(facts.call_names & _CALLS or facts.identifiers & _NAMES
                or facts.call_names & TORCH_OPTIMIZER_CLASS_NAMES)
