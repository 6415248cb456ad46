"""Make OpenSSF Model Signing bundles with the real ``model_signing`` API (key method) and fresh keys."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import model_signing
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID
from model_signing._signing.sign_sigstore_pb import pae

REPO = Path(__file__).resolve().parents[2]
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"
OTHER = REPO / "tests" / "fixtures" / "data" / "peft_lora" / "checkpoint"


def keypair(d: Path, name: str, curve: ec.EllipticCurve | None = None) -> tuple[Path, Path]:
    k = ec.generate_private_key(curve or ec.SECP256R1())
    priv, pub = d / f"{name}.key", d / f"{name}.pub"
    priv.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def sign(model: Path, priv: Path, out: Path, *, ignore: list[str] | None = None, shard: bool = False) -> Path:
    """Sign ``model`` with the reference implementation's key method (as ``model_signing sign key`` does)."""
    cfg = model_signing.signing.Config().use_elliptic_key_signer(private_key=priv)
    if ignore is not None or shard:
        hashing = model_signing.hashing.Config()
        if shard:
            hashing = hashing.use_shard_serialization()
        if ignore is not None:
            hashing = hashing.set_ignored_paths(paths=ignore)
        cfg = cfg.set_hashing_config(hashing)
    cfg.sign(model, out)
    return out


def resign(bundle: Path, priv: Path, edit: Any) -> Path:
    """A validly signed bundle whose statement ``edit`` changed (the subject root digest recomputed),
    to reach the checks behind the signature."""
    doc = json.loads(bundle.read_text())
    stmt = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    edit(stmt)
    stmt["subject"][0]["digest"]["sha256"] = hashlib.sha256(
        b"".join(bytes.fromhex(r["digest"]) for r in stmt["predicate"]["resources"])).hexdigest()
    payload = json.dumps(stmt).encode()
    key = serialization.load_pem_private_key(priv.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    doc["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(
        key.sign(pae(payload), ec.ECDSA(hashes.SHA384() if key.curve.name == "secp384r1" else hashes.SHA256()))
    ).decode()
    out = bundle.with_name("resigned-" + bundle.name)
    out.write_text(json.dumps(doc))
    return out


def ed25519_keypair(d: Path, name: str) -> tuple[ed25519.Ed25519PrivateKey, Path]:
    k = ed25519.Ed25519PrivateKey.generate()
    pub = d / f"{name}.pub"
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo))
    return k, pub


def sign_ed25519(model: Path, key: ed25519.Ed25519PrivateKey, out: Path) -> Path:
    """An OMS bundle signed with Ed25519.  The pinned ``model_signing`` signs with elliptic-curve keys only,
    so the real library makes the bundle (payload, serialisation, resources) under a throwaway P-256 key, and
    the envelope is then signed again with ``key`` over the same DSSE PAE, with the library's public-key hint
    (SHA-256 of the PEM SPKI)."""
    throwaway, _ = keypair(out.parent, out.stem + "-throwaway")
    sign(model, throwaway, out)
    doc = json.loads(out.read_text())
    payload = base64.b64decode(doc["dsseEnvelope"]["payload"])
    doc["dsseEnvelope"]["signatures"] = [{"sig": base64.b64encode(key.sign(pae(payload))).decode()}]
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    doc["verificationMaterial"]["publicKey"]["hint"] = hashlib.sha256(pem).hexdigest()
    out.write_text(json.dumps(doc))
    return out


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def ca(d: Path, name: str, *, start: datetime, end: datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    """A self-signed root CA (P-256), written as PEM to ``d/name.pem``."""
    k = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name)).public_key(k.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(k, hashes.SHA256()))
    path = d / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return k, cert, path


def leaf(d: Path, name: str, issuer: tuple[ec.EllipticCurvePrivateKey, x509.Certificate], *, start: datetime,
         end: datetime, sans: list[x509.GeneralName] | None = None) -> tuple[Path, Path]:
    """A signing certificate issued by ``issuer``; returns (private key PEM, certificate PEM)."""
    k = ec.generate_private_key(ec.SECP256R1())
    b = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(issuer[1].subject)
         .public_key(k.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                      data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                      crl_sign=False, encipher_only=False, decipher_only=False), critical=True))
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = b.sign(issuer[0], hashes.SHA256())
    priv, crt = d / f"{name}.key", d / f"{name}.crt"
    priv.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return priv, crt


def sign_certificate(model: Path, priv: Path, cert: Path, chain: list[Path], out: Path) -> Path:
    """Sign ``model`` with the reference implementation's certificate method (``model_signing sign certificate``)."""
    model_signing.signing.Config().use_certificate_signer(private_key=priv, signing_certificate=cert,
                                                           certificate_chain=chain).sign(model, out)
    return out


def root_sha256(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
