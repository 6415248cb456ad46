"""Bad inputs on the command line: a typed error, a stable code, the documented exit code, no
traceback, and nothing written or changed (the cases a review of every sub-command found)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode

sys.path.insert(0, str(Path(__file__).resolve().parent / "verify"))
from verify_helpers import STATEMENT  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"
TRUST = REPO / "policies" / "ckptgate" / "config" / "trust" / "data.json"
HEX = "ab" * 32
LONG = "a" * 300  # over NAME_MAX (255) on every Linux file system


def cli(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=dict(os.environ))


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*")) if not p.is_fifo()}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "ckpt").mkdir()
    for f in HF.iterdir():
        (tmp_path / "ckpt" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "afile").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage.json").write_text("not json")
    (tmp_path / "predicate.json").write_text("{}")
    (tmp_path / "kp.pub.pem").write_text("already here")
    os.mkfifo(tmp_path / "att.fifo")
    return tmp_path


CASES = [
    # outputs inside an input, or where there is no directory
    (["verify", "ckpt", "--html", "ckpt/model-00001-of-00002.safetensors"], ExitCode.USAGE, "usage.output_inside_input"),
    (["intake", "ckpt", "--out", "ckpt/inner"], ExitCode.USAGE, "usage.dst_inside_source"),
    (["intake", "ckpt", "--out", "afile/x"], ExitCode.USAGE, "usage.dst_parent_missing"),
    (["verify", "ckpt", "--html", "nodir/r.html"], ExitCode.USAGE, "usage.output_parent"),
    (["check", "--repo", REPO, "--sarif", "nodir/x.sarif"], ExitCode.USAGE, "usage.output_parent"),
    (["attest", "keygen", "--out", "kp"], ExitCode.USAGE, "usage.exists"),  # kp.pub.pem exists: no kp.pem either
    (["attest", "keygen", "--out", ""], ExitCode.USAGE, "usage.invalid"),
    # a signer id the trust data refuses (verify.trust.field) was written, exit 0, with its key pair
    (["attest", "keygen", "--out", "k", "--id", "", "--trust-out", "t.json"], ExitCode.USAGE, "usage.keygen.id"),
    (["attest", "keygen", "--out", "k", "--id", "a\x1b[2Jb"], ExitCode.USAGE, "usage.keygen.id"),
    (["attest", "keygen", "--out", "k", "--builder-id", " "], ExitCode.USAGE, "usage.keygen.id"),
    (["attest", "add", str(HF / "model.safetensors.index.json"), "--store", "afile"], ExitCode.USAGE, "usage.store"),
    (["matrix", "build", "--repo", REPO, "--out", "afile/m"], ExitCode.USAGE, "usage.output_parent"),
    (["demo", "--workdir", "ckpt"], ExitCode.USAGE, "usage.workdir"),
    # a name longer than the file system allows: Path.exists and Path.is_dir raised on it (internal.unexpected, exit 1)
    (["intake", "ckpt", "--out", LONG], ExitCode.USAGE, "usage.invalid"),
    (["intake", "ckpt", "--out", "/tmp/" + "b/" * 3000 + "x"], ExitCode.USAGE, "usage.invalid"),
    (["verify", "ckpt", "--html", f"{LONG}/r.html"], ExitCode.USAGE, "usage.invalid"),
    (["decide", "ckpt", "--policies", LONG], ExitCode.USAGE, "usage.invalid"),
    (["check", "--repo", LONG], ExitCode.USAGE, "usage.invalid"),
    (["check", "--repo", REPO, "--sarif", f"{LONG}/x.sarif"], ExitCode.USAGE, "usage.invalid"),
    (["attest", "keygen", "--out", f"{LONG}/k"], ExitCode.USAGE, "usage.output_parent"),  # a prefix, not a path option
    # inputs that are not regular files, or not what they claim
    (["decide", "ckpt", "--attestation", "att.fifo"], ExitCode.USAGE, "usage.attestation_unreadable"),
    (["attest", "show", "att.fifo"], ExitCode.USAGE, "usage.unreadable"),
    (["attest", "show", "/dev/zero"], ExitCode.USAGE, "usage.unreadable"),
    (["decide", "ckpt", "--trust", "/dev/zero"], ExitCode.VERIFICATION_FAILED, "verify.trust.unreadable"),
    (["decide", "ckpt", "--policies", "empty"], ExitCode.USAGE, "usage.policies"),
    (["decide", "ckpt", "--policies", "nodir", "--trust", TRUST], ExitCode.USAGE, "usage.policies"),
    (["decide", "ckpt", "--opa-timeout", "nan"], ExitCode.USAGE, "usage.opa_timeout"),
    (["decide", "ckpt", "--policy-key", "afile"], ExitCode.USAGE, "usage.policy_bundle"),
    (["policy", "build", "--signing-key", "garbage.json", "--out", "b.tar.gz"], ExitCode.USAGE,
     "usage.signing_key_invalid"),
    (["policy", "build", "--signing-key", "garbage.json", "--out", "b.tar.gz", "--policies", "empty"], ExitCode.USAGE,
     "usage.policies"),
    (["attest", "verify", "garbage.json", "--digest", "notadigest"], ExitCode.USAGE, "usage.digest"),
    (["attest", "verify", "garbage.json", "--digest", "sha256:" + HEX, "--commit", "xyz"], ExitCode.USAGE,
     "usage.request.commit"),
    (["attest", "verify", "garbage.json", "--digest", "sha256:" + HEX, "--sigstore-trust-root", "nofile"],
     ExitCode.USAGE, "usage.sigstore_trust_root"),
    (["attest", "verify", "garbage.json", "--digest", "sha256:" + HEX, "--sigstore-trust-root", "garbage.json"],
     ExitCode.USAGE, "usage.sigstore_trust_root"),
    # a trust root is checked when it is named, not only when a Sigstore bundle comes to need it
    (["decide", "ckpt", "--sigstore-trust-root", "garbage.json"], ExitCode.USAGE, "usage.sigstore_trust_root"),
    (["decide", "ckpt", "--sigstore-trust-root", "att.fifo"], ExitCode.USAGE, "usage.sigstore_trust_root"),
    (["attest", "sign", "--key", "garbage.json", "--predicate", "predicate.json", "--subject-digest", "bad",
      "--out", "s.json"], ExitCode.USAGE, "usage.signing_key_invalid"),
]


@pytest.mark.parametrize(("args", "exit_code", "code"), CASES, ids=[" ".join(map(str, c[0]))[:60] for c in CASES])
def test_a_bad_input_is_a_typed_error_that_changes_nothing(work: Path, args: list, exit_code: int, code: str) -> None:
    before = _tree(work)
    res = cli(*args, cwd=work)
    assert "Traceback" not in res.stderr + res.stdout
    assert res.returncode == exit_code, res.stdout + res.stderr
    assert json.loads(res.stdout)["error"]["code"] == code
    assert _tree(work) == before


def test_a_policy_directory_named_by_the_environment_too_long_to_use_is_a_typed_error(work: Path) -> None:
    """$CKPTGATE_POLICIES is no option, so no option type checks it: Path.is_dir raised on it (exit 1)."""
    res = subprocess.run([sys.executable, "-m", "ckptgate", "decide", "ckpt", "--json"], capture_output=True,
                         text=True, timeout=120, cwd=work, env={**os.environ, "CKPTGATE_POLICIES": LONG})
    assert "Traceback" not in res.stderr + res.stdout
    assert res.returncode == ExitCode.ENGINE_UNAVAILABLE, res.stdout + res.stderr
    assert json.loads(res.stdout)["error"]["code"] == "engine.policies.missing"


def test_attest_sign_refuses_a_predicate_type_it_has_no_schema_for(work: Path) -> None:
    assert cli("attest", "keygen", "--out", "k", cwd=work).returncode == 0
    res = cli("attest", "sign", "--key", "k.pem", "--predicate", "predicate.json", "--predicate-type", "bogus",
              "--subject-digest", "sha256:" + HEX, "--out", "s.json", cwd=work)
    assert res.returncode == ExitCode.USAGE and json.loads(res.stdout)["error"]["code"] == "usage.predicate_type"
    assert not (work / "s.json").exists()


def test_attest_add_stores_nothing_when_one_envelope_is_bad(work: Path) -> None:
    assert cli("attest", "keygen", "--out", "k", cwd=work).returncode == 0
    (work / "stmt.json").write_text(json.dumps(STATEMENT))
    assert cli("attest", "sign", "--key", "k.pem", "--statement", "stmt.json", "--out", "good.json",
               cwd=work).returncode == 0
    res = cli("attest", "add", "good.json", "garbage.json", "--store", "store", cwd=work)
    assert res.returncode == ExitCode.VERIFICATION_FAILED and "Traceback" not in res.stderr
    assert not (work / "store").exists()


def test_attest_add_stores_nothing_when_a_stored_entry_is_corrupt(work: Path) -> None:
    """The index is rebuilt from every stored file after storing: a corrupt one found only then left the
    new envelope stored and the index stale (exit 5, naming no file).  It is found first, and named."""
    assert cli("attest", "keygen", "--out", "k", cwd=work).returncode == 0
    (work / "stmt.json").write_text(json.dumps(STATEMENT))
    assert cli("attest", "sign", "--key", "k.pem", "--statement", "stmt.json", "--out", "good.json",
               cwd=work).returncode == 0
    corrupt = work / "store" / ("sha256-" + "cd" * 32) / "slsa.dev-provenance-v1-0123456789abcdef.dsse.json"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_text("{oops")
    before = _tree(work / "store")
    res = cli("attest", "add", "good.json", "--store", "store", cwd=work)
    assert res.returncode == ExitCode.VERIFICATION_FAILED and "Traceback" not in res.stderr
    error = json.loads(res.stdout)["error"]
    assert error["code"] == "verify.store.entry_invalid" and corrupt.name in error["message"]
    assert _tree(work / "store") == before


def test_terminal_controls_in_a_file_name_reach_the_terminal_escaped(tmp_path: Path) -> None:
    """A name that would retitle the window and clear the screen is shown, not obeyed."""
    (tmp_path / "ckpt").mkdir()
    for f in HF.iterdir():
        (tmp_path / "ckpt" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "ckpt" / "\x1b]0;pwned\x07\x1b[2Jx.json").write_text("{}")
    res = subprocess.run([sys.executable, "-m", "ckptgate", "inspect", "ckpt"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "400"})
    assert res.returncode == ExitCode.INPUT_REJECTED
    assert "\x1b]" not in res.stdout and "\x07" not in res.stdout and "\x1b[2J" not in res.stdout
    assert "\\x1b]0;pwned\\x07\\x1b[2Jx.json" in res.stdout
    assert "walk.name_control_chars" in res.stdout


@pytest.mark.parametrize("flag", ["--statement", "--predicate"])
def test_attest_sign_a_malformed_file_of_the_user_is_a_usage_error(work: Path, flag: str) -> None:
    """The statement or predicate to sign is the user's own input: exit 2 (usage.json.*), as its schema errors
    are, never 'verification failed' (exit 5)."""
    assert cli("attest", "keygen", "--out", "k", cwd=work).returncode == 0
    extra = ["--subject-digest", "sha256:" + HEX] if flag == "--predicate" else []
    res = cli("attest", "sign", "--key", "k.pem", flag, "garbage.json", *extra, "--out", "s.json", cwd=work)
    assert res.returncode == ExitCode.USAGE, res.stdout + res.stderr
    assert json.loads(res.stdout)["error"]["code"] == "usage.json.malformed" and "Traceback" not in res.stderr
    assert not (work / "s.json").exists()
