"""SIGHUP, SIGINT and SIGTERM sent to the ckptgate process alone (never its group): before the
publishing rename they abort the intake (exit 129/130/143, "nothing was published", DST absent, no
staging or work directory left); inside or after the rename the publication is complete and is
reported as published (exit 0, the normal output).

Each run is paused at one stage by tests/paused_cli.py (the real command, with a pause hook), which
marks the pause in a file; the test then sends its signal with ``os.kill(pid, sig)``.  A shell starts
a background job with SIGINT ignored: every run here starts that way, and SIGINT must still abort.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode
from tests.pipeline_helpers import demo_attested

REPO = Path(__file__).resolve().parent.parent
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"
DRIVER = REPO / "tests" / "paused_cli.py"

BEFORE = ("startup", "hashing", "staging", "consolidation", "before_rename")
CODES = {signal.SIGHUP: ExitCode.HANGUP, signal.SIGINT: ExitCode.INTERRUPTED, signal.SIGTERM: ExitCode.TERMINATED}


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("signals")
    src = root / "ckpt"
    shutil.copytree(HF, src)
    return {"src": src, "att": demo_attested(src, root)}


def _ignoring_sigint() -> None:  # as a non-interactive shell starts `ckptgate intake ... &`
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(fixture, tmp_path: Path, stage: str, sig: int, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    run, tmp = tmp_path / "run", tmp_path / "tmp"
    run.mkdir(mode=0o700)
    tmp.mkdir()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run), "TMPDIR": str(tmp), "XDG_STATE_HOME": str(tmp_path / "state")}
    out, mark = tmp_path / "out" / "dst", tmp_path / "mark"
    out.parent.mkdir()
    args = ["intake", fixture["src"], "--out", out, "--attestation", fixture["att"].attestation,
            "--trust", fixture["att"].trust, *extra]
    proc = subprocess.Popen([sys.executable, str(DRIVER), stage, str(mark), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ignoring_sigint)
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the intake never reached its pause"
        time.sleep(0.01)
    sent = time.monotonic()
    os.kill(proc.pid, sig)  # the process alone, not its group
    stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 15, "the signal did not stop the pause (a digest thread was not cancelled?)"
    left = {p.name for p in run.rglob("*") if p.is_dir()} | {p.name for p in tmp.rglob("*") if p.is_dir()}
    assert not {n for n in left if n.startswith(("opa-", "ckptgate-opa-"))}, left  # the embedded OPA was closed
    assert [p.name for p in out.parent.iterdir() if p.name != "dst"] == []  # no staging directory left
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), out


def _aborted(result: subprocess.CompletedProcess, out: Path, sig: int) -> None:
    assert result.returncode == CODES[sig] == 128 + sig, result.stderr
    assert "nothing was published" in result.stderr and "Traceback" not in result.stderr
    assert f"interrupted.{signal.Signals(sig).name.lower()}" in result.stderr
    assert not out.exists() and not out.is_symlink()


def _published(result: subprocess.CompletedProcess, out: Path) -> None:
    assert result.returncode == 0, result.stderr
    receipt = json.loads((out / "ckptgate-receipt.json").read_text())
    outputs = sorted(o["file"] for o in receipt["outputs"])
    assert outputs == sorted(p.name for p in out.iterdir() if p.name != "ckptgate-receipt.json")
    assert f"published {len(outputs) + 1} files ({len(outputs)} outputs, ckptgate-receipt.json) to {out}" in result.stdout
    assert "interrupted" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("stage", BEFORE)
def test_sigint_at_each_stage_before_the_rename_aborts(fixture, tmp_path, stage):
    result, out = _run(fixture, tmp_path, stage, signal.SIGINT)
    _aborted(result, out, signal.SIGINT)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
@pytest.mark.parametrize("stage", ["startup", "hashing", "before_rename"])
def test_sighup_and_sigterm_abort_too(fixture, tmp_path, stage, sig):
    result, out = _run(fixture, tmp_path, stage, sig)
    _aborted(result, out, sig)


def test_the_abort_is_typed_in_json(fixture, tmp_path):
    result, out = _run(fixture, tmp_path, "staging", signal.SIGTERM, "--json")
    assert result.returncode == 143
    err = json.loads(result.stdout)["error"]
    assert err["code"] == "interrupted.sigterm" and err["exit_code"] == 143 and err["kind"] == "Aborted"
    assert "nothing was published" in err["message"]
    assert not out.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_inside_the_rename_is_held_and_finds_the_publication_complete(fixture, tmp_path, sig):
    result, out = _run(fixture, tmp_path, "in_rename", sig)
    _published(result, out)


def test_a_signal_after_the_rename_is_reported_as_published(fixture, tmp_path):
    result, out = _run(fixture, tmp_path, "after_rename", signal.SIGTERM)
    _published(result, out)
