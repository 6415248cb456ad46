"""X.509 signing certificates: the chain to a trust anchor, the validity window, the signer's identities.

The one chain verification of every certificate-signed attestation: OpenSSF Model Signing's certificate
method (:mod:`ckptgate.verify.oms`) and training provenance in a Sigstore bundle that carries a certificate and
no transparency-log entry (:mod:`ckptgate.verify.x509bundle`).  Path building and validation are
``cryptography``'s (:mod:`cryptography.x509.verification`): signatures along the path, names, basic
constraints and path length, and every certificate of the path (the trust anchor too) valid at the time
given.  Its extension profile is relaxed from the Web PKI's to a code-signing PKI's: an issuer must be a CA
(basicConstraints ``cA``) and, where it states a key usage, may sign certificates; the signing certificate
must not be a CA, must allow digital signatures (key usage ``digitalSignature`` or extended key usage
``codeSigning``, the rule of ``model_signing``'s certificate verifier, with neither extension forbidding
it) and must name its signer in a subject alternative name (email, URI or DNS) for the trust data to
match.  No revocation (CRL, OCSP) is consulted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    PolicyBuilder,
    Store,
)
from cryptography.x509.verification import VerificationError as PathError

from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import read_regular_file

__all__ = ["CertificateChain", "VerifiedCertificate", "certificate_sha256", "identities", "verify_chain"]

_MAX_PEM_BYTES = 1 << 20


def certificate_sha256(cert: x509.Certificate) -> str:
    """Hex SHA-256 of the DER certificate: how trust data names a root (``root_sha256``)."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def identities(cert: x509.Certificate) -> tuple[str, ...]:
    """The subject alternative names a trust-data ``certificate`` signer may name: email, URI, DNS."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    kinds = (x509.RFC822Name, x509.UniformResourceIdentifier, x509.DNSName)
    return tuple(str(v) for t in kinds for v in san.get_values_for_type(t))


def _self_signed(cert: x509.Certificate) -> bool:
    if cert.issuer != cert.subject:
        return False
    try:
        cert.verify_directly_issued_by(cert)
    except (InvalidSignature, ValueError, TypeError):  # a bad signature, an unsupported key type
        return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateChain:
    """CA certificates named on the command line (``--certificate-chain``, repeatable): the roots (and any
    intermediates) that a signing certificate's chain must lead to.  Which signer identity is trusted comes
    from the trust data (a ``certificate`` signer: SAN and root fingerprint), never from here."""

    sources: tuple[str, ...]
    pem: bytes = field(repr=False)
    count: int
    #: the sha256 of each file's bytes as read, in the order of ``sources`` (``sha256:<hex>``)
    digests: tuple[str, ...]

    @classmethod
    def from_files(cls, paths: Any) -> CertificateChain:
        """Read PEM certificates; ``usage.certificate_chain_unreadable`` or ``verify.oms.certificate_chain_invalid``."""
        blobs: list[bytes] = []
        digests: list[str] = []
        count = 0
        for path in paths:
            try:
                pem = read_regular_file(path, limit=_MAX_PEM_BYTES)
            except OSError as e:
                raise UsageError(
                    "usage.certificate_chain_unreadable",
                    f"cannot read the certificate chain {path}: {e.strerror}",
                    evidence={"path": str(path)},
                    advice=f"Check that {path} is a readable PEM file, or name another with --certificate-chain.",
                ) from None
            try:
                count += len(x509.load_pem_x509_certificates(pem))
            except ValueError as e:
                raise VerificationError(
                    "verify.oms.certificate_chain_invalid",
                    f"{path} holds no PEM certificate: {e}",
                    evidence={"path": str(path)},
                    advice=f"Name with --certificate-chain a PEM file of the CA certificates (-----BEGIN "
                    f"CERTIFICATE-----), not {path}; `openssl x509 -in FILE -inform DER -out CA.pem` converts DER.",
                ) from None
            blobs.append(pem.rstrip(b"\n") + b"\n")
            digests.append("sha256:" + hashlib.sha256(pem).hexdigest())
        if not blobs:
            raise UsageError(
                "usage.certificate_chain_unreadable",
                "no certificate chain was named",
                advice="Name the CA certificates (PEM) of the signing certificate with --certificate-chain CA.pem.",
            )
        return cls(sources=tuple(str(p) for p in paths), pem=b"".join(blobs), count=count, digests=tuple(digests))

    def certificates(self) -> list[x509.Certificate]:
        return x509.load_pem_x509_certificates(self.pem)

    def roots(self) -> list[x509.Certificate]:
        """The self-signed certificates: the trust anchors when no trust data narrows them."""
        return [c for c in self.certificates() if _self_signed(c)]


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifiedCertificate:
    """A signing certificate whose chain to a trust anchor verified at ``checked_at``."""

    certificate: x509.Certificate = field(repr=False)
    identities: tuple[str, ...]
    subject: str
    root_sha256: str
    root_subject: str
    not_before: datetime
    not_after: datetime
    checked_at: datetime


def _issuer_may_sign_certificates(_policy: Any, _cert: x509.Certificate, usage: x509.KeyUsage | None) -> None:
    if usage is not None and not usage.key_cert_sign:
        raise ValueError("an issuer's key usage does not include keyCertSign")


def _signer_is_not_a_ca(_policy: Any, _cert: x509.Certificate, bc: x509.BasicConstraints | None) -> None:
    if bc is not None and bc.ca:
        raise ValueError("the signing certificate is a CA certificate")


_CA_POLICY = (
    ExtensionPolicy.permit_all()
    .require_present(x509.BasicConstraints, Criticality.AGNOSTIC, None)
    .may_be_present(x509.KeyUsage, Criticality.AGNOSTIC, _issuer_may_sign_certificates)
)
_EE_POLICY = ExtensionPolicy.permit_all().may_be_present(
    x509.BasicConstraints, Criticality.AGNOSTIC, _signer_is_not_a_ca
)


def _path(
    leaf: x509.Certificate, intermediates: Sequence[x509.Certificate], anchors: Sequence[x509.Certificate], at: datetime
) -> list[x509.Certificate]:
    verifier = (
        PolicyBuilder()
        .store(Store(list(anchors)))
        .time(at)
        .extension_policies(ca_policy=_CA_POLICY, ee_policy=_EE_POLICY)
        .build_client_verifier()
    )
    return list(verifier.verify(leaf, list(intermediates)).chain)


def _may_sign(cert: x509.Certificate) -> bool:
    """Key usage ``digitalSignature`` or extended key usage ``codeSigning`` (``model_signing``'s rule), and no
    extension that forbids signing (RFC 5280 4.2.1.12: with both, the key serves only purposes both allow): a
    key usage without ``digitalSignature``, or an extended key usage without ``codeSigning`` (or ``any``)."""
    try:
        usage: x509.KeyUsage | None = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    try:
        purposes: x509.ExtendedKeyUsage | None = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        purposes = None
    if usage is None and purposes is None:
        return False
    if usage is not None and not usage.digital_signature:
        return False
    allowed = {ExtendedKeyUsageOID.CODE_SIGNING, ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE}
    return purposes is None or any(p in allowed for p in purposes)


def _window(chain: Sequence[x509.Certificate], now: datetime, code: str) -> VerificationError | None:
    """The first certificate of ``chain`` that is not valid at ``now``, as the refusal it is."""
    for c in chain:
        who = c.subject.rfc4514_string()
        if now > c.not_valid_after_utc:
            return VerificationError(
                f"{code}.certificate_expired",
                f"certificate {who!r} expired at {c.not_valid_after_utc.isoformat()}",
                evidence={
                    "subject": who,
                    "not_after": c.not_valid_after_utc.isoformat(),
                    "checked_at": now.isoformat(),
                },
            )
        if now < c.not_valid_before_utc:
            return VerificationError(
                f"{code}.certificate_not_yet_valid",
                f"certificate {who!r} is valid from {c.not_valid_before_utc.isoformat()} only",
                evidence={
                    "subject": who,
                    "not_before": c.not_valid_before_utc.isoformat(),
                    "checked_at": now.isoformat(),
                },
            )
    return None


def verify_chain(
    leaf: x509.Certificate,
    *,
    intermediates: Sequence[x509.Certificate] = (),
    anchors: Sequence[x509.Certificate],
    now: datetime,
    code: str,
    sources: Collection[str] = (),
) -> VerifiedCertificate:
    """Verify that ``leaf`` chains through ``intermediates`` (untrusted, for path building) to one of ``anchors``,
    every certificate of the path valid at ``now``.  Raises :class:`VerificationError` with codes under
    ``code`` (``verify.oms``, ``verify.x509``): ``.certificate_chain`` (no path to an anchor),
    ``.certificate_expired`` / ``.certificate_not_yet_valid`` (a path exists, but a certificate of it is outside
    its validity window at ``now``), ``.certificate_usage`` (the leaf may not sign), ``.certificate_identity``
    (the leaf names no signer)."""
    where = ", ".join(sources) or "the trust anchors"
    if not anchors:
        raise VerificationError(
            f"{code}.certificate_chain",
            f"no trust anchor (a self-signed CA certificate) among {where} for the signing certificate to chain to",
            evidence={"chain": list(sources), "subject": leaf.subject.rfc4514_string()},
        )
    try:
        chain = _path(leaf, intermediates, anchors, now)
    except PathError as at_now:
        try:  # is there a path at all?  At the leaf's own start time, as model_signing checks it
            chain = _path(leaf, intermediates, anchors, leaf.not_valid_before_utc)
        except PathError:
            chain = []
        outside = _window(chain, now, code) if chain else None
        if outside is not None:
            raise outside from None
        raise VerificationError(
            f"{code}.certificate_chain",
            f"the signing certificate does not chain to {where}: {str(at_now)[:300]}",
            evidence={"chain": list(sources), "subject": leaf.subject.rfc4514_string()},
        ) from None
    if not _may_sign(leaf):
        raise VerificationError(
            f"{code}.certificate_usage",
            "the signing certificate allows no digital signature (key usage digitalSignature or extended key "
            "usage codeSigning)",
            evidence={"subject": leaf.subject.rfc4514_string()},
        )
    names = identities(leaf)
    if not names:
        raise VerificationError(
            f"{code}.certificate_identity",
            "the signing certificate has no subject alternative name (email, URI or DNS) for the trust data to name",
            evidence={"subject": leaf.subject.rfc4514_string()},
        )
    root = chain[-1]
    return VerifiedCertificate(
        certificate=leaf,
        identities=names,
        subject=leaf.subject.rfc4514_string(),
        root_sha256=certificate_sha256(root),
        root_subject=root.subject.rfc4514_string(),
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        checked_at=now,
    )
