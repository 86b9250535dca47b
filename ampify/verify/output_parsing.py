"""Evidence read from the script's own output: grappler's log line, torch's warnings, tracebacks."""
import re
from dataclasses import dataclass
from typing import List, Optional

# grappler's auto_mixed_precision pass, with or without the source path prefix older TF prints:
#   ... I tensorflow/core/grappler/optimizers/auto_mixed_precision.cc:1767] Converted 1240/9478 nodes ...
#   I0000 00:00:1796214958.248757    2103 auto_mixed_precision.cc:2259] Converted 22/192 nodes ...
GRAPPLER_CONVERTED = re.compile(
    r"auto_mixed_precision\.cc:\d+\]\s+Converted\s+(?P<converted>\d+)/(?P<total>\d+)\s+nodes\s+to\s+"
    r"(?P<dtype>\w+)\s+precision\s+using\s+(?P<casts>\d+)\s+cast"
)
GRAPPLER_NO_GPU = re.compile(r"No \(suitable\) GPUs detected, skipping auto_mixed_precision graph optimizer")

# torch/amp/autocast_mode.py and torch/amp/grad_scaler.py, worded as torch 2.x prints them.
AUTOCAST_DISABLED = re.compile(r"CUDA is not available[^\n]*Disabling autocast")
GRAD_SCALER_DISABLED = re.compile(r"GradScaler is enabled, but CUDA is not available")
APEX_OPT_LEVEL = re.compile(r"Selected optimization level (O\d)")

_TRACEBACK_START = "Traceback (most recent call last):"
# "ValueError: bad shape", "KeyboardInterrupt", "pkg.mod.CustomError: ..." (not log lines like "E0000 00:00...")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*|:)?$")


@dataclass(frozen=True)
class GrapplerConversion:
    """One "Converted N/M nodes to float16 precision using K cast(s)" line."""

    converted: int
    total: int
    dtype: str
    casts: int


def grappler_conversions(output: str) -> List[GrapplerConversion]:
    """Every conversion grappler's mixed precision pass logged, in order."""
    return [
        GrapplerConversion(int(m["converted"]), int(m["total"]), m["dtype"], int(m["casts"]))
        for m in GRAPPLER_CONVERTED.finditer(output)
    ]


def last_traceback_line(output: str) -> Optional[str]:
    """The exception line that ends the last traceback in `output` (e.g. "ValueError: bad shape")."""
    start = output.rfind(_TRACEBACK_START)
    if start < 0:
        return None
    for line in output[start:].splitlines()[1:]:
        if line and line[0] not in " \t" and _EXCEPTION_LINE.match(line):
            return line.strip()
    return None
