"""What ``ckptgate check`` reports: the checks, their findings and results."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

__all__ = ["CHECK_DESCRIPTIONS", "CHECK_NAMES", "FINDING_CHECKS", "CheckFinding", "CheckResult"]

CHECK_NAMES = ("policy_tests", "opa_fmt", "regal_lint", "matrix_drift", "gate_drift", "evidence", "claims")
# Findings may also come from the matrix build that the last four checks share.
FINDING_CHECKS = (*CHECK_NAMES, "matrix_build", "widening")
# What each check is for: the SARIF rules' descriptions (docs/user-guide.md, "check findings").
CHECK_DESCRIPTIONS: dict[str, tuple[str, str]] = {
    "policy_tests": (
        "A Rego policy unit test failed.",
        "`opa test` ran the policy unit tests under policies/ and a test failed or raised an error.",
    ),
    "opa_fmt": (
        "A policy file is not formatted.",
        "`opa fmt --list` names this Rego file; run `opa fmt -w` on it and commit the result.",
    ),
    "regal_lint": (
        "Regal reported a policy lint violation.",
        "`regal lint` found a style or correctness problem in a Rego file.",
    ),
    "matrix_drift": (
        "matrix/ differs from a fresh build.",
        "Policies, attestations or fixtures changed without `ckptgate matrix build`; "
        "rebuild the matrix and commit matrix/.",
    ),
    "gate_drift": (
        "The generated gate differs from the retained qualifications.",
        "The policies' ckptgate/config/qualified/data.json (the producer releases each adapter and format "
        "passes) is not what the passing qualifications with retained evidence give; it was edited by hand "
        "or not regenerated. Run `ckptgate matrix build` and commit it.",
    ),
    "evidence": (
        "A supported matrix row lacks retained evidence.",
        "A supported row's attestation or result log is missing, or the log's sha256 is not the "
        "digest its attestation names.",
    ),
    "widening": (
        "A change widens the gate: a signer, exception, gate, freshness window or extra Rego.",
        "check --base REV found a change since REV that admits more than REV did; intake, decide and verify "
        "read these inputs at --base, so the change does not apply to its own check.",
    ),
    "claims": (
        "Documentation text makes a claim the evidence does not back.",
        "The claims lint found a sentence that claims more than the support matrix and the reference register back.",
    ),
    "matrix_build": (
        "The support matrix could not be built.",
        "The checks matrix_drift, evidence and claims need a matrix build, and it failed.",
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckFinding:
    """One failure: which check, a stable code, a message, and where (file/line) when known."""

    check: str
    code: str
    message: str
    file: str | None = None
    line: int | None = None
    detail: str | None = None
    severity: str = "error"
    #: (kind, justification) when a suppression covers it: SARIF ``inSource`` (an inline comment) or
    #: ``external`` (a configuration entry); a suppressed finding does not fail its check
    suppressed: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.check not in FINDING_CHECKS or not self.code or not self.message:
            raise ValueError(f"bad finding {self.check!r}/{self.code!r}")
        if self.severity not in ("error", "warning"):
            raise ValueError(f"bad severity {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "code": self.code,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "detail": self.detail,
            "severity": self.severity,
            "fingerprint": self.fingerprint,
            "suppressed": None
            if self.suppressed is None
            else {"kind": self.suppressed[0], "justification": self.suppressed[1]},
        }

    @property
    def fingerprint(self) -> str:
        """Stable across runs and line moves: the check, code, file and message, hashed."""
        key = "\0".join((self.check, self.code, self.file or "", self.message))
        return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    name: str
    passed: bool
    summary: str
    findings: tuple[CheckFinding, ...] = ()
    seconds: float = 0.0
