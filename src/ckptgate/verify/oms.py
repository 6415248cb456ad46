"""OpenSSF Model Signing (OMS) bundles: verified offline, bound exactly to the measured files.

The bundle's verification material names its method, and each is checked through the reference
implementation (``model_signing``) with ckptgate's own checks added
(:mod:`ckptgate.verify.oms_methods`): a key (ECDSA by the library's verifier; the pinned library
has no Ed25519 verifier, so for an Ed25519 key ckptgate checks the DSSE signature itself with
``cryptography``), an X.509 certificate chain (the library's check, then ckptgate's path
validation to the trusted chain at the verification time), and Sigstore keyless (ckptgate's
offline Sigstore verification: chain to the trust root, transparency-log entry, identity and
issuer from the trust data).  The statement checks and the binding are the same for all three.
ckptgate then checks the statement itself and binds its ``resources`` to the fixture digest's per-file
manifest: every file that ckptgate measured (and so reads and may publish) is a resource with the same
sha256, and every resource is a measured file.  ``model_signing``'s own model hashing is not used, so checkpoint
bytes are read only through the measured manifest.

Refused (``verify.oms.*``): a bundle that is not a Sigstore bundle v0.3 with a DSSE envelope, any
other verification material (``verify.oms.method_unsupported``), a method whose trust input was not
given (``--key``, ``--certificate-chain``, ``--sigstore-trust-root``), another predicate type
(including the pre-1.0 form the library still accepts), a serialisation other than
``files``/``sha256``, ``allow_symlinks``, duplicated resource names, and any difference between the
resources and the measured files.

This module tells the bundle's method and runs the checks in order (:func:`verify_oms_bundle`); the
offered key and flags are :mod:`ckptgate.verify.oms_keys`', the per-method signature checks
:mod:`ckptgate.verify.oms_methods`' (the Ed25519 one in :func:`~ckptgate.verify.oms_methods._ed25519_verifier`),
the statement checks and the binding :mod:`ckptgate.verify.oms_statement`'.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Any

from ckptgate._json import loads_strict, verify_error
from ckptgate.digest import Digest
from ckptgate.verify.dsse import MAX_ENVELOPE_BYTES
from ckptgate.verify.facts import SignerFacts, VerifiedAttestation
from ckptgate.verify.oms_keys import OfferedKey, check_signature_flags, load_verification_material
from ckptgate.verify.oms_methods import _certificate_check, _signature_check, _sigstore_check
from ckptgate.verify.oms_statement import (
    OMS_PREDICATE_TYPE,
    _fail,
    _resources,
    _serialization,
    _statement,
    bind_resources,
)
from ckptgate.verify.x509chain import CertificateChain

__all__ = [
    "BUNDLE_MEDIA_TYPE",
    "OMS_PREDICATE_TYPE",
    "CertificateChain",
    "OfferedKey",
    "check_signature_flags",
    "load_verification_material",
    "verify_oms_bundle",
]

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"


def is_oms_bundle(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("dsseEnvelope"), dict)
        and str(doc.get("mediaType", "")).startswith("application/vnd.dev.sigstore.bundle")
    )


def _check_method(doc: Any) -> str:
    """``key`` (a public-key hint), ``certificate`` (an X.509 chain) or ``sigstore`` (a certificate with a
    transparency-log entry); anything else is refused."""
    if not is_oms_bundle(doc) or doc.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise _fail("not_a_bundle", f"not a Sigstore bundle v0.3 with a DSSE envelope ({BUNDLE_MEDIA_TYPE})")
    vm = doc.get("verificationMaterial")
    fields = sorted(vm) if isinstance(vm, dict) else None
    if (
        isinstance(vm, dict)
        and vm.get("tlogEntries")
        and (isinstance(vm.get("certificate"), dict) or isinstance(vm.get("x509CertificateChain"), dict))
    ):
        return "sigstore"
    if isinstance(vm, dict) and not vm.get("tlogEntries"):
        if isinstance(vm.get("publicKey"), dict) and not set(vm) - {
            "publicKey",
            "tlogEntries",
            "timestampVerificationData",
        }:
            return "key"
        if isinstance(vm.get("x509CertificateChain"), dict) and not set(vm) - {
            "x509CertificateChain",
            "tlogEntries",
            "timestampVerificationData",
        }:
            return "certificate"
    raise _fail(
        "method_unsupported",
        "only the model_signing key, certificate and Sigstore methods are verified "
        "here (a public-key hint, an X.509 certificate chain, or a certificate with a transparency-log entry)",
        fields=fields,
    )


def verify_oms_bundle(
    raw: bytes,
    *,
    source: str,
    key: OfferedKey | None,
    manifest: dict[str, str],
    measured_digest: Digest,
    now: datetime,
    certificate_chain: CertificateChain | None = None,
    sigstore_trust_root: Path | str | None = None,
    trust: Any = None,
) -> VerifiedAttestation:
    """Verify an OMS bundle and bind it to ``manifest`` (path -> sha256 of every measured file, whose
    fixture digest is ``measured_digest``).  The bundle's verification material names the method: a
    public-key hint is verified under ``key``, an X.509 chain against ``certificate_chain``, and a Sigstore
    (keyless) certificate with a transparency-log entry against ``sigstore_trust_root`` and the ``sigstore``
    signers of ``trust`` (:class:`~ckptgate.verify.trust.TrustData`).  Raises ``verify.oms.*`` (and
    ``verify.sigstore.*`` for the Sigstore method)."""
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise _fail("too_large", f"signature is {len(raw)} bytes, over {MAX_ENVELOPE_BYTES}", size=len(raw))
    doc = loads_strict(raw, what="model_signing signature", max_bytes=MAX_ENVELOPE_BYTES, error=verify_error)
    method = _check_method(doc)
    if method == "key":
        if key is None:
            raise _fail("no_key", "the signature uses the key method and no --key was given")
        lib_manifest = _signature_check(raw, key)
        signer = SignerFacts(
            kind="key",
            signer_id=key.signer_id,
            spki_sha256=key.spki_sha256,
            algorithm=key.algorithm,
            offered=key.source,
        )
    elif method == "sigstore":
        if sigstore_trust_root is None:
            raise _fail(
                "no_sigstore_trust_root",
                "the signature uses the Sigstore method and no --sigstore-trust-root was given",
            )
        sigstore_signers = tuple(getattr(trust, "sigstore", ()))
        lib_manifest, res = _sigstore_check(
            raw, sigstore_trust_root, [(t.identity, t.issuer) for t in sigstore_signers]
        )
        if res.payload != _statement(doc)[1]:
            raise _fail("statement", "the verified payload is not the bundle's envelope payload")
        sid = next((t.id for t in sigstore_signers if (t.identity, t.issuer) == (res.identity, res.issuer)), None)
        signer = SignerFacts(
            kind="sigstore", signer_id=sid, identity=res.identity, issuer=res.issuer, extensions=res.extensions
        )
    else:
        if certificate_chain is None:
            raise _fail(
                "no_certificate_chain", "the signature uses the certificate method and no --certificate-chain was given"
            )
        lib_manifest, cert = _certificate_check(doc, raw, certificate_chain, now)
        signer = SignerFacts(
            kind="certificate",
            signer_id=None,
            identity=cert["identities"][0],
            identities=cert["identities"],
            issuer=cert["root_subject"],
            root_sha256=cert["root_sha256"],
            subject=cert["subject"],
            not_after=cert["not_after"],
        )
    stmt, payload = _statement(doc)
    pred = stmt["predicate"]
    ser = _serialization(pred)
    resources = _resources(pred)
    lib = {rd.identifier: rd.digest.digest_hex for rd in lib_manifest.resource_descriptors()}
    if lib != resources or lib_manifest.model_name != stmt["subject"][0]["name"]:
        raise _fail("statement", "the statement does not read as the model_signing library reads it")
    bind_resources(resources, manifest, list(ser.get("ignore_paths", [])))
    checks: tuple[str, ...] = ("bundle", "signature", "statement_schema", "serialization", "resources_bound")
    if method == "certificate":
        checks = (
            "bundle",
            "certificate_chain",
            "certificate_validity",
            "signature",
            "statement_schema",
            "serialization",
            "resources_bound",
        )
    elif method == "sigstore":
        checks = (
            "bundle",
            "certificate_chain",
            "transparency_log",
            "identity",
            "signature",
            "statement_schema",
            "serialization",
            "resources_bound",
        )
    return VerifiedAttestation(
        source=source,
        statement=stmt,
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        method="model_signing",
        signers=(signer,),
        checks=checks,
        verified_at=now,
        subject_name=stmt["subject"][0]["name"],
        measured_digest=measured_digest.prefixed(),
        binding="manifest",
        validity=None,
    )
