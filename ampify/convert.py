"""One file's source in, converted source and findings out: parse, transform, check.

No file system here: this is what the engine runs per file and what tests and notebooks
call with a string.
"""

from __future__ import annotations

import codecs
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Tuple, Union

import libcst as cst

from ampify.findings import FileStatus, Finding, Severity, incomplete_codes
from ampify.options import Options
from ampify.legacy_syntax import legacy_syntax_hint, rename_async_arguments
from ampify.registry import transforms_for
from ampify.transforms.base import CompanionChange, Transform, TransformResult, UnitContext, Verdict
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.positions import remembered_sources
from ampify.transforms.kit.source_facts import SourceFacts


@dataclass
class Conversion:
    """The result of converting one source text."""

    status: FileStatus
    reason: str = ""
    findings: List[Finding] = field(default_factory=list)
    #: the converted source, in the same type (str or bytes) that was given; None unless changed
    converted: Optional[Union[str, bytes]] = None
    #: edits of other project modules that must be written with this one (one change set)
    companions: List[CompanionChange] = field(default_factory=list)


class ConversionError(Exception):
    """The source cannot be converted at all (it does not parse or decode); the message says why."""


def convert_source(
    source: Union[str, bytes],
    options: Optional[Options] = None,
    filename: str = "<source>",
    context: Optional[UnitContext] = None,
) -> Conversion:
    """Convert one module's source. Bytes keep their encoding, BOM and newlines exactly.
    `context` names the unit and its project (the engine gives both for a file)."""
    options = options or Options()
    context = context or UnitContext(filename)
    refuse_unreadable_input(source)
    transforms, reason, python_error, tree = _transforms_and_python_error(source, options)
    if not transforms:
        return Conversion(FileStatus.NOT_APPLICABLE, reason)
    if isinstance(python_error, SyntaxError) and legacy_syntax_hint(python_error.text):
        renamed = _with_non_blocking(source, options, filename, context)
        if renamed is not None:
            return renamed
        # Python 2 (`except IOError, e:`) or pre-3.7 code (`x.cuda(async=True)`) that LibCST may
        # still read: it does not run on this Python, so it is not converted; the reason says why
        raise ConversionError(describe_python_error(python_error))
    if python_error is not None and _too_deep_for_libcst(python_error):
        # LibCST's native parser may crash (a segfault) or run for minutes on input that CPython
        # already refuses for its depth: report CPython's reason without trying.
        raise ConversionError(describe_python_error(python_error))
    try:
        parsed = module = _parse(source)
    except ConversionError:
        if python_error is not None:
            raise ConversionError(describe_python_error(python_error)) from None  # the message users know
        raise
    imports = _with_project_star_imports(ImportMap.from_module(module), context)
    context = dataclasses.replace(context, source=source if isinstance(source, bytes) else source.encode("utf-8"),
                                  tree=tree)
    with remembered_sources() as remember:  # findings' lines: from the statements' lines of the stdlib parse
        remember(module, source, tree)
        results, module = _run_transforms(transforms, module, imports, options, context, remember)
    if isinstance(results, Conversion):
        return results  # a transform's internal error: the file stays as it was

    findings = sorted(
        (f for r in results for f in r.findings), key=lambda f: (f.line, f.column, f.code)
    )
    if module is parsed:
        # No transform rewrote anything, and LibCST gives back exactly the code it parsed:
        # generating the code again only to compare it would cost half a parse.
        status, reason = _agreeing_with_warnings(*_unchanged_status(results), findings)
        return Conversion(status, reason, findings)
    new_source: Union[str, bytes] = module.bytes if isinstance(source, bytes) else module.code
    new_source = _keep_final_newline(source, new_source, module.default_newline)
    if new_source != source:
        if python_error is not None:
            # Newer syntax than this interpreter reads (LibCST read it): the output cannot be
            # checked to compile, and nothing unchecked is ever written.
            raise ConversionError(
                f"{describe_python_error(python_error)}: written for a newer Python? ampify checks that its "
                "output compiles with the Python it runs on, so the file is left untouched"
            )
        _check_compiles(new_source, filename)
        companions = [companion for result in results for companion in result.companions]
        for companion in companions:
            _check_compiles(companion.new, companion.display)
        _check_one_edit_per_module(companions, filename)
        incomplete = incomplete_codes(findings)
        if incomplete:
            return Conversion(
                FileStatus.CHANGED_INCOMPLETE,
                f"part of the training stays float32 or unscaled ({', '.join(incomplete)}): see the warnings",
                findings, new_source, companions,
            )
        return Conversion(FileStatus.CHANGED, "", findings, new_source, companions)
    status, reason = _agreeing_with_warnings(*_unchanged_status(results), findings)
    return Conversion(status, reason, findings)


def _with_non_blocking(source, options, filename, context) -> Optional[Conversion]:
    """The conversion of a file that is invalid only for PyTorch 0.3's `.cuda(async=True)`: the
    argument renamed `non_blocking=True` (legacy_syntax.rename_async_arguments), when the renamed
    file compiles and ampify changes it; None otherwise (the file is reported as before)."""
    renamed = rename_async_arguments(source)
    if renamed is None:
        return None
    new_source, lines = renamed
    try:
        compile(new_source, filename, "exec")
    except SyntaxError as error:
        if legacy_syntax_hint(error.text):  # more old syntax than the rename: that is what to fix
            raise ConversionError(describe_python_error(error)) from None
        return None
    except ValueError:
        return None
    conversion = convert_source(new_source, options, filename, context)
    if conversion.converted is None:
        if conversion.status in (FileStatus.NOT_APPLICABLE, FileStatus.ALREADY_MIXED_PRECISION):
            # an evaluation script of the same repository (DARTS' test.py): nothing to convert, and
            # nothing written; the old spelling is said, not renamed
            conversion.reason += ("; its PyTorch 0.3 `async=` arguments (line " + ", ".join(map(str, lines))
                                  + ") are not valid Python 3.7 or later: rename them `non_blocking=` (ampify does "
                                  "so only in files it converts)")
            return conversion
        if conversion.status is FileStatus.UNCONVERTED:
            # what blocks the conversion is what the user must act on: the rename would come with it
            conversion.reason += ("; the file's PyTorch 0.3 `async=` arguments (line " + ", ".join(map(str, lines))
                                  + ") would be renamed `non_blocking=` with the conversion")
            return conversion
        return None
    conversion.findings[:] = sorted(
        [*conversion.findings, *(Finding("AMP002", "`async=` renamed `non_blocking=` (PyTorch 0.4's name for it; "
                                                   "`async` is a keyword since Python 3.7)", line, 0, Severity.INFO)
                                 for line in lines)],
        key=lambda f: (f.line, f.column, f.code))
    return conversion


def _check_one_edit_per_module(companions, filename) -> None:
    """Two edits of one other module in a change set must have been made one on top of the other
    (the later from the earlier's result): writing both would keep the last one only, and the
    calls this file makes into the lost one would fail. Said, never written."""
    by_key = {}
    for companion in companions:
        earlier = by_key.get(companion.key)
        if earlier is not None and earlier.new != companion.new:
            raise ConversionError(
                f"two edits of {companion.display} for this file's change set could not be combined ({earlier.reason}; "
                f"{companion.reason}): the file is left untouched, please report it")
        by_key[companion.key] = companion


def _run_transforms(transforms, module, imports, options, context, remember):
    """Run each transform in turn: (their results, the last module), or the Conversion of a
    transform's internal error. A module a transform rewrote is parsed afresh for the next."""
    results: List[TransformResult] = []
    for index, transform in enumerate(transforms):
        if not transform.concerns(imports, options):
            continue
        try:
            result = transform.apply(module, imports, options, context)
        except Exception as error:
            # One policy for every target: a bug in a transform never costs a file or the run;
            # the whole file stays as it was (no half of a conversion) and the finding says why.
            return internal_error(transform, error), module
        results.append(result)
        if result.module is not module:
            module = result.module
            if index + 1 < len(transforms):
                # Analyses key nodes by identity (positions, parents), which needs a tree with
                # no shared nodes: hand the next transform a freshly parsed one.
                new_bytes = module.bytes
                module = cst.parse_module(new_bytes)
                remember(module, new_bytes)
                context = dataclasses.replace(context, source=new_bytes)
            else:
                context = dataclasses.replace(context, source=b"")  # not generated: unknown
            imports = _with_project_star_imports(ImportMap.from_module(module), context)

    return results, module


def internal_error(transform: Transform, error: Exception) -> Conversion:
    """The file left unchanged, "not converted", with the transform's `x00` error finding."""
    what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    finding = Finding(
        transform.internal_error_code,
        f"internal error in the {transform.name} transform ({what}); this file is left unchanged: "
        "convert it by hand, and please report it",
        0, 0, Severity.ERROR,
    )
    return Conversion(FileStatus.UNCONVERTED, f"internal error in the {transform.name} transform", [finding])


def _agreeing_with_warnings(status: FileStatus, reason: str, findings: List[Finding]):
    """A file that got a warning is never "not applicable": the warning says training code was
    found and left alone, so the status says so too (and the run exits 1)."""
    if status is FileStatus.NOT_APPLICABLE:
        warning = next((f for f in findings if f.severity is Severity.WARNING), None)
        if warning is not None:
            return FileStatus.UNCONVERTED, f"left unconverted: see the warning ({warning.code})"
    return status, reason


NO_TRAINING_CODE = "no TensorFlow, PyTorch or MXNet training code"


def transforms_that_may_apply(raw: bytes, options: Options) -> List[Transform]:
    """The transforms whose cheap byte test passes (the first of the two tests before parsing)."""
    return [t for t in transforms_for(options) if t.may_apply(raw, options)]


def transforms_to_run(source: Union[str, bytes], options: Options) -> Tuple[List[Transform], str]:
    """The transforms that need the LibCST parse, and when there are none, why the file is not
    applicable: first the byte tests, then the screens on the names the code uses (a stdlib
    `ast` parse, about a fifth of a LibCST parse). The benchmark uses it to know which files
    ampify really has to parse with LibCST.
    """
    transforms, reason, _, _ = _transforms_and_python_error(source, options)
    return transforms, reason


def _transforms_and_python_error(source, options):
    """`transforms_to_run`, plus the error this interpreter's parser raised when it could not
    read the file (then nothing is ruled out by the screens), and the stdlib tree it read."""
    raw = source if isinstance(source, bytes) else source.encode("utf-8")
    candidates = transforms_that_may_apply(raw, options)
    if not candidates:
        return [], NO_TRAINING_CODE, None, None
    facts, error = SourceFacts.read(source)
    if facts is None:
        return candidates, "", error, None
    selected = [t for t in candidates if t.screen(facts, options)]
    return selected, "" if selected else candidates[0].screened_out_reason, None, facts.tree


_UTF16_32_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _with_project_star_imports(imports: ImportMap, context: UnitContext) -> ImportMap:
    """`from utils import *` where utils.py is a project module that does `import torch`: the
    star import binds `torch` here too, as Python would."""
    if not imports.has_star_import or context.project is None:
        return imports
    for local, qualified in sorted(context.project.star_bound_imports().items()):
        if local not in imports.aliases:
            imports = imports.with_alias(local, qualified)
    return imports


def refuse_unreadable_input(source: Union[str, bytes]) -> None:
    """Input Python itself cannot read as source gets its own reason, before any other test:
    UTF-16/32 text (no byte test could see `torch` in it) and NUL bytes."""
    raw = source if isinstance(source, bytes) else source.encode("utf-8", errors="surrogatepass")
    if b"\0" not in raw:
        return
    for bom, name in _UTF16_32_BOMS:
        if raw.startswith(bom):
            raise ConversionError(
                f"encoded as {name} (byte order mark): Python reads source files as UTF-8 or the encoding "
                f"of a coding line, so this file cannot run as it is; save it as UTF-8 and run ampify again"
            )
    if raw.count(b"\0") * 4 >= len(raw):
        raise ConversionError(
            "looks UTF-16 or UTF-32 encoded (NUL bytes between the characters): Python reads source files "
            "as UTF-8 or the encoding of a coding line, so this file cannot run as it is"
        )
    offset = raw.index(b"\0")
    line = raw.count(b"\n", 0, offset) + 1
    raise ConversionError(f"the file contains a NUL byte (line {line}), which Python refuses to compile")


def describe_python_error(error: Exception) -> str:
    """Python's own message for a file it cannot compile, with its line."""
    version = "Python %d.%d" % sys.version_info[:2]
    if isinstance(error, SyntaxError):
        where = f"line {error.lineno}: " if error.lineno else ""
        if isinstance(error, UnicodeError) or "codec" in str(error.msg):
            return f"cannot decode the file ({where}{error.msg})"
        hint = legacy_syntax_hint(error.text)
        return f"not valid {version} ({where}{error.msg}{'; ' + hint if hint else ''})"
    if isinstance(error, RecursionError):
        return f"{version} cannot compile it: too deeply nested ({error}); file left untouched"
    if isinstance(error, MemoryError):
        return f"{version} ran out of memory compiling it; file left untouched"
    return f"{version} cannot compile it ({type(error).__name__}: {error})"


def _too_deep_for_libcst(error: Exception) -> bool:
    return isinstance(error, (RecursionError, MemoryError)) or (
        isinstance(error, SyntaxError) and "too many nested" in str(error.msg)
    )


def _keep_final_newline(source, new_source, newline):
    """LibCST drops the final line ending of a file whose lines end in a bare CR; put it back."""
    ending = b"\r" if isinstance(source, bytes) else "\r"
    if source.endswith(ending) and not new_source.endswith(ending) and newline == "\r":
        return new_source + ending
    return new_source


def _parse(source: Union[str, bytes]) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as error:
        # Only reached for input this interpreter compiles (the screen parsed it first): LibCST's
        # grammar lags behind CPython's in a few places, e.g. `(x): int = 1`.
        raise ConversionError(
            f"valid Python, but LibCST (the parser ampify rewrites with, keeping every comment and "
            f"space) cannot read it at line {error.raw_line}, column {error.raw_column + 1}; file left untouched"
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
