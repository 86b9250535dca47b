"""Reading a project module that a training file's change set rewrites beside it (the model code it
imports: attention masks, Gram matrices, probability clamps, custom autograd Functions).

Each such fix is a companion of the training file's change (CompanionChange): both files are written
together or neither. The module must not train itself (its own conversion comes first), must be in
this run (ampify writes only what the user named), and must read and parse.
"""

from __future__ import annotations

from typing import Tuple, Union

import libcst as cst


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
