"""Reading a project module that a training file's change set rewrites beside it (the model code it
imports: attention masks, Gram matrices, probability clamps, custom autograd Functions).

Each such fix is a companion of the training file's change (CompanionChange): both files are written
together or neither. The module must not train itself (its own conversion comes first), must be in
this run (ampify writes only what the user named), and must read and parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Tuple, Union

import libcst as cst

from ampify.findings import Finding, Severity
from ampify.transforms.base import CompanionChange


def read_companion(project, key: str, display: str, trains: bool,
                   verb: str = "rewrites") -> Union[Tuple[bytes, cst.Module], str]:
    """(source, parsed module) of the project module `key`, or the reason it cannot be rewritten
    beside the training file (`verb`: what ampify would do there, for the message)."""
    if trains:
        return (f"{display} has a training step of its own: convert it first (ampify {display}), then rerun ampify "
                "on this file")
    if not project.in_this_run(key):
        return (f"{display} is not in this run: run ampify on both files or on the repository, and ampify {verb} it "
                "there")
    source = project.source_of(key)
    if source is None:
        return f"{display} cannot be read"
    try:
        return source, cst.parse_module(source)
    except Exception as error:  # noqa: BLE001 - any parser failure is a reason, not a crash
        return f"{display} does not parse ({type(error).__name__})"


@dataclass
class ModuleRewrite:
    """One companion module rewritten: the new module, where its finding points, the finding's
    text, and the line the training file's report gives it (naming the module)."""

    module: cst.Module
    line: int
    text: str
    note: str
    column: int = 0


#: rewrite(key, display, source, parsed module): the rewrite; None when there is nothing to rewrite
#: (done already by the change set of another training file of this run); a str: why it cannot be
Rewriter = Callable[[str, str, bytes, cst.Module], Union[ModuleRewrite, str, None]]


def plan_companion_rewrites(project, here: str, modules: Iterable[Tuple[str, str, bool]], rewrite: Rewriter,
                            code: str, purpose: str, verb: str = "rewrites"
                            ) -> Tuple[List[CompanionChange], List[str], Optional[str]]:
    """The project modules (key, display, trains) the training module `here` imports, each
    rewritten by `rewrite` as a companion of this module's change (one change set). Returns
    (companions, one line per module for this module's report, None), or ([], [], the reason
    it cannot be done: the first module that cannot be read or rewritten). `purpose` ends the
    companion's own report line: "changed with train.py: <purpose>"."""
    companions: List[CompanionChange] = []
    notes: List[str] = []
    for key, display, trains in modules:
        read = read_companion(project, key, display, trains, verb)
        if isinstance(read, str):
            return [], [], read
        source, module = read
        rewritten = rewrite(key, display, source, module)
        if rewritten is None:
            continue
        if isinstance(rewritten, str):
            return [], [], rewritten
        companions.append(CompanionChange(
            key=key, display=display, old=source, new=rewritten.module.bytes,
            findings=[Finding(code, rewritten.text, rewritten.line, rewritten.column, Severity.INFO)],
            reason=f"changed with {here}: {purpose}",
        ))
        notes.append(rewritten.note)
    return companions, notes, None
