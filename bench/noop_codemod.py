"""A LibCST codemod command that changes nothing: the baseline cost of LibCST's own runner.

`python -m libcst.tool codemod noop_codemod.NoopCommand TREE --no-format` still reads, parses,
visits and regenerates every file, which is what any LibCST codemod pays per file before its
own rules run. It never writes a file: LibCST writes back only files whose code changed.
"""

from __future__ import annotations

import libcst as cst
from libcst.codemod import VisitorBasedCodemodCommand


class NoopCommand(VisitorBasedCodemodCommand):
    DESCRIPTION = "Parse and regenerate every file, change nothing (benchmark baseline)."

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node
