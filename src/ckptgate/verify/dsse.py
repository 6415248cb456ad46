"""DSSE envelopes with keys: PAE, strict envelope parsing, signing and verification.

The signature covers PAE(payloadType, payload) over the exact payload bytes; keys come only from
trust data, and a ``keyid`` is used only to order the keys tried, never to accept one.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ckptgate._json import loads_strict, verify_error
from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.statement import check_statement
from ckptgate.verify.trust import PublicKey, TrustedKey, key_algorithm, spki_sha256

IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024
"""Envelopes larger than this are refused before parsing."""
_MAX_KEY_BYTES = 1 << 20  # a PEM key is a few KiB; more is not a key
MAX_SIGNATURES = 16
"""More signatures than this are refused (bounds the work an envelope can demand)."""
SIGNING_KEY_ENV = "CKPTGATE_SIGNING_KEY"


def check_key_path(path: str | os.PathLike[str]) -> None:
    """Refuse a signing key given as its PEM text (a CI secret put in ``--key`` or ``$CKPTGATE_SIGNING_KEY``
    instead of a file's path) without repeating it: every later message names the path, and that would print
    the private key into the job's log."""
    text = os.fspath(path)
    if "-----BEGIN" in text or "PRIVATE KEY" in text or "\n" in text or "\r" in text:
        raise UsageError(
            "usage.signing_key_not_a_path",
            "the signing key was given as PEM text, not as the path of a PEM file (its value is not shown)",
            advice=f"Write the key to a file only the job can read (chmod 600) and pass its path with --key or "
            f"{SIGNING_KEY_ENV}; treat the key as exposed if the text reached a log.",
        )


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 Pre-Authentication Encoding: ``DSSEv1 SP LEN(type) SP type SP LEN(body) SP body``."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _b64(value: str, what: str) -> bytes:
    """Standard or URL-safe base64 (both allowed by DSSE), strictly."""
    s = value.strip()
    if "-" in s or "_" in s:
        s = s.replace("-", "+").replace("_", "/")
    s += "=" * (-len(s) % 4)
    try:
        return base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        raise VerificationError(
            "verify.dsse.bad_base64", f"{what} is not valid base64", evidence={"field": what}
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Signature:
    """One signature of an envelope, as found (not yet verified)."""

    sig: bytes = field(repr=False)
    keyid: str | None
    """The envelope's hint; never used to decide trust."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """A structurally valid DSSE envelope; build with :meth:`parse`."""

    payload_type: str
    payload: bytes = field(repr=False)
    """The exact payload bytes (base64-decoded), which the signatures cover."""
    signatures: tuple[Signature, ...]

    def __post_init__(self) -> None:
        if not self.signatures:
            raise ValueError("an envelope needs at least one signature")

    @classmethod
    def parse(
        cls, raw: bytes, *, max_bytes: int = MAX_ENVELOPE_BYTES, payload_type: str = IN_TOTO_PAYLOAD_TYPE
    ) -> Envelope:
        """Parse in one ordered pass: size, strict JSON, shape, payloadType, signatures, base64."""
        if len(raw) > max_bytes:
            raise VerificationError(
                "verify.dsse.too_large",
                f"envelope is {len(raw)} bytes, over {max_bytes}",
                evidence={"size": len(raw), "cap": max_bytes},
            )
        doc = loads_strict(raw, what="DSSE envelope", max_bytes=max_bytes, error=verify_error)
        return cls.from_doc(doc, payload_type=payload_type)

    @classmethod
    def from_doc(cls, doc: Any, *, payload_type: str = IN_TOTO_PAYLOAD_TYPE) -> Envelope:
        """Check an already strictly parsed envelope object (its payloadType must be ``payload_type``)."""
        if not isinstance(doc, dict):
            raise VerificationError("verify.dsse.shape", "envelope is not a JSON object")
        unknown = sorted(set(doc) - {"payload", "payloadType", "signatures"})
        if unknown:
            raise VerificationError(
                "verify.dsse.shape", f"envelope has unknown fields {unknown}", evidence={"fields": unknown}
            )
        ptype, payload, sigs = doc.get("payloadType"), doc.get("payload"), doc.get("signatures")
        if not isinstance(ptype, str) or not isinstance(payload, str):
            raise VerificationError("verify.dsse.shape", "payloadType and payload must be strings")
        if ptype != payload_type:
            raise VerificationError(
                "verify.dsse.payload_type",
                f"payloadType is {ptype!r}, expected {payload_type!r}",
                evidence={"payload_type": ptype[:256]},
            )
        if sigs is None or sigs == []:
            raise VerificationError(
                "verify.dsse.unsigned",
                "envelope carries no signatures",
                advice="An unsigned envelope proves nothing: obtain the signed attestation, or sign the statement "
                "with `ckptgate attest sign --key KEY`.",
            )
        if not isinstance(sigs, list):
            raise VerificationError("verify.dsse.shape", "signatures must be a list")
        if len(sigs) > MAX_SIGNATURES:
            raise VerificationError(
                "verify.dsse.too_many_signatures",
                f"{len(sigs)} signatures, over the cap of {MAX_SIGNATURES}",
                evidence={"count": len(sigs), "cap": MAX_SIGNATURES},
            )
        parsed: list[Signature] = []
        for i, s in enumerate(sigs):
            if not isinstance(s, dict) or set(s) - {"sig", "keyid"} or not isinstance(s.get("sig"), str):
                raise VerificationError(
                    "verify.dsse.shape", f"signature #{i} must be {{sig, keyid?}} strings", evidence={"index": i}
                )
            keyid = s.get("keyid")
            if keyid is not None and not isinstance(keyid, str):
                raise VerificationError(
                    "verify.dsse.shape", f"signature #{i} keyid must be a string", evidence={"index": i}
                )
            sig = _b64(s["sig"], f"signatures[{i}].sig")
            if sig:
                parsed.append(Signature(sig=sig, keyid=keyid or None))
        if not parsed:
            raise VerificationError(
                "verify.dsse.unsigned",
                "every signature of the envelope is empty",
                advice="An unsigned envelope proves nothing: obtain the signed attestation, or sign the statement "
                "with `ckptgate attest sign --key KEY`.",
            )
        return cls(payload_type=ptype, payload=_b64(payload, "payload"), signatures=tuple(parsed))


def _verifies(key: PublicKey, sig: bytes, data: bytes) -> bool:
    try:
        if isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(sig, data)
        else:
            key.verify(sig, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifiedSignature:
    """A signature that verified over PAE under a trusted key."""

    key: TrustedKey
    keyid_hint: str | None


def verify_envelope(env: Envelope, keys: Sequence[TrustedKey]) -> tuple[VerifiedSignature, ...]:
    """Verify every signature against the trusted keys; each trusted key counts once.

    Returns at least one :class:`VerifiedSignature` or raises: ``verify.dsse.signature_over_payload``
    (a trusted key signed the raw payload, not PAE), ``verify.dsse.bad_signature`` (a signature's
    keyid names a trusted key, yet no trusted key verifies it: altered payload or another key),
    ``verify.key.untrusted`` (no trusted key verifies any signature).
    """
    message = pae(env.payload_type, env.payload)
    verified: dict[str, VerifiedSignature] = {}
    for s in env.signatures:
        # The hint only orders the candidates; every trusted key is still tried.
        order = sorted(keys, key=lambda k: 0 if s.keyid in (k.spki_sha256, k.id) else 1)
        for k in order:
            if k.id in verified:
                continue
            if _verifies(k.public_key, s.sig, message):
                verified[k.id] = VerifiedSignature(key=k, keyid_hint=s.keyid)
                break
    if verified:
        return tuple(verified[k] for k in sorted(verified))
    hints = [s.keyid for s in env.signatures]
    for s in env.signatures:
        for k in keys:
            if _verifies(k.public_key, s.sig, env.payload):
                raise VerificationError(
                    "verify.dsse.signature_over_payload",
                    f"signature by {k.id!r} covers the raw payload, not DSSE PAE",
                    evidence={"signer_id": k.id},
                    advice=f"The signer of {k.id!r} does not implement DSSE: sign the statement again with "
                    "`ckptgate attest sign --key KEY`, which signs PAE(payloadType, payload).",
                )
    named = [k.id for k in keys if any(h in (k.spki_sha256, k.id) for h in hints)]
    if named:
        raise VerificationError(
            "verify.dsse.bad_signature",
            f"no signature verifies, though a keyid names trusted key(s) {named}: the payload was altered "
            "or signed by another key",
            evidence={"keyid_hints": hints, "keyid_hint_trusted": named, "trusted_keys_tried": len(keys)},
        )
    signed_by = ", ".join(repr(h)[:80] for h in hints[:4] if h) or "no keyid given"
    raise VerificationError(
        "verify.key.untrusted",
        f"no signature verifies under any trusted key (the envelope names keyid {signed_by}); to trust that "
        "signer, name its public key in a trust file and pass it with --trust FILE",
        evidence={"keyid_hints": hints, "trusted_keys_tried": len(keys)},
        advice="The envelope was signed by a key that is not in the trust data, or altered after signing. "
        "`ckptgate attest keygen --trust-out FILE` shows the trust file's shape.",
    )


@runtime_checkable
class Signer(Protocol):
    """Anything that signs PAE bytes: a local key today, KMS or PKCS#11 later."""

    @property
    def keyid(self) -> str: ...

    @property
    def algorithm(self) -> str: ...

    def sign(self, pae: bytes) -> bytes: ...


PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True, slots=True, kw_only=True)
class KeySigner:
    """A :class:`Signer` backed by a local private key (development and CI secrets)."""

    private_key: PrivateKey = field(repr=False)
    keyid: str
    """Defaults to the SPKI SHA-256 of the public half."""
    algorithm: str

    def __post_init__(self) -> None:
        if key_algorithm(self.private_key) != self.algorithm:
            raise ValueError("algorithm does not match the key")

    @classmethod
    def from_key(cls, key: PrivateKey, *, keyid: str | None = None) -> KeySigner:
        return cls(private_key=key, algorithm=key_algorithm(key), keyid=keyid or spki_sha256(key.public_key()))

    @classmethod
    def from_pem(cls, path: Path | str | None = None, *, keyid: str | None = None) -> KeySigner:
        """Load an unencrypted PKCS#8 PEM private key from ``path`` or ``$CKPTGATE_SIGNING_KEY``."""
        p = path if path is not None else os.environ.get(SIGNING_KEY_ENV)
        if not p:
            raise UsageError(
                "usage.signing_key_missing",
                f"no signing key: pass --key or set {SIGNING_KEY_ENV}",
                advice=f"Pass --key KEY or set {SIGNING_KEY_ENV}; `ckptgate attest keygen --out KEY` makes a key pair.",
            )
        check_key_path(p)
        try:
            key = serialization.load_pem_private_key(read_regular_file(p, limit=_MAX_KEY_BYTES), password=None)
        except OSError as e:
            raise UsageError(
                "usage.signing_key_unreadable",
                f"cannot read signing key {p}: {e.strerror}",
                advice=f"Check that {p} is a readable regular file, or pass another key with --key.",
            ) from None
        except (ValueError, TypeError, UnsupportedAlgorithm) as e:
            raise UsageError(
                "usage.signing_key_invalid",
                f"{p} is not an unencrypted PEM private key: {e}",
                advice=f"Pass the private key (not the .pub.pem) with --key; {p} must be unencrypted PKCS#8 PEM, "
                "as `ckptgate attest keygen --out KEY` writes it.",
            ) from None
        try:
            return cls.from_key(key, keyid=keyid)  # type: ignore[arg-type]
        except ValueError:
            raise UsageError(
                "usage.signing_key_invalid",
                f"{p}: only Ed25519 and ECDSA P-256 keys are supported",
                advice=f"Replace {p} with an Ed25519 or ECDSA P-256 key: "
                "`ckptgate attest keygen --out KEY --algorithm ecdsa-p256` makes one.",
            ) from None

    @property
    def public_key(self) -> PublicKey:
        return self.private_key.public_key()

    def sign(self, pae: bytes) -> bytes:
        if isinstance(self.private_key, ed25519.Ed25519PrivateKey):
            return self.private_key.sign(pae)
        return self.private_key.sign(pae, ec.ECDSA(hashes.SHA256()))


def canonical_payload(statement: dict[str, Any]) -> bytes:
    """The payload bytes we sign: sorted keys, compact, UTF-8."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def sign_payload(payload: bytes, signers: Sequence[Signer], *, payload_type: str = IN_TOTO_PAYLOAD_TYPE) -> bytes:
    """Sign exact payload bytes with each signer; returns the envelope JSON bytes."""
    if not signers:
        raise UsageError(
            "usage.no_signer",
            "at least one signer is required",
            advice=f"Pass a signing key with --key or set {SIGNING_KEY_ENV}.",
        )
    message = pae(payload_type, payload)
    env = {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [{"keyid": s.keyid, "sig": base64.b64encode(s.sign(message)).decode("ascii")} for s in signers],
    }
    return (json.dumps(env, indent=2, sort_keys=True) + "\n").encode("utf-8")


def sign_statement(statement: dict[str, Any], signer: Signer, *extra: Signer) -> bytes:
    """Check ``statement`` (Statement v1, and its predicate schema if known) and sign it."""
    check_statement(statement)
    return sign_payload(canonical_payload(statement), [signer, *extra])


def generate_keypair(algorithm: str = "ed25519") -> tuple[bytes, bytes]:
    """Development helper: a new (private PKCS#8 PEM, public SPKI PEM) pair.  Never for production keys."""
    key: PrivateKey
    if algorithm == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
    elif algorithm == "ecdsa-p256":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        raise UsageError(
            "usage.algorithm",
            f"unsupported algorithm {algorithm!r}; use ed25519 or ecdsa-p256",
            advice=f"Pass --algorithm ed25519 or --algorithm ecdsa-p256 instead of {algorithm!r}.",
        )
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public


def write_private_key(path: Path, pem: bytes) -> None:
    """Create ``path`` with mode 0600 and write ``pem``: the key is never readable by others, not
    even briefly, and an existing file is never replaced (``FileExistsError``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def trust_entry(
    public_pem: bytes,
    *,
    signer_id: str,
    predicate_types: Sequence[str],
    producers: Sequence[str] = ("*",),
    scopes: Sequence[str] = ("qualification",),
    builder_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """The trust-data entry for a public key (to paste into ``config/trust/data.json``); with
    ``builder_ids``, the builder ids whose training provenance it may vouch for."""
    key = serialization.load_pem_public_key(public_pem)
    extra: dict[str, Any] = {"builder_ids": list(builder_ids)} if builder_ids else {}
    return {
        "id": signer_id,
        "kind": "key",
        "algorithm": key_algorithm(key),
        "public_key": public_pem.decode("ascii"),
        "spki_sha256": spki_sha256(key),  # type: ignore[arg-type]
        "predicate_types": list(predicate_types),
        "producers": list(producers),
        "scopes": list(scopes),
        **extra,
    }
