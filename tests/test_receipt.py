"""``intake --receipt-key`` signs the receipt; ``receipt verify`` checks the signature, every output's
sha256 and size, and reports missing and extra files (exit 5), through the CLI as a pipe."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode
from ckptgate.publish import RECEIPT_NAME, RECEIPT_SIGNATURE_NAME
from ckptgate.verify import generate_keypair
from tests.opa_front import tcp_front
from tests.pipeline_helpers import demo_attested

REPO = Path(__file__).resolve().parent.parent
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=120, check=False)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """One signed intake (receipt key separate from the attestation key) and one unsigned."""
    tmp = tmp_path_factory.mktemp("receipt")
    src = tmp / "ckpt"
    shutil.copytree(HF, src)
    attested = demo_attested(src, tmp)
    trust, att, pub = attested.trust, attested.attestation, attested.public_pem
    rpriv, rpub = generate_keypair("ecdsa-p256")
    (tmp / "receipt.pem").write_bytes(rpriv)
    (tmp / "receipt.pub").write_bytes(rpub)
    signed = cli("intake", src, "--out", tmp / "signed", "--trust", trust, "--attestation", att,
                 "--receipt-key", tmp / "receipt.pem", "--json")
    assert signed.returncode == 0, signed.stderr
    plain = cli("intake", src, "--out", tmp / "plain", "--trust", trust, "--attestation", att, "--json")
    assert plain.returncode == 0, plain.stderr
    return {"tmp": tmp, "src": src, "signed": tmp / "signed", "plain": tmp / "plain", "pub": tmp / "receipt.pub",
            "other_pub": pub, "receipt": json.loads(signed.stdout)["receipt"]}


def _copy(published, name, tmp_path) -> Path:
    dst = tmp_path / name
    shutil.copytree(published[name], dst)
    return dst


def test_receipt_records_the_opa_version_and_the_absolute_source(published):
    r = published["receipt"]
    assert r["source_absolute"] == str(published["src"].resolve()) and Path(r["source_absolute"]).is_absolute()
    version = subprocess.run([str(REPO / ".tools" / "bin" / "opa"), "version"], capture_output=True, text=True,
                             check=True).stdout.splitlines()[0].split(":", 1)[1].strip()
    assert r["opa_version"] == version


def test_a_signed_receipt_verifies_with_its_key(published):
    assert (published["signed"] / RECEIPT_SIGNATURE_NAME).is_file()
    assert not (published["plain"] / RECEIPT_SIGNATURE_NAME).exists()
    res = cli("receipt", "verify", published["signed"], "--key", published["pub"], "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] is True and doc["signature"] == "verified"
    assert doc["files_match"] is True and doc["authenticated"] is True
    assert doc["signer"]["key"] == str(published["pub"]) and len(doc["signer"]["spki_sha256"]) == 64
    assert {f["file"] for f in doc["files"]} == {o["file"] for o in published["receipt"]["outputs"]}
    assert all(f["status"] == "ok" for f in doc["files"])
    human = cli("receipt", "verify", published["signed"], "--key", published["pub"])
    assert human.returncode == 0 and f"receipt verified: signed by {published['pub']}" in human.stdout


def test_without_a_key_matching_files_are_not_reported_as_verified(published, tmp_path):
    """Files that match the receipt beside them prove nothing about who wrote it: before, no --key
    exited 0 "receipt verified" for an unsigned receipt, and for a signed one whose signature was
    never checked, though whoever edited the files could have rewritten the receipt too."""
    for name, signature in (("plain", "absent"), ("signed", "unchecked")):
        res = cli("receipt", "verify", published[name], "--json")
        assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
        doc = json.loads(res.stdout)
        assert (doc["signature"], doc["ok"], doc["files_match"], doc["authenticated"], doc["signer"]) == (
            signature, False, True, False, None)
        assert "who" in doc["signature_detail"] and "unknown" in doc["signature_detail"]
        human = cli("receipt", "verify", published[name])
        assert human.returncode == ExitCode.VERIFICATION_FAILED
        last = human.stdout.splitlines()[-1]
        assert "NOT authenticated" in last and "who wrote it is unknown" in last and "receipt verified" not in last
    # the forgery this guards against: edit a file, rewrite the unsigned receipt to match it
    dst = _copy(published, "plain", tmp_path)
    receipt = json.loads((dst / RECEIPT_NAME).read_text())
    out = receipt["outputs"][0]
    (dst / out["file"]).write_bytes(b"forged")
    out.update(size=6, sha256=hashlib.sha256(b"forged").hexdigest())
    (dst / RECEIPT_NAME).write_text(json.dumps(receipt))
    forged = cli("receipt", "verify", dst, "--json")
    assert forged.returncode == ExitCode.VERIFICATION_FAILED and json.loads(forged.stdout)["files_match"] is True
    needs = cli("receipt", "verify", published["plain"], "--key", published["pub"], "--json")
    assert needs.returncode == ExitCode.VERIFICATION_FAILED
    assert json.loads(needs.stdout)["signature"] == "missing"


def test_the_wrong_key_or_an_edited_receipt_fails_the_signature(published, tmp_path):
    other = tmp_path / "other.pub"
    other.write_bytes(published["other_pub"])
    res = cli("receipt", "verify", published["signed"], "--key", other, "--json")
    assert res.returncode == ExitCode.VERIFICATION_FAILED and json.loads(res.stdout)["signature"] == "invalid"
    dst = _copy(published, "signed", tmp_path)
    receipt = json.loads((dst / RECEIPT_NAME).read_text())
    receipt["decision"]["allow"] = "edited"
    (dst / RECEIPT_NAME).write_text(json.dumps(receipt, indent=2, sort_keys=True) + "\n")
    edited = cli("receipt", "verify", dst, "--key", published["pub"], "--json")
    assert edited.returncode == ExitCode.VERIFICATION_FAILED
    assert json.loads(edited.stdout)["signature"] == "invalid"


def test_changed_missing_and_extra_files_are_reported_and_exit_5(published, tmp_path):
    dst = _copy(published, "plain", tmp_path)
    outputs = [o["file"] for o in published["receipt"]["outputs"]]
    changed, gone = outputs[0], outputs[1]
    data = bytearray((dst / changed).read_bytes())
    data[-1] ^= 1
    (dst / changed).write_bytes(bytes(data))
    (dst / gone).unlink()
    (dst / "stray.bin").write_bytes(b"x")
    res = cli("receipt", "verify", dst, "--json")
    assert res.returncode == ExitCode.VERIFICATION_FAILED
    status = {f["file"]: f["status"] for f in json.loads(res.stdout)["files"]}
    assert status[changed] == "sha256_mismatch" and status[gone] == "missing" and status["stray.bin"] == "extra"
    assert sum(1 for s in status.values() if s == "ok") == len(outputs) - 2
    (dst / changed).write_bytes(bytes(data) + b"more")
    sized = cli("receipt", "verify", dst)
    assert sized.returncode == ExitCode.VERIFICATION_FAILED and "size_mismatch" in sized.stdout


def test_a_directory_without_a_receipt_is_a_usage_error(tmp_path):
    res = cli("receipt", "verify", tmp_path, "--json")
    assert res.returncode == ExitCode.USAGE
    assert json.loads(res.stdout)["error"]["code"] == "usage.receipt_unreadable"


def test_a_receipt_with_a_repeated_key_is_not_a_receipt(tmp_path):
    """The receipt is parsed strictly: a repeated ``outputs`` could hide the list a reader checks."""
    from ckptgate.errors import UsageError
    from ckptgate.receipt import verify_receipt

    (tmp_path / RECEIPT_NAME).write_text('{"outputs": [{"file": "a", "size": 1, "sha256": "x"}], "outputs": []}')
    with pytest.raises(UsageError) as e:
        verify_receipt(tmp_path)
    assert e.value.code == "usage.receipt_invalid"


@pytest.mark.parametrize("outputs", [
    [{"file": 5, "size": 1, "sha256": "x"}],  # a name that is not a string
    [{"file": "a", "size": 1, "sha256": "x"}, {"file": None, "size": 1, "sha256": "x"}],  # unsortable names
    [{"file": "a", "size": True, "sha256": "x"}],
    [{"file": "a", "size": 1.5, "sha256": "x"}],
    [{"file": "a", "size": 1, "sha256": 7}],
    [{"file": "a", "size": 1, "sha256": "x"}, {"file": "a", "size": 2, "sha256": "y"}],  # a file listed twice
    ["a"],
])
def test_a_receipt_of_the_wrong_shape_is_not_a_receipt(tmp_path, outputs):
    """Every field a check reads is typed first: a wrong one is ``usage.receipt_invalid``, never an
    internal error (exit 1) from a path built from a number or names that cannot be sorted."""
    (tmp_path / RECEIPT_NAME).write_text(json.dumps({"outputs": outputs}))
    res = cli("receipt", "verify", tmp_path, "--json")
    assert res.returncode == ExitCode.USAGE, res.stdout + res.stderr
    assert json.loads(res.stdout)["error"]["code"] == "usage.receipt_invalid"


def test_a_receipt_or_key_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    os.mkfifo(dst / RECEIPT_NAME)
    res = cli("receipt", "verify", dst, "--json")
    assert res.returncode == ExitCode.USAGE and json.loads(res.stdout)["error"]["code"] == "usage.receipt_unreadable"
    (dst / RECEIPT_NAME).unlink()
    (dst / RECEIPT_NAME).write_text('{"outputs": []}')
    envelope = {"payloadType": "application/vnd.ckptgate.receipt+json", "signatures": [{"keyid": "", "sig": "AAAA"}],
                "payload": base64.b64encode(b'{"outputs": []}').decode()}
    (dst / RECEIPT_SIGNATURE_NAME).write_text(json.dumps(envelope))
    os.mkfifo(tmp_path / "key.pub")
    res = cli("receipt", "verify", dst, "--key", tmp_path / "key.pub", "--json")
    assert res.returncode == ExitCode.USAGE and json.loads(res.stdout)["error"]["code"] == "usage.receipt_unreadable"


@pytest.mark.parametrize("kind", ["rsa", "ec-p384", "x25519", "secp112r1"])
def test_a_key_of_an_unsupported_type_is_a_usage_error(tmp_path, kind):
    """An RSA, P-384 or X25519 public key is refused as ``usage.key_invalid``; before, RSA and X25519
    ended in an internal error from ``verify``, and P-384 was checked with the wrong hash."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa, x25519

    from tests.verify.verify_helpers import UNSUPPORTED_CURVE_PUBLIC_PEM

    if kind == "secp112r1":  # a curve cryptography knows only by OID: UnsupportedAlgorithm, not ValueError
        (tmp_path / "key.pub").write_bytes(UNSUPPORTED_CURVE_PUBLIC_PEM)
    else:
        private = {"rsa": lambda: rsa.generate_private_key(public_exponent=65537, key_size=1024),
                   "ec-p384": lambda: ec.generate_private_key(ec.SECP384R1()),
                   "x25519": x25519.X25519PrivateKey.generate}[kind]()
        (tmp_path / "key.pub").write_bytes(private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / RECEIPT_NAME).write_text('{"outputs": []}')
    envelope = {"payloadType": "application/vnd.ckptgate.receipt+json", "signatures": [{"keyid": "", "sig": "AAAA"}],
                "payload": base64.b64encode(b'{"outputs": []}').decode()}
    (dst / RECEIPT_SIGNATURE_NAME).write_text(json.dumps(envelope))
    res = cli("receipt", "verify", dst, "--key", tmp_path / "key.pub", "--json")
    assert "Traceback" not in res.stderr
    assert res.returncode == ExitCode.USAGE, res.stdout + res.stderr
    assert json.loads(res.stdout)["error"]["code"] == "usage.key_invalid"


def test_an_output_that_is_a_fifo_is_missing_and_never_blocks(tmp_path):
    (tmp_path / RECEIPT_NAME).write_text(json.dumps({"outputs": [{"file": "w.safetensors", "size": 1, "sha256": "x"}]}))
    os.mkfifo(tmp_path / "w.safetensors")
    res = cli("receipt", "verify", tmp_path, "--json")
    assert res.returncode == ExitCode.VERIFICATION_FAILED
    assert [f["status"] for f in json.loads(res.stdout)["files"]] == ["missing"]


def test_an_output_that_is_a_directory_is_missing_not_a_crash(tmp_path):
    """A directory where an output was ended in IsADirectoryError (exit 1 internal.unexpected)."""
    (tmp_path / RECEIPT_NAME).write_text(json.dumps({"outputs": [{"file": "w.safetensors", "size": 1, "sha256": "x"}]}))
    (tmp_path / "w.safetensors").mkdir()
    res = cli("receipt", "verify", tmp_path, "--json")
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    assert [f["status"] for f in json.loads(res.stdout)["files"]] == ["missing"]


def test_an_output_of_the_wrong_size_is_not_read(tmp_path):
    """An output grown to a sparse terabyte was hashed whole before its size was compared (a hang)."""
    (tmp_path / RECEIPT_NAME).write_text(json.dumps({"outputs": [{"file": "w.safetensors", "size": 1, "sha256": "x"}]}))
    with open(tmp_path / "w.safetensors", "wb") as f:
        f.truncate(1 << 40)
    res = cli("receipt", "verify", tmp_path, "--json")
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout + res.stderr
    [file] = json.loads(res.stdout)["files"]
    assert (file["status"], file["size"], file["sha256"]) == ("size_mismatch", 1 << 40, None)


def test_a_receipt_made_by_a_remote_engine_says_so_and_names_it(published, tmp_path):
    """A remote OPA decided, yet the receipt named no engine among its inputs and ``receipt verify``
    said nothing of it: only ``opa_version: null`` told it apart from the embedded engine's."""
    from ckptgate.decide.engine import EmbeddedOpa
    from ckptgate.decide.options import TRUST_IN_BUNDLE

    # the server and this client verify with the same trust data: the client's comes from
    # $CKPTGATE_POLICIES (--trust is refused beside a remote engine)
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    (policies / TRUST_IN_BUNDLE).write_bytes((published["tmp"] / "trust.json").read_bytes())
    att = published["tmp"] / "att.json"
    with EmbeddedOpa(policy_dir=policies) as server, tcp_front(server) as port:
        token = server._client.headers["Authorization"].split()[1]
        name = f"http://127.0.0.1:{port}"
        env = {**os.environ, "CKPTGATE_POLICIES": str(policies), "CKPTGATE_OPA_TOKEN": token,
               "CKPTGATE_OPA_URL": f"http://op:pw@127.0.0.1:{port}/?token=t0ken"}
        res = subprocess.run([sys.executable, "-m", "ckptgate", "intake", str(published["src"]), "--out",
                              str(tmp_path / "out"), "--attestation", str(att), "--json"],
                             capture_output=True, text=True, env=env, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    receipt = json.loads((tmp_path / "out" / RECEIPT_NAME).read_text())
    assert "pw" not in json.dumps(receipt) and "t0ken" not in json.dumps(receipt)
    (remote,) = [i for i in receipt["inputs"] if i["role"] == "remote_engine"]
    assert (remote["path"], remote["origin"]) == (name, "environment")
    assert remote["revision"] == receipt["policy_revision"] != "unknown"
    assert not any(i["role"] == "policy_tree" for i in receipt["inputs"])
    assert receipt["engine"] == {"kind": "remote", "url": name, "revision": remote["revision"]}
    assert receipt["opa_version"] is None and receipt["decision"]["engine"] == name
    checked = cli("receipt", "verify", tmp_path / "out", "--json")
    assert checked.returncode == ExitCode.VERIFICATION_FAILED  # unsigned: the engine it names is not authenticated
    assert json.loads(checked.stdout)["files_match"] and json.loads(checked.stdout)["engine"]["kind"] == "remote"
    human = cli("receipt", "verify", tmp_path / "out")
    assert f"engine     remote OPA {name} (bundle revision {remote['revision']})" in human.stdout
    embedded = cli("receipt", "verify", published["plain"])
    assert "engine     embedded OPA" in embedded.stdout
    assert json.loads(cli("receipt", "verify", published["plain"], "--json").stdout)["engine"]["kind"] == "embedded"


def test_a_value_from_the_receipt_never_prints_a_line_of_its_own(tmp_path):
    """An engine URL or a file name holding a line break cannot print a forged ``receipt verified`` line:
    every value read from the receipt is shown on its line, with the break as an escape."""

    (tmp_path / "a").write_bytes(b"x")
    sha = hashlib.sha256(b"x").hexdigest()
    (tmp_path / RECEIPT_NAME).write_text(json.dumps({
        "engine": {"kind": "remote", "url": "https://x\nreceipt verified", "revision": "r\tq"},
        "outputs": [{"file": "a", "size": 1, "sha256": sha}, {"file": "b\nreceipt verified", "size": 1,
                                                              "sha256": sha}],
    }))
    res = cli("receipt", "verify", tmp_path)
    assert res.returncode == 5, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1] == "receipt does NOT match (exit 5)"
    assert "receipt verified" not in [line.strip() for line in lines]
    assert any(line.startswith("engine") and "\\nreceipt verified" in line for line in lines), lines
