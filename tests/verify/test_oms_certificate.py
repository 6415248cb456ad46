"""OpenSSF Model Signing bundles, certificate method: made by the real ``model_signing`` API with a CA and
signing certificate generated in the test, verified against ``--certificate-chain`` anchors."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from ckptgate.digest import fixture_digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.inspect import SafeTree
from ckptgate.verify.oms import CertificateChain, OfferedKey, verify_oms_bundle
from tests.verify.oms_helpers import HF, ca, keypair, leaf, root_sha256, sign, sign_certificate

NOW = datetime(2026, 6, 1, tzinfo=UTC)
START, END = NOW - timedelta(days=30), NOW + timedelta(days=365)
SANS = [x509.RFC822Name("ml@example.com"), x509.UniformResourceIdentifier("https://ci.example.com/release")]


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    ck = tmp_path / "ck"
    shutil.copytree(HF, ck)
    root_key, root, root_pem = ca(tmp_path, "root", start=START - timedelta(days=1), end=END + timedelta(days=1))
    priv, crt = leaf(tmp_path, "signer", (root_key, root), start=START, end=END, sans=SANS)
    sig = sign_certificate(ck, priv, crt, [root_pem], tmp_path / "model.sig")
    return {"dir": tmp_path, "ck": ck, "root": root, "root_pem": root_pem, "root_key": root_key, "sig": sig}


def verify(ck: Path, sig: Path, chain: list[Path] | None, key: Path | None = None, now: datetime = NOW) -> Any:
    with SafeTree.open(ck) as tree:
        digest = fixture_digest(tree)
    return verify_oms_bundle(sig.read_bytes(), source=str(sig), key=OfferedKey.from_file(key) if key else None,
                             manifest=digest.file_hashes(), measured_digest=digest.digest, now=now,
                             certificate_chain=CertificateChain.from_files(chain) if chain else None)


def refused(code: str, *args: Any, **kw: Any) -> VerificationError:
    with pytest.raises(VerificationError) as e:
        verify(*args, **kw)
    assert e.value.code == code, e.value.message
    return e.value


def test_a_certificate_bundle_verifies_and_names_its_sans_and_root(pki: dict[str, Any]) -> None:
    facts = verify(pki["ck"], pki["sig"], [pki["root_pem"]]).to_facts()
    (signer,) = facts["signers"]
    assert signer["kind"] == "certificate" and signer["signer_id"] is None
    assert signer["identities"] == ["ml@example.com", "https://ci.example.com/release"]
    assert signer["root_sha256"] == root_sha256(pki["root"]) and signer["subject"] == "CN=signer"
    assert facts["verification"]["binding"] == "manifest"
    assert "certificate_validity" in facts["verification"]["checks"]


def test_a_chain_that_does_not_lead_to_the_given_root_is_refused(pki: dict[str, Any]) -> None:
    _, _, other = ca(pki["dir"], "other-root", start=START, end=END)
    refused("verify.oms.certificate_chain", pki["ck"], pki["sig"], [other])


def test_an_expired_signing_certificate_is_refused(pki: dict[str, Any]) -> None:
    refused("verify.oms.certificate_expired", pki["ck"], pki["sig"], [pki["root_pem"]], now=END + timedelta(hours=1))


def test_an_expired_root_is_refused(tmp_path: Path, pki: dict[str, Any]) -> None:
    root_key, root, root_pem = ca(tmp_path, "short-root", start=START - timedelta(days=2), end=START + timedelta(days=2))
    priv, crt = leaf(tmp_path, "s2", (root_key, root), start=START, end=START + timedelta(days=1), sans=SANS)
    sig = sign_certificate(pki["ck"], priv, crt, [root_pem], tmp_path / "s2.sig")
    e = refused("verify.oms.certificate_expired", pki["ck"], sig, [root_pem])
    assert e.evidence["not_after"]


def test_a_certificate_not_yet_valid_is_refused(pki: dict[str, Any]) -> None:
    refused("verify.oms.certificate_not_yet_valid", pki["ck"], pki["sig"], [pki["root_pem"]],
            now=START - timedelta(hours=1))


def test_a_signing_certificate_without_a_san_is_refused(pki: dict[str, Any]) -> None:
    priv, crt = leaf(pki["dir"], "nosan", (pki["root_key"], pki["root"]), start=START, end=END)
    sig = sign_certificate(pki["ck"], priv, crt, [pki["root_pem"]], pki["dir"] / "nosan.sig")
    refused("verify.oms.certificate_identity", pki["ck"], sig, [pki["root_pem"]])


def test_a_certificate_bundle_without_a_chain_is_refused(pki: dict[str, Any]) -> None:
    _, pub = keypair(pki["dir"], "k")
    refused("verify.oms.no_certificate_chain", pki["ck"], pki["sig"], None, key=pub)


def test_a_key_bundle_without_a_key_is_refused(pki: dict[str, Any]) -> None:
    priv, _ = keypair(pki["dir"], "k")
    sig = sign(pki["ck"], priv, pki["dir"] / "key.sig")
    refused("verify.oms.no_key", pki["ck"], sig, [pki["root_pem"]])


def test_a_file_added_after_certificate_signing_is_refused(pki: dict[str, Any]) -> None:
    (pki["ck"] / "extra.bin").write_bytes(b"added")
    refused("verify.oms.unsigned_file", pki["ck"], pki["sig"], [pki["root_pem"]])


def test_a_chain_file_without_certificates_is_refused(pki: dict[str, Any]) -> None:
    bad = pki["dir"] / "bad.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(VerificationError) as e:
        CertificateChain.from_files([bad])
    assert e.value.code == "verify.oms.certificate_chain_invalid"
    # the file is the user's option value, not the evidence: the advice names the option, not distrust
    assert "--certificate-chain" in e.value.diagnostics() and "Do not trust" not in e.value.diagnostics()
    with pytest.raises(UsageError) as u:
        CertificateChain.from_files([pki["dir"] / "absent.pem"])
    assert u.value.code == "usage.certificate_chain_unreadable"
