"""A local, append-only audit log of decisions (JSON lines), for embedded and remote engines alike."""

from __future__ import annotations

import errno
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckptgate.errors import UsageError


def default_audit_log() -> Path:
    """``$CKPTGATE_AUDIT_LOG``, else ``$XDG_STATE_HOME/ckptgate/decisions.jsonl``."""
    explicit = os.environ.get("CKPTGATE_AUDIT_LOG")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "ckptgate" / "decisions.jsonl"


def append(record: dict[str, Any], path: Path | None = None) -> Path:
    """Append one record with a timestamp: one line, under O_APPEND (a regular file takes it in one
    ``write``; a pipe whose reader is behind, in pieces)."""
    path = path or default_audit_log()
    line = (
        json.dumps({"logged_at": datetime.now(UTC).isoformat(), **record}, sort_keys=True, default=str) + "\n"
    ).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # O_NONBLOCK: a FIFO no process reads fails at once (ENXIO) instead of blocking the run forever
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        try:
            os.set_blocking(fd, True)  # only the open: a reader that is behind is waited for, as with any pipe
            view = memoryview(line)
            while view:  # a pipe takes a long line in pieces
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as e:
        cause = "it is a FIFO or socket that no process reads" if e.errno == errno.ENXIO else e.strerror or e
        raise UsageError(
            "usage.audit_log_unwritable",
            f"the decision audit log {path} cannot be written: {cause}",
            evidence={"path": str(path), "errno": e.errno},
            advice=f"Set CKPTGATE_AUDIT_LOG to a writable regular file instead of {path}; "
            "no decision is used unaudited.",
        ) from None
    return path
