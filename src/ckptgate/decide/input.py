"""The one OPA input document, built by a typed builder (see ``docs/architecture.md``).

The builder takes the records of the earlier steps (anything with ``to_facts()``) and freezes
them into a :class:`PolicyInput`.  A verification failure enters only as a *rejected*
attestation with its error code: its statement never reaches policy.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ckptgate.errors import Error, UsageError
from ckptgate.verify.facts import rejection_facts
from ckptgate.verify.statement import iso_utc

ACTIONS = ("intake", "decide", "verify", "qualify")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_SELECT = re.compile(r"^(?=.{1,256}$)[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def check_commit(value: str, option: str = "--candidate-commit") -> str:
    """``value`` if it is a full commit id (40 lower-case hex), else a usage error naming ``option``."""
    if not _COMMIT.match(value):
        raise UsageError(
            "usage.request.commit",
            f"{option} must be 40 lower-case hex digits",
            advice=f"Give {option} the full commit id (`git rev-parse HEAD` prints it), not {value!r}.",
        )
    return value


class HasFacts(Protocol):
    def to_facts(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """What the user asked for."""

    action: str
    now: datetime
    candidate_commit: str | None = None
    target: str = "hf-sharded-safetensors"
    #: ``--select PREFIX``: the subtree of a training-state tree to write (policy decides the default)
    select: str | None = None

    def __post_init__(self) -> None:
        if self.select is not None and not _SELECT.match(self.select):
            raise UsageError(
                "usage.select.invalid",
                f"--select {self.select!r} is not a key prefix such as 'model' or 'app.model'",
                evidence={"select": self.select},
                advice="Give --select a dotted key prefix of the tree, such as --select model; "
                "`ckptgate inspect SRC --json` shows the tree's keys.",
            )
        if self.action not in ACTIONS:
            raise UsageError(
                "usage.request.action",
                f"unknown action {self.action!r}",
                advice=f"Give the request one of the actions {', '.join(ACTIONS)}, not {self.action!r}.",
            )
        if self.now.tzinfo is None:
            raise UsageError(
                "usage.request.naive_time",
                "the request time must be timezone-aware",
                advice=f"Give the request an aware time, such as `datetime.now(UTC)`, not {self.now.isoformat()}.",
            )
        if self.candidate_commit is not None:
            check_commit(self.candidate_commit)

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "now": iso_utc(self.now),
            "candidate_commit": self.candidate_commit,
            "target": self.target,
            **({"select": self.select} if self.select is not None else {}),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyInput:
    """The complete, immutable input document for one decision."""

    request: Request
    fixture: dict[str, Any]
    inspection: dict[str, Any]
    attestations: tuple[dict[str, Any], ...]
    rejected_attestations: tuple[dict[str, Any], ...]
    containment: dict[str, Any] | None
    offered_keys: tuple[dict[str, Any], ...] = ()
    """Public keys named on the command line (``--key``); policy decides what they may sign."""
    hf_mapping: dict[str, Any] | None = None
    """``intake --hf-config``: the declared family, the config manifest and its sha256, and the
    tensor-parallel degree the layout shows; policy decides which rows are qualified."""

    def __post_init__(self) -> None:
        if not _DIGEST.match(str(self.fixture.get("digest", ""))):
            raise ValueError("the fixture facts carry no sha256 digest")

    def to_json(self) -> dict[str, Any]:
        doc = {
            "request": self.request.to_json(),
            "fixture": self.fixture,
            "inspection": self.inspection,
            "attestations": list(self.attestations),
            "rejected_attestations": list(self.rejected_attestations),
            "containment": self.containment,
        }
        if self.offered_keys:
            doc["offered_keys"] = list(self.offered_keys)
        if self.hf_mapping is not None:
            doc["hf_mapping"] = self.hf_mapping
        return copy.deepcopy(doc)


class PolicyInputBuilder:
    """Collects facts in pipeline order, then :meth:`build` freezes them."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self._fixture: dict[str, Any] | None = None
        self._inspection: dict[str, Any] | None = None
        self._attestations: list[dict[str, Any]] = []
        self._rejected: list[dict[str, Any]] = []
        self._containment: dict[str, Any] | None = None
        self._offered: list[dict[str, Any]] = []
        self._hf_mapping: dict[str, Any] | None = None

    def offered_key(self, key: HasFacts) -> PolicyInputBuilder:
        self._offered.append(key.to_facts())
        return self

    def fixture(self, digest: HasFacts) -> PolicyInputBuilder:
        self._fixture = digest.to_facts()
        return self

    def inspection(self, inspection: HasFacts) -> PolicyInputBuilder:
        self._inspection = inspection.to_facts()
        return self

    def attestation(self, verified: HasFacts) -> PolicyInputBuilder:
        self._attestations.append(verified.to_facts())
        return self

    def rejected_attestation(self, source: str, error: Error) -> PolicyInputBuilder:
        self._rejected.append(rejection_facts(source, error))
        return self

    def containment(self, profile: HasFacts | None) -> PolicyInputBuilder:
        self._containment = profile.to_facts() if profile is not None else None
        return self

    def hf_mapping(self, facts: dict[str, Any]) -> PolicyInputBuilder:
        self._hf_mapping = facts
        return self

    def build(self) -> PolicyInput:
        if self._fixture is None or self._inspection is None:
            raise ValueError("a policy input needs the fixture digest and the inspection")
        return PolicyInput(
            request=self._request,
            fixture=self._fixture,
            inspection=self._inspection,
            attestations=tuple(self._attestations),
            rejected_attestations=tuple(self._rejected),
            containment=self._containment,
            offered_keys=tuple(self._offered),
            hf_mapping=self._hf_mapping,
        )


def now_utc() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
