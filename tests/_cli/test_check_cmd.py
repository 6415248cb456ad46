"""``ckptgate check --sarif/--junit``: a report never replaces what the check reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _repo(tmp_path: Path, *, commit_config: bool) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "README.md").write_text("r\n")
    (root / "ckptgate.toml").write_text('docs = ["README.md"]\n')
    for args in (("init", "-q"), ("add", "README.md", *(["ckptgate.toml"] if commit_config else [])),
                 ("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "x")):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    return root


def _check(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CKPTGATE_NO_CONFIG"}
    return subprocess.run([sys.executable, "-m", "ckptgate", "check", "--json", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("commit_config", "option", "target"), [
    (True, "--sarif", "ckptgate.toml"),  # a tracked file: the configuration itself
    (True, "--junit", "README.md"),  # a tracked file the claims lint reads
    (False, "--sarif", "ckptgate.toml"),  # the configuration, not yet committed
    (True, "--junit", ".git/HEAD"),  # the repository's own state
    (True, "--sarif", ".git/new.sarif"),
])
def test_a_report_that_would_replace_an_input_is_refused_and_nothing_changes(
        tmp_path: Path, commit_config: bool, option: str, target: str) -> None:
    """`check --sarif ckptgate.toml` overwrote the configuration, `--junit .git/HEAD` broke the
    repository, and both exited 0."""
    root = _repo(tmp_path, commit_config=commit_config)
    before = {p: p.read_bytes() for p in (root / "ckptgate.toml", root / "README.md", root / ".git" / "HEAD")}
    proc = _check(root, option, target)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "usage.output_inside_input"
    assert target in error["message"]
    assert {p: p.read_bytes() for p in before} == before
    assert not (root / ".git" / "new.sarif").exists()


def test_a_report_may_replace_an_untracked_report(tmp_path: Path) -> None:
    root = _repo(tmp_path, commit_config=True)
    (root / "check.sarif").write_text("old")
    proc = _check(root, "--sarif", "check.sarif", "--skip", "claims")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((root / "check.sarif").read_text())["version"] == "2.1.0"
