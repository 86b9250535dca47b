"""`ampify -`: one file from standard input, the result on standard output, as black and ruff do
for editors.

Standard output carries only the file (or, with `--diff`, the patch; with `--check`, nothing):
an editor replaces its buffer with it. Findings, statuses and the summary go to standard error.
`--stdin-filename` names the file for messages and lets ampify read the repository around it; a
change that needs edits of other files (a change set) cannot be written through a pipe, so the
input comes back unchanged with that reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ampify.convert import ConversionError, convert_source
from ampify.engine import Mode, unified_diff
from ampify.findings import FileResult, FileStatus
from ampify.options import Options
from ampify.report import apply_selection, exit_code, render_file, render_summary, summarize
from ampify.notebooks import convert_notebook, is_notebook
from ampify.repository import project_view
from ampify.rules import Selection
from ampify.transforms.base import UnitContext


def convert_stdin(filename: Path, options: Options, mode: Mode, selection: Selection) -> int:
    data = sys.stdin.buffer.read()
    display = str(filename)
    converted = None
    try:
        if is_notebook(filename.name):
            conversion = convert_notebook(data, options, display).conversion
        else:
            project = project_view(filename.resolve()) if filename.is_file() else None
            conversion = convert_source(data, options, filename=display, context=UnitContext(display, project))
        result = FileResult(display, conversion.status, conversion.reason, list(conversion.findings))
        converted = conversion.converted
        if conversion.companions:
            others = ", ".join(companion.display for companion in conversion.companions)
            result = FileResult(display, FileStatus.UNCONVERTED,
                                f"the change needs edits of {others} too, which standard output cannot carry: "
                                "run ampify on the repository", list(conversion.findings))
            converted = None
    except ConversionError as error:
        result = FileResult(display, FileStatus.FAILED, str(error))
    if not selection.everything:
        result = apply_selection(result, selection)
    if mode is Mode.WRITE:
        sys.stdout.buffer.write(converted if converted is not None else data)
        sys.stdout.buffer.flush()
    elif mode is Mode.DIFF and converted is not None:
        sys.stdout.write(unified_diff(display, data, converted))
    for line in render_file(result, conditional=mode is not Mode.WRITE):
        print(line, file=sys.stderr)
    print(render_summary(summarize([result]), wrote=mode is Mode.WRITE), file=sys.stderr)
    return exit_code([result], would_change_fails=mode is Mode.CHECK)

