"""Trust data: the only source of public keys and Sigstore identities (``data.ckptgate.config.trust``).

A keyid in an envelope is a hint, never a decision; keys come from here only.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ckptgate import _resources
from ckptgate._json import loads_strict, verify_error
from ckptgate.errors import VerificationError
from ckptgate.userfiles import read_regular_file

Algorithm = Literal["ed25519", "ecdsa-p256"]
ALGORITHMS: tuple[str, ...] = ("ed25519", "ecdsa-p256")
PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey

TRUST_RELATIVE = Path("policies/ckptgate/config/trust/data.json")
TRUST_ENV = "CKPTGATE_TRUST"
_MAX_TRUST_BYTES = 4 * 1024 * 1024
#: The most bytes of trust data read (one more is read, so that a larger file is refused as such).
MAX_TRUST_BYTES = _MAX_TRUST_BYTES
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class TrustDataError(VerificationError):
    """The trust data is missing or malformed: nothing can be verified against it."""

    default_advice = (
        "Fix the trust data file the message names (or name another with --trust FILE): every signer "
        "needs an id, a kind, and either a PEM public key whose spki_sha256 matches, or an "
        "identity and issuer; `ckptgate attest keygen --trust-out FILE` writes a valid one."
    )


def _fix_trust_file(path: Path) -> str:
    """The advice for trust data read from ``path``: the file actually used, not the source tree's."""
    return (
        f"Fix the trust data file {path} (or name another with --trust FILE): every signer needs an id, a "
        "kind, and either a PEM public key whose spki_sha256 matches, or an identity and issuer; "
        "`ckptgate attest keygen --trust-out FILE` writes a valid one."
    )


def spki_sha256(key: PublicKey) -> str:
    """Hex SHA-256 of the DER SubjectPublicKeyInfo: the stable key identifier we compute ourselves."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def key_algorithm(key: object) -> Algorithm:
    """The algorithm name of a supported public or private key; raises ``ValueError`` otherwise."""
    if isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey)):
        return "ed25519"
    if isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)) and isinstance(key.curve, ec.SECP256R1):
        return "ecdsa-p256"
    raise ValueError(f"unsupported key type {type(key).__name__}")


def printable_name(value: str) -> bool:
    """Whether ``value`` is a name a message can quote on one line: not blank, no control character.
    A signer's id in trust data, and what ``attest keygen --id`` writes there."""
    return bool(value.strip()) and not any(ord(c) < 0x20 or c == "\x7f" for c in value)


def _strs(entry: dict[str, Any], name: str, sid: str) -> tuple[str, ...]:
    v = entry.get(name)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise TrustDataError(
            "verify.trust.field",
            f"signer {sid!r}: {name} must be a non-empty list of strings",
            evidence={"signer": sid, "field": name},
        )
    return tuple(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Grant:
    """What every kind of trusted signer is trusted for."""

    id: str
    """Stable signer id, e.g. ``ci-qualification``."""
    predicate_types: tuple[str, ...]
    producers: tuple[str, ...]
    scopes: tuple[str, ...]
    builder_ids: tuple[str, ...] = ()
    """Builder ids (SLSA ``runDetails.builder.id``, or ``*``) whose training provenance this signer may
    vouch for; empty: none (docs/attestations.md)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustedKey(_Grant):
    """A trusted public key."""

    algorithm: Algorithm
    """``ed25519`` or ``ecdsa-p256``."""
    public_key: PublicKey = field(repr=False)
    """The parsed key (from the PEM in trust data)."""
    spki_sha256: str
    """Hex SHA-256 of the DER SPKI, recomputed and checked against trust data."""

    def __post_init__(self) -> None:
        if key_algorithm(self.public_key) != self.algorithm:
            raise ValueError(f"signer {self.id}: key is not {self.algorithm}")
        if spki_sha256(self.public_key) != self.spki_sha256:
            raise ValueError(f"signer {self.id}: spki_sha256 does not match the key")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustedIdentity(_Grant):
    """A trusted Sigstore identity: certificate SAN plus OIDC issuer."""

    identity: str
    issuer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustedCertificate(_Grant):
    """A trusted X.509 signer (OpenSSF Model Signing certificate method): a SAN of the signing certificate
    and the SHA-256 of the DER root certificate its chain must lead to."""

    identity: str
    root_sha256: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TrustData:
    """Validated trust data; build with :meth:`from_file` or :meth:`from_json`."""

    keys: tuple[TrustedKey, ...]
    sigstore: tuple[TrustedIdentity, ...]
    source: str
    certificates: tuple[TrustedCertificate, ...] = ()
    raw: bytes = field(default=b"", repr=False)  # the exact bytes parsed, so OPA is given the same ones

    def __post_init__(self) -> None:
        ids = [s.id for s in self.keys] + [s.id for s in self.sigstore] + [s.id for s in self.certificates]
        if len(ids) != len(set(ids)):
            raise ValueError("duplicate signer ids")

    @classmethod
    def from_json(cls, raw: bytes, *, source: str = "<memory>") -> TrustData:
        """Parse trust data strictly; codes ``verify.trust.*``."""
        try:
            doc = loads_strict(raw, what="trust data", max_bytes=_MAX_TRUST_BYTES, error=verify_error)
        except VerificationError as bad:
            raise TrustDataError("verify.trust.json", f"{source}: {bad.message}", evidence=bad.evidence) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("signers"), list):
            raise TrustDataError("verify.trust.shape", f"{source}: expected an object with a 'signers' list")
        keys: list[TrustedKey] = []
        stores: list[TrustedIdentity] = []
        certs: list[TrustedCertificate] = []
        seen: set[str] = set()
        for i, e in enumerate(doc["signers"]):
            if not isinstance(e, dict) or not isinstance(e.get("id"), str) or not printable_name(e["id"]):
                raise TrustDataError(
                    "verify.trust.field",
                    f"{source}: signer #{i} has no id, or one that is blank or holds control characters",
                    evidence={"index": i},
                )
            sid = e["id"]
            if sid in seen:
                raise TrustDataError(
                    "verify.trust.duplicate_id", f"{source}: signer id {sid!r} repeats", evidence={"signer": sid}
                )
            seen.add(sid)
            common = {
                "predicate_types": _strs(e, "predicate_types", sid),
                "producers": _strs(e, "producers", sid),
                "scopes": _strs(e, "scopes", sid),
                "builder_ids": _strs(e, "builder_ids", sid) if "builder_ids" in e else (),
            }
            kind = e.get("kind")
            if kind == "key":
                keys.append(_key_signer(e, sid, common, source))
            elif kind == "sigstore":
                ident, iss = e.get("identity"), e.get("issuer")
                if not (isinstance(ident, str) and ident and isinstance(iss, str) and iss):
                    raise TrustDataError(
                        "verify.trust.field",
                        f"signer {sid!r}: identity and issuer are required",
                        evidence={"signer": sid},
                    )
                stores.append(TrustedIdentity(id=sid, identity=ident, issuer=iss, **common))
            elif kind == "certificate":
                ident, root = e.get("identity"), e.get("root_sha256")
                if not (isinstance(ident, str) and ident and isinstance(root, str) and _HEX64.match(root)):
                    raise TrustDataError(
                        "verify.trust.field",
                        f"signer {sid!r}: identity and root_sha256 (64 lowercase hex) are required",
                        evidence={"signer": sid},
                    )
                certs.append(TrustedCertificate(id=sid, identity=ident, root_sha256=root, **common))
            else:
                raise TrustDataError(
                    "verify.trust.kind",
                    f"signer {sid!r}: kind must be 'key', 'sigstore' or 'certificate'",
                    evidence={"signer": sid, "kind": kind if isinstance(kind, str) else None},
                )
        return cls(keys=tuple(keys), sigstore=tuple(stores), source=source, raw=bytes(raw), certificates=tuple(certs))

    @classmethod
    def from_file(cls, path: Path | str | None = None) -> TrustData:
        """Load trust data from ``path`` or :func:`default_trust_path`."""
        p = Path(path) if path is not None else default_trust_path()
        try:
            raw = read_regular_file(p, limit=_MAX_TRUST_BYTES)  # one byte more: from_json refuses it
        except OSError as e:
            raise TrustDataError(
                "verify.trust.unreadable",
                f"cannot read trust data {p}: {e.strerror}",
                evidence={"path": str(p)},
                advice=f"Name a readable regular file with --trust FILE ({p} is not one).",
            ) from None
        try:
            return cls.from_json(raw, source=str(p))
        except TrustDataError as e:  # name the file this run read, not the source tree's
            specific = e.diagnostics() != TrustDataError.default_advice
            raise TrustDataError(
                e.code,
                e.message,
                evidence={**e.evidence, "path": str(p)},
                advice=e.diagnostics() if specific else _fix_trust_file(p),
            ) from None


def _key_signer(e: dict[str, Any], sid: str, common: dict[str, Any], source: str) -> TrustedKey:
    alg, pem, spki = e.get("algorithm"), e.get("public_key"), e.get("spki_sha256")
    if alg not in ALGORITHMS:
        raise TrustDataError(
            "verify.trust.algorithm", f"signer {sid!r}: algorithm must be one of {ALGORITHMS}", evidence={"signer": sid}
        )
    if not isinstance(pem, str) or not isinstance(spki, str):
        raise TrustDataError(
            "verify.trust.field", f"signer {sid!r}: public_key and spki_sha256 are required", evidence={"signer": sid}
        )
    try:
        key = serialization.load_pem_public_key(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError, TypeError, UnsupportedAlgorithm) as ex:
        raise TrustDataError(
            "verify.trust.public_key",
            f"signer {sid!r}: public_key is not a PEM public key: {ex}",
            evidence={"signer": sid},
        ) from None
    try:
        got_alg = key_algorithm(key)
    except ValueError:
        got_alg = None
    if got_alg != alg:
        raise TrustDataError(
            "verify.trust.algorithm",
            f"signer {sid!r}: key is {got_alg or 'unsupported'}, trust data says {alg}",
            evidence={"signer": sid},
        )
    actual = spki_sha256(key)  # type: ignore[arg-type]
    if spki.lower() != actual:
        raise TrustDataError(
            "verify.trust.spki_mismatch",
            f"signer {sid!r}: spki_sha256 does not match its key",
            evidence={"signer": sid, "declared": spki, "actual": actual},
        )
    return TrustedKey(id=sid, algorithm=alg, public_key=key, spki_sha256=actual, **common)  # type: ignore[arg-type]


def default_trust_path() -> Path:
    """``$CKPTGATE_TRUST``, else the trust data the installed package carries (the clone's, when running
    from a development clone).  Never a file found by walking up from the current directory: another
    user could plant one above it."""
    env = os.environ.get(TRUST_ENV)
    if env:
        return Path(env)
    base = _resources.policies_dir()
    rel = TRUST_RELATIVE.relative_to("policies")
    return base / rel if base is not None else Path(__file__).resolve().parents[3] / TRUST_RELATIVE
