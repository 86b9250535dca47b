"""Which framework and mixed precision backend a script uses, read from its text alone.

Nothing here imports TensorFlow, PyTorch or apex: ampify may live in an environment that has
none of them.
"""
import re
from pathlib import Path

TF1 = "tf1"
KERAS = "keras"
TORCH = "torch"
APEX = "apex"
GLUON = "gluon"
UNKNOWN = "unknown"

_IMPORT_PATTERNS = {
    APEX: re.compile(r"^\s*(?:from\s+apex(?:\.\w+)*\s+import\b|import\s+apex\b)", re.MULTILINE),
    TORCH: re.compile(r"^\s*(?:from\s+torch(?:\.\w+)*\s+import\b|import\s+torch\b)", re.MULTILINE),
    TF1: re.compile(r"^\s*(?:from\s+tensorflow(?:\.\w+)*\s+import\b|import\s+tensorflow\b)", re.MULTILINE),
    GLUON: re.compile(r"^\s*(?:from\s+mxnet(?:\.\w+)*\s+import\b|import\s+mxnet\b)", re.MULTILINE),
}
_APEX_AMP_USE = re.compile(r"\bamp\s*\.\s*initialize\s*\(|from\s+apex\s+import\s+[^\n]*\bamp\b|apex\.amp\b")
_TF1_REWRITE_USE = re.compile(r"enable_mixed_precision_graph_rewrite")
#: TF1 graph code: a script that imports TensorFlow and shows none of these, but shows Keras, is
#: TF2/Keras code (it must not be run with TF_USE_LEGACY_KERAS=1, which would swap its Keras)
_TF1_MARKERS = re.compile(
    r"compat\.v1|\bSession\(|placeholder\(|\btrain\.\w*Optimizer\b|enable_mixed_precision_graph_rewrite|"
    r"\blayers\.(dense|conv2d|batch_normalization)\(|\bestimator\b|\bcontrib\b|disable_v2_behavior|"
    r"MonitoredTrainingSession|get_variable\("
)
_KERAS_MARKERS = re.compile(r"^\s*(?:import\s+(?:tf_)?keras\b|from\s+(?:tf_)?keras\b|from\s+tensorflow\s+import\s+keras\b)|\.keras\.|GradientTape", re.MULTILINE)


_KERAS_IMPORT = re.compile(r"^\s*(?:import\s+(?:tf_)?keras\b|from\s+(?:tf_)?keras(?:\.\w+)*\s+import\b)", re.MULTILINE)


def read_script_text(script: Path) -> str:
    """The script's text; undecodable bytes are replaced, since only import lines matter here."""
    return Path(script).read_bytes().decode("utf-8", errors="replace")


def detect_backend(text: str) -> str:
    """Return "apex", "torch", "tf1", "keras", "gluon" or "unknown" for a script's source text.

    apex wins over torch (an apex script imports both); a script importing both TensorFlow and
    torch is taken as TF1 only when it calls the TF1 graph rewrite; a TensorFlow script that uses
    Keras and no TF1 graph API is not TF1 ("unknown": the run decides).
    """
    imports = {name for name, pattern in _IMPORT_PATTERNS.items() if pattern.search(text)}
    if APEX in imports and _APEX_AMP_USE.search(text):
        return APEX
    if TF1 in imports and (TORCH not in imports or _TF1_REWRITE_USE.search(text)):
        if _KERAS_MARKERS.search(text) and not _TF1_MARKERS.search(text):
            return KERAS  # TF2/Keras: never run as TF1 (TF_USE_LEGACY_KERAS would swap its Keras)
        return TF1
    if TORCH not in imports and _KERAS_IMPORT.search(text):
        return KERAS
    if TORCH in imports:
        return TORCH
    if GLUON in imports:
        return GLUON
    return UNKNOWN
