"""The signature check of an OMS bundle, one function per method: the reference implementation's
(``model_signing``) verifier for a key (ECDSA; Ed25519 through :func:`_ed25519_verifier`), for an
X.509 certificate chain (then ckptgate's own chain verification), and for Sigstore keyless
(ckptgate's offline Sigstore verification inside a ``model_signing`` verifier).  Each returns the
library's manifest of the verified payload, which :mod:`ckptgate.verify.oms` compares with the statement.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import logging
import os
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ckptgate.errors import VerificationError
from ckptgate.verify.oms_keys import OfferedKey
from ckptgate.verify.oms_statement import _fail
from ckptgate.verify.sigstore import verify_bundle_dsse
from ckptgate.verify.x509chain import CertificateChain, verify_chain


@contextlib.contextmanager
def _library_stdout() -> Iterator[None]:
    """Keep what ``model_signing`` prints off ckptgate's stdout, which carries ``--json`` documents: its key
    verifier prints a warning there for a bundle without a public-key hint (a field of the bundle, so anyone
    offering one could break the JSON a pipeline reads).  What it printed is logged instead."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            yield
    finally:
        if buf.getvalue().strip():
            logging.getLogger("ckptgate.oms").warning("model_signing: %s", buf.getvalue().strip()[:500])


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
            with _library_stdout():
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
            with _library_stdout():
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
            with _library_stdout():
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
