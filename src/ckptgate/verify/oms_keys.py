"""The verification material an OMS bundle is checked under, read from the command line before any
work: the public key of ``--key`` (:class:`OfferedKey`) and the CA certificates of
``--certificate-chain``, and the check that ``--signature`` names one of them."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.trust import spki_sha256
from ckptgate.verify.x509chain import CertificateChain

_CURVES = {"secp256r1": "ecdsa-p256", "secp384r1": "ecdsa-p384"}
_MAX_KEY_BYTES = 1 << 16


@dataclass(frozen=True, slots=True, kw_only=True)
class OfferedKey:
    """A public key named on the command line (``--key``): trusted, by policy, for the OMS predicate
    type only, and never written into the central trust data."""

    source: str
    pem: bytes = field(repr=False)
    algorithm: str
    spki_sha256: str

    @property
    def signer_id(self) -> str:
        return f"key:{self.spki_sha256[:16]}"

    @property
    def file_sha256(self) -> str:
        """``sha256:<hex>`` of the file's bytes as read (what a decision names it by)."""
        return "sha256:" + hashlib.sha256(self.pem).hexdigest()

    @classmethod
    def from_file(cls, path: Path | str) -> OfferedKey:
        """Read a PEM public key (ECDSA P-256 or P-384, or Ed25519); ``usage.key_unreadable`` or
        ``verify.oms.key_unsupported``."""
        try:
            pem = read_regular_file(path, limit=_MAX_KEY_BYTES)
        except OSError as e:
            raise UsageError(
                "usage.key_unreadable",
                f"cannot read the public key {path}: {e.strerror}",
                evidence={"path": str(path)},
                advice=f"Check that {path} is a readable regular file, or name another public key with --key.",
            ) from None
        try:
            key = serialization.load_pem_public_key(pem)
        except (ValueError, TypeError, UnsupportedAlgorithm) as e:
            raise VerificationError(
                "verify.oms.key_unsupported", f"{path} is not a PEM public key: {e}", evidence={"path": str(path)}
            ) from None
        alg = (
            _CURVES.get(key.curve.name)
            if isinstance(key, ec.EllipticCurvePublicKey)
            else "ed25519"
            if isinstance(key, ed25519.Ed25519PublicKey)
            else None
        )
        if alg is None or not isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
            raise VerificationError(
                "verify.oms.key_unsupported",
                f"{path}: an OMS signature is verified under an ECDSA P-256 or P-384 key, or an Ed25519 key, only",
                evidence={"path": str(path), "key_type": type(key).__name__},
            )
        return cls(source=str(path), pem=pem, algorithm=alg, spki_sha256=spki_sha256(key))

    def to_facts(self) -> dict[str, Any]:
        """The ``offered_keys`` entry of the policy input (policy decides which predicate types it may sign)."""
        return {
            "kind": "key",
            "signer_id": self.signer_id,
            "source": self.source,
            "algorithm": self.algorithm,
            "spki_sha256": self.spki_sha256,
        }


def check_signature_flags(signatures: Any, key: object, certificate_chain: Any = ()) -> None:
    """``--signature`` needs ``--key``, ``--certificate-chain`` or ``--sigstore-trust-root``
    (``usage.signature_needs_key``); ``certificate_chain`` is truthy when either of the last two is given."""
    if signatures and key is None and not certificate_chain:
        raise UsageError(
            "usage.signature_needs_key",
            "--signature needs --key (the public key that verifies it), "
            "--certificate-chain (the CA certificates its signing certificate chains to) or "
            "--sigstore-trust-root (for a Sigstore keyless signature)",
            advice="Pass the signer's PEM public key with --key PUB.pem, the CA with "
            "--certificate-chain CA.pem, or a trusted_root.json with --sigstore-trust-root.",
        )


def load_verification_material(
    signatures: Any, key: Path | str | None, certificate_chain: Any = (), sigstore_trust_root: Any = None
) -> tuple[OfferedKey | None, CertificateChain | None]:
    """Check the flags, then read ``--key`` and ``--certificate-chain`` (before any work)."""
    check_signature_flags(signatures, key, bool(certificate_chain) or sigstore_trust_root is not None)
    return (
        OfferedKey.from_file(key) if key is not None else None,
        CertificateChain.from_files(list(certificate_chain)) if certificate_chain else None,
    )
