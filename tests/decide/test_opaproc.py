"""The embedded OPA's process helpers: what OPA said last."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path

import pytest

from ckptgate.decide._opaproc import tail


def test_tail_prefers_the_plain_exit_message_then_the_last_error_record(tmp_path: Path) -> None:
    log = tmp_path / "opa.log"
    info = json.dumps({"level": "info", "msg": "Initializing server."})
    error = json.dumps({"level": "error", "err": "listen tcp 127.0.0.1:1: bind: address already in use"})
    log.write_text("\n".join([info, error, info]) + "\n")
    assert tail(log) == "listen tcp 127.0.0.1:1: bind: address already in use"
    log.write_text("\n".join([info, "error: 1 error occurred: x.rego:3: rego_parse_error", "  allow :=", "  ^"]))
    assert tail(log) == "error: 1 error occurred: x.rego:3: rego_parse_error / allow := / ^"
    assert tail(tmp_path / "missing.log") == ""


@pytest.mark.parametrize("step", ["bundle", "socket"])
def test_without_proc_the_embedded_opa_is_refused_naming_proc(
    step: str, policy_dir: typing.Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``opa sign`` reads the signing key as /proc/self/fd/N and this process reaches OPA's socket
    through /proc/self/fd/<dirfd>: without /proc the first was ``engine.bundle.build_failed``
    ("failed to parse PEM block containing the key") and the second a start that timed out."""
    from ckptgate.decide.bundle import PolicyBundle
    from ckptgate.decide.engine import EmbeddedOpa
    from ckptgate.errors import EngineUnavailable

    root = policy_dir("package ckptgate.intake\n\ndecision := {\"allow\": false}\n")
    bundle = PolicyBundle.from_directory(root, tmp_path) if step == "socket" else None
    exists = os.path.exists
    monkeypatch.setattr(os.path, "exists", lambda p: not str(p).startswith("/proc/self/fd/") and exists(p))
    with pytest.raises(EngineUnavailable) as e:
        EmbeddedOpa(policy_dir=root, bundle=bundle, start_timeout_s=5).close()
    assert e.value.code == "engine.proc_unmounted"
    assert "/proc/self/fd/" in e.value.message and "CKPTGATE_OPA_URL" in e.value.diagnostics()
