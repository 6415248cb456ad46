"""OpenSSF Model Signing bundles (key method), made by the real ``model_signing`` API with fresh keys."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ckptgate.digest import fixture_digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.inspect import SafeTree
from ckptgate.verify.oms import OMS_PREDICATE_TYPE, OfferedKey, verify_oms_bundle
from tests.verify.oms_helpers import HF, OTHER, ed25519_keypair, keypair, resign, sign, sign_ed25519
from tests.verify.verify_helpers import UNSUPPORTED_CURVE_PUBLIC_PEM

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def signed(tmp_path: Path) -> dict[str, Path]:
    ck = tmp_path / "ck"
    shutil.copytree(HF, ck)
    priv, pub = keypair(tmp_path, "signer")
    return {"ck": ck, "priv": priv, "pub": pub, "sig": sign(ck, priv, tmp_path / "model.sig"), "dir": tmp_path}


def verify(ck: Path, sig: Path, pub: Path) -> Any:
    with SafeTree.open(ck) as tree:
        digest = fixture_digest(tree)
    return verify_oms_bundle(sig.read_bytes(), source=str(sig), key=OfferedKey.from_file(pub),
                             manifest=digest.file_hashes(), measured_digest=digest.digest, now=NOW)


def refused(code: str, ck: Path, sig: Path, pub: Path) -> VerificationError:
    with pytest.raises(VerificationError) as e:
        verify(ck, sig, pub)
    assert e.value.code == code, e.value.message
    return e.value


def test_a_real_bundle_verifies_and_binds_every_file(signed: dict[str, Path]) -> None:
    v = verify(signed["ck"], signed["sig"], signed["pub"])
    facts = v.to_facts()
    assert facts["statement"]["predicateType"] == OMS_PREDICATE_TYPE
    assert facts["verification"]["binding"] == "manifest"
    assert facts["verification"]["manifest_matches_fixture"] is True
    assert facts["verification"]["method"] == "model_signing"
    (signer,) = facts["signers"]
    assert signer["offered"] == str(signed["pub"]) and signer["algorithm"] == "ecdsa-p256"
    assert signer["signer_id"] == "key:" + OfferedKey.from_file(signed["pub"]).spki_sha256[:16]
    assert v.subject_name == "ck"
    names = {r["name"] for r in facts["statement"]["predicate"]["resources"]}
    assert names == {p.name for p in HF.iterdir()}


def test_p384_keys_verify(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(HF, ck)
    priv, pub = keypair(tmp_path, "p384", ec.SECP384R1())
    assert verify(ck, sign(ck, priv, tmp_path / "m.sig"), pub).signers[0].algorithm == "ecdsa-p384"


def test_a_file_added_after_signing_is_refused(signed: dict[str, Path]) -> None:
    (signed["ck"] / "extra.json").write_text("{}")
    e = refused("verify.oms.unsigned_file", signed["ck"], signed["sig"], signed["pub"])
    assert e.evidence["files"] == ["extra.json"]


def test_a_removed_file_is_refused(signed: dict[str, Path]) -> None:
    (signed["ck"] / "model-00003-of-00003.safetensors").unlink()
    refused("verify.oms.missing_file", signed["ck"], signed["sig"], signed["pub"])


def test_one_changed_byte_is_refused(signed: dict[str, Path]) -> None:
    p = signed["ck"] / "model-00002-of-00003.safetensors"
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))
    e = refused("verify.oms.digest_mismatch", signed["ck"], signed["sig"], signed["pub"])
    assert e.evidence["files"] == ["model-00002-of-00003.safetensors"]


def test_a_renamed_file_is_refused(signed: dict[str, Path]) -> None:
    (signed["ck"] / "model.safetensors.index.json").rename(signed["ck"] / "index.json")
    refused("verify.oms.unsigned_file", signed["ck"], signed["sig"], signed["pub"])


def test_a_duplicated_resource_name_is_refused(signed: dict[str, Path]) -> None:
    def dup(stmt: dict[str, Any]) -> None:
        res = stmt["predicate"]["resources"]
        res.append(dict(res[0], digest="0" * 64))

    refused("verify.oms.duplicate_resource", signed["ck"], resign(signed["sig"], signed["priv"], dup), signed["pub"])


def test_the_resigned_bundle_is_otherwise_accepted(signed: dict[str, Path]) -> None:
    """The resigning helper itself yields a bundle the reference implementation accepts."""
    assert verify(signed["ck"], resign(signed["sig"], signed["priv"], lambda s: None), signed["pub"]).signers


def test_ignore_paths_hiding_a_file_is_refused(signed: dict[str, Path]) -> None:
    (signed["ck"] / "notes.txt").write_text("not signed")
    sig = sign(signed["ck"], signed["priv"], signed["dir"] / "ignoring.sig", ignore=["notes.txt"])
    e = refused("verify.oms.ignored_file", signed["ck"], sig, signed["pub"])
    assert e.evidence["files"] == ["notes.txt"]


def test_a_bundle_for_another_model_is_refused(signed: dict[str, Path]) -> None:
    other = signed["dir"] / "other"
    shutil.copytree(OTHER, other)
    sig = sign(other, signed["priv"], signed["dir"] / "other.sig")
    refused("verify.oms.unsigned_file", signed["ck"], sig, signed["pub"])


def test_the_wrong_key_is_refused(signed: dict[str, Path]) -> None:
    _, wrong = keypair(signed["dir"], "wrong")
    refused("verify.oms.signature", signed["ck"], signed["sig"], wrong)


def test_a_tampered_signature_is_refused(signed: dict[str, Path]) -> None:
    doc = json.loads(signed["sig"].read_text())
    stmt = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    stmt["subject"][0]["name"] = "another-name"
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    bad = signed["dir"] / "tampered.sig"
    bad.write_text(json.dumps(doc))
    refused("verify.oms.signature", signed["ck"], bad, signed["pub"])


def test_allow_symlinks_is_refused(signed: dict[str, Path]) -> None:
    sig = resign(signed["sig"], signed["priv"], lambda s: s["predicate"]["serialization"].update(allow_symlinks=True))
    refused("verify.oms.allow_symlinks", signed["ck"], sig, signed["pub"])


def test_shard_serialisation_is_refused(signed: dict[str, Path]) -> None:
    sig = sign(signed["ck"], signed["priv"], signed["dir"] / "shards.sig", shard=True)
    refused("verify.oms.serialization_unsupported", signed["ck"], sig, signed["pub"])


def test_the_pre_1_0_predicate_type_is_refused(signed: dict[str, Path]) -> None:
    def compat(stmt: dict[str, Any]) -> None:
        stmt["predicateType"] = "https://model_signing/Digests/v0.1"

    refused("verify.oms.predicate_type", signed["ck"], resign(signed["sig"], signed["priv"], compat), signed["pub"])


def test_a_certificate_bundle_is_not_the_key_method(signed: dict[str, Path]) -> None:
    doc = json.loads(signed["sig"].read_text())
    doc["verificationMaterial"] = {"certificate": {"rawBytes": "AA=="}, "tlogEntries": []}
    bad = signed["dir"] / "cert.sig"
    bad.write_text(json.dumps(doc))
    refused("verify.oms.method_unsupported", signed["ck"], bad, signed["pub"])


def test_an_ed25519_key_verifies_and_binds(signed: dict[str, Path]) -> None:
    key, pub = ed25519_keypair(signed["dir"], "ed")
    sig = sign_ed25519(signed["ck"], key, signed["dir"] / "ed.sig")
    facts = verify(signed["ck"], sig, pub).to_facts()
    (signer,) = facts["signers"]
    assert signer["algorithm"] == "ed25519" and signer["offered"] == str(pub)
    assert facts["verification"]["binding"] == "manifest"


def test_ed25519_under_another_ed25519_key_is_refused(signed: dict[str, Path]) -> None:
    key, _ = ed25519_keypair(signed["dir"], "ed")
    _, other = ed25519_keypair(signed["dir"], "other")
    sig = sign_ed25519(signed["ck"], key, signed["dir"] / "ed.sig")
    refused("verify.oms.signature", signed["ck"], sig, other)
    doc = json.loads(sig.read_text())  # the hint rewritten to name the other key: the signature still fails
    doc["verificationMaterial"]["publicKey"]["hint"] = hashlib.sha256(other.read_bytes()).hexdigest()
    forged = signed["dir"] / "forged.sig"
    forged.write_text(json.dumps(doc))
    refused("verify.oms.signature", signed["ck"], forged, other)


def test_ed25519_binding_attacks_are_refused(signed: dict[str, Path]) -> None:
    """Capability: signature verification (an Ed25519 DSSE signature binds exactly the signed files)."""
    key, pub = ed25519_keypair(signed["dir"], "ed")
    sig = sign_ed25519(signed["ck"], key, signed["dir"] / "ed.sig")
    (signed["ck"] / "extra.bin").write_bytes(b"added after signing")
    refused("verify.oms.unsigned_file", signed["ck"], sig, pub)


def test_ed25519_two_signatures_are_refused(signed: dict[str, Path]) -> None:
    key, pub = ed25519_keypair(signed["dir"], "ed")
    sig = sign_ed25519(signed["ck"], key, signed["dir"] / "ed.sig")
    doc = json.loads(sig.read_text())
    doc["dsseEnvelope"]["signatures"] *= 2
    sig.write_text(json.dumps(doc))
    refused("verify.oms.signature", signed["ck"], sig, pub)


def test_an_rsa_key_is_refused_with_a_code(tmp_path: Path) -> None:
    pub = tmp_path / "rsa.pub"
    pub.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(VerificationError) as e:
        OfferedKey.from_file(pub)
    assert e.value.code == "verify.oms.key_unsupported"


def test_a_key_on_an_unsupported_curve_is_refused_with_a_code(tmp_path: Path) -> None:
    """``cryptography`` raises ``UnsupportedAlgorithm`` (not ``ValueError``) for a curve it knows only by OID."""
    pub = tmp_path / "c112.pub"
    pub.write_bytes(UNSUPPORTED_CURVE_PUBLIC_PEM)
    with pytest.raises(VerificationError) as e:
        OfferedKey.from_file(pub)
    assert e.value.code == "verify.oms.key_unsupported"


def test_an_unreadable_key_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        OfferedKey.from_file(tmp_path / "absent.pem")
    assert e.value.code == "usage.key_unreadable"


@pytest.mark.parametrize("hint", [None, ""])
def test_a_bundle_without_a_key_hint_prints_nothing_on_stdout(
    signed: dict[str, Path], hint: str | None, capfd: pytest.CaptureFixture[str]
) -> None:
    # model_signing's key verifier printed a warning on stdout for a bundle without a public-key hint: a field
    # the bundle's author sets, which broke the --json document of verify and intake
    doc = json.loads(signed["sig"].read_text())
    if hint is None:
        del doc["verificationMaterial"]["publicKey"]["hint"]
    else:
        doc["verificationMaterial"]["publicKey"]["hint"] = hint
    bare = signed["dir"] / "bare.sig"
    bare.write_text(json.dumps(doc))
    capfd.readouterr()
    v = verify(signed["ck"], bare, signed["pub"])  # the signature still verifies under the offered key
    assert v.to_facts()["verification"]["binding"] == "manifest"
    assert capfd.readouterr().out == ""
