"""``ckptgate attest`` end to end, as a user runs it (subprocess, real exit codes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verify_helpers import COMMIT, FIXTURE_HEX, STATEMENT

# The real ``ckptgate`` group and error translation, with only ``attest`` registered (so this test does not
# depend on other sub-commands importing cleanly).
CLI = [sys.executable, "-c",
       "from ckptgate._cli._base import cli; from ckptgate._cli import attest_cmd, attest_verify_cmd; "
       "attest_cmd.register(cli); attest_verify_cmd.register(cli); cli()"]


def run(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_keygen_sign_verify_show_add(tmp_path: Path) -> None:
    r = run("attest", "keygen", "--out", "dev", "--algorithm", "ecdsa-p256", "--id", "dev", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)["trust_entry"]
    assert oct((tmp_path / "dev.pem").stat().st_mode & 0o777) == "0o600"
    (tmp_path / "trust.json").write_text(json.dumps({"signers": [entry]}))
    (tmp_path / "predicate.json").write_text(json.dumps(STATEMENT["predicate"]))
    r = run("attest", "sign", "--predicate", "predicate.json", "--subject-digest", "sha256:" + FIXTURE_HEX,
            "--out", "att.dsse.json", cwd=tmp_path, env={"CKPTGATE_SIGNING_KEY": str(tmp_path / "dev.pem")})
    assert r.returncode == 0, r.stderr
    now = ["--now", "2026-11-29T17:00:00Z", "--trust", "trust.json"]
    r = run("attest", "verify", "att.dsse.json", "--digest", "sha256:" + FIXTURE_HEX, "--commit", COMMIT, *now,
            "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    facts = json.loads(r.stdout)["attestation"]
    assert facts["signers"][0]["signer_id"] == "dev" and facts["verification"]["subject_matches_fixture"]
    r = run("attest", "verify", "att.dsse.json", "--digest", "sha256:" + FIXTURE_HEX, *now, cwd=tmp_path)
    assert r.returncode == 0 and "VERIFIED" in r.stdout
    # wrong digest: exit 5 with a typed code
    r = run("attest", "verify", "att.dsse.json", "--digest", "sha256:" + "00" * 32, *now, "--json", cwd=tmp_path)
    assert r.returncode == 5
    assert json.loads(r.stdout)["error"]["code"] == "verify.statement.subject_mismatch"
    # default trust data (CI key only) does not trust the dev key
    r = run("attest", "verify", "att.dsse.json", "--digest", "sha256:" + FIXTURE_HEX, "--now",
            "2026-11-29T17:00:00Z", "--trust", str(Path(__file__).resolve().parents[2] /
                                                   "policies/ckptgate/config/trust/data.json"), "--json", cwd=tmp_path)
    assert r.returncode == 5 and json.loads(r.stdout)["error"]["code"] == "verify.key.untrusted"
    r = run("attest", "show", "att.dsse.json", cwd=tmp_path)
    assert r.returncode == 0 and "UNVERIFIED" in r.stdout
    r = run("attest", "show", "att.dsse.json", "--json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert doc["verified"] is False and doc["statement"]["predicate"]["candidate_commit"] == COMMIT
    r = run("attest", "add", "att.dsse.json", "--store", "store", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "store" / "index.json").is_file()
    assert Path(json.loads(r.stdout)["stored"][0]).parent.name == f"sha256-{FIXTURE_HEX}"


def test_garbage_file_exits_5_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_bytes(b"\x00garbage")
    r = run("attest", "verify", "g.json", "--digest", "sha256:" + FIXTURE_HEX, "--json", cwd=tmp_path)
    assert r.returncode == 5 and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"]["code"] == "verify.json.malformed"


def test_sign_usage_errors(tmp_path: Path) -> None:
    r = run("attest", "sign", "--out", "x", "--key", "nope.pem", "--statement", "s.json", "--json",
            cwd=tmp_path)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "usage.signing_key_unreadable"


def test_keygen_writes_a_trust_file_that_trust_takes_as_it_is(tmp_path: Path) -> None:
    """Issue 19, item 5: keygen's entry used to fail as --trust (verify.trust.shape)."""
    r = run("attest", "keygen", "--out", "k", "--trust-out", "trust.json", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["trust_file"] == "trust.json"
    (tmp_path / "predicate.json").write_text(json.dumps(STATEMENT["predicate"]))
    r = run("attest", "sign", "--predicate", "predicate.json", "--subject-digest", "sha256:" + FIXTURE_HEX,
            "--key", "k.pem", "--out", "att.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("attest", "verify", "att.json", "--digest", "sha256:" + FIXTURE_HEX, "--trust", "trust.json",
            "--now", "2026-11-29T17:00:00Z", cwd=tmp_path)
    assert r.returncode == 0 and "VERIFIED" in r.stdout, r.stdout + r.stderr
    again = run("attest", "keygen", "--out", "k2", "--trust-out", "trust.json", "--json", cwd=tmp_path)
    assert again.returncode == 2 and not (tmp_path / "k2.pem").exists()  # nothing written when one exists


def test_signing_an_invalid_predicate_is_a_usage_error_not_untrusted_evidence(tmp_path: Path) -> None:
    r = run("attest", "keygen", "--out", "k", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "predicate.json").write_text(json.dumps({**STATEMENT["predicate"], "result": "great"}))
    r = run("attest", "sign", "--predicate", "predicate.json", "--subject-digest", "sha256:" + FIXTURE_HEX,
            "--key", "k.pem", "--out", "att.json", "--json", cwd=tmp_path)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and err["code"] == "usage.statement_invalid"
    assert "do not trust" not in err["advice"].lower() and not (tmp_path / "att.json").exists()


@pytest.mark.parametrize("validity", [
    {"issued_at": "0001-01-01T00:00:00+14:00", "expires_at": "2030-01-01T00:00:00Z"},  # before policy's years
    {"issued_at": "2026-01-02T00:00:00Z", "expires_at": "2026-01-01T00:00:00Z"},  # inverted
])
def test_a_validity_window_no_verifier_accepts_is_not_signed(tmp_path: Path, validity: dict) -> None:
    """Review (session 49): the schema's pattern admits times no verifier accepts; attest sign signed them."""
    assert run("attest", "keygen", "--out", "k", cwd=tmp_path).returncode == 0
    (tmp_path / "predicate.json").write_text(json.dumps({**STATEMENT["predicate"], "validity": validity}))
    r = run("attest", "sign", "--predicate", "predicate.json", "--subject-digest", "sha256:" + FIXTURE_HEX,
            "--key", "k.pem", "--out", "att.json", "--json", cwd=tmp_path)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and err["code"] == "usage.statement_invalid" and "validity" in err["message"]
    assert not (tmp_path / "att.json").exists()

def test_keygen_writes_no_key_pair_when_its_trust_file_cannot_be_written(tmp_path: Path) -> None:
    """--trust-out in a missing directory used to leave k.pem and k.pub.pem behind; an existing one is named
    by its own flag in the advice."""
    r = run("attest", "keygen", "--out", "k", "--trust-out", "nodir/trust.json", "--json", cwd=tmp_path)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "usage.output_parent"
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "trust.json").write_text("{}")
    r = run("attest", "keygen", "--out", "k", "--trust-out", "trust.json", "--json", cwd=tmp_path)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 2 and err["code"] == "usage.exists" and "--trust-out" in err["advice"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trust.json"]


def test_add_with_two_envelopes_for_one_statement_writes_nothing(tmp_path: Path) -> None:
    """Issue: `attest add` wrote the envelopes before the conflicting one, then failed (partial store, no
    index).  Now every conflict, also between two FILES of the call, is found before anything is written."""
    for k in ("k1", "k2"):
        assert run("attest", "keygen", "--out", k, cwd=tmp_path).returncode == 0
    (tmp_path / "predicate.json").write_text(json.dumps(STATEMENT["predicate"]))
    (tmp_path / "other.json").write_text(json.dumps({**STATEMENT["predicate"], "candidate_commit": "f" * 40}))
    for key, predicate, out in (("k1", "other.json", "b.dsse.json"), ("k1", "predicate.json", "a1.dsse.json"),
                                ("k2", "predicate.json", "a2.dsse.json")):
        r = run("attest", "sign", "--predicate", predicate, "--subject-digest", "sha256:" + FIXTURE_HEX,
                "--key", f"{key}.pem", "--out", out, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    r = run("attest", "add", "b.dsse.json", "a1.dsse.json", "a2.dsse.json", "--store", "store", "--json",
            cwd=tmp_path)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 5 and err["code"] == "verify.store.conflict" and "Traceback" not in r.stderr
    assert "a1.dsse.json" in err["message"] and "a2.dsse.json" in err["message"]
    assert not (tmp_path / "store").exists()
    r = run("attest", "add", "a1.dsse.json", "--store", "store", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    before = sorted((p.relative_to(tmp_path).as_posix(), p.read_bytes()) for p in (tmp_path / "store").rglob("*")
                    if p.is_file())
    r = run("attest", "add", "b.dsse.json", "a2.dsse.json", "--store", "store", "--json", cwd=tmp_path)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 5 and err["code"] == "verify.store.conflict" and "a2.dsse.json" in err["message"]
    assert sorted((p.relative_to(tmp_path).as_posix(), p.read_bytes()) for p in (tmp_path / "store").rglob("*")
                  if p.is_file()) == before


def test_add_to_a_store_another_process_holds_is_busy_and_writes_nothing(tmp_path: Path, ed_signer) -> None:
    """While another process changes the store, `attest add` waits for it; past the wait (here shortened) it
    is `runtime.store.busy` naming the store, with no traceback and nothing written."""
    from verify_helpers import statement

    from ckptgate.verify import AttestationStore, sign_statement

    holder = AttestationStore(tmp_path / "store")
    holder.add(sign_statement(STATEMENT, ed_signer))
    (tmp_path / "new.json").write_bytes(sign_statement(statement(candidate_commit="f" * 40), ed_signer))
    before = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "store").rglob("*"))
    cli = [*CLI[:2], "import ckptgate.verify.store as m; m.LOCK_TIMEOUT_S = 0.3; " + CLI[2]]
    args = ["attest", "add", "new.json", "--store", "store", "--json"]
    with holder.locked():
        r = subprocess.run([*cli, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    err = json.loads(r.stdout)["error"]
    assert r.returncode == 7 and err["code"] == "runtime.store.busy" and "Traceback" not in r.stderr
    assert "store" in err["message"] and "store" in err["advice"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "store").rglob("*")) == before
    r = subprocess.run([*cli, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(json.loads((tmp_path / "store" / "index.json").read_text())["attestations"]) == 2


def test_now_outside_the_years_policy_compares_is_a_usage_error(tmp_path: Path) -> None:
    # 9999-12-31 plus the clock skew overflowed datetime (internal.unexpected); +14:00 on year 1 overflowed in UTC
    (tmp_path / "att.dsse.json").write_text("{}")
    for when in ("9999-12-31T23:59:59Z", "0001-01-01T00:00:00+14:00"):
        r = run("attest", "verify", "att.dsse.json", "--digest", "sha256:" + FIXTURE_HEX, "--now", when, "--json",
                cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert json.loads(r.stdout)["error"]["code"] == "usage.invalid"
