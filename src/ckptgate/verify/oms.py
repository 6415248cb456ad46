"""OpenSSF Model Signing (OMS) bundles, key method: verified offline, bound exactly to the measured files.

The signature check is the reference implementation's (``model_signing``, the elliptic-key
verifier on a Sigstore bundle v0.3 with a DSSE envelope).  ckptgate then checks the statement
itself and binds its ``resources`` to the fixture digest's per-file manifest: every file that
ckptgate measured (and so reads and may publish) is a resource with the same sha256, and every
resource is a measured file.  ``model_signing``'s own model hashing is not used, so checkpoint
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

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ckptgate.digest import Digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import read_regular_file
from ckptgate.verify._json import loads_strict
from ckptgate.verify.dsse import IN_TOTO_PAYLOAD_TYPE, MAX_ENVELOPE_BYTES
from ckptgate.verify.facts import MAX_PAYLOAD_BYTES, SignerFacts, VerifiedAttestation
from ckptgate.verify.statement import STATEMENT_TYPE
from ckptgate.verify.trust import spki_sha256

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

    @classmethod
    def from_file(cls, path: Path | str) -> OfferedKey:
        """Read a PEM public key (ECDSA P-256 or P-384); ``usage.key_unreadable`` or ``verify.oms.key_unsupported``."""
        try:
            pem = read_regular_file(path, limit=_MAX_KEY_BYTES)
        except OSError as e:
            raise UsageError("usage.key_unreadable", f"cannot read the public key {path}: {e.strerror}",
                             evidence={"path": str(path)}) from None
        try:
            key = serialization.load_pem_public_key(pem)
        except (ValueError, TypeError) as e:
            raise VerificationError("verify.oms.key_unsupported", f"{path} is not a PEM public key: {e}",
                                    evidence={"path": str(path)}) from None
        alg = _CURVES.get(key.curve.name) if isinstance(key, ec.EllipticCurvePublicKey) else None
        if alg is None:
            raise VerificationError("verify.oms.key_unsupported",
                                    f"{path}: the model_signing key method verifies ECDSA P-256 or P-384 keys only",
                                    evidence={"path": str(path), "key_type": type(key).__name__})
        return cls(source=str(path), pem=pem, algorithm=alg, spki_sha256=spki_sha256(key))

    def to_facts(self) -> dict[str, Any]:
        """The ``offered_keys`` entry of the policy input (policy decides which predicate types it may sign)."""
        return {"kind": "key", "signer_id": self.signer_id, "source": self.source, "algorithm": self.algorithm,
                "spki_sha256": self.spki_sha256}


def check_signature_flags(signatures: Any, key: object) -> None:
    """``--signature`` needs ``--key`` (``usage.signature_needs_key``)."""
    if signatures and key is None:
        raise UsageError("usage.signature_needs_key", "--signature needs --key: the public key that verifies it",
                         advice="Pass the signer's PEM public key with --key PUB.pem.")


def _fail(code: str, message: str, **evidence: Any) -> VerificationError:
    return VerificationError(f"verify.oms.{code}", message, evidence=evidence)


def is_oms_bundle(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("dsseEnvelope"), dict) and \
        str(doc.get("mediaType", "")).startswith("application/vnd.dev.sigstore.bundle")


def _check_method(doc: Any) -> None:
    if not is_oms_bundle(doc) or doc.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise _fail("not_a_bundle", f"not a Sigstore bundle v0.3 with a DSSE envelope ({BUNDLE_MEDIA_TYPE})")
    vm = doc.get("verificationMaterial")
    if not isinstance(vm, dict) or not isinstance(vm.get("publicKey"), dict) or vm.get("tlogEntries") \
            or set(vm) - {"publicKey", "tlogEntries", "timestampVerificationData"}:
        raise _fail("method_unsupported", "only the model_signing key method is verified here (a public-key hint, "
                    "no certificate, no transparency-log entry); the certificate and Sigstore methods are not "
                    "supported yet", fields=sorted(vm) if isinstance(vm, dict) else None)


def _signature_check(raw: bytes, key: OfferedKey) -> Any:
    """The reference implementation's verification of the bundle under ``key``; returns its manifest."""
    from model_signing._signing import sign_ec_key, sign_sigstore_pb

    with tempfile.TemporaryDirectory(prefix="ckptgate-oms-") as d:
        kp, sp = Path(d, "key.pem"), Path(d, "model.sig")
        for p, data in ((kp, key.pem), (sp, raw)):
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        try:
            return sign_ec_key.Verifier(kp).verify(sign_sigstore_pb.Signature.read(sp))
        except Exception as e:  # noqa: BLE001 - the library raises ValueError, InvalidSignature, KeyError...
            raise _fail("signature", f"the model_signing signature does not verify under {key.source}: "
                        f"{type(e).__name__}: {str(e)[:300]}", key=key.source, spki_sha256=key.spki_sha256) from None


def _statement(doc: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    env = doc["dsseEnvelope"]
    if env.get("payloadType") != IN_TOTO_PAYLOAD_TYPE or not isinstance(env.get("payload"), str):
        raise _fail("payload_type", f"the DSSE payload is not {IN_TOTO_PAYLOAD_TYPE}")
    try:
        payload = base64.b64decode(env["payload"], validate=True)
    except (binascii.Error, ValueError):
        raise _fail("payload", "the DSSE payload is not valid base64") from None
    stmt = loads_strict(payload, what="statement", max_bytes=MAX_PAYLOAD_BYTES)
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise _fail("statement", f"the payload is not an in-toto {STATEMENT_TYPE} statement")
    if stmt.get("predicateType") != OMS_PREDICATE_TYPE:
        raise _fail("predicate_type", f"predicate type {str(stmt.get('predicateType'))[:200]!r} is not "
                    f"{OMS_PREDICATE_TYPE}", predicate_type=str(stmt.get("predicateType"))[:200])
    subj = stmt.get("subject")
    if not (isinstance(subj, list) and len(subj) == 1 and isinstance(subj[0], dict)
            and isinstance(subj[0].get("name"), str) and isinstance(subj[0].get("digest"), dict)):
        raise _fail("statement", "an OMS statement has exactly one subject with a name and a digest")
    if not isinstance(stmt.get("predicate"), dict):
        raise _fail("statement", "the statement has no predicate object")
    return stmt, payload


def _serialization(pred: dict[str, Any]) -> dict[str, Any]:
    ser = pred.get("serialization")
    if not isinstance(ser, dict):
        raise _fail("serialization_unsupported", "the predicate has no serialization block")
    if ser.get("method") != "files" or ser.get("hash_type") != "sha256":
        raise _fail("serialization_unsupported", f"serialization {ser.get('method')!r}/{ser.get('hash_type')!r} "
                    "cannot be reproduced from ckptgate's per-file manifest (only files/sha256)",
                    method=str(ser.get("method")), hash_type=str(ser.get("hash_type")))
    if ser.get("allow_symlinks") is not False:
        raise _fail("allow_symlinks", "the signature was made with allow_symlinks; ckptgate refuses it",
                    allow_symlinks=ser.get("allow_symlinks"))
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
        if not (isinstance(r, dict) and isinstance(r.get("name"), str) and r.get("algorithm") == "sha256"
                and isinstance(r.get("digest"), str) and _HEX64.match(r["digest"])):
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
        raise _fail("ignored_file", f"{len(hidden)} file(s) that ckptgate reads are excluded by the signature's "
                    f"ignore_paths, so nothing signs them: {hidden[:5]}", files=hidden[:20])
    if unsigned:
        raise _fail("unsigned_file", f"{len(unsigned)} file(s) of the checkpoint are not in the signature's "
                    f"resources: {unsigned[:5]}", files=unsigned[:20])
    missing = sorted(set(resources) - set(measured))
    if missing:
        raise _fail("missing_file", f"{len(missing)} signed resource(s) are not in the checkpoint: {missing[:5]}",
                    files=missing[:20])
    changed = sorted(p for p in resources if resources[p] != measured[p])
    if changed:
        raise _fail("digest_mismatch", f"{len(changed)} file(s) differ from the signed sha256: {changed[:5]}",
                    files=changed[:20])


def verify_oms_bundle(raw: bytes, *, source: str, key: OfferedKey, manifest: dict[str, str], measured_digest: Digest | str,
                      now: datetime) -> VerifiedAttestation:
    """Verify an OMS bundle (key method) under ``key`` and bind it to ``manifest`` (path -> sha256 of every
    measured file, whose fixture digest is ``measured_digest``).  Raises ``verify.oms.*``."""
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise _fail("too_large", f"signature is {len(raw)} bytes, over {MAX_ENVELOPE_BYTES}", size=len(raw))
    doc = loads_strict(raw, what="model_signing signature", max_bytes=MAX_ENVELOPE_BYTES)
    _check_method(doc)
    lib_manifest = _signature_check(raw, key)
    stmt, payload = _statement(doc)
    pred = stmt["predicate"]
    ser = _serialization(pred)
    resources = _resources(pred)
    lib = {rd.identifier: rd.digest.digest_hex for rd in lib_manifest.resource_descriptors()}
    if lib != resources or lib_manifest.model_name != stmt["subject"][0]["name"]:
        raise _fail("statement", "the statement does not read as the model_signing library reads it")
    bind_resources(resources, manifest, list(ser.get("ignore_paths", [])))
    return VerifiedAttestation(
        source=source, statement=stmt, payload_sha256=hashlib.sha256(payload).hexdigest(), method="model_signing",
        signers=(SignerFacts(kind="key", signer_id=key.signer_id, spki_sha256=key.spki_sha256,
                             algorithm=key.algorithm, offered=key.source),),
        checks=("bundle", "signature", "statement_schema", "serialization", "resources_bound"),
        verified_at=now, subject_name=stmt["subject"][0]["name"], measured_digest=Digest.of(measured_digest).prefixed(),
        binding="manifest", validity=None)
