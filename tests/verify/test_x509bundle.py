"""Training provenance in a Sigstore bundle v0.3 signed under an X.509 certificate, no log entry
(``ckptgate.verify.x509bundle``): a throwaway CA, intermediate and signing certificate made here with
``cryptography``; verified with ``verify_attestation`` against ``--certificate-chain`` anchors that the trust
data names, at the time of the verification; every malformed or unsupported bundle refused with its code."""

from __future__ import annotations

import base64
import copy
import json
import shutil
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sigstore_models.bundle.v1 import Bundle

from ckptgate.errors import VerificationError
from ckptgate.producer.attest import AttestRequest, attest_checkpoint
from ckptgate.producer.certificate import sign_with_certificate
from ckptgate.verify import KeySigner, TrustData, verify_attestation
from ckptgate.verify.x509chain import CertificateChain
from tests.verify.oms_helpers import HF, ca, leaf, root_sha256

NOW = datetime.now(UTC).replace(microsecond=0)
START, END = NOW - timedelta(days=1), NOW + timedelta(days=20)
BUILDER = "https://ci.example/trainer"
SAN = x509.UniformResourceIdentifier(BUILDER)
SLSA = "https://slsa.dev/provenance/v1"


def _intermediate(d: Path, issuer: tuple[Any, x509.Certificate]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "intermediate")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer[1].subject).public_key(k.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(START).not_valid_after(END)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(issuer[0], hashes.SHA256()))
    path = d / "intermediate.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return k, cert, path


def _trust(root: x509.Certificate, *, identity: str = BUILDER) -> TrustData:
    return TrustData.from_json(json.dumps({"signers": [{
        "id": "ca-trainer", "kind": "certificate", "identity": identity, "root_sha256": root_sha256(root),
        "predicate_types": [SLSA], "producers": ["*"], "scopes": ["training_provenance"],
        "builder_ids": [BUILDER]}]}).encode())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("x509")
    ck = d / "ck"
    shutil.copytree(HF, ck)
    done = attest_checkpoint(AttestRequest(src=ck, dry_run=True, builder_id=BUILDER, environment=False))
    root_key, root, root_pem = ca(d, "root", start=START - timedelta(days=1), end=END + timedelta(days=1))
    priv, crt = leaf(d, "signer", (root_key, root), start=START, end=END, sans=[SAN])
    signer = KeySigner.from_pem(priv)
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    return {"dir": d, "statement": done.statement, "digest": done.digest, "root": root, "root_key": root_key,
            "root_pem": root_pem, "signer": signer, "cert": cert,
            "bundle": sign_with_certificate(done.statement, signer, cert)}


def verify(pki: dict[str, Any], bundle: bytes, chain: list[Path] | None, *, trust: TrustData | None = None,
           now: datetime = NOW) -> dict[str, Any]:
    return verify_attestation(
        bundle, source="ck.sigstore.json", trust=trust or _trust(pki["root"]), measured_digest=pki["digest"].digest,
        now=now, manifest=pki["digest"].file_hashes(),
        certificate_chain=CertificateChain.from_files(chain) if chain else None).to_facts()


def refused(code: str, *args: Any, **kw: Any) -> VerificationError:
    with pytest.raises(VerificationError) as e:
        verify(*args, **kw)
    assert e.value.code == code, e.value.message
    return e.value


def test_a_certificate_bundle_verifies_and_names_its_sans_root_and_times(pki: dict[str, Any]) -> None:
    facts = verify(pki, pki["bundle"], [pki["root_pem"]])
    (signer,) = facts["signers"]
    assert signer["kind"] == "certificate" and signer["signer_id"] == "ca-trainer"
    assert signer["identities"] == [BUILDER] and signer["identity"] == BUILDER
    assert signer["root_sha256"] == root_sha256(pki["root"]) and signer["subject"] == "CN=signer"
    v = facts["verification"]
    assert v["method"] == "x509" and v["binding"] == "manifest"
    assert {"certificate_chain", "certificate_validity", "signature", "subjects_bound_to_files"} <= set(v["checks"])
    assert v["timing"]["certificate_checked_at"] == NOW.isoformat().replace("+00:00", "Z")
    assert facts["training"]["builder_id"] == BUILDER


def test_the_bundle_is_a_v03_bundle_sigstores_own_models_read(pki: dict[str, Any]) -> None:
    doc = json.loads(pki["bundle"])
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert set(doc["verificationMaterial"]) == {"certificate", "tlogEntries"}
    assert doc["verificationMaterial"]["tlogEntries"] == []
    parsed = Bundle.from_json(pki["bundle"])
    assert x509.load_der_x509_certificate(parsed.verification_material.certificate.raw_bytes) == pki["cert"]
    assert len(parsed.dsse_envelope.signatures) == 1


def test_a_chain_through_an_intermediate_leads_to_the_named_root(pki: dict[str, Any]) -> None:
    d = pki["dir"]
    ik, icert, ipem = _intermediate(d, (pki["root_key"], pki["root"]))
    priv, crt = leaf(d, "via-intermediate", (ik, icert), start=START, end=END, sans=[SAN])
    bundle = sign_with_certificate(pki["statement"], KeySigner.from_pem(priv), x509.load_pem_x509_certificate(crt.read_bytes()))
    (signer,) = verify(pki, bundle, [pki["root_pem"], ipem])["signers"]
    assert signer["root_sha256"] == root_sha256(pki["root"])
    refused("verify.x509.certificate_chain", pki, bundle, [pki["root_pem"]])  # the intermediate is the verifier's


def test_a_certificate_of_another_ca_is_refused(pki: dict[str, Any]) -> None:
    other_key, other, _ = ca(pki["dir"], "other-root", start=START, end=END)
    priv, crt = leaf(pki["dir"], "other-signer", (other_key, other), start=START, end=END, sans=[SAN])
    bundle = sign_with_certificate(pki["statement"], KeySigner.from_pem(priv), x509.load_pem_x509_certificate(crt.read_bytes()))
    refused("verify.x509.certificate_chain", pki, bundle, [pki["root_pem"]])


def test_a_root_the_trust_data_does_not_name_is_no_anchor(pki: dict[str, Any]) -> None:
    _, other, _ = ca(pki["dir"], "unnamed", start=START, end=END)
    e = refused("verify.x509.untrusted_root", pki, pki["bundle"], [pki["root_pem"]], trust=_trust(other))
    assert e.evidence["offered"] == [root_sha256(pki["root"])]


def test_an_expired_or_not_yet_valid_signing_certificate_is_refused_at_verification_time(pki: dict[str, Any]) -> None:
    e = refused("verify.x509.certificate_expired", pki, pki["bundle"], [pki["root_pem"]], now=END + timedelta(hours=1))
    assert e.evidence["subject"] == "CN=signer" and e.evidence["not_after"]
    refused("verify.x509.certificate_not_yet_valid", pki, pki["bundle"], [pki["root_pem"]],
            now=START - timedelta(hours=1))


def test_a_certificate_of_another_key_than_the_signature_is_refused(pki: dict[str, Any]) -> None:
    priv, crt = leaf(pki["dir"], "impostor", (pki["root_key"], pki["root"]), start=START, end=END, sans=[SAN])
    doc = json.loads(pki["bundle"])
    doc["verificationMaterial"]["certificate"]["rawBytes"] = base64.b64encode(
        x509.load_pem_x509_certificate(crt.read_bytes()).public_bytes(serialization.Encoding.DER)).decode()
    refused("verify.x509.signature", pki, json.dumps(doc).encode(), [pki["root_pem"]])


def test_a_signing_certificate_without_a_san_is_refused(pki: dict[str, Any]) -> None:
    priv, crt = leaf(pki["dir"], "nosan", (pki["root_key"], pki["root"]), start=START, end=END)
    bundle = sign_with_certificate(pki["statement"], KeySigner.from_pem(priv), x509.load_pem_x509_certificate(crt.read_bytes()))
    refused("verify.x509.certificate_identity", pki, bundle, [pki["root_pem"]])


def test_without_a_certificate_chain_nothing_anchors_the_certificate(pki: dict[str, Any]) -> None:
    e = refused("verify.x509.no_certificate_chain", pki, pki["bundle"], None)
    assert "--certificate-chain" in e.diagnostics()


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    def run(raw: bytes) -> bytes:
        doc = copy.deepcopy(json.loads(raw))
        change(doc)
        return json.dumps(doc).encode()
    return run


def _chain_form(doc: dict[str, Any]) -> None:
    vm = doc["verificationMaterial"]
    vm["x509CertificateChain"] = {"certificates": [vm.pop("certificate")]}


def _payload(doc: dict[str, Any]) -> None:
    stmt = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    stmt["predicate"]["runDetails"]["builder"]["id"] = "https://ci.example/other"
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()


MALFORMED = {
    "media_type": _edit(lambda d: d.update(mediaType="application/vnd.dev.sigstore.bundle+json;version=0.2")),
    "certificate_form": _edit(_chain_form),
    "timestamp_unsupported": _edit(lambda d: d["verificationMaterial"].update(
        timestampVerificationData={"rfc3161Timestamps": [{"signedTimestamp": "AAAA"}]})),
    "bundle": _edit(lambda d: d["verificationMaterial"]["certificate"].update(rawBytes="bm90IGEgY2VydA==")),
    "signatures": _edit(lambda d: d["dsseEnvelope"]["signatures"].append(dict(d["dsseEnvelope"]["signatures"][0]))),
    "signature": _edit(_payload),
}


@pytest.mark.parametrize("code", sorted(MALFORMED))
def test_a_malformed_or_unsupported_bundle_is_refused_with_its_code(pki: dict[str, Any], code: str) -> None:
    refused(f"verify.x509.{code}", pki, MALFORMED[code](pki["bundle"]), [pki["root_pem"]])


def test_a_bundle_with_a_log_entry_goes_the_sigstore_way(pki: dict[str, Any]) -> None:
    logged = _edit(lambda d: d["verificationMaterial"].update(tlogEntries=[{"logIndex": "1"}]))(pki["bundle"])
    refused("verify.sigstore.no_trust_root", pki, logged, [pki["root_pem"]])


# Adversarial certificate shapes: a CA certificate as the signing certificate, key usages that forbid
# signing, an expired intermediate, an issuer that is not a CA, a SAN the trust data does not name.
_KU = {"content_commitment": False, "key_encipherment": False, "data_encipherment": False,
       "key_agreement": False, "crl_sign": False, "encipher_only": False, "decipher_only": False}


def _cert(issuer: tuple[Any, x509.Certificate], *, ca: bool | None, digital_signature: bool | None,
          cert_sign: bool = False, eku: list[x509.ObjectIdentifier] | None = None, name: str = "signer",
          start: Any = START, end: Any = END) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate for the adversarial shapes below (None: the extension is absent)."""
    k = ec.generate_private_key(ec.SECP256R1())
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)]))
         .issuer_name(issuer[1].subject).public_key(k.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(end)
         .add_extension(x509.SubjectAlternativeName([SAN]), critical=False))
    if ca is not None:
        b = b.add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    if digital_signature is not None:
        b = b.add_extension(x509.KeyUsage(digital_signature=digital_signature, key_cert_sign=cert_sign, **_KU),
                            critical=True)
    if eku is not None:
        b = b.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    return k, b.sign(issuer[0], hashes.SHA256())


def _bundle(pki: dict[str, Any], key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> bytes:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path = pki["dir"] / f"k{id(cert)}.pem"
    path.write_bytes(pem)
    return sign_with_certificate(pki["statement"], KeySigner.from_pem(path), cert)


def _pem(d: Path, cert: x509.Certificate, name: str) -> Path:
    p = d / f"{name}.pem"
    p.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return p


def test_a_ca_certificate_as_the_signing_certificate_is_refused(pki: dict[str, Any]) -> None:
    k, c = _cert((pki["root_key"], pki["root"]), ca=True, digital_signature=True, cert_sign=True)
    refused("verify.x509.certificate_chain", pki, _bundle(pki, k, c), [pki["root_pem"]])


def test_a_key_usage_without_digital_signature_is_refused_even_with_code_signing(pki: dict[str, Any]) -> None:
    """RFC 5280 4.2.1.12: with both extensions the key serves only purposes consistent with both; a key usage
    that states no digitalSignature forbids signing whatever the extended key usage says."""
    k, c = _cert((pki["root_key"], pki["root"]), ca=False, digital_signature=False,
                 eku=[x509.oid.ExtendedKeyUsageOID.CODE_SIGNING])
    refused("verify.x509.certificate_usage", pki, _bundle(pki, k, c), [pki["root_pem"]])


def test_neither_key_usage_nor_extended_key_usage_is_refused(pki: dict[str, Any]) -> None:
    k, c = _cert((pki["root_key"], pki["root"]), ca=False, digital_signature=None)
    refused("verify.x509.certificate_usage", pki, _bundle(pki, k, c), [pki["root_pem"]])


def test_an_expired_intermediate_is_refused(pki: dict[str, Any]) -> None:
    ik, ic = _cert((pki["root_key"], pki["root"]), ca=True, digital_signature=None, name="inter",
                   start=START - timedelta(days=5), end=START + timedelta(hours=1))
    k, c = _cert((ik, ic), ca=False, digital_signature=True)
    e = refused("verify.x509.certificate_expired", pki, _bundle(pki, k, c),
                [pki["root_pem"], _pem(pki["dir"], ic, "inter-expired")], now=START + timedelta(days=2))
    assert "inter" in e.message


def test_an_issuer_that_is_not_a_ca_is_refused(pki: dict[str, Any]) -> None:
    ik, ic = _cert((pki["root_key"], pki["root"]), ca=False, digital_signature=True, cert_sign=True, name="notca")
    k, c = _cert((ik, ic), ca=False, digital_signature=True)
    refused("verify.x509.certificate_chain", pki, _bundle(pki, k, c),
            [pki["root_pem"], _pem(pki["dir"], ic, "notca")])


def test_a_san_the_trust_data_does_not_name_has_no_signer_id(pki: dict[str, Any]) -> None:
    facts = verify(pki, pki["bundle"], [pki["root_pem"]], trust=_trust(pki["root"], identity="https://other/"))
    assert facts["signers"][0]["signer_id"] is None


def test_an_extended_key_usage_without_code_signing_is_refused(pki: dict[str, Any]) -> None:
    k, c = _cert((pki["root_key"], pki["root"]), ca=False, digital_signature=True,
                 eku=[x509.oid.ExtendedKeyUsageOID.SERVER_AUTH])
    refused("verify.x509.certificate_usage", pki, _bundle(pki, k, c), [pki["root_pem"]])


def test_digital_signature_with_code_signing_verifies(pki: dict[str, Any]) -> None:
    k, c = _cert((pki["root_key"], pki["root"]), ca=False, digital_signature=True,
                 eku=[x509.oid.ExtendedKeyUsageOID.CODE_SIGNING])
    assert verify(pki, _bundle(pki, k, c), [pki["root_pem"]])["signers"][0]["signer_id"] == "ca-trainer"
