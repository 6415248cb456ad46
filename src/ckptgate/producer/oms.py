"""``attest checkpoint --format oms``: an OpenSSF Model Signing bundle (key or certificate method) over the same files.

The bundle is made by the ``model_signing`` library itself (``model_signing sign key``), with no path
ignored, so that every file intake measures is a resource of the bundle; intake verifies it with
``--signature FILE --key PUB.pem`` (docs/attestations.md).  The pinned ``model_signing`` signs with
elliptic-curve keys only (ECDSA P-256: ``attest keygen --algorithm ecdsa-p256``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ckptgate.errors import UsageError
from ckptgate.producer.certificate import read_certificates
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.dsse import check_key_path

__all__ = ["OMS_SUFFIX", "check_oms_signing", "sign_oms"]

OMS_SUFFIX = ".sig"
"""``<checkpoint>.sig`` beside the checkpoint is where the bundle goes by default (as ``model_signing`` names it)."""


def _public_key(cert: x509.Certificate) -> object:
    """The certificate's public key; ``None`` for one ``cryptography`` does not support (a curve it knows
    only by OID), which is then not the signing key either."""
    try:
        return cert.public_key()
    except UnsupportedAlgorithm:
        return None


def _check_certificate(key: Path, certificate: Path, chain: tuple[Path, ...]) -> None:
    """The certificate is a PEM certificate of ``key``'s public key, and each chain file holds certificates."""
    private = serialization.load_pem_private_key(read_regular_file(key, limit=1 << 20), password=None)
    for path in (certificate, *chain):
        certs = read_certificates(path, "--certificate" if path == certificate else "--certificate-chain")
        if path == certificate and _public_key(certs[0]) != private.public_key():
            raise UsageError(
                "usage.certificate_key_mismatch",
                f"the certificate {certificate} is not for the key --key {key}: its public key differs",
                advice=f"Pass with --certificate the certificate issued for --key {key}, or with --key the key "
                f"{certificate} was issued for.",
            )


def _check_key(key: Path) -> None:
    check_key_path(key)
    try:
        pem = read_regular_file(key, limit=1 << 20)
        private = serialization.load_pem_private_key(pem, password=None)
    except (OSError, ValueError, TypeError, UnsupportedAlgorithm) as e:
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


def check_oms_signing(key: Path, certificate: Path | None = None, chain: tuple[Path, ...] = ()) -> None:
    """The key (and certificate) ``sign_oms`` will sign with, checked before anything is hashed."""
    _check_key(key)
    if certificate is not None:
        _check_certificate(key, certificate, chain)


def sign_oms(src: Path, key: Path, out: Path, *, certificate: Path | None = None, chain: tuple[Path, ...] = ()) -> Path:
    """Sign every file under ``src`` into the OMS bundle ``out`` (which must not exist); returns ``out``.
    With ``certificate`` (the X.509 certificate of ``key``, and its ``chain``): model_signing's certificate
    method, the chain carried in the bundle, verified at intake against ``--certificate-chain`` anchors."""
    _check_key(key)
    if certificate is not None:
        _check_certificate(key, certificate, chain)
    if out.exists() or out.is_symlink():
        raise UsageError(
            "usage.exists", f"{out} exists; refusing to overwrite", advice=f"Remove {out}, or name another --out."
        )
    import model_signing  # noqa: PLC0415 - model_signing: 1.7 s import, for --format oms only

    ms: Any = model_signing
    hashing = ms.hashing.Config().set_ignored_paths(paths=[], ignore_git_paths=False)
    config = ms.signing.Config()
    if certificate is None:
        config = config.use_elliptic_key_signer(private_key=key)
    else:
        config = config.use_certificate_signer(
            private_key=key, signing_certificate=certificate, certificate_chain=list(chain)
        )
    config.set_hashing_config(hashing).sign(src, out)
    return out
