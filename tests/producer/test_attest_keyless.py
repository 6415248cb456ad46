"""``attest checkpoint --identity-token``: Sigstore keyless signing of the training provenance, through
sigstore-python's own ``SigningContext``, against the project's test instance (``tools/sigstore-testca
-serve``: a local Fulcio that checks the token against its own OIDC key and issues a certificate with an
SCT, and a Rekor that logs the DSSE entry); then intake accepts the bundle when the trust data names that
identity, issuer and builder id, and refuses it, typed, otherwise.  Also ``--format oms --certificate``
(model_signing's certificate method) taken in with ``--certificate-chain``; the training provenance under a
certificate is ``test_attest_certificate.py``'s."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from tests.pipeline_helpers import ckptgate_json
from tests.verify.oms_helpers import ca, leaf, root_sha256

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "fixtures" / "data"
TOOL_DIR = ROOT / "tools" / "sigstore-testca"
IDENTITY = "https://github.com/example/trainer/.github/workflows/train.yml@refs/heads/main"
ISSUER = "https://token.actions.githubusercontent.com"
BUILDER = "https://ci.example/trainer"
SLSA = "https://slsa.dev/provenance/v1"

needs_go = pytest.mark.skipif(shutil.which("go") is None, reason="Go toolchain not installed")


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The test Sigstore instance, served on a free local port for this module."""
    d = tmp_path_factory.mktemp("testca")
    exe = d / "sigstore-testca"
    subprocess.run(["go", "build", "-trimpath", "-o", str(exe), "."], cwd=TOOL_DIR, check=True,
                   capture_output=True, timeout=600)
    files = {"root": d / "trusted_root.json", "config": d / "trust_config.json", "token": d / "token.txt"}
    proc = subprocess.Popen([str(exe), "-serve", "127.0.0.1:0", "-identity", IDENTITY, "-issuer", ISSUER,
                             "-trusted-root", str(files["root"]), "-trust-config", str(files["config"]),
                             "-token", str(files["token"])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready http://127.0.0.1:"), line + (proc.stderr.read() if proc.stderr else "")
        yield files
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the server stops when its stdin closes
        proc.wait(timeout=30)


def _trust(path: Path, identity: str = IDENTITY, issuer: str = ISSUER, builders: list[str] | None = None) -> Path:
    path.write_text(json.dumps({"signers": [{
        "id": "ci-trainer", "kind": "sigstore", "identity": identity, "issuer": issuer, "predicate_types": [SLSA],
        "producers": ["*"], "scopes": ["training_provenance"], "builder_ids": builders or [BUILDER]}]}))
    return path


def _doc(text: str) -> dict:
    return json.loads("\n".join(line for line in text.splitlines() if not line.startswith("ckptgate:")) or "{}")


def _codes(doc: dict) -> set[str]:
    err = doc.get("error", doc)
    return {r["code"] for r in err.get("reasons") or []} | {err.get("code")}


def _copy(tmp_path: Path, name: str = "hf_sharded") -> Path:
    ck = tmp_path / name
    shutil.copytree(DATA / name / "checkpoint", ck)
    return ck


def _keyless(ck: Path, instance: dict[str, Path], *extra: object) -> subprocess.CompletedProcess[str]:
    return ckptgate_json("attest", "checkpoint", ck, "--identity-token", f"@{instance['token']}",
                         "--sigstore-trust-config", instance["config"], "--builder-id", BUILDER, *extra)


def _intake(ck: Path, bundle: Path, trust: Path, root: Path, out: Path) -> tuple[int, dict]:
    res = ckptgate_json("intake", ck, "--out", out, "--attestation", bundle, "--trust", trust,
                        "--sigstore-trust-root", root)
    return res.returncode, _doc(res.stdout if res.stdout.strip() else res.stderr)


@pytest.fixture(scope="module")
def signed(instance: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One keyless-signed DeepSpeed checkpoint (the framework plane: the producer gate applies too)."""
    d = tmp_path_factory.mktemp("signed")
    ck = _copy(d, "deepspeed_zero2")
    res = _keyless(ck, instance)
    assert res.returncode == 0, res.stdout + res.stderr
    bundle = d / "deepspeed_zero2.sigstore.json"
    assert _doc(res.stdout)["envelope"] == str(bundle)
    return {"ck": ck, "bundle": bundle, "dir": d}


@needs_go
def test_a_keyless_bundle_is_a_sigstore_bundle_of_the_training_provenance(signed: dict[str, Path]) -> None:
    doc = json.loads(signed["bundle"].read_text())
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    vm = doc["verificationMaterial"]
    assert vm["certificate"]["rawBytes"] and len(vm["tlogEntries"]) == 1
    assert vm["tlogEntries"][0]["kindVersion"] == {"kind": "dsse", "version": "0.0.1"}
    shown = ckptgate_json("attest", "show", signed["bundle"])
    assert shown.returncode == 0, shown.stderr
    statement = _doc(shown.stdout)["statement"]
    assert statement["predicateType"] == SLSA
    assert statement["predicate"]["runDetails"]["builder"]["id"] == BUILDER


@needs_go
def test_intake_takes_in_a_keyless_signed_training_provenance_of_a_trusted_identity(
    instance: dict[str, Path], signed: dict[str, Path], tmp_path: Path
) -> None:
    rc, doc = _intake(signed["ck"], signed["bundle"], _trust(tmp_path / "trust.json"), instance["root"],
                      tmp_path / "out")
    assert rc == 0, doc
    (att,) = doc["receipt"]["attestations"] if "attestations" in doc["receipt"] else doc["decision"]["attestations"]
    assert json.dumps(att).count(IDENTITY) >= 1


@needs_go
@pytest.mark.parametrize("identity, issuer", [
    ("https://github.com/evil/trainer/.github/workflows/train.yml@refs/heads/main", ISSUER),
    (IDENTITY, "https://accounts.example.com"),
])
def test_intake_refuses_a_keyless_bundle_of_another_identity_or_issuer(
    instance: dict[str, Path], signed: dict[str, Path], tmp_path: Path, identity: str, issuer: str
) -> None:
    rc, err = _intake(signed["ck"], signed["bundle"], _trust(tmp_path / "trust.json", identity, issuer),
                      instance["root"], tmp_path / "out")
    assert rc == 5, err
    assert "attestation_rejected" in _codes(err)
    assert "verify.sigstore.identity_mismatch" in json.dumps(err)
    assert not (tmp_path / "out").exists()


@needs_go
def test_intake_refuses_a_keyless_bundle_whose_builder_the_identity_is_not_trusted_for(
    instance: dict[str, Path], signed: dict[str, Path], tmp_path: Path
) -> None:
    trust = _trust(tmp_path / "trust.json", builders=["https://ci.example/other"])
    rc, err = _intake(signed["ck"], signed["bundle"], trust, instance["root"], tmp_path / "out")
    assert rc == 5, err
    assert "attestation_untrusted_signer" in _codes(err)


@needs_go
def test_the_hooks_sign_keyless_and_intake_takes_the_bundle_in(instance: dict[str, Path], tmp_path: Path) -> None:
    from ckptgate.hooks import attest_saved

    ck = _copy(tmp_path)
    done = attest_saved(ck, builder_id=BUILDER, identity_token=instance["token"].read_text(),
                        sigstore_trust_config=instance["config"], main_process=True)
    assert done is not None and done.path == tmp_path / "hf_sharded.sigstore.json"
    rc, doc = _intake(ck, done.path, _trust(tmp_path / "trust.json"), instance["root"], tmp_path / "out")
    assert rc == 0, doc


@needs_go
def test_an_existing_bundle_is_refused_before_fulcio_or_rekor_is_asked(
    instance: dict[str, Path], tmp_path: Path
) -> None:
    ck = _copy(tmp_path)
    (tmp_path / "hf_sharded.sigstore.json").write_text("kept")
    config = json.loads(instance["config"].read_text())
    for service in (*config["signingConfig"]["caUrls"], *config["signingConfig"]["rekorTlogUrls"]):
        service["url"] = "http://127.0.0.1:9"  # nothing listens: a signing attempt would fail differently
    (tmp_path / "unreachable.json").write_text(json.dumps(config))
    res = ckptgate_json("attest", "checkpoint", ck, "--identity-token", f"@{instance['token']}",
                        "--sigstore-trust-config", tmp_path / "unreachable.json")
    assert res.returncode == 2, res.stdout + res.stderr
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.exists"
    assert (tmp_path / "hf_sharded.sigstore.json").read_text() == "kept"
    (tmp_path / "hf_sharded.sigstore.json").unlink()
    res = ckptgate_json("attest", "checkpoint", ck, "--identity-token", f"@{instance['token']}",
                        "--sigstore-trust-config", tmp_path / "unreachable.json")
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.sigstore_signing"  # typed, nothing written
    assert not (tmp_path / "hf_sharded.sigstore.json").exists()


@needs_go
def test_a_token_that_is_no_oidc_token_is_refused_before_anything_is_written(
    instance: dict[str, Path], tmp_path: Path
) -> None:
    ck = _copy(tmp_path)
    res = ckptgate_json("attest", "checkpoint", ck, "--identity-token", "not-a-jwt",
                        "--sigstore-trust-config", instance["config"])
    assert res.returncode == 2, res.stdout + res.stderr
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.identity_token"
    assert not (tmp_path / "hf_sharded.sigstore.json").exists()


def test_an_unreadable_trust_config_is_refused(tmp_path: Path) -> None:
    ck = _copy(tmp_path)
    claims = {"iss": "https://a.example", "sub": "a", "aud": "sigstore", "iat": 1764729000, "exp": 9999999999}
    token = "e30." + base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=") + ".c2ln"
    (tmp_path / "config.json").write_text("{}")
    res = ckptgate_json("attest", "checkpoint", ck, "--identity-token", token,
                        "--sigstore-trust-config", tmp_path / "config.json")
    assert res.returncode == 2, res.stdout + res.stderr
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.sigstore_trust_config"


@pytest.mark.parametrize("extra", [["--key", "k.pem"], ["--format", "oms"]])
def test_identity_token_with_another_signing_method_is_a_usage_error(tmp_path: Path, extra: list[str]) -> None:
    ck = _copy(tmp_path)
    res = ckptgate_json("attest", "checkpoint", ck, "--identity-token", "t", *extra)
    assert res.returncode == 2
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.attest.signing_method"


NOW = datetime.now(UTC)


@pytest.fixture
def pki(tmp_path: Path) -> dict:
    root_key, root, root_pem = ca(tmp_path, "root", start=NOW - timedelta(days=2), end=NOW + timedelta(days=30))
    priv, crt = leaf(tmp_path, "signer", (root_key, root), start=NOW - timedelta(days=1),
                     end=NOW + timedelta(days=20), sans=[x509.UniformResourceIdentifier(BUILDER)])
    return {"root": root, "root_pem": root_pem, "key": priv, "cert": crt}


def test_format_oms_with_a_certificate_is_taken_in_against_the_chain_and_the_trusted_san(
    tmp_path: Path, pki: dict
) -> None:
    ck = _copy(tmp_path)
    res = ckptgate_json("attest", "checkpoint", ck, "--format", "oms", "--key", pki["key"],
                        "--certificate", pki["cert"], "--certificate-chain", pki["root_pem"])
    assert res.returncode == 0, res.stdout + res.stderr
    sig = tmp_path / "hf_sharded.sig"
    assert "x509CertificateChain" in json.loads(sig.read_text())["verificationMaterial"]
    trust = tmp_path / "trust.json"

    def intake(san: str, out: str) -> tuple[int, dict]:
        trust.write_text(json.dumps({"signers": [{
            "id": "ca-signer", "kind": "certificate", "identity": san, "root_sha256": root_sha256(pki["root"]),
            "predicate_types": ["https://model_signing/signature/v1.0"], "producers": ["*"], "scopes": ["*"]}]}))
        r = ckptgate_json("intake", ck, "--out", tmp_path / out, "--signature", sig, "--certificate-chain",
                          pki["root_pem"], "--trust", trust)
        return r.returncode, _doc(r.stdout if r.stdout.strip() else r.stderr)

    rc, doc = intake(BUILDER, "out")
    assert rc == 0, doc
    rc, err = intake("https://ci.example/other", "out2")
    assert rc == 5 and not (tmp_path / "out2").exists(), err
    assert "attestation_untrusted_signer" in _codes(err), _codes(err)


def test_a_certificate_of_another_key_is_refused(tmp_path: Path, pki: dict) -> None:
    ck = _copy(tmp_path)
    other = ckptgate_json("attest", "keygen", "--out", tmp_path / "ec", "--algorithm", "ecdsa-p256")
    assert other.returncode == 0, other.stderr
    res = ckptgate_json("attest", "checkpoint", ck, "--format", "oms", "--key", tmp_path / "ec.pem",
                        "--certificate", pki["cert"], "--certificate-chain", pki["root_pem"])
    assert res.returncode == 2, res.stdout + res.stderr
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.certificate_key_mismatch"
    assert not (tmp_path / "hf_sharded.sig").exists()


@pytest.mark.parametrize("extra", [["--certificate-chain", "root.pem"], ["--format", "oms", "--certificate", "signer.crt"]])
def test_a_chain_without_a_certificate_or_an_oms_certificate_without_a_chain_is_a_usage_error(
    tmp_path: Path, pki: dict, extra: list
) -> None:
    ck = _copy(tmp_path)
    res = ckptgate_json("attest", "checkpoint", ck, "--key", pki["key"],
                        *[tmp_path / e if e.endswith((".pem", ".crt")) else e for e in extra])
    assert res.returncode == 2
    assert _doc(res.stdout or res.stderr)["error"]["code"] == "usage.attest.signing_method"
