"""Verify 10,000 stored DSSE Ed25519 attestations; compare with raw ``cryptography`` Ed25519 verify.

Run: ``.venv/bin/python bench/bench_verify.py [--n 10000]``.  Writes ``bench/results/bench_verify.json``.
Target: >= 2,000 full verifications per second (read file, strict JSON, signature, schema, subject, window).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report  # noqa: E402

from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402

from ckptgate.verify import (  # noqa: E402
    QUALIFICATION_PREDICATE_TYPE,
    AttestationStore,
    KeySigner,
    TrustData,
    sign_statement,
    trust_entry,
    verify_attestation,
)
from ckptgate.verify.dsse import pae  # noqa: E402

TARGET = 2000.0


def _statement(i: int) -> dict:
    hexd = f"{i:064x}"
    return {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": f"fixture-{i}", "digest": {"sha256": hexd}}],
        "predicateType": QUALIFICATION_PREDICATE_TYPE,
        "predicate": {
            "producer": {"name": "torch", "version": "2.13.0"}, "adapter": {"name": "dcp", "version": "1"},
            "fixture": {"digest": "sha256:" + hexd, "digest_algorithm": "sha256", "manifest": f"m/{i}.json"},
            "candidate_commit": f"{i:040x}",
            "environment": {"python": "3.11.7", "torch": "2.13.0", "os": "linux", "arch": "x86_64",
                            "accelerator": "cpu"},
            "topology": {"tp": 2, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": 1, "fsdp": True, "world_size": 4},
            "result": {"status": "passed", "checks_run": ["roundtrip", "tensor_equality"],
                       "evidence": {"digest": "sha256:" + "cd" * 32, "location": f"evidence/{i}.json"}},
            "validity": {"issued_at": "2026-11-01T00:00:00Z", "expires_at": "2027-02-01T00:00:00Z"},
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    n = ap.parse_args().n
    key = ed25519.Ed25519PrivateKey.generate()
    signer = KeySigner.from_key(key)
    from cryptography.hazmat.primitives import serialization

    pub_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    trust = TrustData.from_json(json.dumps({"signers": [trust_entry(pub_pem, signer_id="bench",
                                                                     predicate_types=[QUALIFICATION_PREDICATE_TYPE])]}
                                           ).encode())
    now = datetime(2026, 11, 29, tzinfo=timezone.utc)
    with tempfile.TemporaryDirectory() as d:
        store = AttestationStore(d)
        t0 = time.perf_counter()
        paths = [store.add(sign_statement(_statement(i), signer), reindex=False) for i in range(n)]
        store.rebuild_index()
        t_sign = time.perf_counter() - t0

        # Full path: read each stored file and verify it for its fixture digest.
        digests = [f"sha256:{i:064x}" for i in range(n)]
        t0 = time.perf_counter()
        for p, dg in zip(paths, digests, strict=True):
            verify_attestation(p.read_bytes(), source=str(p), trust=trust, measured_digest=dg, now=now)
        t_full = time.perf_counter() - t0

        # Raw cryptography: the same PAE bytes and signatures, key.verify only.
        pairs = []
        for p in paths:
            env = json.loads(p.read_bytes())
            payload = base64.b64decode(env["payload"])
            pairs.append((base64.b64decode(env["signatures"][0]["sig"]), pae(env["payloadType"], payload)))
        pub = key.public_key()
        t0 = time.perf_counter()
        for sig, msg in pairs:
            pub.verify(sig, msg)
        t_raw = time.perf_counter() - t0

    full, raw, sign = n / t_full, n / t_raw, n / t_sign
    rows = [["ckptgate verify_attestation (read+parse+verify+schema+subject+window)", n, round(t_full, 3),
             round(full), f"{full / raw:.2f}x of raw"],
            ["cryptography Ed25519PublicKey.verify (PAE bytes only)", n, round(t_raw, 3), round(raw), "1.00x"],
            ["sign_statement + store.add (setup)", n, round(t_sign, 3), round(sign), "-"]]
    report("bench_verify", ["path", "n", "seconds", "per second", "relative"], rows,
           {"n": n, "verify_per_s": full, "raw_cryptography_per_s": raw, "sign_and_store_per_s": sign,
            "target_per_s": TARGET, "meets_target": full >= TARGET})
    print(f"target >= {TARGET:.0f}/s: {'MET' if full >= TARGET else 'NOT MET'} ({full:.0f}/s)")


if __name__ == "__main__":
    main()
