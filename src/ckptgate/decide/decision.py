"""Strict parsing of policy decisions: anything but the exact decision shape is deny.

The shape (see ``docs/architecture.md``)::

    {"allow": bool, "plane": str | null, "permitted_loaders": [str], "required_controls": [str],
     "reasons": [{"code": str, "message": str, "evidence": object, "severity"?: str}],
     "refusal": null | "input" | "verification" | "policy", "companions"?: [str],
     "selection"?: null | {"prefix": str, "layout": str | null, "source": "request" | "policy",
                           "excluded": [str]}}

``companions`` names the pure-data files at the top of the checkpoint that travel to DST byte for
byte; without it none does (a missing list publishes less, never more), and a deny names none.
``refusal`` is what a deny stands for, decided by the policy, and it alone sets the exit code of
every command (:data:`REFUSAL_EXIT`).  ``selection`` names the subtree of a training-state tree
that is written (its names lose the prefix); null or absent writes the tree whole.

A :class:`Decision` also names the fixture digest it was made for (``fixture_digest``): Python sets
it in :func:`ckptgate.decide.decide` from the input document's ``fixture.digest``, never the policy
(the shape above has no such key), and enforce refuses a decision for other bytes.

:func:`parse_decision` never raises: a malformed answer becomes a deny :class:`Decision` whose
single reason says what was wrong with it (fail closed).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckptgate.decide.engine import RawDecision
from ckptgate.decide.inputs import DecisionInput
from ckptgate.digestvalue import Digest
from ckptgate.errors import ExitCode

PLANES = ("pure_data", "static_pickle", "framework")
#: What a deny stands for -> the exit code every command gives it.
REFUSAL_EXIT = MappingProxyType(
    {"input": ExitCode.INPUT_REJECTED, "verification": ExitCode.VERIFICATION_FAILED, "policy": ExitCode.DENIED}
)
_KEYS = frozenset({"allow", "plane", "permitted_loaders", "required_controls", "reasons", "refusal"})
_OPTIONAL = frozenset({"companions", "selection"})
_SELECTION_KEYS = frozenset({"prefix", "layout", "source", "excluded"})
_PREFIX = re.compile(r"^[^.\s][^\s]{0,510}$")
_COMPANION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_REASON_KEYS = frozenset({"code", "message", "evidence", "severity"})
_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Reason:
    """One object-shaped reason from the policy."""

    code: str
    message: str
    evidence: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    severity: str = "deny"

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "evidence": dict(self.evidence), "severity": self.severity}


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """The subtree of a training-state tree that is written: the entries under ``prefix + "."``,
    named without it.  ``layout`` is the policy-data layout that chose it (None for ``--select``)."""

    prefix: str
    layout: str | None
    source: str
    excluded: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "layout": self.layout, "source": self.source, "excluded": list(self.excluded)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """A decision that passed the strict shape check, with where it came from."""

    allow: bool
    plane: str | None
    permitted_loaders: tuple[str, ...]
    required_controls: tuple[str, ...]
    reasons: tuple[Reason, ...]
    decision_id: str
    policy_revision: str
    engine: str
    refusal: str | None = None
    #: files at the top of the checkpoint that travel to DST byte for byte (allow only)
    companions: tuple[str, ...] = ()
    #: the subtree of a training-state tree that is written (allow only); None: the tree is written whole
    selection: Selection | None = None
    #: every input that shaped the decision, by role, path, origin and sha256 (ckptgate.decide.inputs)
    inputs: tuple[DecisionInput, ...] = ()
    #: the fixture digest of the input document it was decided on (set by ``decide``, not the policy);
    #: None: decided on no digest, which enforce refuses
    fixture_digest: Digest | None = None

    def __post_init__(self) -> None:
        if (self.companions or self.selection is not None) and not self.allow:
            raise ValueError("only an allow decision names companions or a selection")
        if self.allow and self.plane not in PLANES:
            raise ValueError("an allow decision must name a plane")
        if (self.refusal is None) != self.allow or (self.refusal is not None and self.refusal not in REFUSAL_EXIT):
            raise ValueError("a deny, and only a deny, names its refusal class")

    @property
    def remote(self) -> bool:
        """Whether a remote OPA (``--opa-url``) decided: its name is its URL, and its own bundle holds
        the trust data it decided with (``--trust`` is refused with it)."""
        return "://" in self.engine or self.remote_engine is not None

    @property
    def remote_engine(self) -> DecisionInput | None:
        """The input that names the remote OPA that decided (role ``remote_engine``), or None."""
        return next((i for i in self.inputs if i.role == "remote_engine"), None)

    def engine_json(self, opa_version: str | None) -> dict[str, Any]:
        """Which engine decided, as the receipt and the report record it: ``remote`` with its URL (no
        credentials) and the bundle revision it reported, or ``embedded`` with the local OPA's version."""
        remote = self.remote_engine
        if remote is not None:
            return {"kind": "remote", "url": remote.path, "revision": remote.revision}
        if self.remote:  # a decision from before the input was named: its engine is its URL
            return {"kind": "remote", "url": self.engine, "revision": None}
        return {"kind": "embedded", "opa_version": opa_version}

    @property
    def exit_code(self) -> ExitCode:
        """0 for allow; for a deny, the exit code of its refusal class."""
        return ExitCode.OK if self.refusal is None else REFUSAL_EXIT[self.refusal]

    @property
    def deny_reasons(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.severity == "deny")

    def to_json(self, *fields: str) -> dict[str, Any]:
        """The decision as JSON; with ``fields``, only those keys, in that order (every record that
        carries a decision, the receipt and the report included, takes its keys from here)."""
        doc = {
            "allow": self.allow,
            "plane": self.plane,
            "permitted_loaders": list(self.permitted_loaders),
            "required_controls": list(self.required_controls),
            "reasons": [r.to_json() for r in self.reasons],
            "refusal": self.refusal,
            "companions": list(self.companions),
            "decision_id": self.decision_id,
            "policy_revision": self.policy_revision,
            "engine": self.engine,
            "inputs": [i.to_json() for i in self.inputs],
            "fixture_digest": self.fixture_digest.prefixed() if self.fixture_digest is not None else None,
            **({"selection": self.selection.to_json()} if self.selection is not None else {}),
        }
        return {k: doc[k] for k in fields} if fields else doc


def deny(
    code: str, message: str, *, raw: RawDecision | None = None, evidence: Mapping[str, Any] | None = None
) -> Decision:
    """A deny decision made by ckptgate itself (fail closed)."""
    return Decision(
        allow=False,
        plane=None,
        permitted_loaders=(),
        required_controls=(),
        reasons=(Reason(code=code, message=message, evidence=MappingProxyType(dict(evidence or {}))),),
        decision_id=raw.decision_id if raw else "",
        policy_revision=raw.policy_revision if raw else "",
        engine=raw.engine if raw else "ckptgate",
        refusal="policy",
        inputs=raw.inputs if raw else (),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Precheck:
    """The policy's answer before the fixture is hashed: ``refuse`` and its deny reasons.

    It can only refuse, never allow: an intake it does not refuse still needs the decision.
    """

    refuse: bool
    reasons: tuple[Reason, ...]
    decision_id: str
    policy_revision: str
    engine: str
    refusal: str | None = None

    @property
    def deny_reasons(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.severity == "deny")

    def to_json(self) -> dict[str, Any]:
        return {
            "refuse": self.refuse,
            "reasons": [r.to_json() for r in self.reasons],
            "refusal": self.refusal,
            "decision_id": self.decision_id,
            "policy_revision": self.policy_revision,
            "engine": self.engine,
        }


class _Malformed(Exception):
    pass


def parse_precheck(raw: RawDecision) -> Precheck | None:
    """The precheck in ``raw``, or None when it is not exactly ``{refuse, reasons, refusal}`` with
    a deny reason and a refusal class behind every refusal.  None refuses nothing early; the
    decision still decides."""
    doc = raw.result
    try:
        if (
            not isinstance(doc, dict)
            or set(doc) != {"refuse", "reasons", "refusal"}
            or not isinstance(doc["refuse"], bool)
        ):
            raise _Malformed("not {refuse, reasons, refusal}")
        reasons = _reasons(doc["reasons"], default_severity="deny")
        if doc["refuse"] != any(r.severity == "deny" for r in reasons):
            raise _Malformed("'refuse' does not match its deny reasons")
        refusal = _refusal(doc["refusal"], denied=doc["refuse"])
    except _Malformed:
        return None
    return Precheck(
        refuse=doc["refuse"],
        reasons=reasons,
        decision_id=raw.decision_id,
        policy_revision=raw.policy_revision,
        engine=raw.engine,
        refusal=refusal,
    )


def parse_decision(raw: RawDecision) -> Decision:
    """The decision in ``raw``, or a deny whose reason explains why it was not accepted."""
    try:
        return _parse(raw)
    except _Malformed as e:
        return deny(
            "decision_malformed",
            f"the policy engine's answer does not match the decision schema ({e}); deny",
            raw=raw,
            evidence={"answer": _preview(raw.result)},
        )


def _parse(raw: RawDecision) -> Decision:
    doc = raw.result
    if not isinstance(doc, dict):
        raise _Malformed(f"expected an object, got {type(doc).__name__}")
    if not _KEYS <= set(doc) <= _KEYS | _OPTIONAL:
        missing, extra = sorted(_KEYS - set(doc)), sorted(set(doc) - _KEYS - _OPTIONAL)
        raise _Malformed(f"missing keys {missing}, unexpected keys {extra}")
    allow = doc["allow"]
    if not isinstance(allow, bool):
        raise _Malformed("'allow' is not a boolean")
    plane = doc["plane"]
    if plane is not None and plane not in PLANES:
        raise _Malformed(f"unknown plane {plane!r}")
    if allow and plane is None:
        raise _Malformed("an allow decision without a plane")
    loaders = _names(doc["permitted_loaders"], "permitted_loaders")
    controls = _names(doc["required_controls"], "required_controls")
    reasons = _reasons(doc["reasons"], default_severity="info" if allow else "deny")
    if allow and any(r.severity == "deny" for r in reasons):
        raise _Malformed("'allow' is true but a deny reason is present")
    if not allow and not any(r.severity == "deny" for r in reasons):
        raise _Malformed("'allow' is false but no deny reason says why")
    if allow and not loaders:
        raise _Malformed("an allow decision that permits no loader")
    refusal = _refusal(doc["refusal"], denied=not allow)
    companions = _companions(doc.get("companions", []))
    if companions and not allow:
        raise _Malformed("a deny that names companions to publish")
    selection = _selection(doc.get("selection"))
    if selection is not None and not allow:
        raise _Malformed("a deny that names a selection")
    return Decision(
        allow=allow,
        plane=plane,
        permitted_loaders=loaders,
        required_controls=controls,
        reasons=reasons,
        decision_id=raw.decision_id,
        policy_revision=raw.policy_revision,
        engine=raw.engine,
        refusal=refusal,
        companions=companions,
        selection=selection,
        inputs=raw.inputs,
    )


def _selection(value: Any) -> Selection | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != _SELECTION_KEYS:
        raise _Malformed(f"'selection' is not an object with exactly {sorted(_SELECTION_KEYS)}")
    prefix, layout, source, excluded = value["prefix"], value["layout"], value["source"], value["excluded"]
    if not isinstance(prefix, str) or not _PREFIX.match(prefix) or prefix.endswith("."):
        raise _Malformed("'selection.prefix' is not a dotted key prefix")
    if layout is not None and not (isinstance(layout, str) and _NAME.match(layout)):
        raise _Malformed("'selection.layout' is not a layout name or null")
    if source not in ("request", "policy"):
        raise _Malformed("'selection.source' is neither 'request' nor 'policy'")
    if not isinstance(excluded, list) or not all(isinstance(k, str) for k in excluded):
        raise _Malformed("'selection.excluded' is not a list of keys")
    return Selection(prefix=prefix, layout=layout, source=source, excluded=tuple(excluded))


def _companions(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _COMPANION.match(v) for v in value):
        raise _Malformed("'companions' is not a list of plain file names")
    if len(set(value)) != len(value):
        raise _Malformed("'companions' repeats a name")
    return tuple(value)


def _refusal(value: Any, *, denied: bool) -> str | None:
    if not denied:
        if value is not None:
            raise _Malformed("a refusal class on an answer that refuses nothing")
        return None
    if not isinstance(value, str) or value not in REFUSAL_EXIT:
        raise _Malformed(f"a deny whose refusal class is {_preview(value, 40)}, not one of {sorted(REFUSAL_EXIT)}")
    return str(value)


def _names(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and _NAME.match(v) for v in value):
        raise _Malformed(f"'{what}' is not a list of names")
    if len(set(value)) != len(value):
        raise _Malformed(f"'{what}' repeats a name")
    return tuple(value)


def _reasons(value: Any, *, default_severity: str) -> tuple[Reason, ...]:
    """Reasons without a ``severity`` explain the decision they come with: info for allow, deny for deny."""
    if not isinstance(value, list):
        raise _Malformed("'reasons' is not a list")
    out = []
    for r in value:
        if not isinstance(r, dict) or not {"code", "message"} <= set(r) or not set(r) <= _REASON_KEYS:
            raise _Malformed("a reason is not {code, message, evidence}")
        if not isinstance(r["code"], str) or not _NAME.match(r["code"]) or not isinstance(r["message"], str):
            raise _Malformed("a reason has a bad code or message")
        evidence = r.get("evidence", {})
        if not isinstance(evidence, dict):
            raise _Malformed(f"reason {r['code']!r} has non-object evidence")
        severity = r.get("severity", default_severity)
        if severity not in ("deny", "warn", "info"):
            raise _Malformed(f"reason {r['code']!r} has unknown severity {severity!r}")
        out.append(
            Reason(code=r["code"], message=r["message"], evidence=MappingProxyType(dict(evidence)), severity=severity)
        )
    return tuple(out)


def _preview(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def decision_from_json(doc: dict[str, Any]) -> Decision:
    """The :class:`Decision` rank 0 sent as its ``to_json()``: every field it carries, lists as tuples."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Decision):
        if f.name not in doc:
            continue
        v = doc[f.name]
        if f.name == "reasons":
            v = tuple(
                Reason(
                    code=r["code"],
                    message=r["message"],
                    evidence=r.get("evidence") or {},
                    severity=r.get("severity", "deny"),
                )
                for r in v
            )
        elif f.name == "inputs":
            v = tuple(DecisionInput.from_json(i) for i in v)
        elif f.name == "selection":
            v = _selection(v)
        elif f.name == "fixture_digest":
            v = None if v is None else Digest.parse(v)
        elif isinstance(v, list):
            v = tuple(v)
        values[f.name] = v
    return Decision(**values)
