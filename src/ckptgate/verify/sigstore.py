"""Sigstore bundles, verified fully offline against a trust root the caller supplies.

``sigstore`` checks the certificate chain, transparency-log inclusion, verified time and the DSSE
signature; it does **not** bind the statement's subject to the artifact, so :mod:`ckptgate.verify.facts`
does that.  Identity is decided by an identity policy (certificate SAN plus OIDC issuer).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import ObjectIdentifier

from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import read_regular_file

PRODUCTION = "production"
"""Pass as ``trust_root`` to use the production root embedded in ``sigstore`` (offline, no TUF refresh)."""

BUNDLE_MEDIA_PREFIX = "application/vnd.dev.sigstore.bundle"

MAX_TRUST_ROOT_BYTES = 16 << 20
"""A trusted_root.json is a few KiB; a larger file is refused before it is read."""

_FULCIO = "1.3.6.1.4.1.57264.1."
_FULCIO_NAMES = {
    1: "issuer_v1",
    2: "github_workflow_trigger",
    3: "github_workflow_sha",
    4: "github_workflow_name",
    5: "github_workflow_repository",
    6: "github_workflow_ref",
    8: "issuer",
    9: "build_signer_uri",
    10: "build_signer_digest",
    11: "runner_environment",
    12: "source_repository_uri",
    13: "source_repository_digest",
    14: "source_repository_ref",
    15: "source_repository_identifier",
    16: "source_repository_owner_uri",
    17: "source_repository_owner_identifier",
    18: "build_config_uri",
    19: "build_config_digest",
    20: "build_trigger",
    21: "run_invocation_uri",
    22: "source_repository_visibility",
}
_RAW_V1 = {1, 2, 3, 4, 5, 6}


def _der_utf8(value: bytes) -> str | None:
    if len(value) < 2 or value[0] != 0x0C:
        return None
    n, i = value[1], 2
    if n & 0x80:
        width = n & 0x7F
        if width == 0 or width > 4 or len(value) < 2 + width:
            return None
        n, i = int.from_bytes(value[2 : 2 + width], "big"), 2 + width
    if len(value) != i + n:
        return None
    try:
        return value[i:].decode("utf-8")
    except UnicodeDecodeError:
        return None


def fulcio_extensions(cert: x509.Certificate) -> dict[str, str]:
    """Fulcio OIDC extensions of a certificate, by name (unknown or undecodable ones are left out)."""
    out: dict[str, str] = {}
    for ext in cert.extensions:
        oid = ext.oid.dotted_string
        if not oid.startswith(_FULCIO):
            continue
        try:
            num = int(oid[len(_FULCIO) :])
        except ValueError:
            continue
        name = _FULCIO_NAMES.get(num)
        raw = getattr(ext.value, "value", None)
        if name is None or not isinstance(raw, bytes):
            continue
        text = raw.decode("utf-8", "replace") if num in _RAW_V1 else _der_utf8(raw)
        if text is not None:
            out[name] = text
    return out


def certificate_identities(cert: x509.Certificate) -> tuple[str, ...]:
    """SAN values Sigstore treats as identities: e-mail, URI and the Fulcio other-name."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    vals = [*san.get_values_for_type(x509.RFC822Name), *san.get_values_for_type(x509.UniformResourceIdentifier)]
    vals += [
        o.value.decode("utf-8", "replace")
        for o in san.get_values_for_type(x509.OtherName)
        if o.type_id == ObjectIdentifier(_FULCIO + "7")
    ]
    return tuple(vals)


@dataclass(frozen=True, slots=True, kw_only=True)
class SigstoreResult:
    """What a verified bundle establishes."""

    payload_type: str | None
    """DSSE payloadType, or ``None`` for a message-signature bundle."""
    payload: bytes | None = field(repr=False)
    """Exact DSSE payload bytes, or ``None`` for a message-signature bundle."""
    identity: str
    """The certificate identity that the policy matched."""
    issuer: str
    """The OIDC issuer that the policy matched."""
    san: tuple[str, ...]
    extensions: dict[str, str]
    cert_not_before: datetime
    cert_not_after: datetime
    integrated_time: datetime | None
    """The transparency log's integrated time, where the entry has one."""
    log_entry_kind: str


def _policy(identities: Sequence[tuple[str, str]]) -> Any:
    from sigstore.verify.policy import AllOf, AnyOf, Identity, OIDCIssuer, OIDCIssuerV2  # noqa: PLC0415 - sigstore: 1.3 s import

    return AnyOf([AllOf([Identity(identity=i), AnyOf([OIDCIssuer(iss), OIDCIssuerV2(iss)])]) for i, iss in identities])


def _verifier(trust_root: Path | str) -> Any:
    from sigstore.models import TrustedRoot  # noqa: PLC0415 - sigstore: 1.3 s import
    from sigstore.verify import Verifier  # noqa: PLC0415 - sigstore: 1.3 s import

    try:
        if trust_root == PRODUCTION:
            return Verifier.production(offline=True)
        st = os.stat(trust_root)  # a FIFO would block the read below, a device would never end
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TRUST_ROOT_BYTES:
            raise ValueError(f"not a regular file of at most {MAX_TRUST_ROOT_BYTES} bytes")
        return Verifier(trusted_root=TrustedRoot.from_file(str(trust_root)))
    except Exception as e:  # sigstore raises pydantic, OSError, its own errors
        raise VerificationError(
            "verify.sigstore.trust_root",
            f"cannot load the Sigstore trust root {trust_root}: {type(e).__name__}: {str(e)[:300]}",
            evidence={"trust_root": str(trust_root)},
            advice="Pass a trusted_root.json (Sigstore TrustedRoot v0.1+) that you obtained out of band.",
        ) from None


def trust_root_sha256(trust_root: Path | str) -> str:
    """``sha256:<hex>`` of the Sigstore trust root bundles are verified against, for the decision's
    inputs: the bytes of the named trusted_root.json, or for :data:`PRODUCTION` the JSON of the
    root ``sigstore`` loads from its offline cache.  Unreadable: ``usage.sigstore_trust_root``."""
    try:
        if trust_root == PRODUCTION:
            data = _verifier(trust_root)._trusted_root._inner.to_json().encode()
        else:
            data = read_regular_file(Path(trust_root), limit=MAX_TRUST_ROOT_BYTES)
            if len(data) > MAX_TRUST_ROOT_BYTES:
                raise OSError(errno.EFBIG, f"larger than {MAX_TRUST_ROOT_BYTES} bytes")
    except (OSError, VerificationError) as e:
        raise UsageError(
            "usage.sigstore_trust_root",
            f"cannot read the Sigstore trust root {trust_root}: {e}",
            evidence={"trust_root": str(trust_root)},
            advice="Pass a readable trusted_root.json (Sigstore TrustedRoot v0.1+) that you obtained out of band.",
        ) from None
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_trust_root(trust_root: Path | str) -> None:
    """Load ``trust_root`` now: a file that is no usable trusted_root.json is refused as a usage
    error before anything is measured, whether or not a Sigstore bundle is offered later."""
    try:
        _verifier(trust_root)
    except VerificationError as e:
        raise UsageError("usage.sigstore_trust_root", e.message, evidence=e.evidence, advice=e.diagnostics()) from None


def _bundle(raw: bytes) -> Any:
    from sigstore.models import Bundle  # noqa: PLC0415 - sigstore: 1.3 s import

    try:
        return Bundle.from_json(raw)
    except Exception as e:  # InvalidBundle, pydantic errors, ValueError
        raise VerificationError(
            "verify.sigstore.invalid_bundle",
            f"not a valid Sigstore bundle: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
        ) from None


def _verify(
    raw: bytes, trust_root: Path | str, identities: Sequence[tuple[str, str]], artifact: bytes | None
) -> SigstoreResult:
    if not identities:
        raise VerificationError(
            "verify.sigstore.no_identity_policy",
            "no trusted Sigstore identity (identity + issuer) to verify against",
            advice="Add a sigstore signer to the trust data, or pass --identity and --issuer.",
        )
    verifier = _verifier(trust_root)
    bundle = _bundle(raw)
    try:
        cert = bundle.signing_certificate
    except Exception as e:
        raise VerificationError("verify.sigstore.invalid_bundle", f"bundle has no usable certificate: {e}") from None
    exts = fulcio_extensions(cert)
    issuer = exts.get("issuer") or exts.get("issuer_v1") or ""
    sans = certificate_identities(cert)
    matched = next(((i, iss) for i, iss in identities if i in sans and iss == issuer), None)
    if matched is None:
        raise VerificationError(
            "verify.sigstore.identity_mismatch",
            "the certificate's identity and issuer match no trusted identity",
            evidence={
                "san": list(sans),
                "issuer": issuer,
                "expected": [{"identity": i, "issuer": s} for i, s in identities],
            },
        )
    from sigstore.errors import Error as SigstoreError  # noqa: PLC0415 - sigstore: 1.3 s import

    policy = _policy([matched])
    payload_type: str | None = None
    payload: bytes | None = None
    logging.getLogger("sigstore").setLevel(logging.ERROR)
    try:
        if artifact is None:
            if bundle._dsse_envelope is None:
                raise VerificationError(
                    "verify.sigstore.not_dsse", "bundle carries a message signature, not a DSSE attestation"
                )
            payload_type, payload = verifier.verify_dsse(bundle, policy)
        else:
            verifier.verify_artifact(artifact, bundle, policy)
    except VerificationError:
        raise
    except SigstoreError as e:
        raise VerificationError(
            "verify.sigstore.failed",
            f"Sigstore verification failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
        ) from None
    except Exception as e:  # malformed material surfacing from deep inside
        raise VerificationError(
            "verify.sigstore.failed", f"Sigstore verification failed: {type(e).__name__}: {str(e)[:300]}"
        ) from None
    entry = bundle.log_entry._inner
    it = getattr(entry, "integrated_time", None)
    return SigstoreResult(
        payload_type=payload_type,
        payload=payload,
        identity=matched[0],
        issuer=matched[1],
        san=sans,
        extensions=exts,
        cert_not_before=cert.not_valid_before_utc,
        cert_not_after=cert.not_valid_after_utc,
        integrated_time=datetime.fromtimestamp(int(it), tz=UTC) if it else None,
        log_entry_kind=f"{entry.kind_version.kind}/{entry.kind_version.version}",
    )


def verify_bundle_dsse(raw: bytes, *, trust_root: Path | str, identities: Sequence[tuple[str, str]]) -> SigstoreResult:
    """Verify a DSSE Sigstore bundle offline; returns the exact payload and the signer's identity.

    The subject is NOT bound here; callers must bind it (see :func:`ckptgate.verify.verify_attestation`).
    Codes: ``verify.sigstore.trust_root``, ``.invalid_bundle``, ``.identity_mismatch``, ``.not_dsse``, ``.failed``.
    """
    return _verify(raw, trust_root, identities, None)


def verify_bundle_artifact(
    raw: bytes, artifact: bytes, *, trust_root: Path | str, identities: Sequence[tuple[str, str]]
) -> SigstoreResult:
    """Verify a message-signature bundle over ``artifact`` offline (not an attestation; for completeness)."""
    return _verify(raw, trust_root, identities, artifact)
