"""Every decision is appended to the local audit log, with its id, revision and fixture."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime

from ckptgate.decide import PolicyInput, Request, decide
from ckptgate.decide.engine import EmbeddedOpa

ALLOW = textwrap.dedent("""\
    package ckptgate.intake

    decision := {"allow": true, "plane": "pure_data", "permitted_loaders": ["safetensors"],
                 "required_controls": [], "reasons": [{"code": "ok", "message": "fine", "evidence": {}}],
                 "refusal": null}
    """)
DIGEST = "sha256:" + "ab" * 32


def test_each_decision_is_appended_to_the_audit_log(policy_dir, tmp_path):
    log = tmp_path / "audit" / "decisions.jsonl"
    pi = PolicyInput(request=Request(action="intake", now=datetime.now(UTC)),
                     fixture={"digest": DIGEST, "algorithm": "sha256", "file_count": 1, "total_bytes": 1},
                     inspection={"format": "safetensors"}, attestations=(), rejected_attestations=(),
                     containment=None)
    with EmbeddedOpa(policy_dir=policy_dir(ALLOW)) as opa:
        first = decide(opa, pi, audit_log=log)
        second = decide(opa, pi, audit_log=log)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["decision"]["decision_id"] for r in records] == [first.decision_id, second.decision_id]
    assert first.decision_id != second.decision_id
    assert all(r["fixture_digest"] == DIGEST and r["decision"]["allow"] is True for r in records)
    assert records[0]["decision"]["policy_revision"] == first.policy_revision
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_an_audit_log_that_is_a_fifo_no_one_reads_is_refused_not_waited_on(tmp_path):
    """CKPTGATE_AUDIT_LOG naming a FIFO with no reader used to block the run forever in open()."""
    import os
    import signal

    import pytest

    from ckptgate.decide.audit import append
    from ckptgate.errors import UsageError

    fifo = tmp_path / "decisions.jsonl"
    os.mkfifo(fifo)

    def hung(*_):
        raise AssertionError("append() blocked on a FIFO with no reader")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(UsageError) as e:
            append({"x": 1}, fifo)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert e.value.code == "usage.audit_log_unwritable"
    assert "FIFO" in e.value.message and str(fifo) in e.value.diagnostics()


def test_a_fifo_with_a_live_reader_receives_the_whole_record(tmp_path):
    """Review (session 49): O_NONBLOCK, there so that a FIFO no process reads fails at once, stayed on for the
    write: a live reader slower than the run (a log shipper's pipe) got a partial line and the decision was
    refused.  Only the open is non-blocking now, and a long line goes in pieces."""
    import os
    import threading
    import time

    from ckptgate.decide.audit import append

    fifo = tmp_path / "decisions.jsonl"
    os.mkfifo(fifo)
    got = bytearray()
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that is there, but drains only later

    def drain() -> None:
        time.sleep(0.5)
        os.set_blocking(rfd, True)
        while chunk := os.read(rfd, 1 << 16):
            got.extend(chunk)

    t = threading.Thread(target=drain)
    t.start()
    try:
        append({"decision": {"reasons": ["x" * 200] * 500}}, fifo)  # ~100 KB: more than the pipe holds
    finally:
        time.sleep(0.1)
        wfd = os.open(fifo, os.O_WRONLY)  # keep a writer so the drain sees EOF only after we close it
        os.close(wfd)
        t.join(5)
        os.close(rfd)
    assert got.endswith(b"\n") and got.count(b"\n") == 1
