"""In-toto Statement v1 checks: shape, the known predicate schemas (qualification, fixture provenance),
subject binding, validity window."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import fastjsonschema

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify.declared import DeclaredValueError, Topology, check_step

if TYPE_CHECKING:
    import jsonschema

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
QUALIFICATION_PREDICATE_TYPE = "https://ckptgate.dev/attestation/qualification/v1"
"""The versioned predicateType of ckptgate qualification evidence."""

PROVENANCE_PREDICATE_TYPE = "https://ckptgate.dev/attestation/fixture-provenance/v1"
"""The versioned predicateType of fixture provenance: the signer vouches that a fixture's bytes are the
ones committed at a candidate commit, written by the recorded generator and producer versions."""

PREDICATE_SCHEMAS = {
    QUALIFICATION_PREDICATE_TYPE: "qualification-v1.schema.json",
    PROVENANCE_PREDICATE_TYPE: "fixture-provenance-v1.schema.json",
}
"""Predicate types that ckptgate knows, and the JSON Schema each statement must satisfy."""

PREDICATE_SUBJECT_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    QUALIFICATION_PREDICATE_TYPE: (("fixture", "digest"),),
    PROVENANCE_PREDICATE_TYPE: (("fixture", "digest"),),
}
"""Per known predicate type, the predicate fields that name, by digest, the checkpoint the statement
is about.  Each must equal the subject that the binding used (:func:`bind_subject`): a statement
with a second subject Y and ``fixture.digest`` Z is about Z, and says nothing about Y.  (The
qualification's ``result.evidence.digest`` names the result log; ``fixture.manifest``, and the
provenance's ``fixture.location`` and ``git_tree``, name repository paths, not bytes.)"""


SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
"""The predicate type of SLSA build provenance v1: a statement of this type (or any other type that is not
ckptgate's own) may bind file by file (:func:`bind_manifest`)."""

TRAINING_BUILD_TYPE = "https://ckptgate.dev/training/v1"
"""The SLSA ``buildDefinition.buildType`` of a training job's provenance (docs/attestations.md): the
job's configuration, topology, producer libraries, code commit and base model, over every file written."""

TRAINING_SCHEMA = "training-provenance-v1.schema.json"
"""The JSON Schema a statement of SLSA provenance with :data:`TRAINING_BUILD_TYPE` must satisfy."""


def statement_schema(doc: Any) -> str | None:
    """The schema file a statement must satisfy: its known predicate type's, the training provenance
    schema for SLSA provenance of :data:`TRAINING_BUILD_TYPE`, else ``None`` (in-toto shape only)."""
    if not isinstance(doc, dict):
        return None
    predicate_type = doc.get("predicateType")
    if not isinstance(predicate_type, str):
        return None
    if predicate_type == SLSA_PROVENANCE_V1 and field_at(doc, "predicate", "buildDefinition", "buildType") == (
        TRAINING_BUILD_TYPE
    ):
        return TRAINING_SCHEMA
    return PREDICATE_SCHEMAS.get(predicate_type)


def _schema(name: str) -> dict[str, Any]:
    text = resources.files("ckptgate.verify").joinpath("schemas", name).read_text(encoding="utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


@cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    # The slow path's error messages only: valid statements never need jsonschema.
    import jsonschema  # noqa: PLC0415 - jsonschema: 270 ms import

    schema = _schema(name)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@cache
def _fast(name: str) -> Callable[[Any], Any]:
    """The same schema compiled by ``fastjsonschema``: the hot path for documents that are valid."""
    validate: Callable[[Any], Any] = fastjsonschema.compile(_schema(name))
    return validate


def schema_text(predicate_type: str = QUALIFICATION_PREDICATE_TYPE) -> str:
    """The JSON Schema (text) for a known predicate type."""
    return (
        resources.files("ckptgate.verify")
        .joinpath("schemas", PREDICATE_SCHEMAS[predicate_type])
        .read_text(encoding="utf-8")
    )


def _first_error(name: str, doc: Any) -> jsonschema.ValidationError | None:
    """``None`` when ``doc`` satisfies schema ``name``; else jsonschema's best error (slow path only)."""
    try:
        _fast(name)(doc)
        return None
    except fastjsonschema.JsonSchemaException:
        pass
    from jsonschema.exceptions import best_match  # noqa: PLC0415 - jsonschema: 270 ms import

    found: jsonschema.ValidationError | None = best_match(_validator(name).iter_errors(doc))
    return found


def check_statement(doc: Any) -> dict[str, Any]:
    """Check an in-toto Statement v1 and, for a known predicate type, its predicate schema.

    Codes: ``verify.statement.type`` (not a Statement v1), ``verify.statement.shape`` (bad
    subject/fields), ``verify.statement.predicate_invalid`` (a known predicate type whose
    predicate fails its schema).  An unknown predicate type passes through for policy to judge.
    """
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        got = doc.get("_type") if isinstance(doc, dict) else type(doc).__name__
        raise VerificationError(
            "verify.statement.type",
            f"payload is not an in-toto Statement v1 (_type={got!r})",
            evidence={"_type": got if isinstance(got, str) else None},
        )
    schema = statement_schema(doc)
    # A known predicate type's schema is stricter than the generic one, so it alone decides a valid
    # statement (the hot path); on failure the generic schema tells shape errors from predicate errors.
    if schema is None or _first_error(schema, doc) is not None:
        err = _first_error("in-toto-statement-v1.schema.json", doc)
        if err is not None:
            raise VerificationError(
                "verify.statement.shape",
                f"statement shape: {err.message}",
                evidence={"path": "/" + "/".join(str(p) for p in err.absolute_path)},
            )
        if schema is not None:
            err = _first_error(schema, doc)
            assert err is not None
            raise VerificationError(
                "verify.statement.predicate_invalid",
                f"{doc['predicateType']} statement fails its schema: {err.message}",
                evidence={
                    "path": "/" + "/".join(str(p) for p in err.absolute_path),
                    "predicate_type": doc["predicateType"],
                },
            )
    if schema == TRAINING_SCHEMA:
        bad = _declared_error(doc)
        if bad is not None:
            raise VerificationError(
                "verify.statement.predicate_invalid",
                f"{doc['predicateType']} statement declares what cannot be: {bad['message']}",
                evidence={"path": bad["path"], "predicate_type": doc["predicateType"]},
            )
    if schema is not None and schema != TRAINING_SCHEMA:
        pred_digest = doc["predicate"]["fixture"]["digest"]
        if not any("sha256:" + s["digest"]["sha256"] == pred_digest for s in doc["subject"]):
            raise VerificationError(
                "verify.statement.fixture_inconsistent",
                "predicate.fixture.digest names no subject of the statement",
                evidence={"fixture_digest": pred_digest},
            )
    return doc


def schema_errors(doc: Any) -> list[dict[str, str]]:
    """Every schema error of a statement at once (``path`` as a JSON pointer, ``message``), for a
    producer fixing a statement before signing: the in-toto shape's, then its predicate schema's."""
    names = ["in-toto-statement-v1.schema.json"]
    schema = statement_schema(doc)
    if schema is not None:
        names.append(schema)
    seen: set[tuple[str, str]] = set()
    out: list[dict[str, str]] = []
    for name in names:
        errors: list[jsonschema.ValidationError] = list(_validator(name).iter_errors(doc))
        for err in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path]):
            for leaf in _leaves(err):
                item = ("/" + "/".join(str(p) for p in leaf.absolute_path), leaf.message)
                if item not in seen:
                    seen.add(item)
                    out.append({"path": item[0], "message": item[1]})
    if schema == TRAINING_SCHEMA and not out and (bad := _declared_error(doc)) is not None:
        out.append(bad)  # what no schema can say: check_statement refuses it too
    return out


def _declared_error(doc: Any) -> dict[str, str] | None:
    """The training statement's declared topology or step that :mod:`ckptgate.verify.declared` refuses,
    as ``schema_errors`` reports one; ``None`` when both hold (or are not there to read)."""
    internal = field_at(doc, "predicate", "buildDefinition", "internalParameters")
    if not isinstance(internal, dict):
        return None
    base = "/predicate/buildDefinition/internalParameters"
    try:
        check_step(internal.get("step"))
    except DeclaredValueError as e:
        return {"path": f"{base}/step", "message": e.message}
    topology = internal.get("topology")
    if isinstance(topology, dict):
        try:
            Topology.from_mapping(topology)
        except DeclaredValueError as e:
            return {"path": f"{base}/topology/{e.field}", "message": e.message}
    return None


def _leaves(err: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """A ``oneOf``/``anyOf`` error stands for its alternatives' errors: report the closest ones."""
    if not err.context:
        return [err]
    from jsonschema.exceptions import best_match  # noqa: PLC0415 - jsonschema: 270 ms import

    best = best_match(err.context)
    return [err] if best is None else _leaves(best)


def field_at(doc: Any, *keys: str) -> Any:
    """``doc[k1][k2]...`` while each level is an object, else ``None``: a statement of a predicate
    type without a schema is checked only as in-toto, so its predicate may hold any shape."""
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


EARLIEST_TIME = datetime(1678, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(2262, 1, 1, tzinfo=UTC)
"""The times a statement may name: those the policy engine reads as nanoseconds since the epoch (a signed
64-bit count, 1677-09-21 to 2262-04-11, less a margin), so that Python never accepts a time that policy
cannot compare, and never computes past the range of :class:`datetime` (``0001-01-01T00:00:00+14:00`` is
before year 1 in UTC)."""


def parse_time(value: str) -> datetime:
    """RFC 3339 timestamp with an explicit offset -> aware datetime in UTC.  ``ValueError`` for a time
    without an offset, or outside :data:`EARLIEST_TIME` .. :data:`LATEST_TIME`."""
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError("timestamp without a UTC offset")
    try:
        utc = t.astimezone(UTC)
    except OverflowError:  # a date at the edge of datetime's range, moved out of it by its offset
        utc = None
    if utc is None or not EARLIEST_TIME <= utc < LATEST_TIME:
        raise ValueError(
            f"timestamp {value[:40]!r} is outside {EARLIEST_TIME.year}..{LATEST_TIME.year - 1}, the years "
            "policy can compare"
        )
    return utc


@dataclass(frozen=True, slots=True, kw_only=True)
class Validity:
    """The predicate's validity window."""

    issued_at: datetime
    """When the statement says it was issued."""
    expires_at: datetime
    """When it stops being valid."""

    def __post_init__(self) -> None:
        if self.issued_at.tzinfo is None or self.expires_at.tzinfo is None:
            raise ValueError("validity times must be timezone-aware")


def validity_window(statement: dict[str, Any]) -> Validity | None:
    """A known predicate type's validity window, read (``verify.statement.validity_window`` where its times
    are not RFC 3339 within the years policy compares, or expires_at is not after issued_at); ``None`` for
    predicate types without one.  ``attest sign`` checks it too: it never signs a window nothing accepts."""
    if statement["predicateType"] not in PREDICATE_SCHEMAS:
        return None
    raw = statement["predicate"]["validity"]
    try:
        v = Validity(issued_at=parse_time(raw["issued_at"]), expires_at=parse_time(raw["expires_at"]))
    except ValueError as e:
        raise VerificationError(
            "verify.statement.validity_window", f"validity times are not RFC 3339: {e}", evidence=dict(raw)
        ) from None
    if v.expires_at <= v.issued_at:
        raise VerificationError(
            "verify.statement.validity_window", "expires_at is not after issued_at", evidence=dict(raw)
        )
    return v


def check_validity(statement: dict[str, Any], now: datetime, *, max_clock_skew: timedelta) -> Validity | None:
    """For a known predicate type, enforce issued_at <= now + skew < expires_at.

    Codes: ``verify.statement.validity_window`` (unparseable or inverted window),
    ``verify.statement.not_yet_valid``, ``verify.statement.expired``.  Returns ``None`` for
    predicate types without a validity window (policy decides their freshness).
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    v = validity_window(statement)
    if v is None:
        return None
    raw = statement["predicate"]["validity"]
    if v.issued_at > now + max_clock_skew:
        raise VerificationError(
            "verify.statement.not_yet_valid",
            f"issued_at {raw['issued_at']} is in the future (now {now.isoformat()})",
            evidence={**raw, "now": now.isoformat()},
        )
    if now >= v.expires_at:
        raise VerificationError(
            "verify.statement.expired",
            f"expired at {raw['expires_at']} (now {now.isoformat()})",
            evidence={**raw, "now": now.isoformat()},
            advice=f"The evidence expired at {raw['expires_at']}: run `ckptgate qualify` for this commit again "
            "to obtain fresh evidence.",
        )
    return v


def iso_utc(t: datetime) -> str:
    """RFC 3339 UTC with seconds, as the schemas' timestamps expect."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def qualification_statement(
    *,
    subject_name: str,
    fixture_digest: Digest,
    manifest: str,
    producer: dict[str, str],
    adapter: dict[str, str],
    candidate_commit: str,
    environment: dict[str, Any],
    topology: dict[str, Any],
    status: str,
    checks_run: list[str],
    evidence_digest: str,
    evidence_location: str,
    issued_at: datetime,
    valid_for: timedelta,
    producer_releases: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A qualification Statement v1 for one fixture; checked against its schema before it is returned.

    ``producer_releases``: other releases of the producer that wrote exactly the fixture's bytes,
    each ``{name, version, provenance, manifest}``: the stored fixture-provenance statement that
    states it, and the generation record that statement rests on; absent when there are none."""
    predicate: dict[str, Any] = {
        "producer": producer,
        "adapter": adapter,
        "fixture": {
            "digest": fixture_digest.prefixed(),
            "digest_algorithm": fixture_digest.algorithm,
            "manifest": manifest,
        },
        "candidate_commit": candidate_commit,
        "environment": environment,
        "topology": topology,
        "result": {
            "status": status,
            "checks_run": list(checks_run),
            "evidence": {"digest": evidence_digest, "location": evidence_location},
        },
        "validity": {"issued_at": iso_utc(issued_at), "expires_at": iso_utc(issued_at + valid_for)},
    }
    if producer_releases:
        predicate["producer_releases"] = [dict(r) for r in producer_releases]
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": fixture_digest.dsse_subject()}],
        "predicateType": QUALIFICATION_PREDICATE_TYPE,
        "predicate": predicate,
    }
    check_statement(statement)
    return statement
