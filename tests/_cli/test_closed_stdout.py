"""A closed stdout (``ckptgate intake ... | head -1``) never turns an outcome into a failure: the
exit code is the outcome's (0 when published), nothing is printed about it, no traceback, and
Python's flush of stdout at exit does not fail either (it would print "Exception ignored" and exit
120)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_helpers import demo_attested

HF = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "hf_sharded" / "checkpoint"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("closed-stdout")
    src = root / "ckpt"
    shutil.copytree(HF, src)
    return {"src": src, "att": demo_attested(src, root)}


def _closed(*args: object) -> subprocess.CompletedProcess[str]:
    """Run ckptgate with stdout a pipe whose reader has closed it before anything was written."""
    proc = subprocess.Popen([sys.executable, "-m", "ckptgate", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away: every write to stdout now meets EPIPE
    stderr = proc.stderr.read()
    return subprocess.CompletedProcess(proc.args, proc.wait(timeout=180), "", stderr)


def _open(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ))


@pytest.mark.parametrize("as_json", [False, True])
def test_intake_publishes_and_exits_0(fixture, tmp_path, as_json):
    out = tmp_path / "out"
    result = _closed("intake", fixture["src"], "--out", out, "--attestation", fixture["att"].attestation,
                     "--trust", fixture["att"].trust, *(["--json"] if as_json else []))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no "internal error", no traceback, no "Exception ignored"
    assert (out / "ckptgate-receipt.json").is_file()


@pytest.mark.parametrize("extra", [[], ["--json"], ["--digest"]])
def test_inspect_keeps_its_exit_code(fixture, extra):
    opened = _open("inspect", fixture["src"], *extra)
    assert opened.stdout  # it does print something, which now meets the closed pipe
    result = _closed("inspect", fixture["src"], *extra)
    assert result.returncode == opened.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("with_attestation", [True, False])
def test_explain_keeps_its_exit_code(fixture, with_attestation):
    args = ["explain", fixture["src"], "--trust", fixture["att"].trust,
            *(["--attestation", fixture["att"].attestation] if with_attestation else [])]
    opened = _open(*args)
    assert opened.stdout
    result = _closed(*args)
    assert result.returncode == opened.returncode, result.stderr
    assert result.returncode == (0 if with_attestation else 3)  # allow, and deny: each its own code
    assert "Traceback" not in result.stderr and "internal" not in result.stderr
    assert "Exception ignored" not in result.stderr
