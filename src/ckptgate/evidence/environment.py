"""Where a qualification ran: interpreter, torch, operating system and architecture, and, in a farm
runtime environment, which committed runtime lock that environment was built from.

A runtime environment (``kind = "runtime"`` in ``qualification/locks/``, issue #31 item 2) is
ckptgate's own dependencies at another torch: the contained worker's ``torch.load`` runs there with
that torch.  ``scripts/farm.py`` writes :data:`RUNTIME_RECORD` at the prefix of the per-checkout
venv it runs ckptgate from; the qualification records it as ``environment.runtime``, and that is
what tells a runtime row from a row qualified in ckptgate's own environment.  The torch version is
always read from the installed distribution, never from the record.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

from ckptgate.evidence.errors import EvidenceError

#: The file at ``sys.prefix`` that names the runtime lock this interpreter's environment was built from.
RUNTIME_RECORD = "ckptgate-runtime.json"
_LOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def runtime_record(prefix: Path | None = None) -> dict[str, str] | None:
    """``{"lock", "lock_sha256"}`` from :data:`RUNTIME_RECORD` under ``prefix`` (default ``sys.prefix``);
    None when there is none (ckptgate's own environment).  A record of any other shape is refused."""
    path = Path(sys.prefix if prefix is None else prefix) / RUNTIME_RECORD
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        doc = e
    lock = doc.get("lock") if isinstance(doc, dict) else None
    sha = doc.get("lock_sha256") if isinstance(doc, dict) else None
    if not (
        isinstance(doc, dict)
        and set(doc) == {"lock", "lock_sha256"}
        and isinstance(lock, str)
        and _LOCK_NAME.match(lock)
        and isinstance(sha, str)
        and _SHA256.match(sha)
    ):
        raise EvidenceError(
            "evidence.qualify.runtime_record",
            f"{path} is not a runtime record ({{lock, lock_sha256}} naming a committed runtime lock)",
            evidence={"path": str(path)},
            advice="Rebuild the runtime link with `python3 scripts/farm.py run --only <runtime lock>`, "
            "or remove the file to qualify in this environment as ckptgate's own.",
        )
    return {"lock": lock, "lock_sha256": sha}


def environment() -> dict[str, Any]:
    """Where the run happened (no accelerator is used: consolidation moves bytes on the CPU)."""
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch_version,
        "os": f"{platform.system()} {platform.release()}"[:256],
        "arch": platform.machine() or "unknown",
        "accelerator": "none (cpu)",
    }
    runtime = runtime_record()
    if runtime is not None:
        env["runtime"] = runtime
    return env


def runtime_lock(env: object) -> str | None:
    """The runtime lock an ``environment`` record names (None: ckptgate's own environment)."""
    runtime = env.get("runtime") if isinstance(env, dict) else None
    lock = runtime.get("lock") if isinstance(runtime, dict) else None
    return lock if isinstance(lock, str) else None


__all__ = ["RUNTIME_RECORD", "environment", "runtime_lock", "runtime_record"]
