"""Which framework and mixed precision backend a script uses, read from its text alone.

Nothing here imports TensorFlow, PyTorch or apex: ampify may live in an environment that has
none of them.
"""
import re
from pathlib import Path

TF1 = "tf1"
TORCH = "torch"
APEX = "apex"
UNKNOWN = "unknown"

_IMPORT_PATTERNS = {
    APEX: re.compile(r"^\s*(?:from\s+apex(?:\.\w+)*\s+import\b|import\s+apex\b)", re.MULTILINE),
    TORCH: re.compile(r"^\s*(?:from\s+torch(?:\.\w+)*\s+import\b|import\s+torch\b)", re.MULTILINE),
    TF1: re.compile(r"^\s*(?:from\s+tensorflow(?:\.\w+)*\s+import\b|import\s+tensorflow\b)", re.MULTILINE),
}
_APEX_AMP_USE = re.compile(r"\bamp\s*\.\s*initialize\s*\(|from\s+apex\s+import\s+[^\n]*\bamp\b|apex\.amp\b")
_TF1_REWRITE_USE = re.compile(r"enable_mixed_precision_graph_rewrite")


def read_script_text(script: Path) -> str:
    """The script's text; undecodable bytes are replaced, since only import lines matter here."""
    return Path(script).read_bytes().decode("utf-8", errors="replace")


def detect_backend(text: str) -> str:
    """Return "apex", "torch", "tf1" or "unknown" for a script's source text.

    apex wins over torch (an apex script imports both); a script importing both TensorFlow and
    torch is taken as TF1 only when it calls the TF1 graph rewrite.
    """
    imports = {name for name, pattern in _IMPORT_PATTERNS.items() if pattern.search(text)}
    if APEX in imports and _APEX_AMP_USE.search(text):
        return APEX
    if TF1 in imports and (TORCH not in imports or _TF1_REWRITE_USE.search(text)):
        return TF1
    if TORCH in imports:
        return TORCH
    return UNKNOWN
