"""``attest checkpoint --format oms``: an OpenSSF Model Signing bundle (key method) over the same files.

The bundle is made by the ``model_signing`` library itself (``model_signing sign key``), with no path
ignored, so that every file intake measures is a resource of the bundle; intake verifies it with
``--signature FILE --key PUB.pem`` (docs/attestations.md).  The pinned ``model_signing`` signs with
elliptic-curve keys only (ECDSA P-256: ``attest keygen --algorithm ecdsa-p256``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ckptgate.errors import UsageError
from ckptgate.userfiles import read_regular_file

__all__ = ["OMS_SUFFIX", "sign_oms"]

OMS_SUFFIX = ".sig"
"""``<checkpoint>.sig`` beside the checkpoint is where the bundle goes by default (as ``model_signing`` names it)."""


def _check_key(key: Path) -> None:
    try:
        pem = read_regular_file(key, limit=1 << 20)
        private = serialization.load_pem_private_key(pem, password=None)
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(
            "usage.signing_key",
            f"cannot read the private key {key}: {e}",
            advice=f"Check that {key} is a PEM private key.",
        ) from None
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        raise UsageError(
            "usage.oms.key_algorithm",
            f"--format oms signs with an elliptic-curve key (the model_signing key method); {key} is not one",
            advice="Make one with `ckptgate attest keygen --algorithm ecdsa-p256`.",
        )


def sign_oms(src: Path, key: Path, out: Path) -> Path:
    """Sign every file under ``src`` into the OMS bundle ``out`` (which must not exist); returns ``out``."""
    _check_key(key)
    if out.exists() or out.is_symlink():
        raise UsageError(
            "usage.exists", f"{out} exists; refusing to overwrite", advice=f"Remove {out}, or name another --out."
        )
    import model_signing  # noqa: PLC0415 - model_signing: 1.7 s import, for --format oms only

    ms: Any = model_signing
    hashing = ms.hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=False)
    ms.signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(hashing).sign(src, out)
    return out
