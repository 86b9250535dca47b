"""The outcome of verifying one script."""
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

VERIFIED = "verified"
NOT_ACTIVE = "not_active"
SCRIPT_FAILED = "script_failed"
CANNOT_VERIFY = "cannot_verify"

EXIT_CODES = {VERIFIED: 0, NOT_ACTIVE: 1, SCRIPT_FAILED: 2, CANNOT_VERIFY: 3}


@dataclass
class VerifyResult:
    """What `ampify verify` found for one script, with the evidence behind it."""

    script: str
    status: str
    framework: str
    backend: str
    verdict: str
    reason: Optional[str] = None
    evidence: Dict[str, Any] = field(default_factory=dict)
    elapsed: float = 0.0
    output: str = ""
    returncode: Optional[int] = None
    stopped_early: bool = False
    timed_out: bool = False
    command: List[str] = field(default_factory=list)
    #: what verify changed in the script's environment, and why (shown under the verdict)
    notes: List[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 verified, 1 mixed precision not active, 2 script failed, 3 cannot verify here."""
        return EXIT_CODES[self.status]

    def to_dict(self, include_output: bool = False) -> Dict[str, Any]:
        """A JSON-ready dictionary; the script's output only when asked for."""
        data = asdict(self)
        data["exit_code"] = self.exit_code
        if not include_output:
            del data["output"]
        return data
