from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from verify_helpers import COMMIT, FIXTURE_HEX, NOW, STATEMENT, signer, statement, trust_for

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify import dsse, rejection_facts, sign_statement, verify_attestation


def _verify(raw: bytes, trust, digest: str = "sha256:" + FIXTURE_HEX, **kw):
    return verify_attestation(raw, source="a.dsse.json", trust=trust, measured_digest=Digest.parse(digest),
                              now=kw.pop("now", NOW), **kw)


def _code(fn) -> str:
    with pytest.raises(VerificationError) as ei:
        fn()
    return ei.value.code


def test_facts_document_shape(ed_signer, ec_signer) -> None:
    raw = dsse.sign_payload(dsse.canonical_payload(STATEMENT), [ed_signer, ec_signer])
    va = _verify(raw, trust_for(ed_signer, ec_signer), expected_commit=COMMIT)
    f = va.to_facts()
    assert f["source"] == "a.dsse.json"
    assert f["statement"] == STATEMENT
    assert [s["signer_id"] for s in f["signers"]] == ["key-0", "key-1"]
    assert {s["algorithm"] for s in f["signers"]} == {"ed25519", "ecdsa-p256"}
    assert all(s["kind"] == "key" and len(s["spki_sha256"]) == 64 for s in f["signers"])
    v = f["verification"]
    assert v["method"] == "dsse" and v["subject_matches_fixture"] is True
    assert v["checks"] == ["envelope", "payload_type", "signature", "statement_schema", "subject_digest",
                           "validity_window", "candidate_commit"]
    assert v["verified_at"] == "2026-11-29T17:00:00Z"
    assert v["validity"] == {"issued_at": "2026-11-01T00:00:00Z", "expires_at": "2027-02-01T00:00:00Z"}
    json.dumps(f)  # JSON-serialisable for OPA


def test_ci_trust_data_accepts_only_ci_key(ed_signer) -> None:
    from ckptgate.verify import TrustData

    trust = TrustData.from_file()
    assert [k.id for k in trust.keys] == ["ci-qualification"]
    assert _code(lambda: _verify(sign_statement(STATEMENT, ed_signer), trust)) == "verify.key.untrusted"


def test_subject_digest_mismatch(ed_signer) -> None:
    raw = sign_statement(STATEMENT, ed_signer)
    assert _code(lambda: _verify(raw, trust_for(ed_signer), digest="sha256:" + "00" * 32)) == \
        "verify.statement.subject_mismatch"


def test_replay_for_another_fixture_is_rejected(ed_signer) -> None:
    # A valid attestation for fixture A presented for fixture B.
    other = json.loads(json.dumps(STATEMENT))
    other["subject"][0]["digest"]["sha256"] = "ee" * 32
    other["predicate"]["fixture"]["digest"] = "sha256:" + "ee" * 32
    raw = sign_statement(other, ed_signer)
    assert _code(lambda: _verify(raw, trust_for(ed_signer))) == "verify.statement.subject_mismatch"


def test_replay_for_another_commit(ed_signer) -> None:
    raw = sign_statement(STATEMENT, ed_signer)
    trust = trust_for(ed_signer)
    # Without an expected commit Python verifies; the commit is a fact that policy compares.
    assert _verify(raw, trust).to_facts()["statement"]["predicate"]["candidate_commit"] == COMMIT
    assert _code(lambda: _verify(raw, trust, expected_commit="f" * 40)) == "verify.statement.commit_mismatch"


def test_expired_and_future_dated(ed_signer) -> None:
    raw = sign_statement(STATEMENT, ed_signer)
    trust = trust_for(ed_signer)
    from verify_helpers import NOW as now

    assert _code(lambda: _verify(raw, trust, now=now.replace(year=2027, month=3))) == "verify.statement.expired"
    assert _code(lambda: _verify(raw, trust, now=now.replace(month=10))) == "verify.statement.not_yet_valid"
    # within the clock-skew allowance of issued_at
    assert _verify(raw, trust, now=now.replace(month=11, day=1) - timedelta(minutes=4))


def test_inverted_validity_window(ed_signer) -> None:
    raw = sign_statement(statement(validity={"issued_at": "2026-12-01T00:00:00Z",
                                             "expires_at": "2026-11-01T00:00:00Z"}), ed_signer)
    assert _code(lambda: _verify(raw, trust_for(ed_signer))) == "verify.statement.validity_window"


def _resign(payload: bytes, s) -> bytes:
    return dsse.sign_payload(payload, [s])


def test_duplicate_keys_in_signed_statement(ed_signer) -> None:
    payload = dsse.canonical_payload(STATEMENT)
    dup = payload.replace(b'"_type":', b'"_type":"x","_type":', 1)
    assert _code(lambda: _verify(_resign(dup, ed_signer), trust_for(ed_signer))) == "verify.json.duplicate_key"
    nested = payload.replace(b'"status":"passed"', b'"status":"failed","status":"passed"')
    assert _code(lambda: _verify(_resign(nested, ed_signer), trust_for(ed_signer))) == "verify.json.duplicate_key"


def test_exact_bytes_are_verified_not_reserialised(ed_signer) -> None:
    # Signed bytes with different whitespace verify; the signature is over those bytes exactly.
    payload = json.dumps(STATEMENT, indent=3).encode()
    va = _verify(_resign(payload, ed_signer), trust_for(ed_signer))
    import hashlib

    assert va.payload_sha256 == hashlib.sha256(payload).hexdigest()


def test_not_a_statement(ed_signer) -> None:
    trust = trust_for(ed_signer)
    assert _code(lambda: _verify(_resign(b'{"_type": "https://in-toto.io/Statement/v0.1"}', ed_signer), trust)) == \
        "verify.statement.type"
    assert _code(lambda: _verify(_resign(b'[1]', ed_signer), trust)) == "verify.statement.type"
    assert _code(lambda: _verify(_resign(b'{"_type": "https://in-toto.io/Statement/v1", "subject": []}',
                                         ed_signer), trust)) == "verify.statement.shape"


def test_unknown_predicate_type_passes_to_policy(ed_signer) -> None:
    s = {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "x", "digest": {"sha256": FIXTURE_HEX}}],
         "predicateType": "https://slsa.dev/provenance/v1", "predicate": {"anything": 1}}
    va = _verify(sign_statement(s, ed_signer), trust_for(ed_signer))
    assert va.predicate_type == "https://slsa.dev/provenance/v1" and va.validity is None
    assert "validity_window" not in va.checks


def test_fixture_digest_inconsistent_with_subject(ed_signer) -> None:
    s = statement(fixture={"digest": "sha256:" + "11" * 32, "digest_algorithm": "sha256", "manifest": "m"})
    raw = _resign(dsse.canonical_payload(s), ed_signer)
    assert _code(lambda: _verify(raw, trust_for(ed_signer))) == "verify.statement.fixture_inconsistent"


def test_unknown_format_and_garbage(ed_signer) -> None:
    trust = trust_for(ed_signer)
    assert _code(lambda: _verify(b'{"hello": 1}', trust)) == "verify.format.unknown"
    assert _code(lambda: _verify(b'\x89PNG\r\n', trust)) == "verify.json.not_utf8"
    raw = sign_statement(STATEMENT, ed_signer)
    assert _code(lambda: _verify(raw[:-40], trust)) == "verify.json.malformed"


def test_very_large_attestation(ed_signer) -> None:
    raw = b" " * (dsse.MAX_ENVELOPE_BYTES + 1)
    assert _code(lambda: _verify(raw, trust_for(ed_signer))) == "verify.dsse.too_large"


def test_large_payload_inside_small_cap(ed_signer) -> None:
    s = statement(result={"status": "passed", "checks_run": ["x" * 200] * 1,
                          "evidence": {"digest": "sha256:" + "cd" * 32, "location": "l"}})
    s["subject"] = s["subject"] * 1
    payload = dsse.canonical_payload(s) + b" " * (9 * 1024 * 1024)
    assert _code(lambda: _verify(_resign(payload, ed_signer), trust_for(ed_signer))) == "verify.json.too_large"


def test_deeply_nested_statement(ed_signer) -> None:
    payload = b"[" * 100_000 + b"]" * 100_000
    assert _code(lambda: _verify(_resign(payload, ed_signer), trust_for(ed_signer))) == "verify.json.too_deep"
    payload = b'{"a":' * 70 + b"1" + b"}" * 70
    assert _code(lambda: _verify(_resign(payload, ed_signer), trust_for(ed_signer))) == "verify.json.too_deep"


def test_malformed_measured_digest(ed_signer) -> None:
    assert _code(lambda: _verify(sign_statement(STATEMENT, ed_signer), trust_for(ed_signer),
                                 digest="md5:abc")) == "verify.digest.malformed"


def test_rejection_facts_never_carry_the_statement(ed_signer) -> None:
    raw = sign_statement(STATEMENT, signer())
    with pytest.raises(VerificationError) as ei:
        _verify(raw, trust_for(ed_signer))
    r = rejection_facts("a.dsse.json", ei.value)
    assert set(r) == {"source", "code", "message"} and r["code"] == "verify.key.untrusted"


def test_sigstore_bundle_needs_a_trust_root(ed_signer) -> None:
    raw = json.dumps({"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}).encode()
    assert _code(lambda: _verify(raw, trust_for(ed_signer))) == "verify.sigstore.no_trust_root"


def test_tampered_payload_end_to_end(ed_signer) -> None:
    d = json.loads(sign_statement(STATEMENT, ed_signer))
    d["payload"] = base64.b64encode(base64.b64decode(d["payload"]).replace(COMMIT.encode(), b"f" * 40)).decode()
    assert _code(lambda: _verify(json.dumps(d).encode(), trust_for(ed_signer))) == "verify.dsse.bad_signature"
