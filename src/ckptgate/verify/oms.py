"""OpenSSF Model Signing (OMS) bundles, key method: verified offline, bound exactly to the measured files.

The signature check is the reference implementation's (``model_signing``, the elliptic-key
verifier on a Sigstore bundle v0.3 with a DSSE envelope) for ECDSA keys.  The pinned library has no
Ed25519 verifier, so for an Ed25519 key ckptgate checks the DSSE signature itself with
``cryptography`` (see :func:`_ed25519_verifier`); the statement checks and the binding are the same.
ckptgate then checks the statement itself and binds its ``resources`` to the fixture digest's per-file
manifest: every file that ckptgate measured (and so reads and may publish) is a resource with the same
sha256, and every resource is a measured file.  ``model_signing``'s own model hashing is not used, so checkpoint
bytes are read only through the measured manifest.

Refused (``verify.oms.*``): another predicate type (including the pre-1.0 form the library still
accepts), a serialisation other than ``files``/``sha256``, ``allow_symlinks``, a certificate or
transparency-log bundle (later work), duplicated resource names, and any difference between the
resources and the measured files.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ckptgate._json import loads_strict, verify_error
from ckptgate.digest import Digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.dsse import IN_TOTO_PAYLOAD_TYPE, MAX_ENVELOPE_BYTES
from ckptgate.verify.facts import MAX_PAYLOAD_BYTES, SignerFacts, VerifiedAttestation
from ckptgate.verify.sigstore import verify_bundle_dsse
from ckptgate.verify.statement import STATEMENT_TYPE
from ckptgate.verify.trust import spki_sha256
from ckptgate.verify.x509chain import CertificateChain, verify_chain

__all__ = ["BUNDLE_MEDIA_TYPE", "OMS_PREDICATE_TYPE", "CertificateChain", "OfferedKey", "verify_oms_bundle"]

OMS_PREDICATE_TYPE = "https://model_signing/signature/v1.0"
"""The predicate type of an OpenSSF Model Signing v1.0 signature."""
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
_CURVES = {"secp256r1": "ecdsa-p256", "secp384r1": "ecdsa-p384"}
_MAX_KEY_BYTES = 1 << 16
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


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
        except (ValueError, TypeError) as e:
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


def _fail(code: str, message: str, **evidence: Any) -> VerificationError:
    return VerificationError(f"verify.oms.{code}", message, evidence=evidence)


def is_oms_bundle(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and isinstance(doc.get("dsseEnvelope"), dict)
        and str(doc.get("mediaType", "")).startswith("application/vnd.dev.sigstore.bundle")
    )


def _check_method(doc: Any) -> str:
    """``key`` (a public-key hint) or ``certificate`` (an X.509 chain); anything else is refused."""
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


def _signature_check(raw: bytes, key: OfferedKey) -> Any:
    """The reference implementation's verification of the bundle under ``key``; returns its manifest."""
    from model_signing._signing import sign_ec_key, sign_sigstore_pb  # noqa: PLC0415 - model_signing: 1.7 s import

    with tempfile.TemporaryDirectory(prefix="ckptgate-oms-") as d:
        kp, sp = Path(d, "key.pem"), Path(d, "model.sig")
        for p, data in ((kp, key.pem), (sp, raw)):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            verifier = sign_ec_key.Verifier(kp) if key.algorithm != "ed25519" else _ed25519_verifier(key)
            return verifier.verify(sign_sigstore_pb.Signature.read(sp))
        except Exception as e:  # the library raises ValueError, InvalidSignature, KeyError...
            raise _fail(
                "signature",
                f"the model_signing signature does not verify under {key.source}: {type(e).__name__}: {str(e)[:300]}",
                key=key.source,
                spki_sha256=key.spki_sha256,
            ) from None


def _certificate_check(
    doc: dict[str, Any], raw: bytes, chain: CertificateChain, now: datetime
) -> tuple[Any, dict[str, Any]]:
    """The reference implementation's certificate verification (``model_signing``: the bundle's chain leads
    to a certificate of ``chain``, the leaf may sign, the DSSE signature verifies under the leaf's key), then
    ckptgate's one chain verification (:func:`~ckptgate.verify.x509chain.verify_chain`, ``cryptography``'s path
    validation to the self-signed certificates of ``chain``): every certificate of the path valid at ``now``
    (the library checks the chain at the leaf's notBefore only), and the signer facts (SANs, root
    fingerprint) that the trust data is matched on."""
    from model_signing._signing import sign_certificate, sign_sigstore_pb  # noqa: PLC0415 - model_signing: 1.7 s import
    from OpenSSL import crypto  # noqa: PLC0415 - pyOpenSSL: 33 ms import, for the library's error type

    try:
        ders = [
            base64.b64decode(c["rawBytes"], validate=True)
            for c in doc["verificationMaterial"]["x509CertificateChain"]["certificates"]
        ]
        bundled = [x509.load_der_x509_certificate(d) for d in ders]
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise _fail(
            "certificate_chain_invalid", "the bundle's certificate chain is not a list of DER certificates"
        ) from None
    if not bundled:
        raise _fail("certificate_chain_invalid", "the bundle's certificate chain is empty")
    with tempfile.TemporaryDirectory(prefix="ckptgate-oms-") as d:
        cp, sp = Path(d, "chain.pem"), Path(d, "model.sig")
        for p, data in ((cp, chain.pem), (sp, raw)):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        verifier = sign_certificate.Verifier([cp])
        try:
            lib_manifest = verifier.verify(sign_sigstore_pb.Signature.read(sp))
        except crypto.X509StoreContextError as e:
            raise _fail(
                "certificate_chain",
                f"the signing certificate does not chain to {', '.join(chain.sources)}: {str(e)[:300]}",
                chain=list(chain.sources),
            ) from None
        except Exception as e:  # the library raises ValueError, InvalidSignature, KeyError...
            raise _fail(
                "signature",
                f"the model_signing certificate signature does not verify: {type(e).__name__}: {str(e)[:300]}",
                chain=list(chain.sources),
            ) from None
    # ckptgate's own chain verification (the one every certificate signer goes through), at the time of the
    # run: the library checks the chain at the leaf's notBefore only; it also names the anchor reached.
    offered = x509.load_pem_x509_certificates(chain.pem)
    roots = chain.roots()
    cert = verify_chain(
        bundled[0],
        intermediates=[c for c in offered if c not in roots] + bundled[1:],
        anchors=roots,
        now=now,
        code="verify.oms",
        sources=chain.sources,
    )
    facts = {
        "identities": cert.identities,
        "subject": cert.subject,
        "root_sha256": cert.root_sha256,
        "root_subject": cert.root_subject,
        "not_after": cert.not_after.isoformat(),
    }
    return lib_manifest, facts


def _sigstore_check(raw: bytes, trust_root: Path | str, identities: list[tuple[str, str]]) -> tuple[Any, Any]:
    """Sigstore keyless: ckptgate's offline Sigstore verification (:func:`ckptgate.verify.sigstore.verify_bundle_dsse`:
    certificate chain to the trust root, transparency-log entry, verified time, identity and issuer from the
    trust data, DSSE signature), inside a ``model_signing`` verifier so that the library reads the verified
    payload into its manifest as for the other methods.  Raises ``verify.sigstore.*``."""
    from model_signing._signing import sign_sigstore_pb  # noqa: PLC0415 - model_signing: 1.7 s import

    found: list[Any] = []

    class _SigstoreVerifier(sign_sigstore_pb.Verifier):
        def _verify_bundle(self, bundle: Any) -> tuple[str, bytes]:
            res = verify_bundle_dsse(raw, trust_root=trust_root, identities=identities)
            found.append(res)
            return str(res.payload_type), bytes(res.payload or b"")

    with tempfile.TemporaryDirectory(prefix="ckptgate-oms-") as d:
        sp = Path(d, "model.sig")
        fd = os.open(sp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        try:
            manifest = _SigstoreVerifier().verify(sign_sigstore_pb.Signature.read(sp))
        except VerificationError:
            raise
        except Exception as e:  # the library's payload checks raise ValueError, KeyError...
            raise _fail(
                "statement", f"model_signing does not read the verified payload: {type(e).__name__}: {str(e)[:300]}"
            ) from None
    return manifest, found[0]


def _ed25519_verifier(key: OfferedKey) -> Any:
    """A ``model_signing`` verifier whose bundle check is ours, for Ed25519: the pinned library's key
    method verifies elliptic-curve keys only.  The check is the library's ECDSA one with Ed25519 in
    its place: the public-key hint (SHA-256 of the PEM SPKI) must name this key, the envelope holds
    exactly one signature, and that signature verifies over the DSSE v1 pre-authentication encoding of
    the in-toto payload.  The pre-1.0 ``pae_compat`` fallback is not offered.  The library still
    parses the payload into its manifest, which is compared with the statement as before."""
    from model_signing._signing import sign_sigstore_pb  # noqa: PLC0415 - model_signing: 1.7 s import

    public = serialization.load_pem_public_key(key.pem)
    assert isinstance(public, ed25519.Ed25519PublicKey)
    ed_public: ed25519.Ed25519PublicKey = public  # the narrowed type, for the method below
    hint = hashlib.sha256(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    ).hexdigest()

    class _Ed25519Verifier(sign_sigstore_pb.Verifier):
        def _verify_bundle(self, bundle: Any) -> tuple[str, bytes]:
            if bundle.verification_material.public_key.hint != hint:
                raise ValueError("the bundle's public-key hint does not name this key")
            env = bundle.dsse_envelope
            if len(env.signatures) != 1:
                raise ValueError(f"the envelope holds {len(env.signatures)} signatures, not one")
            try:
                ed_public.verify(env.signatures[0].sig, sign_sigstore_pb.pae(env.payload))
            except InvalidSignature:
                raise ValueError("the Ed25519 signature does not verify") from None
            return env.payload_type, env.payload

    return _Ed25519Verifier()


def _statement(doc: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    env = doc["dsseEnvelope"]
    if env.get("payloadType") != IN_TOTO_PAYLOAD_TYPE or not isinstance(env.get("payload"), str):
        raise _fail("payload_type", f"the DSSE payload is not {IN_TOTO_PAYLOAD_TYPE}")
    try:
        payload = base64.b64decode(env["payload"], validate=True)
    except (binascii.Error, ValueError):
        raise _fail("payload", "the DSSE payload is not valid base64") from None
    stmt = loads_strict(payload, what="statement", max_bytes=MAX_PAYLOAD_BYTES, error=verify_error)
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise _fail("statement", f"the payload is not an in-toto {STATEMENT_TYPE} statement")
    if stmt.get("predicateType") != OMS_PREDICATE_TYPE:
        raise _fail(
            "predicate_type",
            f"predicate type {str(stmt.get('predicateType'))[:200]!r} is not {OMS_PREDICATE_TYPE}",
            predicate_type=str(stmt.get("predicateType"))[:200],
        )
    subj = stmt.get("subject")
    if not (
        isinstance(subj, list)
        and len(subj) == 1
        and isinstance(subj[0], dict)
        and isinstance(subj[0].get("name"), str)
        and isinstance(subj[0].get("digest"), dict)
    ):
        raise _fail("statement", "an OMS statement has exactly one subject with a name and a digest")
    if not isinstance(stmt.get("predicate"), dict):
        raise _fail("statement", "the statement has no predicate object")
    return stmt, payload


def _serialization(pred: dict[str, Any]) -> dict[str, Any]:
    ser = pred.get("serialization")
    if not isinstance(ser, dict):
        raise _fail("serialization_unsupported", "the predicate has no serialization block")
    if ser.get("method") != "files" or ser.get("hash_type") != "sha256":
        raise _fail(
            "serialization_unsupported",
            f"serialization {ser.get('method')!r}/{ser.get('hash_type')!r} "
            "cannot be reproduced from ckptgate's per-file manifest (only files/sha256)",
            method=str(ser.get("method")),
            hash_type=str(ser.get("hash_type")),
        )
    if ser.get("allow_symlinks") is not False:
        raise _fail(
            "allow_symlinks",
            "the signature was made with allow_symlinks; ckptgate refuses it",
            allow_symlinks=ser.get("allow_symlinks"),
        )
    ignore = ser.get("ignore_paths", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise _fail("serialization_unsupported", "ignore_paths must be a list of strings")
    return ser


def _resources(pred: dict[str, Any]) -> dict[str, str]:
    res = pred.get("resources")
    if not isinstance(res, list) or not res:
        raise _fail("resources", "the predicate has no resources")
    out: dict[str, str] = {}
    for i, r in enumerate(res):
        if not (
            isinstance(r, dict)
            and isinstance(r.get("name"), str)
            and r.get("algorithm") == "sha256"
            and isinstance(r.get("digest"), str)
            and _HEX64.match(r["digest"])
        ):
            raise _fail("resources", f"resource #{i} is not {{name, algorithm: sha256, digest: <64 hex>}}", index=i)
        if r["name"] in out:
            raise _fail("duplicate_resource", f"resource {r['name']!r} is listed twice", name=r["name"])
        out[r["name"]] = r["digest"]
    return out


def _ignored(path: str, ignore_paths: list[str]) -> bool:
    return any(path == p.strip("/") or path.startswith(p.strip("/") + "/") for p in ignore_paths)


def bind_resources(resources: dict[str, str], measured: dict[str, str], ignore_paths: list[str]) -> None:
    """Raise unless ``resources`` (name -> sha256) and the measured files are exactly the same set."""
    unsigned = sorted(set(measured) - set(resources))
    hidden = [p for p in unsigned if _ignored(p, ignore_paths)]
    if hidden:
        raise _fail(
            "ignored_file",
            f"{len(hidden)} file(s) that ckptgate reads are excluded by the signature's "
            f"ignore_paths, so nothing signs them: {hidden[:5]}",
            files=hidden[:20],
        )
    if unsigned:
        raise _fail(
            "unsigned_file",
            f"{len(unsigned)} file(s) of the checkpoint are not in the signature's resources: {unsigned[:5]}",
            files=unsigned[:20],
        )
    missing = sorted(set(resources) - set(measured))
    if missing:
        raise _fail(
            "missing_file",
            f"{len(missing)} signed resource(s) are not in the checkpoint: {missing[:5]}",
            files=missing[:20],
        )
    changed = sorted(p for p in resources if resources[p] != measured[p])
    if changed:
        raise _fail(
            "digest_mismatch",
            f"{len(changed)} file(s) differ from the signed sha256: {changed[:5]}",
            files=changed[:20],
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
