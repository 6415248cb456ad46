"""Helpers for attestation tests: throwaway keys, trust data, a valid qualification statement."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timezone
from typing import Any


from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ckptgate.verify import KeySigner, TrustData, trust_entry
from ckptgate.verify.statement import QUALIFICATION_PREDICATE_TYPE
from cryptography.hazmat.primitives import serialization

FIXTURE_HEX = "ab" * 32
#: A key pair on secp112r1, a curve ``cryptography`` parses the OID of but does not support: loading
#: either raises ``UnsupportedAlgorithm`` (not ``ValueError``).  Made with ``openssl ecparam -name
#: secp112r1 -genkey`` for these tests only; it protects nothing.
UNSUPPORTED_CURVE_PUBLIC_PEM = b"""-----BEGIN PUBLIC KEY-----
MDIwEAYHKoZIzj0CAQYFK4EEAAYDHgAEkOkJ/i7nzrXST0Uave4onDQT7mEd8YYh
VB0JVg==
-----END PUBLIC KEY-----
"""
UNSUPPORTED_CURVE_PRIVATE_PEM = b"""-----BEGIN PRIVATE KEY-----
ME4CAQAwEAYHKoZIzj0CAQYFK4EEAAYENzA1AgEBBA42flUVQ84qrXuqZWwI5qEg
Ax4ABJDpCf4u58610k9FGr3uKJw0E+5hHfGGIVQdCVY=
-----END PRIVATE KEY-----
"""
#: A self-signed certificate whose key is on secp160r1 (unsupported the same way): its
#: ``public_key()`` raises ``UnsupportedAlgorithm``.  Made with openssl for these tests only.
UNSUPPORTED_CURVE_CERTIFICATE_PEM = b"""-----BEGIN CERTIFICATE-----
MIIBNzCB96ADAgECAhQFF9vP7bHySB7zxg0Fuhqgtnd6ajAJBgcqhkjOPQQBMAwx
CjAIBgNVBAMMAXgwHhcNMjYxMjA0MTMyNDQ1WhcNMjYxMjA3MTMyNDQ1WjAMMQow
CAYDVQQDDAF4MD4wEAYHKoZIzj0CAQYFK4EEAAgDKgAEl09uxXwxgQKXdCZv9SvL
yGg0EXRlJHVucWKoIuAINmkmW0S4xW4pKKNTMFEwHQYDVR0OBBYEFIJEPOAZ+aLO
HsulaAIlYTKmW7g6MB8GA1UdIwQYMBaAFIJEPOAZ+aLOHsulaAIlYTKmW7g6MA8G
A1UdEwEB/wQFMAMBAf8wCQYHKoZIzj0EAQMwADAtAhUA6UGPZFrdJUS8In0HrUrp
UdBJn38CFENqBv+ZsPl6E6BPJA4Yu1LHIDQM
-----END CERTIFICATE-----
"""
NOW = datetime(2026, 11, 29, 17, 0, 0, tzinfo=timezone.utc)
COMMIT = "0123456789abcdef0123456789abcdef01234567"

STATEMENT: dict[str, Any] = {
    "_type": "https://in-toto.io/Statement/v1",
    "subject": [{"name": "hf_sharded", "digest": {"sha256": FIXTURE_HEX}}],
    "predicateType": QUALIFICATION_PREDICATE_TYPE,
    "predicate": {
        "producer": {"name": "huggingface_hub", "version": "1.0.0"},
        "adapter": {"name": "hf-sharded-safetensors", "version": "1"},
        "fixture": {"digest": "sha256:" + FIXTURE_HEX, "digest_algorithm": "sha256",
                    "manifest": "tests/fixtures/data/hf_sharded/meta.json"},
        "candidate_commit": COMMIT,
        "environment": {"python": "3.11.7", "torch": "2.13.0", "os": "linux", "arch": "x86_64",
                        "accelerator": "cpu"},
        "topology": {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": 1, "zero_stage": None,
                     "world_size": 2},
        "result": {"status": "passed", "checks_run": ["roundtrip", "tensor_equality"],
                   "evidence": {"digest": "sha256:" + "cd" * 32, "location": "matrix/evidence/x.json"}},
        "validity": {"issued_at": "2026-11-01T00:00:00Z", "expires_at": "2027-02-01T00:00:00Z"},
    },
}


def statement(**predicate_changes: Any) -> dict[str, Any]:
    s = copy.deepcopy(STATEMENT)
    s["predicate"].update(predicate_changes)
    return s


def signer(algorithm: str = "ed25519", keyid: str | None = None) -> KeySigner:
    key = ed25519.Ed25519PrivateKey.generate() if algorithm == "ed25519" else ec.generate_private_key(ec.SECP256R1())
    return KeySigner.from_key(key, keyid=keyid)


def public_pem(s: KeySigner) -> bytes:
    return s.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def trust_for(*signers: KeySigner, sigstore: list[dict[str, Any]] | None = None) -> TrustData:
    entries = [trust_entry(public_pem(s), signer_id=f"key-{i}", predicate_types=[QUALIFICATION_PREDICATE_TYPE])
               for i, s in enumerate(signers)]
    entries += sigstore or []
    return TrustData.from_json(json.dumps({"signers": entries}).encode(), source="test")
