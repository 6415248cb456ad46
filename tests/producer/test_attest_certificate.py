"""``attest checkpoint --key K --certificate CERT``: the training provenance signed under an X.509 certificate
(a throwaway CA and signing certificate made here with ``cryptography``), written as a Sigstore bundle v0.3
with the certificate and no log entry, and taken in by ``ckptgate intake --certificate-chain``; the trust
data's ``certificate`` signer decides for which builder ids; each refusal typed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from ckptgate.errors import UsageError
from ckptgate.producer.attest import AttestRequest, attest_checkpoint
from tests.pipeline_helpers import ckptgate_json
from tests.verify.oms_helpers import ca, leaf, root_sha256

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
BUILDER = "https://ci.example/trainer"
NOW = datetime.now(UTC)


def _doc(text: str) -> dict:
    return json.loads("\n".join(line for line in text.splitlines() if not line.startswith("ckptgate:")) or "{}")


def _codes(doc: dict) -> set[str]:
    err = doc.get("error", doc)
    return {r["code"] for r in err.get("reasons") or []} | {err.get("code")}


@pytest.fixture
def pki(tmp_path: Path) -> dict:
    root_key, root, root_pem = ca(tmp_path, "root", start=NOW - timedelta(days=2), end=NOW + timedelta(days=30))
    priv, crt = leaf(tmp_path, "signer", (root_key, root), start=NOW - timedelta(days=1),
                     end=NOW + timedelta(days=20), sans=[x509.UniformResourceIdentifier(BUILDER)])
    ck = tmp_path / "hf_sharded"
    shutil.copytree(DATA / "hf_sharded" / "checkpoint", ck)
    return {"dir": tmp_path, "ck": ck, "root": root, "root_key": root_key, "root_pem": root_pem, "key": priv,
            "cert": crt}


def _attest(pki: dict, *extra: object) -> tuple[int, dict]:
    res = ckptgate_json("attest", "checkpoint", pki["ck"], "--builder-id", BUILDER, "--no-environment", *extra)
    return res.returncode, _doc(res.stdout if res.stdout.strip() else res.stderr)


def test_a_certificate_signed_training_provenance_is_taken_in_for_the_trusted_san_and_builder(pki: dict) -> None:
    rc, done = _attest(pki, "--key", pki["key"], "--certificate", pki["cert"], "--certificate-chain", pki["root_pem"])
    assert rc == 0, done
    bundle = pki["dir"] / "hf_sharded.sigstore.json"
    assert done["envelope"] == str(bundle)
    vm = json.loads(bundle.read_text())["verificationMaterial"]
    assert set(vm) == {"certificate", "tlogEntries"} and vm["tlogEntries"] == []  # the leaf alone, no log
    trust = pki["dir"] / "trust.json"

    def intake(builders: list[str], out: str) -> tuple[int, dict]:
        trust.write_text(json.dumps({"signers": [{
            "id": "ca-trainer", "kind": "certificate", "identity": BUILDER, "root_sha256": root_sha256(pki["root"]),
            "predicate_types": ["https://slsa.dev/provenance/v1"], "producers": ["*"],
            "scopes": ["training_provenance"], "builder_ids": builders}]}))
        r = ckptgate_json("intake", pki["ck"], "--out", pki["dir"] / out, "--attestation", bundle,
                          "--certificate-chain", pki["root_pem"], "--trust", trust)
        return r.returncode, _doc(r.stdout if r.stdout.strip() else r.stderr)

    rc, doc = intake([BUILDER], "published")
    assert rc == 0, doc
    assert (pki["dir"] / "published" / "ckptgate-receipt.json").is_file()
    rc, err = intake(["https://ci.example/another-builder"], "refused")  # the SAN is trusted, not for this builder
    assert rc == 5 and not (pki["dir"] / "refused").exists(), err
    assert "attestation_untrusted_signer" in _codes(err), _codes(err)


def test_intake_refuses_a_certificate_of_another_ca(pki: dict) -> None:
    other_key, other, _ = ca(pki["dir"], "other-root", start=NOW - timedelta(days=2), end=NOW + timedelta(days=30))
    priv, crt = leaf(pki["dir"], "stranger", (other_key, other), start=NOW - timedelta(days=1),
                     end=NOW + timedelta(days=20), sans=[x509.UniformResourceIdentifier(BUILDER)])
    rc, done = _attest(pki, "--key", priv, "--certificate", crt)
    assert rc == 0, done
    trust = pki["dir"] / "trust.json"
    trust.write_text(json.dumps({"signers": [{
        "id": "ca-trainer", "kind": "certificate", "identity": BUILDER, "root_sha256": root_sha256(pki["root"]),
        "predicate_types": ["https://slsa.dev/provenance/v1"], "producers": ["*"], "scopes": ["*"],
        "builder_ids": ["*"]}]}))
    r = ckptgate_json("intake", pki["ck"], "--out", pki["dir"] / "out", "--attestation", done["envelope"],
                      "--certificate-chain", pki["root_pem"], "--trust", trust)
    err = _doc(r.stdout if r.stdout.strip() else r.stderr)
    assert r.returncode == 5 and not (pki["dir"] / "out").exists(), err
    (rejected,) = [x for x in err["error"]["reasons"] if x["code"] == "attestation_rejected"]
    assert rejected["evidence"]["error_code"] == "verify.x509.certificate_chain"


def _expired(pki: dict) -> dict:
    priv, crt = leaf(pki["dir"], "old", (pki["root_key"], pki["root"]), start=NOW - timedelta(days=10),
                     end=NOW - timedelta(days=1), sans=[x509.UniformResourceIdentifier(BUILDER)])
    return {"key": priv, "certificate": crt}


def _other_key(pki: dict) -> dict:
    priv, _ = leaf(pki["dir"], "other", (pki["root_key"], pki["root"]), start=NOW - timedelta(days=1),
                   end=NOW + timedelta(days=20), sans=[x509.UniformResourceIdentifier(BUILDER)])
    return {"key": priv, "certificate": pki["cert"]}


def _wrong_chain(pki: dict) -> dict:
    _, _, other_pem = ca(pki["dir"], "unrelated", start=NOW - timedelta(days=2), end=NOW + timedelta(days=30))
    return {"key": pki["key"], "certificate": pki["cert"], "certificate_chain": (other_pem,)}


def _no_san(pki: dict) -> dict:
    priv, crt = leaf(pki["dir"], "nosan", (pki["root_key"], pki["root"]), start=NOW - timedelta(days=1),
                     end=NOW + timedelta(days=20))
    return {"key": priv, "certificate": crt}


REFUSALS = {
    "usage.certificate_expired": (_expired, "--certificate"),
    "usage.certificate_key_mismatch": (_other_key, "--certificate"),
    "usage.certificate_chain": (_wrong_chain, "--certificate-chain"),
    "usage.certificate_identity": (_no_san, "--certificate"),
    "usage.attest.signing_method": (lambda p: {"identity_token": "t", "certificate": p["cert"]}, "--identity-token"),
}


@pytest.mark.parametrize("code", sorted(REFUSALS))
def test_a_certificate_that_cannot_sign_is_a_usage_error_before_anything_is_written(pki: dict, code: str) -> None:
    make, option = REFUSALS[code]
    with pytest.raises(UsageError) as e:
        attest_checkpoint(AttestRequest(src=pki["ck"], builder_id=BUILDER, environment=False, **make(pki)))
    assert e.value.code == code and e.value.exit_code == 2, e.value.message
    assert option in e.value.diagnostics(), e.value.diagnostics()
    assert not (pki["dir"] / "hf_sharded.sigstore.json").exists()


def test_a_certificate_for_a_key_cryptography_does_not_support_is_a_key_mismatch(pki: dict) -> None:
    """Its ``public_key()`` raises ``UnsupportedAlgorithm``: before, an internal error (exit 1)."""
    from tests.verify.verify_helpers import UNSUPPORTED_CURVE_CERTIFICATE_PEM

    cert = pki["dir"] / "secp160r1.crt"
    cert.write_bytes(UNSUPPORTED_CURVE_CERTIFICATE_PEM)
    with pytest.raises(UsageError) as e:
        attest_checkpoint(AttestRequest(src=pki["ck"], builder_id=BUILDER, environment=False, key=pki["key"],
                                        certificate=cert))
    assert e.value.code == "usage.certificate_key_mismatch" and e.value.exit_code == 2, e.value.message
    assert not (pki["dir"] / "hf_sharded.sigstore.json").exists()


def test_a_chain_without_a_root_is_a_usage_error(pki: dict) -> None:
    with pytest.raises(UsageError) as e:  # the signing certificate itself is no trust anchor
        attest_checkpoint(AttestRequest(src=pki["ck"], builder_id=BUILDER, environment=False, key=pki["key"],
                                        certificate=pki["cert"], certificate_chain=(pki["cert"],)))
    assert e.value.code == "usage.certificate_chain" and "no trust anchor" in e.value.message, e.value.message


def test_the_command_exits_2_on_such_a_certificate(pki: dict) -> None:
    rc, err = _attest(pki, *[x for k, v in _expired(pki).items() for x in (f"--{k}", v)])
    assert rc == 2 and err["error"]["code"] == "usage.certificate_expired", err


def _docs_block(title: str) -> str:
    """The console block under ``title`` in docs/attestations.md's "Three ways to sign", as one bash script."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "attestations.md").read_text(encoding="utf-8")
    section = text.split("### Three ways to sign the training provenance", 1)[1].split(title, 1)[1]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None
    return "set -e\n" + "\n".join(line[2:] if line.startswith("$ ") else line for line in block.group(1).splitlines())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_the_docs_certificate_example_runs_as_written(tmp_path: Path) -> None:
    script = _docs_block("A key with an X.509 certificate")
    shutil.copytree(DATA / "hf_sharded" / "checkpoint", tmp_path / "checkpoint")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert "allowed plane=pure_data" in res.stdout
    assert (tmp_path / "published" / "ckptgate-receipt.json").is_file()


def test_attest_verify_checks_a_certificate_bundle_against_the_chain_it_is_given(pki: dict) -> None:
    rc, done = _attest(pki, "--key", pki["key"], "--certificate", pki["cert"], "--certificate-chain", pki["root_pem"])
    assert rc == 0, done
    bundle = pki["dir"] / "hf_sharded.sigstore.json"
    trust = pki["dir"] / "trust.json"
    trust.write_text(json.dumps({"signers": [{
        "id": "ca-trainer", "kind": "certificate", "identity": BUILDER, "root_sha256": root_sha256(pki["root"]),
        "predicate_types": ["https://slsa.dev/provenance/v1"], "producers": ["*"],
        "scopes": ["training_provenance"], "builder_ids": [BUILDER]}]}))
    base = ("attest", "verify", bundle, "--checkpoint", pki["ck"], "--trust", trust)
    ok = ckptgate_json(*base, "--certificate-chain", pki["root_pem"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    facts = _doc(ok.stdout)["attestation"]
    assert facts["verification"]["method"] == "x509"
    assert [s["kind"] for s in facts["signers"]] == ["certificate"] and facts["signers"][0]["identity"] == BUILDER
    (pki["dir"] / "other").mkdir()
    _, _, other_pem = ca(pki["dir"] / "other", "root", start=NOW - timedelta(days=2), end=NOW + timedelta(days=30))
    for extra, code in (((), "verify.x509.no_certificate_chain"),
                        (("--certificate-chain", other_pem), "verify.x509.untrusted_root")):
        bad = ckptgate_json(*base, *extra)
        assert bad.returncode == 5, bad.stdout + bad.stderr
        assert code in _codes(_doc(bad.stdout if bad.stdout.strip() else bad.stderr))


def test_attest_verify_says_when_no_trust_data_signer_names_the_certificate(pki: dict) -> None:
    """A certificate under a trusted root whose SAN no trust-data entry names verifies (policy refuses it at
    intake), and `attest verify` says that no signer of the trust data names it rather than a bare VERIFIED."""
    rc, done = _attest(pki, "--key", pki["key"], "--certificate", pki["cert"], "--certificate-chain", pki["root_pem"])
    assert rc == 0, done
    bundle = pki["dir"] / "hf_sharded.sigstore.json"
    for identity, shown in ((BUILDER, "trust-data signer ca-trainer"),
                            ("https://ci.example/someone-else", "no trust-data signer names it")):
        trust = pki["dir"] / "trust-named.json"
        trust.write_text(json.dumps({"signers": [{
            "id": "ca-trainer", "kind": "certificate", "identity": identity, "root_sha256": root_sha256(pki["root"]),
            "predicate_types": ["https://slsa.dev/provenance/v1"], "producers": ["*"],
            "scopes": ["training_provenance"], "builder_ids": [BUILDER]}]}))
        args = ("attest", "verify", bundle, "--checkpoint", pki["ck"], "--trust", trust,
                "--certificate-chain", pki["root_pem"])
        res = subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                             timeout=300, env={**os.environ, "COLUMNS": "300"})
        assert res.returncode == 0, res.stdout + res.stderr
        assert shown in " ".join(res.stdout.split()), res.stdout


def test_attest_verify_refuses_a_checkpoint_that_intake_would_refuse_for_its_walk(pki: dict) -> None:
    rc, done = _attest(pki, "--key", pki["key"], "--certificate", pki["cert"], "--certificate-chain", pki["root_pem"])
    assert rc == 0, done
    (pki["ck"] / "extra.bin").symlink_to(pki["ck"] / "model.safetensors.index.json")  # not a regular file: intake refuses
    res = ckptgate_json("attest", "verify", pki["dir"] / "hf_sharded.sigstore.json", "--checkpoint", pki["ck"],
                        "--certificate-chain", pki["root_pem"])
    err = _doc(res.stdout if res.stdout.strip() else res.stderr)
    assert res.returncode == 4, err
    assert err["error"]["code"] == "input.walk.not_clean" and "extra.bin" in err["error"]["message"], err
