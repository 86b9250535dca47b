"""One file's source in, converted source and findings out: parse, transform, check.

No file system here: this is what the engine runs per file and what tests and notebooks
call with a string.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple, Union

import libcst as cst

from ampify.findings import FileStatus, Finding
from ampify.options import Options
from ampify.registry import transforms_for
from ampify.transforms.base import Transform, TransformResult, Verdict
from ampify.transforms.imports import ImportMap
from ampify.transforms.source_facts import SourceFacts


@dataclass
class Conversion:
    """The result of converting one source text."""

    status: FileStatus
    reason: str = ""
    findings: List[Finding] = field(default_factory=list)
    #: the converted source, in the same type (str or bytes) that was given; None unless changed
    converted: Optional[Union[str, bytes]] = None


class ConversionError(Exception):
    """The source cannot be converted at all (it does not parse or decode); the message says why."""


def convert_source(
    source: Union[str, bytes], options: Optional[Options] = None, filename: str = "<source>"
) -> Conversion:
    """Convert one module's source. Bytes keep their encoding, BOM and newlines exactly."""
    options = options or Options()
    transforms, reason = transforms_to_run(source, options)
    if not transforms:
        return Conversion(FileStatus.NOT_APPLICABLE, reason)

    parsed = module = _parse(source)
    imports = ImportMap.from_module(module)
    results: List[TransformResult] = []
    for index, transform in enumerate(transforms):
        if not transform.concerns(imports, options):
            continue
        result = transform.apply(module, imports, options)
        results.append(result)
        if result.module is not module:
            module = result.module
            if index + 1 < len(transforms):
                # Analyses key nodes by identity (positions, parents), which needs a tree with
                # no shared nodes: hand the next transform a freshly parsed one.
                module = cst.parse_module(module.bytes)
            imports = ImportMap.from_module(module)

    findings = sorted(
        (f for r in results for f in r.findings), key=lambda f: (f.line, f.column, f.code)
    )
    if module is parsed:
        # No transform rewrote anything, and LibCST gives back exactly the code it parsed:
        # generating the code again only to compare it would cost half a parse.
        status, reason = _unchanged_status(results)
        return Conversion(status, reason, findings)
    new_source: Union[str, bytes] = module.bytes if isinstance(source, bytes) else module.code
    if new_source != source:
        _check_compiles(new_source, filename)
        return Conversion(FileStatus.CHANGED, "", findings, new_source)
    status, reason = _unchanged_status(results)
    return Conversion(status, reason, findings)


NO_TRAINING_CODE = "no TensorFlow or PyTorch training code"


def transforms_that_may_apply(raw: bytes, options: Options) -> List[Transform]:
    """The transforms whose cheap byte test passes (the first of the two tests before parsing)."""
    return [t for t in transforms_for(options) if t.may_apply(raw, options)]


def transforms_to_run(source: Union[str, bytes], options: Options) -> Tuple[List[Transform], str]:
    """The transforms that need the LibCST parse, and when there are none, why the file is not
    applicable: first the byte tests, then the screens on the names the code uses (a stdlib
    `ast` parse, about a fifth of a LibCST parse). The benchmark uses it to know which files
    ampify really has to parse with LibCST.
    """
    raw = source if isinstance(source, bytes) else source.encode("utf-8")
    candidates = transforms_that_may_apply(raw, options)
    if not candidates:
        return [], NO_TRAINING_CODE
    facts = SourceFacts.from_source(source)
    if facts is None:
        return candidates, ""  # the stdlib parser cannot read it: rule nothing out
    selected = [t for t in candidates if t.screen(facts, options)]
    return selected, "" if selected else candidates[0].screened_out_reason


def _parse(source: Union[str, bytes]) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "syntax error"
        raise ConversionError(
            f"not valid Python 3 (line {error.raw_line}: {first_line})"
        ) from None
    except (UnicodeDecodeError, LookupError, SyntaxError) as error:
        raise ConversionError(f"cannot decode the file: {error}") from None


def _check_compiles(new_source: Union[str, bytes], filename: str) -> None:
    try:
        compile(new_source, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        # A transform produced code that does not compile: a bug in ampify. Never write it.
        raise ConversionError(f"ampify's output does not compile, file left untouched: {error}") from None


_PRECEDENCE = [
    (Verdict.UNCONVERTED, FileStatus.UNCONVERTED),
    (Verdict.ALREADY_MIXED_PRECISION, FileStatus.ALREADY_MIXED_PRECISION),
    (Verdict.NOT_APPLICABLE, FileStatus.NOT_APPLICABLE),
    (Verdict.NOTHING_TO_DO, FileStatus.NOT_APPLICABLE),
    (Verdict.CONVERTED, FileStatus.ALREADY_MIXED_PRECISION),
]


def _unchanged_status(results: List[TransformResult]):
    """The status of a file that no transform changed, and the reason the user is shown."""
    for verdict, status in _PRECEDENCE:
        for result in results:
            if result.verdict is verdict:
                return status, result.reason
    return FileStatus.NOT_APPLICABLE, NO_TRAINING_CODE
