"""``attest checkpoint --identity-token``: Sigstore keyless signing of the training provenance.

sigstore-python's own ``SigningContext`` does the work: an ephemeral key, a certificate from Fulcio for the
token's identity (its SCT checked against the trust root's CT keys), the DSSE signature, and a Rekor entry.
The result is a Sigstore bundle v0.3 that intake verifies with ``--sigstore-trust-root`` against the trust
data's ``sigstore`` signers (identity and issuer).  The Fulcio and Rekor URLs and the trust root come from a
client trust config (``--sigstore-trust-config FILE``, the format ``sigstore sign --trust-config`` reads), else
from the public-good instance's TUF repository (which needs the network).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ckptgate.errors import UsageError
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.dsse import canonical_payload
from ckptgate.verify.statement import check_statement

__all__ = ["SIGSTORE_SUFFIX", "check_identity_token", "load_trust_config", "read_identity_token", "sign_keyless"]

SIGSTORE_SUFFIX = ".sigstore.json"
"""``<checkpoint>.sigstore.json`` beside the checkpoint is where the keyless bundle goes by default."""

_MAX_CONFIG_BYTES = 16 << 20
_MAX_TOKEN_BYTES = 64 << 10


def read_identity_token(value: str) -> str:
    """``--identity-token``: the token itself, or ``@FILE`` to read it from a file (kept off the command line)."""
    if not value.startswith("@"):
        return value.strip()
    path = value[1:]
    try:
        raw = read_regular_file(path, limit=_MAX_TOKEN_BYTES)
    except OSError as e:
        raise UsageError(
            "usage.identity_token",
            f"cannot read the identity token file {path}: {e.strerror}",
            advice="Name a readable file holding the OIDC token, as --identity-token @FILE.",
        ) from None
    return raw.decode("utf-8", "replace").strip()


def check_identity_token(token: str) -> Any:
    """The token as sigstore-python reads it (audience ``sigstore``, within its validity window, an identity
    claim): ``usage.identity_token`` otherwise.  Its signature is Fulcio's to check, not the client's."""
    from sigstore.oidc import IdentityError, IdentityToken  # noqa: PLC0415 - sigstore: 1.3 s import

    try:
        return IdentityToken(token)
    except IdentityError as e:
        raise UsageError(
            "usage.identity_token",
            f"the identity token is not usable for Sigstore signing: {e}",
            advice="Pass a current OIDC token issued for the audience 'sigstore' (in CI, the job's ID token; "
            "SIGSTORE_ID_TOKEN is read when --identity-token is not given).",
        ) from None


def load_trust_config(path: Path | None) -> Any:
    """The Sigstore client trust config: ``path`` (a ClientTrustConfig JSON naming the trust root, Fulcio and
    Rekor), else the public-good instance's through TUF.  ``usage.sigstore_trust_config`` when neither loads."""
    from sigstore.models import ClientTrustConfig  # noqa: PLC0415 - sigstore: 1.3 s import

    try:
        if path is None:
            return ClientTrustConfig.production()
        raw = read_regular_file(path, limit=_MAX_CONFIG_BYTES)
        if len(raw) > _MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {_MAX_CONFIG_BYTES >> 20} MiB")
        config = ClientTrustConfig.from_json(raw.decode("utf-8"))
        config.signing_config.get_fulcio()  # fails here, not mid-signing, when it names none
        return config
    except Exception as e:  # OSError, pydantic, sigstore's Error, TUF errors
        where = str(path) if path is not None else "the public-good instance (TUF, network)"
        raise UsageError(
            "usage.sigstore_trust_config",
            f"cannot load the Sigstore trust config from {where}: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
            advice="Pass --sigstore-trust-config FILE, a Sigstore ClientTrustConfig JSON naming the trust root, "
            "Fulcio and Rekor of the instance you sign with (offline, the public-good instance is unreachable).",
        ) from None


def sign_keyless(statement: dict[str, Any], token: Any, config: Any) -> bytes:
    """Sign ``statement`` (checked against its schema first) keyless; returns the Sigstore bundle JSON."""
    from sigstore._internal.fulcio.client import ExpiredCertificate, FulcioClientError  # noqa: PLC0415 - sigstore: 1.3 s import
    from sigstore._internal.rekor import RekorClientError  # noqa: PLC0415 - sigstore: 1.3 s import
    from sigstore.dsse import Statement  # noqa: PLC0415 - sigstore: 1.3 s import
    from sigstore.errors import Error as SigstoreError  # noqa: PLC0415 - sigstore: 1.3 s import
    from sigstore.oidc import ExpiredIdentity  # noqa: PLC0415 - sigstore: 1.3 s import
    from sigstore.sign import SigningContext  # noqa: PLC0415 - sigstore: 1.3 s import

    check_statement(statement)
    logging.getLogger("sigstore").setLevel(logging.ERROR)
    try:
        context = SigningContext.from_trust_config(config)
        with context.signer(token, cache=True) as signer:
            bundle = signer.sign_dsse(Statement(canonical_payload(statement)))
    except (
        SigstoreError,
        FulcioClientError,
        RekorClientError,
        ExpiredCertificate,
        ExpiredIdentity,
        OSError,
        ValueError,
    ) as e:  # Fulcio/Rekor refused or unreachable (requests' errors are OSErrors), SCT invalid, token expired
        raise UsageError(
            "usage.sigstore_signing",
            f"Sigstore keyless signing failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
            advice="Check that the Fulcio and Rekor URLs of --sigstore-trust-config are reachable and accept this "
            "--identity-token; nothing was written.",
        ) from None
    return (bundle.to_json() + "\n").encode("utf-8")
