"""OpenSSF Model Signing bundles, Sigstore (keyless) method, fully offline: the statement is made by the real
``model_signing`` API, and signed into a Sigstore bundle by ``tools/sigstore-testca`` on a throwaway trust root
(as ``model_signing sign sigstore`` would against a real Fulcio and Rekor)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ckptgate.digest import fixture_digest
from ckptgate.errors import VerificationError
from ckptgate.inspect import SafeTree
from ckptgate.verify import TrustData
from ckptgate.verify.oms import OMS_PREDICATE_TYPE, verify_oms_bundle
from tests.verify.oms_helpers import HF, keypair, sign

TOOL_DIR = Path(__file__).resolve().parents[2] / "tools" / "sigstore-testca"
IDENTITY = "https://github.com/example/models/.github/workflows/release.yml@refs/heads/main"
ISSUER = "https://token.actions.githubusercontent.com"

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="Go toolchain not installed")


def _trust(identity: str = IDENTITY, issuer: str = ISSUER) -> TrustData:
    return TrustData.from_json(json.dumps({"signers": [{
        "id": "models-release", "kind": "sigstore", "identity": identity, "issuer": issuer,
        "predicate_types": [OMS_PREDICATE_TYPE], "producers": ["*"], "scopes": ["*"]}]}).encode())


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("oms-keyless")
    exe = d / "sigstore-testca"
    subprocess.run(["go", "build", "-trimpath", "-o", str(exe), "."], cwd=TOOL_DIR, check=True,
                   capture_output=True, timeout=600)
    ck = d / "ck"
    shutil.copytree(HF, ck)
    priv, _ = keypair(d, "throwaway")
    statement = base64.b64decode(json.loads(sign(ck, priv, d / "key.sig").read_text())["dsseEnvelope"]["payload"])
    bundle, root = d / "model.sig", d / "trusted_root.json"
    subprocess.run([str(exe), "-identity", IDENTITY, "-issuer", ISSUER, "-statement", "-", "-bundle", str(bundle),
                    "-trusted-root", str(root)], input=statement, check=True, capture_output=True, timeout=60)
    other = d / "other"
    other.mkdir()
    subprocess.run([str(exe), "-identity", IDENTITY, "-issuer", ISSUER, "-statement", "-", "-bundle",
                    str(other / "b.json"), "-trusted-root", str(other / "trusted_root.json")], input=statement,
                   check=True, capture_output=True, timeout=60)
    return {"dir": d, "ck": ck, "sig": bundle, "root": root, "other_root": other / "trusted_root.json"}


def verify(ck: Path, sig: Path, root: Path | None, trust: TrustData) -> Any:
    with SafeTree.open(ck) as tree:
        digest = fixture_digest(tree)
    return verify_oms_bundle(sig.read_bytes(), source=str(sig), key=None, manifest=digest.file_hashes(),
                             measured_digest=digest.digest, now=datetime.now(UTC), sigstore_trust_root=root,
                             trust=trust)


def refused(code: str, *args: Any) -> None:
    with pytest.raises(VerificationError) as e:
        verify(*args)
    assert e.value.code == code, e.value.message


def test_a_keyless_bundle_verifies_and_names_the_trusted_identity(keyless: dict[str, Path]) -> None:
    facts = verify(keyless["ck"], keyless["sig"], keyless["root"], _trust()).to_facts()
    (signer,) = facts["signers"]
    assert (signer["kind"], signer["identity"], signer["issuer"], signer["signer_id"]) == \
        ("sigstore", IDENTITY, ISSUER, "models-release")
    assert "transparency_log" in facts["verification"]["checks"]
    assert facts["verification"]["binding"] == "manifest"


def test_an_identity_the_trust_data_does_not_name_is_refused(keyless: dict[str, Path]) -> None:
    refused("verify.sigstore.identity_mismatch", keyless["ck"], keyless["sig"], keyless["root"],
            _trust(identity="https://github.com/someone/else/.github/workflows/x.yml@refs/heads/main"))
    refused("verify.sigstore.identity_mismatch", keyless["ck"], keyless["sig"], keyless["root"],
            _trust(issuer="https://accounts.example.com"))


def test_another_trust_root_is_refused(keyless: dict[str, Path]) -> None:
    refused("verify.sigstore.failed", keyless["ck"], keyless["sig"], keyless["other_root"], _trust())


def test_a_keyless_bundle_without_a_trust_root_is_refused(keyless: dict[str, Path]) -> None:
    refused("verify.oms.no_sigstore_trust_root", keyless["ck"], keyless["sig"], None, _trust())


def test_a_file_changed_after_keyless_signing_is_refused(keyless: dict[str, Path], tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(keyless["ck"], ck)
    (ck / "extra.bin").write_bytes(b"added after signing")
    refused("verify.oms.unsigned_file", ck, keyless["sig"], keyless["root"], _trust())


def test_a_changed_payload_is_refused(keyless: dict[str, Path], tmp_path: Path) -> None:
    doc = json.loads(keyless["sig"].read_text())
    stmt = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    stmt["predicate"]["resources"] = stmt["predicate"]["resources"][:-1]
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    bad = tmp_path / "bad.sig"
    bad.write_text(json.dumps(doc))
    refused("verify.sigstore.failed", keyless["ck"], bad, keyless["root"], _trust())


def test_intake_takes_a_keyless_signature_with_the_trust_root_and_trust_data(keyless: dict[str, Path]) -> None:
    from tests.pipeline_helpers import ckptgate_json

    trust_file = keyless["dir"] / "trust.json"
    trust_file.write_bytes(_trust().raw)
    out = keyless["dir"] / "out"
    res = ckptgate_json("intake", keyless["ck"], "--out", out, "--signature", keyless["sig"],
                        "--sigstore-trust-root", keyless["root"], "--trust", trust_file)
    assert res.returncode == 0, res.stdout + res.stderr
    receipt = json.loads(res.stdout)["receipt"]
    assert receipt["decision"]["allow"] is True
    assert receipt["attestations"][0]["signers"][0]["signer_id"] == "models-release"
