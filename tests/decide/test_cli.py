"""`ckptgate decide`, `explain` and `policy build` on a real fixture through the embedded OPA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ckptgate.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def test_decide_prints_the_input_document_and_the_decision():
    res = cli("decide", HF, "--json")
    assert res.returncode == ExitCode.DENIED  # no attestation offered
    doc = json.loads(res.stdout)
    assert set(doc["input"]) == {"request", "fixture", "inspection", "attestations", "rejected_attestations",
                                 "containment"}
    assert doc["input"]["inspection"]["format"] == "hf-sharded-safetensors"
    assert doc["decision"]["allow"] is False
    assert "attestation_missing" in [r["code"] for r in doc["decision"]["reasons"]]


def test_explain_names_the_failed_evidence_in_plain_words(tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": []}')
    res = cli("explain", HF, "--attestation", bogus)
    assert res.returncode == ExitCode.VERIFICATION_FAILED  # a failed signature alone explains the deny
    assert "REJECTED" in res.stdout and str(bogus) in res.stdout
    assert "attestation_rejected" in res.stdout


def test_explain_json_gives_structured_reasons_naming_the_attestation(tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": []}')
    res = cli("explain", HF, "--attestation", bogus, "--json")
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc) == {"checkpoint", "inspection", "attestations", "containment", "decision", "reasons"}
    assert "explanation" not in doc  # no pre-formatted terminal lines
    assert doc["checkpoint"]["format"] == "hf-sharded-safetensors"
    assert doc["decision"]["allow"] is False and doc["decision"]["exit_code"] == ExitCode.VERIFICATION_FAILED
    assert doc["attestations"] == [{"source": str(bogus), "status": "rejected",
                                    "code": doc["attestations"][0]["code"],
                                    "message": doc["attestations"][0]["message"]}]
    for r in doc["reasons"]:
        assert set(r) == {"code", "message", "severity", "evidence", "attestation"}
        assert isinstance(r["evidence"], dict) and all(isinstance(line, str) for line in (r["code"], r["message"]))
    rejected = [r for r in doc["reasons"] if r["code"] == "attestation_rejected"]
    assert rejected, doc["reasons"]
    assert rejected[0]["attestation"]["source"] == str(bogus)
    assert rejected[0]["severity"] == "deny"


def test_explain_json_reason_without_an_attestation_says_so():
    res = cli("explain", HF, "--json")
    assert res.returncode == ExitCode.DENIED
    doc = json.loads(res.stdout)
    missing = [r for r in doc["reasons"] if r["code"] == "attestation_missing"]
    assert missing and missing[0]["attestation"] is None
    assert doc["attestations"] == []


def _bundle_keys(tmp_path):
    """An ES256 bundle-signing key pair: tmp_path/k.pem (private) and tmp_path/k.pub."""
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "k.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    (tmp_path / "k.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                   serialization.PublicFormat.SubjectPublicKeyInfo))


def test_policy_build_makes_a_bundle_that_the_engine_verifies(tmp_path):
    _bundle_keys(tmp_path)
    bundle = tmp_path / "policy.tar.gz"
    built = cli("policy", "build", "--signing-key", tmp_path / "k.pem", "--out", bundle, "--json")
    assert built.returncode == 0, built.stderr
    revision = json.loads(built.stdout)["revision"]
    ok = cli("decide", HF, "--policy-bundle", bundle, "--policy-key", tmp_path / "k.pub", "--json")
    assert ok.returncode == ExitCode.DENIED
    assert json.loads(ok.stdout)["decision"]["policy_revision"] == revision
    # Tamper with one policy file: OPA refuses to start, and the result is a deny (engine unavailable).
    tampered = tmp_path / "tampered.tar.gz"
    with tarfile.open(bundle) as src, tarfile.open(tampered, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None
            if m.name.endswith("intake/intake.rego"):
                data += b"\n# tampered\n"
                m.size = len(data)
            dst.addfile(m, None if data is None else __import__("io").BytesIO(data))
    bad = cli("decide", HF, "--policy-bundle", tampered, "--policy-key", tmp_path / "k.pub", "--json")
    assert bad.returncode == ExitCode.ENGINE_UNAVAILABLE
    assert json.loads(bad.stdout)["error"]["code"] == "engine.opa.start_failed"


def test_a_signed_bundle_brings_its_own_trust_data(tmp_path):
    """A signer listed only in the bundle's trust data is trusted when that bundle decides."""
    import shutil

    from ckptgate.demo import demo_statement
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, KeySigner, generate_keypair, trust_entry
    from ckptgate.verify.dsse import sign_statement

    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    priv, pub = generate_keypair("ed25519")
    (tmp_path / "signer.pem").write_bytes(priv)
    (policies / "ckptgate" / "config" / "trust" / "data.json").write_text(json.dumps(
        {"signers": [trust_entry(pub, signer_id="bundle-only", predicate_types=[QUALIFICATION_PREDICATE_TYPE])]}))
    _bundle_keys(tmp_path)
    bundle = tmp_path / "policy.tar.gz"
    assert cli("policy", "build", "--signing-key", tmp_path / "k.pem", "--out", bundle,
               "--policies", policies).returncode == 0
    with SafeTree.open(HF) as tree:
        digest = fixture_digest(tree).digest
    att = tmp_path / "att.json"
    att.write_bytes(sign_statement(demo_statement(digest, "hf", producer=("huggingface_hub", "2.4.0")),
                                   KeySigner.from_pem(tmp_path / "signer.pem")))
    res = cli("decide", HF, "--attestation", att, "--policy-bundle", bundle, "--policy-key", tmp_path / "k.pub",
              "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["input"]["attestations"][0]["signers"][0]["signer_id"] == "bundle-only"


def test_an_unreadable_trust_file_is_a_typed_error_on_every_engine_command(tmp_path):
    missing = tmp_path / "no-such-trust.json"
    for args in (("decide", HF), ("matrix", "build", "--check", "--repo", REPO)):
        res = cli(*args, "--trust", missing, "--json")
        assert res.returncode == ExitCode.VERIFICATION_FAILED, (args, res.stderr)
        assert json.loads(res.stdout)["error"]["code"] == "verify.trust.unreadable"
        assert "Traceback" not in res.stderr


def test_trust_with_a_remote_engine_is_refused_not_silently_ignored(tmp_path):
    """Issue 19, item 11: the remote engine's bundle holds the trust data; --trust would be ignored."""
    trust = tmp_path / "trust.json"
    trust.write_text('{"signers": []}')
    res = cli("decide", HF, "--opa-url", "http://127.0.0.1:9", "--trust", trust, "--json")
    assert res.returncode == ExitCode.USAGE
    assert json.loads(res.stdout)["error"]["code"] == "usage.trust_with_remote_opa"


def test_explain_reason_attestation_reference_takes_source_and_index_from_the_evidence():
    from ckptgate._cli.decide_cmd import _attestation_ref

    assert _attestation_ref({"attestation": 2, "source": "a.json", "fields": []}) == {"source": "a.json", "index": 2}
    assert _attestation_ref({"attestation": 0}) == {"source": None, "index": 0}
    assert _attestation_ref({"attestation": True, "source": 3}) is None  # not an index, not a source
    assert _attestation_ref({"plane": "pure_data"}) is None


def test_every_engine_command_takes_the_production_sigstore_root_as_attest_verify_does():
    """Issue 19, item 11: 'production' was accepted by `attest verify` only."""
    res = cli("decide", HF, "--sigstore-trust-root", "production", "--json")
    assert res.returncode == ExitCode.DENIED, res.stderr  # no attestation: a policy deny, not a usage error
    bad = cli("decide", HF, "--sigstore-trust-root", "staging", "--json")
    assert bad.returncode == ExitCode.USAGE


def test_demo_refuses_trust_options_it_would_ignore(tmp_path):
    trust = tmp_path / "trust.json"
    trust.write_text('{"signers": []}')
    res = cli("demo", "--workdir", tmp_path / "w", "--trust", trust, "--json")
    assert res.returncode == ExitCode.USAGE
    assert json.loads(res.stdout)["error"]["code"] == "usage.demo_option"
    assert not (tmp_path / "w").exists()
