"""Errors of the evidence subsystem; all are :class:`ckptgate.errors.Error` subclasses."""

from __future__ import annotations

from typing import Any

from ckptgate.errors import Error, ExitCode, PolicyDenied


class EvidenceError(Error):
    """Evidence could not be produced or read (a usage problem: dirty tree, unknown fixture, bad repo)."""

    exit_code = ExitCode.USAGE
    default_advice = "Run the command from a clean checkout of the repository; see docs/user-guide.md."


class GitError(EvidenceError):
    """A git plumbing command failed or the directory is not a git work tree."""

    default_advice = (
        "Run the command inside a git work tree with at least one commit (`git log -1` shows it), or name "
        "one with --repo."
    )


class QualificationFailed(Error):
    """The adapter ran but failed, or its output did not equal the fixture's ground truth; the signed
    ``failed`` or ``error`` result and its log are stored before this is raised."""

    exit_code = ExitCode.RUNTIME_FAILED
    default_advice = (
        "The adapter's output differs from expected.safetensors; read the result log named in "
        "the evidence and fix the adapter before qualifying again."
    )


class CheckFailed(PolicyDenied):
    """``ckptgate check`` found at least one failing check (exit 3)."""

    default_advice = "Read each failing check's message; `ckptgate check --json` lists them with evidence."

    def __init__(
        self,
        code: str,
        message: str,
        *,
        failures: list[dict[str, Any]] | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(code, message, reasons=failures, evidence=evidence)
