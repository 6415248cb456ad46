"""In-toto Statement v1 checks: shape, the known predicate schemas (qualification, fixture provenance),
subject binding, validity window."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import fastjsonschema

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError

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


def prepare_statement_checks() -> None:
    """Compile the known predicate schemas now (about 50 ms) rather than on the first statement:
    the pipeline does it on a thread while the digest hashes."""
    for name in (*PREDICATE_SCHEMAS.values(), TRAINING_SCHEMA):
        _fast(name)


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
    return out


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


@dataclass(frozen=True, slots=True, kw_only=True)
class SubjectBinding:
    """The subject of a statement that was bound to the measured digest, and, for a known predicate
    type, whether each predicate field naming the attested checkpoint names that same subject."""

    name: str
    """The bound subject's name (a label: only its digest binds)."""
    digest: str
    """``sha256:<hex>`` of the bound subject (the measured digest)."""
    predicate_fields: Mapping[str, bool] = field(default_factory=dict)
    """Dotted predicate field -> whether it equals :attr:`digest`; empty for predicate types that
    ckptgate does not know (policy accepts none of those)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "predicate_fields", dict(self.predicate_fields))  # a copy the caller cannot change

    @property
    def predicate_matches(self) -> bool | None:
        """True when every such field names the bound subject; ``None`` when there are none."""
        return all(self.predicate_fields.values()) if self.predicate_fields else None


def bind_subject(statement: dict[str, Any], measured_digest: Digest | str) -> SubjectBinding:
    """Require a subject whose sha256 equals the measured digest, and say whether the predicate's
    fields that name the attested checkpoint (:data:`PREDICATE_SUBJECT_FIELDS`) name that subject.

    A mismatch there is not a cryptographic failure, so it is a fact for policy (``ckptgate.trust``
    refuses it), not an error here.
    """
    measured_digest = Digest.of(measured_digest)
    want = measured_digest.hex
    for s in statement["subject"]:
        got = s["digest"].get("sha256")
        if isinstance(got, str) and got.lower() == want:
            digest = measured_digest.prefixed()
            fields = {
                ".".join(path): field_at(statement.get("predicate"), *path) == digest
                for path in PREDICATE_SUBJECT_FIELDS.get(str(statement.get("predicateType")), ())
            }
            return SubjectBinding(name=str(s.get("name", "")), digest=digest, predicate_fields=fields)
    expected = ", ".join(f"sha256:{s['digest'].get('sha256')}" for s in statement["subject"][:3])
    more = f" and {len(statement['subject']) - 3} more" if len(statement["subject"]) > 3 else ""
    raise VerificationError(
        "verify.statement.subject_mismatch",
        f"no subject of the statement matches the measured fixture digest: measured {measured_digest.prefixed()}, "
        f"the statement names {expected}{more}",
        evidence={
            "measured": measured_digest.prefixed(),
            "subjects": [s["digest"].get("sha256") for s in statement["subject"]],
        },
        advice=f"The attestation was made for other bytes ({expected}{more}), not for the measured "
        f"{measured_digest.prefixed()}: do not reuse it; attest these bytes with `ckptgate attest sign`.",
    )


def parse_time(value: str) -> datetime:
    """RFC 3339 timestamp with an explicit offset -> aware datetime."""
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError("timestamp without a UTC offset")
    return t


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


def check_validity(statement: dict[str, Any], now: datetime, *, max_clock_skew: timedelta) -> Validity | None:
    """For a known predicate type, enforce issued_at <= now + skew < expires_at.

    Codes: ``verify.statement.validity_window`` (unparseable or inverted window),
    ``verify.statement.not_yet_valid``, ``verify.statement.expired``.  Returns ``None`` for
    predicate types without a validity window (policy decides their freshness).
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
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
    fixture_digest: Digest | str,
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
    fixture_digest = Digest.of(fixture_digest)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestBinding:
    """How a statement's subjects cover every measured file (``binding: "manifest"``)."""

    match: str
    """``path``: subject names are the files' relative paths.  ``basename``: the subjects carry bare
    basenames (as GitHub artifact attestations write them) and every basename in the checkpoint is unique."""
    files: int
    """Measured files, each covered by a subject with the same name and sha256."""
    extra_subjects: int
    """Subjects that name no measured file (one release may attest many artifacts; policy sees the count)."""

    def to_json(self) -> dict[str, Any]:
        return {"match": self.match, "files": self.files, "extra_subjects": self.extra_subjects}


def _bind_fail(code: str, message: str, advice: str | None = None, **evidence: Any) -> VerificationError:
    return VerificationError(f"verify.statement.{code}", message, evidence=evidence, advice=advice)


def _subject_digests(statement: dict[str, Any]) -> dict[str, set[str]]:
    """Subject name -> the sha256 values it carries (lower-case); subjects without both are skipped."""
    out: dict[str, set[str]] = {}
    for s in statement["subject"]:
        name, got = s.get("name"), s.get("digest", {}).get("sha256")
        if isinstance(name, str) and name and isinstance(got, str):
            out.setdefault(name, set()).add(got.lower())
    return out


def bind_manifest(statement: dict[str, Any], manifest: Mapping[str, str]) -> ManifestBinding:
    """Bind a statement whose subjects list the checkpoint's files to ``manifest`` (relative path -> sha256
    of every measured file): every measured file must be covered by a subject with the same name and sha256.

    Names match by relative path.  When no subject name holds a ``/`` and some measured file lies in a
    folder, the subjects are bare basenames and match by basename, only if every basename in the checkpoint
    is unique.  Subjects naming no measured file are counted, not refused.  Codes
    (``verify.statement.*``): ``subject_mismatch`` (no subject names a measured file or its bytes: a
    statement about something else), ``ambiguous_basename``, ``duplicate_subject`` (one name, two digests,
    for a measured file), ``unsigned_file`` (a measured file no subject names: added after signing),
    ``renamed_file`` (its bytes are signed under another name), ``file_digest_mismatch`` (its bytes changed).
    """
    subjects = _subject_digests(statement)
    measured = {p: h.lower() for p, h in manifest.items()}
    if not measured:
        raise _bind_fail("subject_mismatch", "the checkpoint has no measured files to bind")
    by_basename = not any("/" in n for n in subjects) and any("/" in p for p in measured)
    if by_basename:
        seen: dict[str, list[str]] = {}
        for p in measured:
            seen.setdefault(p.rsplit("/", 1)[-1], []).append(p)
        clashes = {b: sorted(ps) for b, ps in seen.items() if len(ps) > 1}
        if clashes:
            raise _bind_fail(
                "ambiguous_basename",
                f"the subjects carry bare basenames, and {len(clashes)} basename(s) name several files of the "
                f"checkpoint: {sorted(clashes)[:5]}",
                files=dict(sorted(clashes.items())[:20]),
                advice="Attest the files by their relative paths inside the checkpoint.",
            )
        key = {p: p.rsplit("/", 1)[-1] for p in measured}
    else:
        key = {p: p for p in measured}
    named = {p for p in measured if key[p] in subjects}
    signed_hashes = set().union(*subjects.values()) if subjects else set()
    if not named and not any(h in signed_hashes for h in measured.values()):
        raise _bind_fail(
            "subject_mismatch",
            "no subject of the statement names a measured file or carries its sha256",
            measured_files=len(measured),
            subjects=len(statement["subject"]),
            advice="The attestation was made for different files: do not reuse it for this checkpoint.",
        )
    dup = sorted(p for p in named if len(subjects[key[p]]) > 1)
    if dup:
        raise _bind_fail(
            "duplicate_subject",
            f"{len(dup)} file(s) are named by several subjects with different digests: {dup[:5]}",
            files=dup[:20],
        )
    unnamed = sorted(set(measured) - named)
    renamed = [p for p in unnamed if measured[p] in signed_hashes]
    if renamed:
        raise _bind_fail(
            "renamed_file",
            f"{len(renamed)} file(s) carry signed bytes under a name no subject gives: {renamed[:5]}",
            files=renamed[:20],
        )
    if unnamed:
        raise _bind_fail(
            "unsigned_file",
            f"{len(unnamed)} file(s) of the checkpoint are named by no subject: {unnamed[:5]}",
            files=unnamed[:20],
            advice="A file was added after signing, or the statement does not cover the checkpoint.",
        )
    changed = sorted(p for p in named if measured[p] not in subjects[key[p]])
    if changed:
        raise _bind_fail(
            "file_digest_mismatch",
            f"{len(changed)} file(s) differ from their subject's sha256: {changed[:5]}",
            files=changed[:20],
        )
    covered = {key[p] for p in measured}
    return ManifestBinding(
        match="basename" if by_basename else "path",
        files=len(measured),
        extra_subjects=sum(1 for s in statement["subject"] if s.get("name") not in covered),
    )
