"""``verify_attestation``: one entry point for DSSE-with-keys and Sigstore bundles, and the facts for OPA.

Python decides what is cryptographically wrong (bad or untrusted signature, wrong subject, malformed
or expired evidence) and raises :class:`~ckptgate.errors.VerificationError`; only verified statements
become facts.  Policy decides what verified facts mean (signer scopes, candidate commit, producer
versions).  A verified signature establishes integrity under a trusted key; it does not make the
checkpoint safe to deserialise [R27].
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from ckptgate._json import loads_strict, verify_error
from ckptgate.digest import Digest
from ckptgate.errors import Error, VerificationError
from ckptgate.verify import dsse, sigstore
from ckptgate.verify.binding import ManifestBinding, SubjectBinding, bind_manifest, bind_subject
from ckptgate.verify.statement import PREDICATE_SCHEMAS, Validity, check_statement, check_validity
from ckptgate.verify.training import TrainingFacts, is_training
from ckptgate.verify.trust import TrustData
from ckptgate.verify.x509bundle import is_certificate_bundle, verify_certificate_bundle
from ckptgate.verify.x509chain import CertificateChain

MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""The statement inside an envelope may not be larger than this."""
DEFAULT_CLOCK_SKEW = timedelta(minutes=5)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True, kw_only=True)
class SignerFacts:
    """One verified signer (a key counts once however often it signed)."""

    kind: Literal["key", "sigstore", "certificate"]
    signer_id: str | None
    """The trust-data id; ``None`` for a Sigstore identity given on the command line only."""
    keyid: str | None = None
    """The envelope's keyid hint (not a trust decision)."""
    spki_sha256: str | None = None
    algorithm: str | None = None
    identity: str | None = None
    issuer: str | None = None
    extensions: dict[str, str] = field(default_factory=dict)
    offered: str | None = None
    """For a key named on the command line (``--key``), where it came from; ``None`` for trust data."""
    identities: tuple[str, ...] = ()
    """For an X.509 certificate signer (OpenSSF Model Signing certificate method, or a certificate-signed
    Sigstore bundle): every SAN (email, URI, DNS) of the signing certificate; ``identity`` is the one a
    trust-data signer names, else the first."""
    root_sha256: str | None = None
    """For a certificate signer: SHA-256 of the DER trust anchor the verified chain led to."""
    subject: str | None = None
    not_after: str | None = None

    def __post_init__(self) -> None:
        if self.kind == "key" and not (self.spki_sha256 and self.algorithm and self.signer_id):
            raise ValueError("key signer facts need signer_id, spki_sha256 and algorithm")
        if self.kind == "sigstore" and not (self.identity and self.issuer):
            raise ValueError("sigstore signer facts need identity and issuer")
        if self.kind == "certificate" and not (self.identities and self.identity and self.root_sha256):
            raise ValueError("certificate signer facts need identities and root_sha256")

    def to_json(self) -> dict[str, Any]:
        if self.kind == "key":
            out: dict[str, Any] = {
                "kind": "key",
                "signer_id": self.signer_id,
                "keyid": self.keyid,
                "spki_sha256": self.spki_sha256,
                "algorithm": self.algorithm,
            }
            if self.offered is not None:
                out["offered"] = self.offered
            return out
        if self.kind == "certificate":
            return {
                "kind": "certificate",
                "signer_id": self.signer_id,
                "identity": self.identity,
                "identities": list(self.identities),
                "issuer": self.issuer,
                "root_sha256": self.root_sha256,
                "subject": self.subject,
                "not_after": self.not_after,
            }
        return {
            "kind": "sigstore",
            "signer_id": self.signer_id,
            "identity": self.identity,
            "issuer": self.issuer,
            "extensions": dict(sorted(self.extensions.items())),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifiedAttestation:
    """A statement whose signature, trust, subject and validity window all verified."""

    source: str
    statement: dict[str, Any] = field(repr=False)
    payload_sha256: str
    """SHA-256 of the exact signed payload bytes."""
    method: Literal["dsse", "sigstore", "x509", "model_signing"]
    """``x509``: a DSSE envelope in a Sigstore bundle signed under an X.509 certificate, no log
    (:mod:`ckptgate.verify.x509bundle`)."""
    signers: tuple[SignerFacts, ...]
    checks: tuple[str, ...]
    verified_at: datetime
    subject_name: str
    measured_digest: str
    """``sha256:<hex>``: the digest measured, and so the digest of the subject that was bound."""
    predicate_subject: dict[str, bool] = field(default_factory=dict)
    """Per predicate field that names the attested checkpoint (``fixture.digest``), whether it names
    the bound subject (:class:`~ckptgate.verify.binding.SubjectBinding`); policy refuses a ckptgate
    predicate where any is false or none was checked."""
    validity: Validity | None
    binding: Literal["subject", "manifest"] = "subject"
    """``subject``: a statement subject is the fixture digest.  ``manifest``: Python bound the statement's
    per-file resources exactly to the measured per-file manifest (OpenSSF Model Signing), or a statement's
    subjects cover every measured file with the same sha256 (:func:`~ckptgate.verify.binding.bind_manifest`)."""
    manifest_binding: ManifestBinding | None = None
    """For a statement bound file by file by its subjects: how names matched and how many subjects are extra."""
    timing: dict[str, str] = field(default_factory=dict)
    """Sigstore times (certificate window, log integrated time), ISO 8601."""

    def __post_init__(self) -> None:
        if not self.signers:
            raise ValueError("a verified attestation has at least one signer")
        if self.verified_at.tzinfo is None:
            raise ValueError("verified_at must be timezone-aware")

    @property
    def predicate_type(self) -> str:
        return str(self.statement["predicateType"])

    def to_facts(self) -> dict[str, Any]:
        """The attestation object of the OPA input document (docs/architecture.md)."""
        verification: dict[str, Any] = {
            "method": self.method,
            "checks": list(self.checks),
            "verified_at": _iso(self.verified_at),
            "subject_matches_fixture": True,
            "measured_digest": self.measured_digest,
            "subject_name": self.subject_name,
            "subject_digest": self.measured_digest,
            "predicate_subject": dict(sorted(self.predicate_subject.items())),
            "payload_sha256": self.payload_sha256,
            "binding": self.binding,
        }
        if self.binding == "manifest":
            verification["manifest_matches_fixture"] = True
        if self.manifest_binding is not None:
            verification["manifest"] = self.manifest_binding.to_json()
        if self.validity is not None:
            verification["validity"] = {
                "issued_at": _iso(self.validity.issued_at),
                "expires_at": _iso(self.validity.expires_at),
            }
        if self.timing:
            verification["timing"] = dict(sorted(self.timing.items()))
        out = {
            "source": self.source,
            "statement": self.statement,
            "signers": [s.to_json() for s in self.signers],
            "verification": verification,
        }
        if is_training(self.statement):
            out["training"] = TrainingFacts.from_statement(self.statement).to_json()
        return out


def rejection_facts(source: str, err: Error) -> dict[str, Any]:
    """The ``rejected_attestations`` entry for a failure: code and message only, never the statement."""
    return {"source": source, "code": err.code, "message": err.message}


def _detect(doc: Any) -> Literal["dsse", "sigstore"]:
    if isinstance(doc, dict):
        mt = doc.get("mediaType")
        if isinstance(mt, str) and mt.startswith(sigstore.BUNDLE_MEDIA_PREFIX):
            return "sigstore"
        if "payloadType" in doc or "signatures" in doc or "payload" in doc:
            return "dsse"
    raise VerificationError("verify.format.unknown", "neither a DSSE envelope nor a Sigstore bundle")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnverifiedEnvelope:
    """What an attestation file says before anything is checked: never trust it as is."""

    format: Literal["dsse", "sigstore"]
    payload_type: Any
    payload: bytes = field(repr=False)
    keyids: tuple[Any, ...]


def read_envelope(raw: bytes) -> UnverifiedEnvelope:
    """Parse a DSSE envelope or a Sigstore bundle and decode its DSSE payload; checks nothing else."""
    doc = loads_strict(raw, what="attestation", max_bytes=dsse.MAX_ENVELOPE_BYTES, error=verify_error)
    fmt = _detect(doc)
    if fmt == "dsse":
        env = dsse.Envelope.from_doc(doc)
        return UnverifiedEnvelope(
            format=fmt,
            payload_type=env.payload_type,
            payload=env.payload,
            keyids=tuple(s.keyid for s in env.signatures),
        )
    env_doc = doc.get("dsseEnvelope")
    if not isinstance(env_doc, dict) or not isinstance(env_doc.get("payload"), str):
        raise VerificationError("verify.sigstore.not_dsse", "bundle carries no DSSE envelope")
    return UnverifiedEnvelope(
        format=fmt,
        payload_type=env_doc.get("payloadType"),
        payload=dsse._b64(env_doc["payload"], "payload"),
        keyids=tuple(s.get("keyid") for s in env_doc.get("signatures", []) if isinstance(s, dict)),
    )


def verify_attestation(
    raw: bytes,
    *,
    source: str,
    trust: TrustData,
    measured_digest: Digest,
    now: datetime,
    sigstore_trust_root: Path | str | None = None,
    expected_identity: tuple[str, str] | None = None,
    expected_commit: str | None = None,
    max_clock_skew: timedelta = DEFAULT_CLOCK_SKEW,
    manifest: Mapping[str, str] | None = None,
    certificate_chain: CertificateChain | None = None,
) -> VerifiedAttestation:
    """Verify one attestation file's bytes for the fixture whose digest was measured.

    Order: size -> strict JSON -> format -> signature under trusted keys (DSSE) or offline Sigstore
    verification with an identity policy -> strict statement JSON -> Statement v1 and predicate schema ->
    subject == ``measured_digest`` (and whether the predicate names that subject: a fact for policy) ->
    validity window at ``now`` -> optional ``expected_commit``.
    With ``manifest`` (relative path -> sha256 of every measured file), a statement of a predicate type that
    is not ckptgate's own and has no subject equal to the fixture digest binds file by file instead
    (:func:`~ckptgate.verify.binding.bind_manifest`, ``binding: "manifest"``).
    ``expected_identity`` is ``(identity, issuer)``; without it the trust data's Sigstore identities apply.
    A Sigstore bundle with an X.509 certificate and no transparency-log entry is verified against
    ``certificate_chain`` (``--certificate-chain``) at ``now`` instead (:mod:`ckptgate.verify.x509bundle`).
    Raises :class:`VerificationError` with a ``verify.*`` code on any failure.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if len(raw) > dsse.MAX_ENVELOPE_BYTES:
        raise VerificationError(
            "verify.dsse.too_large",
            f"attestation is {len(raw)} bytes, over {dsse.MAX_ENVELOPE_BYTES}",
            evidence={"size": len(raw), "cap": dsse.MAX_ENVELOPE_BYTES},
        )
    doc = loads_strict(raw, what="attestation", max_bytes=dsse.MAX_ENVELOPE_BYTES, error=verify_error)
    method: Literal["dsse", "sigstore", "x509"] = _detect(doc)
    if method == "sigstore" and is_certificate_bundle(doc):
        method = "x509"
    checks: list[str] = []
    signers: list[SignerFacts]
    timing: dict[str, str] = {}
    if method == "x509":
        found = verify_certificate_bundle(doc, chain=certificate_chain, trust=trust, now=now)
        cert = found.certificate
        payload = found.payload
        checks += ["bundle", "certificate_chain", "certificate_validity", "payload_type", "signature"]
        signers = [
            SignerFacts(
                kind="certificate",
                signer_id=found.signer_id,
                identity=found.identity,
                identities=cert.identities,
                issuer=cert.root_subject,
                root_sha256=cert.root_sha256,
                subject=cert.subject,
                not_after=_iso(cert.not_after),
            )
        ]
        timing = {
            "cert_not_before": _iso(cert.not_before),
            "cert_not_after": _iso(cert.not_after),
            "certificate_checked_at": _iso(cert.checked_at),
        }
    elif method == "dsse":
        env = dsse.Envelope.from_doc(doc)
        checks += ["envelope", "payload_type"]
        verified = dsse.verify_envelope(env, trust.keys)
        checks.append("signature")
        signers = [
            SignerFacts(
                kind="key",
                signer_id=v.key.id,
                keyid=v.keyid_hint,
                spki_sha256=v.key.spki_sha256,
                algorithm=v.key.algorithm,
            )
            for v in verified
        ]
        payload = env.payload
    else:
        if sigstore_trust_root is None:
            raise VerificationError(
                "verify.sigstore.no_trust_root",
                "a Sigstore bundle needs a trust root (--sigstore-trust-root)",
                advice="Pass the trusted_root.json of the Sigstore instance you trust.",
            )
        idents = [expected_identity] if expected_identity else [(s.identity, s.issuer) for s in trust.sigstore]
        res = sigstore.verify_bundle_dsse(raw, trust_root=sigstore_trust_root, identities=idents)
        if res.payload_type != dsse.IN_TOTO_PAYLOAD_TYPE:
            raise VerificationError(
                "verify.dsse.payload_type",
                f"payloadType is {res.payload_type!r}, expected {dsse.IN_TOTO_PAYLOAD_TYPE!r}",
            )
        assert res.payload is not None
        payload = res.payload
        checks += ["bundle", "certificate_chain", "transparency_log", "identity", "payload_type", "signature"]
        sid = next((s.id for s in trust.sigstore if (s.identity, s.issuer) == (res.identity, res.issuer)), None)
        signers = [
            SignerFacts(
                kind="sigstore", signer_id=sid, identity=res.identity, issuer=res.issuer, extensions=res.extensions
            )
        ]
        timing = {
            "cert_not_before": _iso(res.cert_not_before),
            "cert_not_after": _iso(res.cert_not_after),
            "log_entry_kind": res.log_entry_kind,
        }
        if res.integrated_time is not None:
            timing["integrated_time"] = _iso(res.integrated_time)
    stmt = loads_strict(payload, what="statement", max_bytes=MAX_PAYLOAD_BYTES, error=verify_error)
    check_statement(stmt)
    checks.append("statement_schema")
    files: ManifestBinding | None = None
    try:
        binding = bind_subject(stmt, measured_digest)
        checks.append("subject_digest")
    except VerificationError as e:
        per_file = len(stmt["subject"]) > 1 or is_training(stmt)
        if manifest is None and stmt["predicateType"] not in PREDICATE_SCHEMAS and per_file:
            # a subject per file binds files, never one fixture digest: say how to verify it, not that
            # it was made for other bytes (it may well name exactly these files)
            raise VerificationError(
                e.code,
                f"the statement names {len(stmt['subject'])} files, one subject each: it binds the checkpoint's "
                f"files, not the fixture digest {measured_digest.prefixed()}, so it cannot be checked against a "
                "digest alone",
                evidence={**e.evidence, "subjects_per_file": len(stmt["subject"])},
                advice="Measure the checkpoint itself: `ckptgate attest verify FILE --checkpoint DIR`, or "
                "`ckptgate verify DIR --attestation FILE`.",
            ) from None
        if (
            manifest is None
            or stmt["predicateType"] in PREDICATE_SCHEMAS
            or e.code != "verify.statement.subject_mismatch"
        ):
            raise
        files = bind_manifest(stmt, manifest)
        checks.append("subjects_bound_to_files")
        binding = SubjectBinding(name=f"{files.files} files by {files.match}", digest=measured_digest.prefixed())
    validity = check_validity(stmt, now, max_clock_skew=max_clock_skew)
    if validity is not None:
        checks.append("validity_window")
    if expected_commit is not None:
        got = stmt.get("predicate", {}).get("candidate_commit") if isinstance(stmt.get("predicate"), dict) else None
        if got != expected_commit.lower():
            raise VerificationError(
                "verify.statement.commit_mismatch",
                f"attestation is for commit {got!r}, not {expected_commit!r}",
                evidence={"attested": got, "expected": expected_commit},
            )
        checks.append("candidate_commit")
    return VerifiedAttestation(
        source=source,
        statement=stmt,
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        method=method,
        signers=tuple(signers),
        checks=tuple(checks),
        verified_at=now,
        subject_name=binding.name,
        measured_digest=binding.digest,
        predicate_subject=dict(binding.predicate_fields),
        validity=validity,
        timing=timing,
        binding="subject" if files is None else "manifest",
        manifest_binding=files,
    )
