"""Training loops a framework owns: set the framework's own mixed precision switch.

- `accelerate.Accelerator(...)`            -> `mixed_precision="fp16"` / `"bf16"`
- Lightning `Trainer(...)`                 -> `precision="16-mixed"` / `"bf16-mixed"`
- `transformers.TrainingArguments(...)`    -> `fp16=True` / `bf16=True` (also Seq2SeqTrainingArguments)

A call that already sets the switch keeps it, whatever it says (the script's author chose); a call
that passes `**kwargs` may set it there, so it is reported, not changed. Nothing else in the
file is touched: the framework scales the loss and autocasts its own loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import libcst as cst

from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.torch import statements as statements


@dataclass(frozen=True)
class Switch:
    """One framework's switch: which constructors carry it, its keyword(s), its values."""

    framework: str
    constructors: Tuple[str, ...]
    keyword: str
    float16: str
    bfloat16: str
    #: keywords that, when present, already decide the precision
    deciding: Tuple[str, ...]


SWITCHES = (
    Switch("Accelerate", ("accelerate.Accelerator", "accelerate.accelerator.Accelerator"),
           "mixed_precision", '"fp16"', '"bf16"', ("mixed_precision",)),
    Switch("Lightning", ("lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer",
                         "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.trainer.trainer.Trainer"),
           "precision", '"16-mixed"', '"bf16-mixed"', ("precision",)),
    Switch("Hugging Face Trainer", ("transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments",
                                    "transformers.training_args.TrainingArguments"),
           "fp16", "True", "True", ("fp16", "bf16", "half_precision_backend")),
)

#: the constructor names, for the cheap tests before the parse
CONSTRUCTOR_NAMES = frozenset(name.rsplit(".", 1)[-1] for switch in SWITCHES for name in switch.constructors)


@dataclass
class SwitchSite:
    """A framework constructor call, and what to do with it."""

    switch: Switch
    call: cst.Call
    #: "set" (add the keyword), "kept" (already decided by the script), "unknown" (`**kwargs`)
    action: str
    existing: str = ""


#: the packages those constructors come from: a module that imports none of them has no site
_FRAMEWORK_PACKAGES = frozenset(name.split(".")[0] for switch in SWITCHES for name in switch.constructors)


def framework_switch_sites(module: cst.Module, imports: ImportMap) -> List[SwitchSite]:
    """Every constructor call of a framework that owns the training loop."""
    if not any(imports.uses(package) for package in _FRAMEWORK_PACKAGES):
        return []  # no call can resolve to one of them: skip the walk over every call
    sites = []
    for call in statements.calls_within(module):
        qualified = imports.resolve(call.func)
        if qualified is None:
            continue
        switch = next((s for s in SWITCHES if qualified in s.constructors), None)
        if switch is None:
            continue
        given = {arg.keyword.value: arg for arg in call.args if arg.keyword is not None}
        deciding = [given[name] for name in switch.deciding if name in given]
        if deciding:
            existing = ", ".join(f"{arg.keyword.value}={statements.code_of(arg.value)}" for arg in deciding)
            sites.append(SwitchSite(switch, call, "kept", existing))
        elif any(arg.star == "**" for arg in call.args):
            sites.append(SwitchSite(switch, call, "unknown"))
        else:
            sites.append(SwitchSite(switch, call, "set"))
    return sites


def switch_keyword(site: SwitchSite, dtype: str) -> Tuple[str, str]:
    """(keyword, value) to add for `dtype` ("float16" / "bfloat16")."""
    switch = site.switch
    if switch.framework == "Hugging Face Trainer":
        return ("fp16" if dtype == "float16" else "bf16"), "True"
    return switch.keyword, switch.float16 if dtype == "float16" else switch.bfloat16


def may_use_a_framework_switch(source: bytes) -> bool:
    """Byte test: could the file construct one of the frameworks above?"""
    return any(name.encode() + b"(" in source for name in CONSTRUCTOR_NAMES)


def describe(site: SwitchSite, keyword: Optional[str] = None, value: Optional[str] = None) -> str:
    name = site.switch.constructors[0].rsplit(".", 1)[-1]
    if site.action == "set":
        return f"{site.switch.framework} owns the training loop: {name}(..., {keyword}={value}) turns its mixed precision on"
    if site.action == "kept":
        return f"{name}({site.existing}) already decides the precision; left as the script sets it"
    return (
        f"{name}(**...) may set the precision in its keyword arguments, which ampify cannot see; nothing changed: "
        f"pass {site.switch.keyword}= explicitly, or set it in those arguments"
    )
