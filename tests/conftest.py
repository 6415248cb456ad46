"""Shared test helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def policy_dir(tmp_path: Path):
    """A policy tree holding the real system.authz policy plus a test-only decision package.

    Engine tests use it to exercise the engine's mechanics (start, auth, fail closed) apart
    from the real intake policy, which has its own tests.
    """

    def make(rego: str) -> Path:
        root = tmp_path / "policies"
        shutil.copytree(REPO / "policies" / "system", root / "system")
        pkg = root / "ckptgate" / "intake"
        pkg.mkdir(parents=True)
        (pkg / "intake.rego").write_text(rego)
        return root

    return make


@pytest.fixture(autouse=True)
def _audit_log_in_tmp(tmp_path_factory, monkeypatch):
    """Decisions made by tests are audited into a temporary file, not the user's state directory."""
    monkeypatch.setenv("CKPTGATE_AUDIT_LOG", str(tmp_path_factory.getbasetemp() / "decisions.jsonl"))


@pytest.fixture(autouse=True)
def _private_runtime_and_state(tmp_path_factory, monkeypatch):
    """Work directories and the registry of live directories of tests live in this session's
    temporary directory, not in the user's $XDG_RUNTIME_DIR, /tmp/ckptgate-<uid> or state directory."""
    base = tmp_path_factory.getbasetemp()
    runtime = base / "xdg-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "xdg-state"))
