"""Make OpenSSF Model Signing bundles with the real ``model_signing`` API (key method) and fresh keys."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import model_signing
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
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
