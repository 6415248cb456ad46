"""A DSSE envelope in a Sigstore bundle v0.3 signed under an X.509 certificate, with no transparency log.

What ``attest checkpoint --key K --certificate CERT`` writes (sigstore's tooling calls it a "private PKI"
bundle): ``verificationMaterial.certificate`` holds the signing certificate alone, as the bundle
specification asks of a v0.3 bundle (``x509CertificateChain`` is the v0.1/v0.2 form, which sigstore-go
refuses in v0.3; the root and intermediates are the verifier's own), and ``dsseEnvelope`` holds exactly one
signature.  There is no log entry and no signed timestamp, so nothing vouches for when it was signed: the
certificate path must be valid at the time of the verification (sigstore-go's ``WithCurrentTime``).

The anchors are the certificates of ``--certificate-chain`` whose SHA-256 a trust-data ``certificate`` signer
names as its ``root_sha256``; the other certificates given there serve as intermediates.  The chain is
verified by :func:`ckptgate.verify.x509chain.verify_chain` (the one every certificate signer goes through),
then the DSSE signature over PAE under the certificate's key.  Which SAN is trusted for which builder id is
policy's (``ckptgate.trust``, a ``certificate`` signer).  A bundle that also carries transparency-log entries
is a Sigstore bundle and never comes here (:mod:`ckptgate.verify.sigstore`).

Refusals: ``verify.x509.*`` (``media_type``, ``bundle``, ``certificate_form``, ``timestamp_unsupported``,
``signatures``, ``no_certificate_chain``, ``untrusted_root``, ``key_unsupported``, ``signature``, and the chain's
``certificate_chain``, ``certificate_expired``, ``certificate_not_yet_valid``, ``certificate_usage``,
``certificate_identity``); the envelope's ``verify.dsse.*``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm

from ckptgate.errors import VerificationError
from ckptgate.verify.dsse import Envelope, _verifies, pae
from ckptgate.verify.trust import TrustData, key_algorithm
from ckptgate.verify.x509chain import CertificateChain, VerifiedCertificate, certificate_sha256, verify_chain

__all__ = ["BUNDLE_V03_MEDIA_TYPES", "CertificateBundle", "is_certificate_bundle", "verify_certificate_bundle"]

BUNDLE_V03_MEDIA_TYPES = (
    "application/vnd.dev.sigstore.bundle.v0.3+json",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
)
"""The two spellings of the v0.3 media type that sigstore's clients accept; the first is the one written."""
_MATERIAL = frozenset({"certificate", "x509CertificateChain", "tlogEntries", "timestampVerificationData"})


def _fail(code: str, message: str, advice: str | None = None, **evidence: Any) -> VerificationError:
    return VerificationError(f"verify.x509.{code}", message, evidence=evidence, advice=advice)


def is_certificate_bundle(doc: Any) -> bool:
    """A Sigstore bundle whose verification material is an X.509 certificate (or chain) and which carries no
    transparency-log entry: this module's, not the Sigstore path's."""
    vm = doc.get("verificationMaterial") if isinstance(doc, dict) else None
    return isinstance(vm, dict) and not vm.get("tlogEntries") and ("certificate" in vm or "x509CertificateChain" in vm)


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateBundle:
    """What a verified certificate bundle establishes."""

    payload: bytes = field(repr=False)
    """The exact DSSE payload bytes the signature covers."""
    certificate: VerifiedCertificate
    signer_id: str | None
    """The trust-data ``certificate`` signer with one of the SANs and the root reached; ``None`` when none:
    policy then finds no trusted signer."""
    identity: str
    """That signer's SAN, else the certificate's first."""


def _leaf(doc: dict[str, Any]) -> x509.Certificate:
    if doc.get("mediaType") not in BUNDLE_V03_MEDIA_TYPES:
        raise _fail(
            "media_type",
            f"a certificate-signed bundle is read as a Sigstore bundle v0.3 ({BUNDLE_V03_MEDIA_TYPES[0]}), "
            f"not {str(doc.get('mediaType'))[:100]!r}",
            media_type=str(doc.get("mediaType"))[:100],
        )
    extra = sorted(set(doc) - {"mediaType", "verificationMaterial", "dsseEnvelope"})
    if extra:
        raise _fail("bundle", f"the bundle has fields that are not a DSSE bundle's: {extra}", fields=extra[:10])
    vm = doc["verificationMaterial"]
    unknown = sorted(set(vm) - _MATERIAL)
    if unknown:
        raise _fail("bundle", f"the verification material has unknown fields {unknown}", fields=unknown[:10])
    if "x509CertificateChain" in vm:
        raise _fail(
            "certificate_form",
            "a v0.3 bundle carries its signing certificate alone (verificationMaterial.certificate); "
            "x509CertificateChain is the v0.1/v0.2 form",
            advice="Sign again with `ckptgate attest checkpoint --key KEY --certificate CERT`; the verifier names "
            "the CA certificates with --certificate-chain.",
        )
    tvd = vm.get("timestampVerificationData")
    if tvd and (not isinstance(tvd, dict) or any(tvd.values())):
        raise _fail(
            "timestamp_unsupported",
            "the bundle carries signed timestamps; ckptgate does not verify RFC 3161 timestamps, and checks the "
            "certificate at the time of the verification instead",
        )
    raw = vm["certificate"].get("rawBytes") if isinstance(vm["certificate"], dict) else None
    try:
        if not isinstance(raw, str):
            raise ValueError("no rawBytes")
        return x509.load_der_x509_certificate(base64.b64decode(raw, validate=True))
    except (ValueError, binascii.Error) as e:
        raise _fail("bundle", f"verificationMaterial.certificate is not a DER certificate: {str(e)[:200]}") from None


def verify_certificate_bundle(
    doc: dict[str, Any], *, chain: CertificateChain | None, trust: TrustData, now: datetime
) -> CertificateBundle:
    """Verify a certificate-signed DSSE bundle (already strictly parsed) at ``now``; the statement it carries
    is not checked here (:func:`ckptgate.verify.facts.verify_attestation` goes on with it)."""
    leaf = _leaf(doc)
    if not isinstance(doc.get("dsseEnvelope"), dict):
        raise _fail("bundle", "the bundle carries no DSSE envelope (a message signature is not an attestation)")
    env = Envelope.from_doc(doc["dsseEnvelope"])
    if len(env.signatures) != 1:
        raise _fail(
            "signatures",
            f"the bundle's envelope holds {len(env.signatures)} signatures; a Sigstore bundle's holds exactly one",
        )
    if chain is None:
        raise _fail(
            "no_certificate_chain",
            "the attestation is signed under an X.509 certificate and no --certificate-chain was given",
            advice="Name the CA certificates (PEM) the signing certificate chains to with --certificate-chain CA.pem; "
            "the trust data names the root by its sha256.",
        )
    offered = chain.certificates()
    named = {t.root_sha256 for t in trust.certificates}
    anchors = [c for c in offered if certificate_sha256(c) in named]
    if not anchors:
        raise _fail(
            "untrusted_root",
            f"no certificate of --certificate-chain ({', '.join(chain.sources)}) is a root that the trust data names",
            advice=f"Add a certificate signer naming the root's sha256 (root_sha256) to the trust data {trust.source}, "
            "or name that root with --certificate-chain.",
            offered=sorted(certificate_sha256(c) for c in offered),
            named=sorted(named),
        )
    cert = verify_chain(
        leaf,
        intermediates=[c for c in offered if c not in anchors],
        anchors=anchors,
        now=now,
        code="verify.x509",
        sources=chain.sources,
    )
    try:
        public = leaf.public_key()
    except UnsupportedAlgorithm as e:  # a curve cryptography knows only by OID
        raise _fail(
            "key_unsupported",
            f"the signing certificate's key is unsupported ({e}); ckptgate verifies Ed25519 and ECDSA P-256",
        ) from None
    try:
        key_algorithm(public)
    except ValueError:
        raise _fail(
            "key_unsupported",
            f"the signing certificate's key is {type(public).__name__}; ckptgate verifies Ed25519 and ECDSA P-256",
        ) from None
    if not _verifies(public, env.signatures[0].sig, pae(env.payload_type, env.payload)):  # type: ignore[arg-type]
        raise _fail(
            "signature",
            "the DSSE signature does not verify under the signing certificate's key: the payload was altered, "
            "or another key signed it",
            subject=cert.subject,
        )
    entry = next(
        (t for t in trust.certificates if t.identity in cert.identities and t.root_sha256 == cert.root_sha256), None
    )
    return CertificateBundle(
        payload=env.payload,
        certificate=cert,
        signer_id=entry.id if entry is not None else None,
        identity=entry.identity if entry is not None else cert.identities[0],
    )
