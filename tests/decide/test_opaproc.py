"""The embedded OPA's process helpers: what OPA said last."""

from __future__ import annotations

import json
from pathlib import Path

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
