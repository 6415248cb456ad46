"""The one error root of ckptgate, its subsystem subclasses and the stable exit codes.

Every failure that reaches a user is an :class:`Error` with a stable ``code`` (a dotted,
lower-case string such as ``input.safetensors.offsets_gap``), a plain-words message, and
``diagnostics()`` advice on what to do next.  Only the CLI turns an error into an exit: it
prints the message (or, with ``--json``, :meth:`Error.to_json`) and exits with
:attr:`Error.exit_code`.  No traceback ever reaches the user.

Exit codes are part of the public interface and never change meaning:

====  =====================  ==========================================================
code  name                   meaning
====  =====================  ==========================================================
0     OK                     success; for ``intake``, the decision was allow and DST was published
1     INTERNAL               a bug in ckptgate; nothing was published
2     USAGE                  bad command-line usage
3     DENIED                 the policy decided deny (or the decision was missing/malformed: fail closed)
4     INPUT_REJECTED         the input is malformed or unsafe to read (inspection refused it)
5     VERIFICATION_FAILED    a signature, digest or attestation did not verify
6     ENGINE_UNAVAILABLE     the policy engine could not be started or reached (fail closed: deny)
7     RUNTIME_FAILED         a contained loader or the consolidation runtime failed; nothing was published
129   HANGUP                 SIGHUP arrived before the publishing rename; nothing was published
130   INTERRUPTED            SIGINT (Ctrl-C) arrived before the publishing rename; nothing was published
143   TERMINATED             SIGTERM arrived before the publishing rename; nothing was published
====  =====================  ==========================================================

129, 130 and 143 are ``128 + signal``, as a shell reports a process that a signal ended: the run
was stopped cleanly (the staging directory removed, the contained worker and OPA stopped).  A
signal that arrives after the rename finds the publication complete: the run reports it as
published and exits 0 (:mod:`ckptgate.interrupts`).  A closed stdout (``| head -1``) never
changes the exit code.
"""

from __future__ import annotations

import enum
import signal
from typing import Any


class ExitCode(enum.IntEnum):
    """Stable, documented process exit codes."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    DENIED = 3
    INPUT_REJECTED = 4
    VERIFICATION_FAILED = 5
    ENGINE_UNAVAILABLE = 6
    RUNTIME_FAILED = 7
    HANGUP = 129
    INTERRUPTED = 130
    TERMINATED = 143


class Error(Exception):
    """Root of every ckptgate error.

    :param code: stable machine-readable code, dotted and lower-case.
    :param message: what went wrong, in plain words.
    :param evidence: JSON-serialisable facts that support the message (paths, offsets, digests).
    :param reasons: the policy's object-shaped reasons, when a policy decision stands behind the error.
    """

    exit_code: ExitCode = ExitCode.INTERNAL
    default_advice: str = "This is a bug in ckptgate; please report it with the --json output."

    def __init__(
        self,
        code: str,
        message: str,
        *,
        evidence: dict[str, Any] | None = None,
        advice: str | None = None,
        reasons: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.evidence = dict(evidence or {})
        self.reasons = list(reasons or [])
        self._advice = advice

    def diagnostics(self) -> str:
        """Advice on what to do next, not just what broke."""
        return self._advice or self.default_advice

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.code,
                "kind": type(self).__name__,
                "message": self.message,
                "evidence": self.evidence,
                "advice": self.diagnostics(),
                "exit_code": int(self.exit_code),
                "reasons": self.reasons,
            }
        }

    def __str__(self) -> str:  # pragma: no cover - trivial
        return f"{self.code}: {self.message}"


class UsageError(Error):
    exit_code = ExitCode.USAGE
    default_advice = "Run the command with --help to see its arguments."


class ConfigError(UsageError):
    """The repository configuration (``ckptgate.config``) is unreadable, not TOML, or does not match the schema."""

    default_advice = "Fix the configuration file it names; `ckptgate init` in an empty repository shows the keys."


class InputRejected(Error):
    """The checkpoint (or another input file) is malformed or unsafe to read."""

    exit_code = ExitCode.INPUT_REJECTED
    default_advice = (
        "The input was refused before anything in it was loaded or executed. "
        "Run `ckptgate inspect PATH` to see every finding; obtain the checkpoint again "
        "from its producer if it should have been valid."
    )


class VerificationError(Error):
    """A signature, digest, certificate or attestation failed verification."""

    exit_code = ExitCode.VERIFICATION_FAILED
    default_advice = (
        "Do not trust this evidence. `ckptgate attest show FILE` shows an attestation's subjects and signer: "
        "compare the subject with the digest `ckptgate inspect SRC --digest` measures, and the signer with "
        "the trust data this run used (--trust FILE, else the bundled trust data)."
    )


class PolicyDenied(Error):
    """The policy decided deny.  ``reasons`` are the policy's object-shaped reasons."""

    exit_code = ExitCode.DENIED
    default_advice = "Run `ckptgate explain` with the same arguments to see the evidence behind each reason."


class EngineUnavailable(Error):
    """The policy engine could not be started, reached, or did not answer in time (deny)."""

    exit_code = ExitCode.ENGINE_UNAVAILABLE
    default_advice = (
        "The decision is deny because no valid decision arrived. Install the pinned OPA with "
        "`ckptgate engine install` (or name one with --opa-binary), or check that --opa-url is reachable."
    )


class Aborted(Error):
    """SIGHUP, SIGINT or SIGTERM stopped the run before its commit point; nothing was published.

    The exit code is ``128 + signal`` (129, 130, 143); the code names the signal
    (``interrupted.sigint``).  Raised in flight as :class:`ckptgate.interrupts.Interrupted`, which no
    ``except Exception`` catches; the CLI reports it as this error."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"interrupted.{name.lower()}",
            f"interrupted by {name}; nothing was published",
            evidence={"signal": name},
            advice="Nothing was published and the staging directory was removed; run the command again "
            "to take the checkpoint in.",
        )
        self.exit_code = ExitCode(128 + signum)  # HANGUP, INTERRUPTED or TERMINATED


class RuntimeFailure(Error):
    """A contained loader or the consolidation runtime failed; nothing was published."""

    exit_code = ExitCode.RUNTIME_FAILED
    default_advice = (
        "Nothing was published, and the receipt of a previous run is unchanged. The message and its evidence "
        "(whole with --json) name the step that failed; `ckptgate doctor` lists what the run left behind "
        "(`ckptgate doctor --clean` removes it)."
    )
