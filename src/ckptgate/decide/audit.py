"""A local, append-only audit log of decisions (JSON lines), for embedded and remote engines alike."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def default_audit_log() -> Path:
    """``$CKPTGATE_AUDIT_LOG``, else ``$XDG_STATE_HOME/ckptgate/decisions.jsonl``."""
    explicit = os.environ.get("CKPTGATE_AUDIT_LOG")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "ckptgate" / "decisions.jsonl"


def append(record: dict[str, Any], path: Path | None = None) -> Path:
    """Append one record with a timestamp; one ``write`` of one line, under O_APPEND."""
    path = path or default_audit_log()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = json.dumps({"logged_at": datetime.now(UTC).isoformat(), **record}, sort_keys=True,
                      default=str) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return path
