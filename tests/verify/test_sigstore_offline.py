"""Sigstore round trip, fully offline: bundles signed by ``tools/sigstore-testca`` on a throwaway trust root.

The tool (Go, sigstore-go's ``VirtualSigstore`` for Rekor and the TSA, its own Fulcio CA and CT log for the
SCT) is built with ``go build`` into the session's temp folder; the Go build cache makes rebuilds cheap.
Each signing makes a fresh trust root, so nothing here is long-lived trust material.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from verify_helpers import FIXTURE_HEX, NOW, STATEMENT, trust_for

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify import TrustData, verify_attestation

TOOL_DIR = Path(__file__).resolve().parents[2] / "tools" / "sigstore-testca"
IDENTITY = "https://github.com/example/ckptgate/.github/workflows/qualify.yml@refs/heads/main"
ISSUER = "https://token.actions.githubusercontent.com"
DIGEST = "sha256:" + FIXTURE_HEX

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="Go toolchain not installed")


@dataclass(frozen=True, slots=True, kw_only=True)
class Signed:
    bundle: bytes
    trusted_root: Path


@pytest.fixture(scope="module")
def testca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("testca") / "sigstore-testca"
    subprocess.run(["go", "build", "-trimpath", "-o", str(exe), "."], cwd=TOOL_DIR, check=True,
                   capture_output=True, timeout=600)
    return exe


def _sign(testca: Path, out: Path, statement: bytes, identity: str = IDENTITY, issuer: str = ISSUER) -> Signed:
    out.mkdir(parents=True, exist_ok=True)
    bundle, root = out / "bundle.sigstore.json", out / "trusted_root.json"
    subprocess.run([str(testca), "-identity", identity, "-issuer", issuer, "-statement", "-",
                    "-bundle", str(bundle), "-trusted-root", str(root)],
                   input=statement, check=True, capture_output=True, timeout=60)
    return Signed(bundle=bundle.read_bytes(), trusted_root=root)


def _verify(signed: Signed, *, expected: tuple[str, str] | None = (IDENTITY, ISSUER), digest: str = DIGEST,
            trust: TrustData | None = None, root: Path | None = None):
    return verify_attestation(signed.bundle, source="bundle.sigstore.json", trust=trust or trust_for(),
                              measured_digest=Digest.parse(digest), now=NOW, sigstore_trust_root=root or signed.trusted_root,
                              expected_identity=expected)


@pytest.fixture(scope="module")
def signed(testca: Path, tmp_path_factory: pytest.TempPathFactory) -> Signed:
    return _sign(testca, tmp_path_factory.mktemp("signed"), json.dumps(STATEMENT).encode())


def test_round_trip_is_accepted_with_identity_facts(signed: Signed) -> None:
    va = _verify(signed)
    assert va.method == "sigstore"
    assert va.statement == STATEMENT
    assert va.measured_digest == DIGEST and va.subject_name == "hf_sharded"
    (s,) = va.signers
    assert (s.kind, s.identity, s.issuer, s.signer_id) == ("sigstore", IDENTITY, ISSUER, None)
    assert s.extensions["issuer"] == ISSUER
    assert {"certificate_chain", "transparency_log", "identity", "signature", "subject_digest"} <= set(va.checks)
    assert va.timing["log_entry_kind"] == "dsse/0.0.1"
    facts = va.to_facts()
    assert facts["signers"][0]["identity"] == IDENTITY and facts["signers"][0]["issuer"] == ISSUER
    assert facts["verification"]["method"] == "sigstore"


def test_identity_from_trust_data_names_the_signer(signed: Signed) -> None:
    trust = trust_for(sigstore=[{"id": "ci", "kind": "sigstore", "identity": IDENTITY, "issuer": ISSUER,
                                 "predicate_types": [STATEMENT["predicateType"]], "producers": ["*"],
                                 "scopes": ["qualification"]}])
    va = _verify(signed, expected=None, trust=trust)
    assert va.signers[0].signer_id == "ci"


def test_email_identity_round_trip(testca: Path, tmp_path: Path) -> None:
    s = _sign(testca, tmp_path, json.dumps(STATEMENT).encode(), identity="qualifier@example.com",
              issuer="https://accounts.example.com")
    va = _verify(s, expected=("qualifier@example.com", "https://accounts.example.com"))
    assert va.signers[0].identity == "qualifier@example.com"


@pytest.mark.parametrize("identity, issuer", [
    ("https://github.com/evil/ckptgate/.github/workflows/qualify.yml@refs/heads/main", ISSUER),
    (IDENTITY, "https://accounts.google.com"),
])
def test_wrong_identity_or_issuer_is_rejected(signed: Signed, identity: str, issuer: str) -> None:
    with pytest.raises(VerificationError) as ei:
        _verify(signed, expected=(identity, issuer))
    assert ei.value.code == "verify.sigstore.identity_mismatch"


def test_tampered_payload_is_rejected(signed: Signed) -> None:
    doc = json.loads(signed.bundle)
    stmt = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    stmt["subject"][0]["digest"]["sha256"] = "cd" * 32
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    tampered = Signed(bundle=json.dumps(doc).encode(), trusted_root=signed.trusted_root)
    with pytest.raises(VerificationError) as ei:
        _verify(tampered, digest="sha256:" + "cd" * 32)
    assert ei.value.code == "verify.sigstore.failed"
    assert "invalid signature" in ei.value.message


def test_subject_digest_mismatch_is_rejected(signed: Signed) -> None:
    with pytest.raises(VerificationError) as ei:
        _verify(signed, digest="sha256:" + "00" * 32)
    assert ei.value.code == "verify.statement.subject_mismatch"


def test_another_trust_root_is_rejected(testca: Path, signed: Signed, tmp_path: Path) -> None:
    other = _sign(testca, tmp_path, json.dumps(STATEMENT).encode())
    with pytest.raises(VerificationError) as ei:
        _verify(signed, root=other.trusted_root)
    assert ei.value.code == "verify.sigstore.failed"
    assert "chain" in ei.value.message


def test_intake_decision_accepts_a_sigstore_bundle_through_the_cli(testca: Path, tmp_path: Path) -> None:
    """`decide --attestation BUNDLE --sigstore-trust-root ROOT`: verified offline, trusted by identity."""
    import os
    import sys
    from datetime import timedelta

    from ckptgate.decide import now_utc
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify.statement import qualification_statement

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "hf_sharded" / "checkpoint"
    with SafeTree.open(fixture) as tree:
        digest = fixture_digest(tree).digest
    statement = qualification_statement(
        subject_name="hf_sharded", fixture_digest=digest, manifest="hf_sharded",
        producer={"name": "huggingface_hub", "version": "2.4.0"}, adapter={"name": "hf-safetensors", "version": "1"},
        candidate_commit="0" * 40,
        environment={"python": "3.11", "torch": None, "os": "linux", "arch": "x86_64", "accelerator": "cpu"},
        topology={"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1},
        status="passed", checks_run=["bit-exact"], evidence_digest=str(digest), evidence_location="test",
        issued_at=now_utc(), valid_for=timedelta(hours=1))
    signed = _sign(testca, tmp_path, json.dumps(statement).encode())
    bundle = tmp_path / "attestation.sigstore.json"
    bundle.write_bytes(signed.bundle)
    trust = tmp_path / "trust.json"
    trust.write_text(json.dumps({"signers": [{
        "id": "ci-sigstore", "kind": "sigstore", "identity": IDENTITY, "issuer": ISSUER,
        "predicate_types": [statement["predicateType"]], "producers": ["*"], "scopes": ["qualification"]}]}))

    def decide(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ckptgate", "decide", str(fixture), "--attestation", str(bundle),
                               "--trust", str(trust), "--json", *extra], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ))

    ok = decide("--sigstore-trust-root", str(signed.trusted_root))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["decision"]["allow"] is True
    assert doc["input"]["attestations"][0]["signers"][0]["identity"] == IDENTITY
    without_root = decide()
    assert without_root.returncode == 5  # verification alone failed
    assert json.loads(without_root.stdout)["input"]["rejected_attestations"][0]["code"] == \
        "verify.sigstore.no_trust_root"


def test_the_sigstore_trust_root_is_a_named_input_of_the_decision(testca: Path, signed: Signed,
                                                                   tmp_path: Path) -> None:
    """The trusted_root.json decides which CAs and logs a Sigstore bundle may come from: each decision
    names it with the sha256 of its bytes (it was named nowhere, so another root under the same
    identity and issuer decided under the same inputs and revision; review2 A3)."""
    import hashlib

    from ckptgate.decide.options import EngineOptions, decision_inputs

    other = _sign(testca, tmp_path / "other", json.dumps(STATEMENT).encode())
    named = {}
    for root in (signed.trusted_root, other.trusted_root):
        (i,) = [i for i in decision_inputs(EngineOptions(sigstore_trust_root=root), None, {})
                if i.role == "sigstore_trust_root"]
        assert i.path == str(root) and i.origin == "explicit"
        assert i.sha256 == "sha256:" + hashlib.sha256(root.read_bytes()).hexdigest()
        named[root] = i.sha256
    assert len(set(named.values())) == 2
    assert not [i for i in decision_inputs(EngineOptions(), None, {}) if i.role == "sigstore_trust_root"]
