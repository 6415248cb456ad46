"""A newcomer's bad inputs (#33): each refusal names the file, finding or option that caused it,
and its advice is the next command to run, with this run's values in it."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode

REPO = Path(__file__).resolve().parents[1]
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"


def cli(*args: object, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args), "--json"], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env={**os.environ, **(env or {})})


def error_of(res: subprocess.CompletedProcess[str]) -> dict:
    assert "Traceback" not in res.stderr + res.stdout
    return json.loads(res.stdout)["error"]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "ckpt").mkdir()
    for f in HF.iterdir():
        (tmp_path / "ckpt" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "taken").mkdir()
    (tmp_path / "afile").write_text("x")
    (tmp_path / "predicate.json").write_text("{}")
    return tmp_path


@pytest.mark.parametrize("command", [["inspect"], ["verify"], ["intake", "--out", "o"], ["decide"]])
def test_a_missing_path_exits_2_for_every_command(work: Path, command: list[str]) -> None:
    res = cli(command[0], "nosuch", *command[1:], cwd=work)
    assert res.returncode == ExitCode.USAGE, res.stdout
    error = error_of(res)
    assert "nosuch" in error["message"]
    assert f"ckptgate {command[0]} --help" in error["advice"]


def test_an_existing_destination_names_it_and_the_next_commands(work: Path) -> None:
    res = cli("intake", "ckpt", "--out", "taken", cwd=work)
    assert res.returncode == ExitCode.USAGE
    error = error_of(res)
    assert error["code"] == "usage.dst_exists"
    assert "--out" in error["advice"] and f"ckptgate receipt verify {work / 'taken'}" in error["advice"]


def test_a_missing_destination_parent_names_the_directory_to_create(work: Path) -> None:
    res = cli("intake", "ckpt", "--out", "nodir/out", cwd=work)
    assert res.returncode == ExitCode.USAGE
    error = error_of(res)
    assert error["code"] == "usage.dst_parent_missing"
    assert f"mkdir -p {work / 'nodir'}" in error["advice"]


def test_a_directory_without_a_receipt_says_which_directory_holds_one(work: Path) -> None:
    res = cli("receipt", "verify", "ckpt", cwd=work)
    assert res.returncode == ExitCode.USAGE
    error = error_of(res)
    assert error["code"] == "usage.receipt_unreadable"
    assert "--out" in error["advice"] and "ckptgate-receipt.json" in error["advice"] and "ckpt" in error["advice"]


def test_a_predicate_type_without_a_schema_names_the_ones_there_are(work: Path) -> None:
    assert cli("attest", "keygen", "--out", "k", cwd=work).returncode == 0
    res = cli("attest", "sign", "--key", "k.pem", "--predicate", "predicate.json", "--predicate-type", "bogus",
              "--subject-digest", "sha256:" + "ab" * 32, "--out", "s.json", cwd=work)
    assert res.returncode == ExitCode.USAGE
    error = error_of(res)
    assert error["code"] == "usage.predicate_type"
    assert "--predicate-type" in error["advice"] and "https://ckptgate.dev/" in error["advice"]


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_names_the_file_system_not_the_workers_limits(tmp_path: Path, err: int) -> None:
    from ckptgate.outcome import io_failure

    failure = io_failure(OSError(err, os.strerror(err)), tmp_path / "out")
    assert failure.code == "runtime.io" and failure.exit_code == ExitCode.RUNTIME_FAILED
    advice = failure.diagnostics()
    assert f"df -h {tmp_path}" in advice and "--out" in advice
    assert "resource limit" not in advice and "containment profile" not in advice


def test_a_full_disk_under_a_report_names_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptgate import userfiles
    from ckptgate.errors import UsageError

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(userfiles.os, "fsync", no_space)
    with pytest.raises(UsageError) as e:
        userfiles.write_output_file(tmp_path / "r.sarif", b"x", what="the SARIF report")
    assert e.value.code == "usage.output_unwritable" and f"df -h {tmp_path}" in e.value.diagnostics()


def test_intake_of_an_empty_directory_says_it_holds_no_files(work: Path) -> None:
    (work / "empty").mkdir()
    res = cli("intake", "empty", "--out", "o", cwd=work)
    assert res.returncode == ExitCode.INPUT_REJECTED
    error = error_of(res)
    assert "the directory holds no files" in error["message"]
    assert not (work / "o").exists()


def test_a_fifo_in_the_checkpoint_is_named_with_its_finding(work: Path) -> None:
    os.mkfifo(work / "ckpt" / "pipe")
    res = cli("intake", "ckpt", "--out", "o", cwd=work)
    assert res.returncode == ExitCode.INPUT_REJECTED
    error = error_of(res)
    assert "pipe: fifo refused" in error["message"] and "walk.fifo" in error["message"]
    res = cli("inspect", "ckpt", cwd=work)
    assert res.returncode == ExitCode.INPUT_REJECTED


@pytest.mark.parametrize("signed", [False, True])
def test_intake_counts_every_file_it_published(work: Path, signed: bool) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from pipeline_helpers import demo_attested

    att = demo_attested(work / "ckpt", work)
    key = ("--receipt-key", work / "att.pem") if signed else ()
    res = subprocess.run([sys.executable, "-m", "ckptgate", "intake", "ckpt", "--out", "published", "--attestation",
                          att.attestation, "--trust", att.trust, *key], capture_output=True, text=True, timeout=300,
                         cwd=work, env={**os.environ, "COLUMNS": "400"})
    assert res.returncode == 0, res.stdout + res.stderr
    on_disk = sorted(p.name for p in (work / "published").iterdir())
    outputs = len(json.loads((work / "published" / "ckptgate-receipt.json").read_text())["outputs"])
    named = "ckptgate-receipt.json, ckptgate-receipt.dsse.json" if signed else "ckptgate-receipt.json"
    assert f"published {len(on_disk)} files ({outputs} outputs, {named}) to" in res.stdout
    assert len(on_disk) == outputs + (2 if signed else 1)


def test_an_untrusted_signer_under_a_remote_engine_is_told_the_servers_bundle_holds_trust(work: Path) -> None:
    from ckptgate._resources import default_policy_dir
    from ckptgate.decide.bundle import find_opa
    from ckptgate.decide.engine import EmbeddedOpa
    from ckptgate.errors import EngineUnavailable

    try:
        find_opa()
    except EngineUnavailable:
        pytest.skip("no OPA binary here")
    sys.path.insert(0, str(REPO / "tests"))
    from pipeline_helpers import demo_attested

    att = demo_attested(work / "ckpt", work)  # its key is in att.trust, not in the server's bundle
    from tests.opa_front import tcp_front

    with EmbeddedOpa(policy_dir=default_policy_dir()) as server, tcp_front(server) as port:
        token = server._client.headers["Authorization"].split()[1]
        url = f"http://127.0.0.1:{port}"
        remote = cli("intake", "ckpt", "--out", "o", "--attestation", att.attestation, "--opa-url", url, cwd=work,
                     env={"CKPTGATE_OPA_TOKEN": token})
        local = cli("intake", "ckpt", "--out", "o", "--attestation", att.attestation, cwd=work)
    assert remote.returncode == local.returncode == ExitCode.VERIFICATION_FAILED, remote.stdout + local.stdout
    remote_advice, local_advice = error_of(remote)["advice"], error_of(local)["advice"]
    assert "--opa-url" in remote_advice and "bundle" in remote_advice
    assert "pass a trust file" not in remote_advice
    assert "--trust FILE" in local_advice and "--opa-url" not in local_advice


def test_a_trust_error_names_the_trust_file_this_run_read(work: Path) -> None:
    (work / "bad-trust.json").write_text(json.dumps({"signers": [{"kind": "key"}]}))
    res = cli("decide", "ckpt", "--trust", "bad-trust.json", cwd=work)
    assert res.returncode == ExitCode.VERIFICATION_FAILED, res.stdout
    error = error_of(res)
    assert error["code"].startswith("verify.trust.")
    assert str(work / "bad-trust.json") in error["advice"] or "bad-trust.json" in error["advice"]
    assert "policies/ckptgate/config/trust/data.json" not in error["advice"]


def test_explain_marks_cut_evidence_with_an_ellipsis(work: Path) -> None:
    for i in range(6):
        os.mkfifo(work / "ckpt" / f"pipe-with-a-long-name-{i}")
    res = subprocess.run([sys.executable, "-m", "ckptgate", "explain", "ckpt"], capture_output=True, text=True,
                         timeout=120, cwd=work, env={**os.environ, "COLUMNS": "1000"})
    assert "Traceback" not in res.stderr
    line = next(line for line in res.stdout.splitlines() if "findings=[" in line)
    assert "…" in line.split("(… cut")[0] and "--json shows the evidence whole" in line
    whole = [line for line in res.stdout.splitlines() if "evidence:" in line and "clean_inspection" in line]
    assert whole and "…" not in whole[0]  # evidence that fits is shown as it is


def test_a_subject_mismatch_shows_the_expected_digest_beside_the_measured_one() -> None:
    from ckptgate.errors import VerificationError
    from ckptgate.digest import Digest
    from ckptgate.verify.binding import bind_subject

    other = "cd" * 32
    statement = {"subject": [{"name": "ckpt", "digest": {"sha256": other}}], "predicateType": "x", "predicate": {}}
    with pytest.raises(VerificationError) as e:
        bind_subject(statement, Digest.parse("sha256:" + "ab" * 32))
    assert e.value.code == "verify.statement.subject_mismatch"
    assert f"measured sha256:{'ab' * 32}" in e.value.message and f"sha256:{other}" in e.value.message


@pytest.mark.parametrize("fixture", ["deepspeed_zero2", "deepspeed_zero3"])
def test_inspect_of_a_deepspeed_checkpoint_says_which_findings_the_bundled_policy_excepts(fixture: str,
                                                                                        tmp_path: Path) -> None:
    src = REPO / "tests" / "fixtures" / "data" / fixture / "checkpoint"
    res = subprocess.run([sys.executable, "-m", "ckptgate", "inspect", src, "--json"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    doc = json.loads(res.stdout)
    excepted = {(e["path"], e["exception"]) for e in doc["excepted_by_bundled_policy"]}
    assert ("zero_to_fp32.py", "deepspeed-helper-scripts") in excepted
    # the same findings the policy itself excepts (intake.rego), by the same rule
    decided = cli("decide", src, cwd=tmp_path, env={"CKPTGATE_NO_CONFIG": "1"})
    reasons = json.loads(decided.stdout)["decision"]["reasons"]
    by_policy = {(r["evidence"]["path"], r["evidence"]["exception"])
                 for r in reasons if r["code"] == "finding_excepted"}
    assert excepted == by_policy

    human = subprocess.run([sys.executable, "-m", "ckptgate", "inspect", src], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path, env={**os.environ, "COLUMNS": "1000"})
    assert human.returncode == ExitCode.INPUT_REJECTED
    assert "the bundled policy excepts by name: zero_to_fp32.py" in human.stderr + human.stdout
    assert "DeepSpeed copies its own consolidation scripts" in human.stderr + human.stdout
    assert f"ckptgate decide {src}" in human.stderr + human.stdout
    assert "obtain it again" not in human.stderr + human.stdout


def test_inspect_names_the_file_of_each_finding(work: Path) -> None:
    os.mkfifo(work / "ckpt" / "pipe")
    res = subprocess.run([sys.executable, "-m", "ckptgate", "inspect", "ckpt"], capture_output=True, text=True,
                         timeout=120, cwd=work, env={**os.environ, "COLUMNS": "1000"})
    assert res.returncode == ExitCode.INPUT_REJECTED
    assert "1 error finding(s): pipe: fifo refused" in res.stderr
    assert f"ckptgate inspect {Path('ckpt')} --json" in res.stderr
