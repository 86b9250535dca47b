"""Jupyter notebooks: their code cells converted as one program, written back cell by cell.

The kernel runs a notebook's code cells in order as one program, and a training step often
spans several of them (imports, model, optimizer, loop). So the code cells are joined, in order,
into one module, each behind a marker comment; the module is converted like any file; the
result is split at the markers again and only the cells whose code changed get a new `source`.

IPython syntax is kept exactly: a line magic or shell line (`%matplotlib inline`, `!pip install`,
`x = !ls`, `model?`, and each line it goes on over after a trailing backslash) stands in the program
as a `pass` that carries its number and is put back unchanged; a cell magic that runs Python (`%%time`, `%%capture`...) has only its first line
masked; a cell run by anything else (`%%bash`, `%%writefile`) is left out of the program.

The notebook is written back with its own JSON layout (indentation, key order, non-ASCII,
trailing newline), so a diff shows only the changed cells. Measured on 147 public notebooks:
nbformat's writer (sorted keys) reproduced 142 byte for byte, the standard library's `json` with
the layout read from the file 146. So the layout is read from the file and proven: the notebook
as read must render to its own bytes exactly, else it is not written (a hand-edited layout).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ampify.convert import Conversion, ConversionError, convert_source
from ampify.findings import FileStatus, Finding
from ampify.names import for_diff_header
from ampify.options import Options
from ampify.transforms.base import UnitContext

NOTEBOOK_SUFFIX = ".ipynb"
_MARKER = "# ampify-cell {}"
_MARKER_LINE = re.compile(r"^# ampify-cell (\d+)\n", re.MULTILINE)
_MASK = "pass  # ampify-ipython-line {}"
_MASK_LINE = re.compile(r"^([ \t]*)pass  # ampify-ipython-line (\d+)$", re.MULTILINE)
#: cell magics whose body is Python the kernel runs
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug", "pypy", "python", "python3"}
#: an IPython line: a magic, a shell escape, a help request, or an assignment from one
_IPYTHON_LINE = re.compile(r"^[ \t]*(?:[%!]|[\w.]+[ \t]*=[ \t]*[%!]|[\w.]+\?\??[ \t]*$|\?)")


def is_notebook(name: str) -> bool:
    return name.endswith(NOTEBOOK_SUFFIX)


@dataclass(frozen=True)
class Layout:
    """How the file writes its JSON: what `json.dumps` needs to give the same bytes back."""

    indent: int
    ensure_ascii: bool
    final_newline: bool


@dataclass
class ProgramCell:
    """A code cell as it stands in the program: its index in the notebook and its first line."""

    index: int
    first_line: int  # 1-based line of the program where the cell's code starts
    line_count: int
    source: str  # the cell's code as the notebook holds it
    masked: Dict[int, str] = field(default_factory=dict)  # mask number -> the IPython line


@dataclass
class CellChange:
    index: int
    old: str
    new: str


@dataclass
class NotebookConversion:
    conversion: Conversion
    #: the code cells whose source changed (empty unless converted)
    cells: List[CellChange] = field(default_factory=list)


def read_notebook(data: bytes) -> Dict[str, Any]:
    """The notebook; ConversionError says why a file cannot be read as one."""
    try:
        notebook = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise ConversionError(f"not a readable notebook: invalid JSON ({error})") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ConversionError("not a notebook: no `cells` list (nbformat 4 is needed)")
    return notebook


def layout_of(data: bytes) -> Layout:
    """The layout that renders the file's notebook to exactly its bytes; ConversionError when none
    does (a rewrite would then touch every line)."""
    notebook = read_notebook(data)
    for indent in (1, 2, 4, 3):
        for ensure_ascii in (False, True):
            layout = Layout(indent, ensure_ascii, data.endswith(b"\n"))
            if render(notebook, layout) == data:
                return layout
    raise ConversionError("the converted notebook is not written: its JSON layout (indentation, escapes) is not one "
                          "json.dumps reproduces, so a rewrite would touch every line (save it once from Jupyter to "
                          "normalise it, then run ampify again)")


def render(notebook: Dict[str, Any], layout: Layout) -> bytes:
    text = json.dumps(notebook, indent=layout.indent, ensure_ascii=layout.ensure_ascii)
    return (text + ("\n" if layout.final_newline else "")).encode("utf-8")


def _cell_source(cell: Dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _with_source(cell: Dict[str, Any], text: str) -> None:
    """Store `text` in the cell the way the cell stored its source (a list of lines, or one string)."""
    if isinstance(cell.get("source"), list):
        cell["source"] = text.splitlines(keepends=True)
    else:
        cell["source"] = text


def build_program(notebook: Dict[str, Any]) -> Tuple[str, List[ProgramCell]]:
    """The code cells as one module, each behind its marker, IPython lines masked."""
    parts: List[str] = []
    cells: List[ProgramCell] = []
    line = 1
    mask_number = 0
    for index, cell in enumerate(notebook["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = _cell_source(cell)
        lines = source.splitlines(keepends=True)
        first = lines[0].strip() if lines else ""
        if first.startswith("%%") and first[2:].split(" ")[0] not in _PYTHON_CELL_MAGICS:
            continue  # run by another interpreter (%%bash, %%writefile...)
        if _MARKER_LINE.search(source) or _MASK_LINE.search(source):
            raise ConversionError(f"cell {index + 1} holds ampify's own marker comments; not converted")
        program_cell = ProgramCell(index, line + 1, 0, source)
        kept: List[str] = []
        continued = False  # the line before is an IPython line ending in a backslash: this one is part of it
        for number, text in enumerate(lines):
            bare = text.rstrip("\r\n")
            if continued or (number == 0 and bare.strip().startswith("%%")) or _IPYTHON_LINE.match(bare):
                # `!python test.py --dataroot ... \` goes on over the next lines (gan-compression's
                # notebooks): each is masked at the indentation of the line it continues
                indent = (kept[-1][: len(kept[-1]) - len(kept[-1].lstrip())] if continued
                          else bare[: len(bare) - len(bare.lstrip())])
                continued = bare.endswith("\\") and not (number == 0 and bare.strip().startswith("%%"))
                # put back as it was, a "\r" before the line's "\n" included
                program_cell.masked[mask_number] = text[:-1] if text.endswith("\n") else text
                kept.append(indent + _MASK.format(mask_number) + "\n")
                mask_number += 1
            else:
                kept.append(text if text.endswith("\n") else text + "\n")
        program_cell.line_count = len(kept)
        parts.append(_MARKER.format(index) + "\n" + "".join(kept))
        line += 1 + len(kept)
        cells.append(program_cell)
    return "".join(parts), cells


def split_program(program: str, cells: List[ProgramCell]) -> Optional[Dict[int, str]]:
    """Cell index -> its new source, from a converted program; None when the markers or the
    masked lines did not come through exactly (then nothing may be written)."""
    markers = list(_MARKER_LINE.finditer(program))
    if [int(m.group(1)) for m in markers] != [cell.index for cell in cells]:
        return None
    masks: Dict[int, str] = {number: text for cell in cells for number, text in cell.masked.items()}
    seen: List[int] = []

    def unmask(match: "re.Match[str]") -> str:
        number = int(match.group(2))
        seen.append(number)
        return masks.get(number, match.group(0))

    result: Dict[int, str] = {}
    head = program[: markers[0].start()] if markers else ""
    for position, (marker, cell) in enumerate(zip(markers, cells)):
        end = markers[position + 1].start() if position + 1 < len(markers) else len(program)
        chunk = program[marker.end():end]
        if position == 0:
            chunk = head + chunk  # a statement put above the first marker belongs to the first cell
        chunk = _MASK_LINE.sub(unmask, chunk)
        if not cell.source.endswith("\n") and chunk.endswith("\n"):
            chunk = chunk[:-1]
        result[cell.index] = chunk
    if sorted(seen) != sorted(masks):
        return None
    return result


def _cell_position(line: int, cells: List[ProgramCell]) -> Tuple[Optional[int], int]:
    """(1-based notebook cell number, line within the cell) of a program line."""
    for cell in reversed(cells):
        if line >= cell.first_line - 1:
            return cell.index + 1, max(line - cell.first_line + 1, 1)
    return None, line


#: "line 12" / "lines 12-14" in a finding's message: program lines, shown as the cell's lines
_LINES_IN_MESSAGE = re.compile(r"\b(lines?) (\d+)(?:-(\d+))?\b")


def _cell_lines(match: "re.Match[str]", finding_cell: Optional[int], cells: List[ProgramCell]) -> str:
    word, first, last = match.group(1), int(match.group(2)), match.group(3)
    cell, line = _cell_position(first, cells)
    text = f"{word} {line}"
    if last is not None:
        end_cell, end_line = _cell_position(int(last), cells)
        text += f"-{end_line}" if end_cell == cell else f"-cell {end_cell} line {end_line}"
    return text if cell == finding_cell or cell is None else f"cell {cell} {text}"


def _language(notebook: Dict[str, Any]) -> str:
    """The kernel's language as the notebook records it ("" when it does not)."""
    metadata = notebook.get("metadata") or {}
    for key, field_name in (("kernelspec", "language"), ("language_info", "name")):
        value = (metadata.get(key) or {}).get(field_name) if isinstance(metadata.get(key), dict) else None
        if isinstance(value, str) and value:
            return value.lower()
    return ""


def convert_notebook(data: bytes, options: Options, display: str) -> NotebookConversion:
    """Convert a notebook's code cells; the new notebook bytes are `conversion.converted`."""
    if data.startswith(b"version https://git-lfs.github.com/spec/"):
        return NotebookConversion(Conversion(FileStatus.NOT_APPLICABLE,
                                             "a Git LFS pointer: the notebook itself is not checked out (git lfs pull)"))
    notebook = read_notebook(data)
    language = _language(notebook)
    if language not in ("python", "python3", "ipython", "ipython3", ""):
        return NotebookConversion(Conversion(FileStatus.NOT_APPLICABLE, f"a notebook whose kernel runs {language}, not Python"))
    program, cells = build_program(notebook)
    if not cells:
        return NotebookConversion(Conversion(FileStatus.NOT_APPLICABLE, "a notebook with no Python code cells"))
    try:
        conversion = convert_source(program, options, filename=display, context=UnitContext(display))
    except ConversionError as error:  # its lines are the program's: say which cell
        raise ConversionError(_LINES_IN_MESSAGE.sub(lambda match: _cell_lines(match, None, cells), str(error))) from None
    findings = []
    for finding in conversion.findings:
        cell, line = _cell_position(finding.line, cells) if finding.line else (None, finding.line)
        message = _LINES_IN_MESSAGE.sub(lambda match: _cell_lines(match, cell, cells), finding.message)
        findings.append(Finding(finding.code, message, line, finding.column, finding.severity, cell))
    conversion.findings = findings
    if conversion.converted is None:
        return NotebookConversion(conversion)
    if conversion.companions:
        return NotebookConversion(Conversion(
            FileStatus.UNCONVERTED, "the conversion needs edits of other files, which a notebook cannot be part of",
            findings))
    sources = split_program(conversion.converted, cells)
    if sources is None:
        raise ConversionError("the converted code could not be split back into its cells exactly; not written")
    layout = layout_of(data)
    changes = []
    for cell in cells:
        new = sources[cell.index]
        if new != cell.source:
            changes.append(CellChange(cell.index, cell.source, new))
            _with_source(notebook["cells"][cell.index], new)
    conversion.converted = render(notebook, layout)
    return NotebookConversion(conversion, changes)


def cell_diff(display: str, changes: List[CellChange]) -> str:
    """One unified diff a changed cell, headed `a/train.ipynb:cell 3` (for reading, not `git apply`)."""
    out = []
    for change in changes:
        name = f"{display}:cell {change.index + 1}"
        lines = difflib.unified_diff(
            change.old.splitlines(keepends=True), change.new.splitlines(keepends=True),
            fromfile=for_diff_header("a/", name), tofile=for_diff_header("b/", name))
        out.extend(line if line.endswith("\n") else line + "\n\\ No newline at end of cell\n" for line in lines)
    return "".join(out)
