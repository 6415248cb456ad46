"""``attest checkpoint --key K --certificate CERT``: the training provenance signed under an X.509 certificate.

The DSSE envelope is signed with ``K`` and written in a Sigstore bundle v0.3 whose verification material is
the signing certificate alone (``verificationMaterial.certificate``: the bundle specification's form for v0.3;
its root and intermediates are the verifier's, named at intake with ``--certificate-chain``), with no
transparency-log entry: what sigstore's tooling calls a "private PKI" bundle.  Intake verifies it with
:mod:`ckptgate.verify.x509bundle`, at the time of the intake (nothing in the bundle says when it was signed).

Before anything is measured or signed: the certificate is ``K``'s (``usage.certificate_key_mismatch``), valid
now (``usage.certificate_expired``, ``usage.certificate_not_yet_valid``) and names a signer in a subject
alternative name (``usage.certificate_identity``); with ``--certificate-chain``, it chains to those CA
certificates by the same verification intake runs (``usage.certificate_chain``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.dsse import IN_TOTO_PAYLOAD_TYPE, KeySigner, canonical_payload, pae
from ckptgate.verify.statement import check_statement
from ckptgate.verify.x509bundle import BUNDLE_V03_MEDIA_TYPES
from ckptgate.verify.x509chain import CertificateChain, identities, verify_chain

__all__ = ["check_certificate", "sign_with_certificate"]

_MAX_PEM_BYTES = 1 << 20


def read_certificates(path: Path, option: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(read_regular_file(path, limit=_MAX_PEM_BYTES))
    except (OSError, ValueError) as e:
        raise UsageError(
            "usage.certificate",
            f"cannot read the certificate {path}: {getattr(e, 'strerror', None) or e}",
            advice=f"Check that {path} is a PEM certificate file, or name another with {option}.",
        ) from None
    return certs


def check_certificate(signer: KeySigner, certificate: Path, chain: Sequence[Path], now: datetime) -> x509.Certificate:
    """The signing certificate of ``signer``'s key, valid at ``now``, naming a signer (and, with ``chain``,
    chaining to it); raises :class:`UsageError` (exit 2) naming the option to fix."""
    leaf = read_certificates(certificate, "--certificate")[0]
    mine = signer.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        theirs = leaf.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    except UnsupportedAlgorithm:  # a curve cryptography knows only by OID: not the signing key either
        theirs = b""
    if mine != theirs:
        raise UsageError(
            "usage.certificate_key_mismatch",
            f"the certificate {certificate} is not for the signing key: its public key differs",
            advice=f"Pass with --certificate the certificate issued for --key, or with --key the key {certificate} "
            "was issued for.",
        )
    if now > leaf.not_valid_after_utc or now < leaf.not_valid_before_utc:
        expired = now > leaf.not_valid_after_utc
        raise UsageError(
            "usage.certificate_expired" if expired else "usage.certificate_not_yet_valid",
            f"the certificate {certificate} is valid from {leaf.not_valid_before_utc.isoformat()} to "
            f"{leaf.not_valid_after_utc.isoformat()}, not now ({now.isoformat()}): intake checks it at the time of "
            "the intake, since the bundle carries no signing time",
            evidence={
                "not_before": leaf.not_valid_before_utc.isoformat(),
                "not_after": leaf.not_valid_after_utc.isoformat(),
            },
            advice="Pass with --certificate a certificate of --key that is valid now (have your CA issue a new one).",
        )
    if not identities(leaf):
        raise UsageError(
            "usage.certificate_identity",
            f"the certificate {certificate} has no subject alternative name (email, URI or DNS) for trust data to name",
            advice="Pass with --certificate a certificate whose subject alternative name names the signer.",
        )
    if chain:
        try:
            offered = CertificateChain.from_files(list(chain))
            certs = offered.certificates()
            roots = offered.roots()
            verify_chain(
                leaf,
                intermediates=[c for c in certs if c not in roots],
                anchors=roots,
                now=now,
                code="verify.x509",
                sources=offered.sources,
            )
        except VerificationError as e:
            raise UsageError(
                "usage.certificate_chain",
                f"the certificate {certificate} does not verify against --certificate-chain: {e.message}",
                evidence={"code": e.code, **e.evidence},
                advice="Pass with --certificate-chain the CA certificates (the root, and any intermediates) that "
                "issued --certificate, or drop --certificate-chain.",
            ) from None
    return leaf


def sign_with_certificate(statement: dict[str, Any], signer: KeySigner, leaf: x509.Certificate) -> bytes:
    """Check ``statement`` against its schema, sign it (DSSE, PAE) and return the Sigstore bundle v0.3 JSON."""
    check_statement(statement)
    payload = canonical_payload(statement)
    sig = signer.sign(pae(IN_TOTO_PAYLOAD_TYPE, payload))
    bundle = {
        "mediaType": BUNDLE_V03_MEDIA_TYPES[0],
        "verificationMaterial": {
            "certificate": {"rawBytes": base64.b64encode(leaf.public_bytes(serialization.Encoding.DER)).decode()},
            "tlogEntries": [],
        },
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": IN_TOTO_PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(sig).decode()}],
        },
    }
    return (json.dumps(bundle, indent=2) + "\n").encode("utf-8")
