"""``ckptgate intake/verify CKPT --signature model.sig --key pub.pem``: a user holding only a checkpoint, an
OpenSSF Model Signing signature (made by the real ``model_signing`` API) and the signer's public key."""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from ckptgate.errors import ExitCode
from tests.verify.oms_helpers import (HF, ca, ed25519_keypair, keypair, leaf, root_sha256, sign, sign_certificate,
                                      sign_ed25519)
from tests.pipeline_helpers import ckptgate_json


_cli = ckptgate_json
TRUST = Path(__file__).resolve().parents[1] / "policies/ckptgate/config/trust/data.json"
OMS_TYPE = "https://model_signing/signature/v1.0"


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("oms")
    ck = d / "ck"
    shutil.copytree(HF, ck)
    priv, pub = keypair(d, "signer")
    _, wrong = keypair(d, "wrong")
    return {"dir": d, "ck": ck, "pub": pub, "wrong": wrong, "sig": sign(ck, priv, d / "model.sig")}


def test_intake_with_a_model_signing_signature_and_key_is_allowed_for_pure_data(case: dict[str, Path]) -> None:
    out = case["dir"] / "out"
    res = _cli("intake", str(case["ck"]), "--out", str(out), "--signature", str(case["sig"]),
               "--key", str(case["pub"]))
    assert res.returncode == 0, res.stdout + res.stderr
    receipt = json.loads(res.stdout)["receipt"]
    assert receipt["decision"]["allow"] is True and receipt["decision"]["plane"] == "pure_data"
    (att,) = receipt["attestations"]
    (signer,) = att["signers"]
    assert signer["offered"] == str(case["pub"]) and signer["signer_id"].startswith("key:")
    assert any(r["code"] == "attestation_trusted" for r in receipt["decision"]["reasons"])
    assert (out / "model.safetensors.index.json").is_file()
    # the offered key decided too: named by path and the sha256 of the bytes read, as every input
    (key_input,) = [i for i in receipt["inputs"] if i["role"] == "verification_key"]
    assert key_input == {"role": "verification_key", "path": str(case["pub"]), "origin": "explicit",
                         "sha256": "sha256:" + hashlib.sha256(case["pub"].read_bytes()).hexdigest()}


def test_the_reviewer_report_names_the_signer_and_the_model(case: dict[str, Path]) -> None:
    res = _cli("verify", str(case["ck"]), "--signature", str(case["sig"]), "--key", str(case["pub"]))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    (att,) = doc["attestations"]
    assert att["digest_matches"] is True and att["model_name"] == "ck" and att["method"] == "model_signing"
    assert att["signers"][0]["offered"] == str(case["pub"])
    assert att["predicate_type"] == "https://model_signing/signature/v1.0"


def test_intake_under_the_wrong_key_is_refused_as_a_verification_failure(case: dict[str, Path]) -> None:
    out = case["dir"] / "never"
    res = _cli("intake", str(case["ck"]), "--out", str(out), "--signature", str(case["sig"]),
               "--key", str(case["wrong"]))
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    err = json.loads(res.stdout)["error"]
    assert any(r["evidence"].get("error_code") == "verify.oms.signature" for r in err["reasons"])
    assert not out.exists()


def test_a_signature_without_a_key_is_a_usage_error(case: dict[str, Path]) -> None:
    res = _cli("intake", str(case["ck"]), "--out", str(case["dir"] / "no"), "--signature", str(case["sig"]))
    assert res.returncode == ExitCode.USAGE
    assert json.loads(res.stdout)["error"]["code"] == "usage.signature_needs_key"


def test_intake_with_an_ed25519_signature_is_allowed_for_pure_data(case: dict[str, Path]) -> None:
    key, pub = ed25519_keypair(case["dir"], "ed")
    sig = sign_ed25519(case["ck"], key, case["dir"] / "ed.sig")
    out = case["dir"] / "out-ed"
    res = _cli("intake", str(case["ck"]), "--out", str(out), "--signature", str(sig), "--key", str(pub))
    assert res.returncode == 0, res.stdout + res.stderr
    receipt = json.loads(res.stdout)["receipt"]
    assert receipt["decision"]["allow"] is True
    assert receipt["attestations"][0]["signers"][0]["algorithm"] == "ed25519"


@pytest.fixture(scope="module")
def pki(case: dict[str, Path]) -> dict[str, Path]:
    """A CA and a signing certificate made in the test, a certificate-method bundle made by model_signing,
    and trust data that names the signer by SAN and root fingerprint."""
    d, now = case["dir"], datetime.now(UTC)
    root_key, root, root_pem = ca(d, "root", start=now - timedelta(days=2), end=now + timedelta(days=30))
    priv, crt = leaf(d, "signer", (root_key, root), start=now - timedelta(days=1), end=now + timedelta(days=7),
                     sans=[x509.RFC822Name("ml@example.com")])
    sig = sign_certificate(case["ck"], priv, crt, [root_pem], d / "cert.sig")
    doc = json.loads(TRUST.read_text())
    doc["signers"].append({"id": "example-release", "kind": "certificate", "identity": "ml@example.com",
                           "root_sha256": root_sha256(root), "predicate_types": [OMS_TYPE], "producers": ["*"],
                           "scopes": ["*"]})
    trust = d / "trust.json"
    trust.write_text(json.dumps(doc))
    _, _, other = ca(d, "other-root", start=now - timedelta(days=2), end=now + timedelta(days=30))
    return {"sig": sig, "root": root_pem, "trust": trust, "other": other}


def test_intake_with_a_certificate_signature_named_by_trust_data_is_allowed(case: dict[str, Path],
                                                                            pki: dict[str, Path]) -> None:
    out = case["dir"] / "out-cert"
    res = _cli("intake", str(case["ck"]), "--out", str(out), "--signature", str(pki["sig"]),
               "--certificate-chain", str(pki["root"]), "--trust", str(pki["trust"]))
    assert res.returncode == 0, res.stdout + res.stderr
    receipt = json.loads(res.stdout)["receipt"]
    assert receipt["decision"]["allow"] is True
    (signer,) = receipt["attestations"][0]["signers"]
    assert signer["kind"] == "certificate" and signer["identity"] == "ml@example.com"
    chain = [i for i in receipt["inputs"] if i["role"] == "certificate_chain"]
    assert chain == [{"role": "certificate_chain", "path": str(pki["root"]), "origin": "explicit",
                      "sha256": "sha256:" + hashlib.sha256(pki["root"].read_bytes()).hexdigest()}]


def test_a_certificate_signer_the_trust_data_does_not_name_is_refused(case: dict[str, Path],
                                                                      pki: dict[str, Path]) -> None:
    res = _cli("decide", str(case["ck"]), "--signature", str(pki["sig"]), "--certificate-chain", str(pki["root"]))
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    reasons = json.loads(res.stdout)["decision"]["reasons"]
    assert any(r["code"] == "attestation_untrusted_signer" for r in reasons)


def test_decide_refuses_a_chain_to_another_root(case: dict[str, Path], pki: dict[str, Path]) -> None:
    res = _cli("decide", str(case["ck"]), "--signature", str(pki["sig"]), "--certificate-chain", str(pki["other"]),
               "--trust", str(pki["trust"]))
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    (rej,) = json.loads(res.stdout)["input"]["rejected_attestations"]
    assert rej["code"] == "verify.oms.certificate_chain"


def test_decide_and_explain_take_signature_and_key(case: dict[str, Path]) -> None:
    res = _cli("decide", str(case["ck"]), "--signature", str(case["sig"]), "--key", str(case["pub"]))
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["decision"]["allow"] is True
    res = _cli("explain", str(case["ck"]), "--signature", str(case["sig"]), "--key", str(case["wrong"]))
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    assert "verify.oms.signature" in res.stdout
    res = _cli("explain", str(case["ck"]), "--signature", str(case["sig"]))
    assert res.returncode == ExitCode.USAGE
    assert json.loads(res.stdout)["error"]["code"] == "usage.signature_needs_key"
