"""A newcomer's bad inputs (#33): each refusal names the file, finding or option that caused it,
and its advice is the next command to run, with this run's values in it."""

from __future__ import annotations

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
