#!/usr/bin/env python3
"""Decision latency through ckptgate's engine against a raw HTTP POST to the same OPA.

Both sides query the same embedded OPA server, with the same input, in one run:

* ckptgate: ``decide()`` = input document -> one HTTP exchange under one deadline (``ckptgate.decide._http``) -> strict decision parse -> audit log;
* raw: a ``requests.Session`` POST of the same JSON to ``/v1/data/ckptgate/intake/decision``.

It also evaluates a batch of support-matrix rows (``data.ckptgate.support``) through the engine
against raw REST.  Reports p50/p99 and the overhead ratio (targets: p99 < 10 ms for one decision,
overhead <= 1.5x raw).  Usage: ``bench/bench_decide.py [--n 1000] [--rows 10000]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, summary_ms, time_calls  # noqa: E402

from ckptgate.decide import PolicyInput, Request, decide  # noqa: E402
from ckptgate.decide._http import _UnixConnection  # noqa: E402
from ckptgate.decide.engine import EmbeddedOpa  # noqa: E402

DIGEST = "sha256:" + "ab" * 32


def intake_input(n_files: int = 20) -> PolicyInput:
    files = [{"path": f"model-{i:05d}-of-{n_files:05d}.safetensors", "kind": "safetensors", "size": 1 << 20}
             for i in range(n_files)]
    return PolicyInput(
        request=Request(action="intake", now=datetime.now(UTC)),
        fixture={"digest": DIGEST, "algorithm": "sha256", "file_count": n_files, "total_bytes": n_files << 20},
        inspection={"format": "hf-sharded-safetensors", "clean": True, "loaders": ["safetensors", "json"],
                    "findings": [], "files": files, "layout": {}},
        attestations=(), rejected_attestations=(), containment=None)


def support_rows(n: int) -> dict:
    """``n`` verified qualification facts (one real signed statement, verified once, then varied)."""
    import copy
    import json

    from ckptgate.demo import demo_statement
    from ckptgate.digestvalue import Digest
    from ckptgate.verify import (QUALIFICATION_PREDICATE_TYPE, KeySigner, TrustData, generate_keypair, trust_entry,
                                 verify_attestation)
    from ckptgate.verify.dsse import sign_statement

    with tempfile.TemporaryDirectory() as tmp:
        priv, pub = generate_keypair("ed25519")
        key = Path(tmp) / "k.pem"
        key.write_bytes(priv)
        trust = TrustData.from_json(json.dumps({"signers": [trust_entry(
            pub, signer_id="bench", predicate_types=[QUALIFICATION_PREDICATE_TYPE])]}).encode())
        raw = sign_statement(demo_statement(Digest.parse(DIGEST), "bench", producer=("torch", "2.13.0")), KeySigner.from_pem(key))
        facts = verify_attestation(raw, source="bench.json", trust=trust, measured_digest=Digest.parse(DIGEST),
                                   now=datetime.now(UTC)).to_facts()
    commit = facts["statement"]["predicate"]["candidate_commit"]
    atts = []
    for i in range(n):
        f = copy.deepcopy(facts)
        f["source"] = f"attestations/{i}.json"
        f["statement"]["predicate"]["adapter"]["name"] = f"adapter-{i % 50}"
        atts.append(f)
    head = {"commit": commit, "candidate_commit": commit, "source_tree": "t", "candidate_source_tree": "t",
            "evidence_commits": []}
    return {"attestations": atts, "rejected_attestations": [], "head": head, "targets": [],
            "now": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="single decisions per side")
    ap.add_argument("--rows", type=int, default=10000, help="support-matrix rows in the batch case")
    ap.add_argument("--batches", type=int, default=5, help="batch evaluations per side")
    args = ap.parse_args()

    pi = intake_input()
    doc = pi.to_json()
    rows_doc = support_rows(args.rows)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedOpa(timeout_s=600) as opa:
        audit = Path(tmp) / "audit.jsonl"
        # one kept-alive connection to the engine's Unix socket (it listens on no TCP port)
        conn = _UnixConnection(opa._client.unix_path or "", timeout=600)
        headers = {**opa._client.headers, "Content-Type": "application/json"}

        def post(path: str, body: object) -> object:
            conn.request("POST", f"/v1/data/{path}", body=json.dumps({"input": body}), headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                raise requests.HTTPError(f"HTTP {r.status}")
            return json.loads(data)["result"]

        def raw_single() -> None:
            post("ckptgate/intake/decision", doc)

        def engine_single() -> None:
            decide(opa, pi, audit_log=audit)

        raw = time_calls(raw_single, args.n)
        eng = time_calls(engine_single, args.n)

        def raw_batch() -> None:
            assert len(post("ckptgate/support/rows", rows_doc)) == args.rows  # type: ignore[arg-type]

        def engine_batch() -> None:
            assert len(opa.evaluate("ckptgate/support/rows", rows_doc).result) == args.rows

        try:
            raw_b = time_calls(raw_batch, args.batches, warmup=1)
            eng_b = time_calls(engine_batch, args.batches, warmup=1)
        except (requests.HTTPError, AssertionError, KeyError) as e:
            print(f"support batch skipped: data.ckptgate.support.rows unavailable ({e!r})", file=sys.stderr)
            raw_b = eng_b = []

    s_raw, s_eng = summary_ms(raw), summary_ms(eng)
    rows = [["single decision", "raw REST", s_raw["p50_ms"], s_raw["p99_ms"], 1.0],
            ["single decision", "ckptgate", s_eng["p50_ms"], s_eng["p99_ms"], s_eng["p50_ms"] / s_raw["p50_ms"]]]
    doc_out = {"single": {"raw": s_raw, "ckptgate": s_eng, "overhead_p50": s_eng["p50_ms"] / s_raw["p50_ms"],
                          "overhead_p99": s_eng["p99_ms"] / s_raw["p99_ms"],
                          "target": {"p99_ms": 10, "overhead": 1.5}}}
    if raw_b:
        b_raw, b_eng = summary_ms(raw_b), summary_ms(eng_b)
        rows += [[f"batch {args.rows} rows", "raw REST", b_raw["p50_ms"], b_raw["p99_ms"], 1.0],
                 [f"batch {args.rows} rows", "ckptgate", b_eng["p50_ms"], b_eng["p99_ms"],
                  b_eng["p50_ms"] / b_raw["p50_ms"]]]
        doc_out["batch"] = {"rows": args.rows, "raw": b_raw, "ckptgate": b_eng,
                            "overhead_p50": b_eng["p50_ms"] / b_raw["p50_ms"]}
    report("bench_decide", ["case", "side", "p50 ms", "p99 ms", "ratio to raw (p50)"], rows, doc_out)
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"done in {time.time() - t0:.1f} s")
    sys.exit(rc)
