"""Runtime environments of the qualification farm (issue #31 item 2): ckptgate itself run with the
user's torch.

A runtime lock (``kind = "runtime"``) is built like any lock, into the keyed environment
``$CKPTGATE_ENV_HOME/farm/envs/<env>-<digest16>``.  ckptgate is not in the lock: each checkout gets
its own thin venv over that environment, ``farm/runtime/<env>-<digest16>-<checkout12>``, whose
``.pth`` links the environment's site-packages and the checkout's ``src/`` (what
``scripts/bootstrap.py`` does for ckptgate's own ``.venv``), with the ``ckptgate`` script and the
runtime record that :mod:`ckptgate.evidence.environment` reads into the qualification's
``environment.runtime``.  So the code qualified is exactly the checkout's (the candidate commit the
statement names), and two checkouts never share one link.

Only the standard library is used (scripts/farm.py imports this before any environment exists).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: = ckptgate.evidence.environment.RUNTIME_RECORD (tests/test_farm.py keeps them equal).
RUNTIME_RECORD = "ckptgate-runtime.json"
LINK_PTH = "_ckptgate_runtime.pth"
#: strace: every thread and process, absolute timestamps (to order threads around the filter load),
#: pids translated out of the worker's PID namespace, no attach/exit chatter.
STRACE = ("strace", "-f", "-ttt", "--pidns-translation", "-qq")


def checkout_id(root: Path) -> str:
    return hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]


def link_dir(home: Path, key: str, root: Path) -> Path:
    return home / "runtime" / f"{key}-{checkout_id(root)}"


def site_packages(prefix: Path) -> Path:
    found = sorted(prefix.glob("lib/python3.*/site-packages"))
    if len(found) != 1:
        raise FileNotFoundError(f"{prefix}: expected one lib/python3.*/site-packages, found {len(found)}")
    return found[0]


def record_text(lock_name: str, lock_sha256: str) -> str:
    return json.dumps({"lock": lock_name, "lock_sha256": lock_sha256}, sort_keys=True) + "\n"


def link_runtime(*, env_prefix: Path, link: Path, python: str, root: Path, lock_name: str, lock_sha256: str) -> Path:
    """Make (or keep) the checkout's thin venv over the built runtime environment; returns its ckptgate."""
    py = link / "bin" / "python"
    want = f"{site_packages(env_prefix)}\n{root / 'src'}\n"
    record = record_text(lock_name, lock_sha256)
    current = py.exists() and (link / RUNTIME_RECORD).is_file() and (link / RUNTIME_RECORD).read_text() == record
    if current:
        pth = site_packages(link) / LINK_PTH
        current = pth.is_file() and pth.read_text() == want
    if not current:
        if link.exists():
            shutil.rmtree(link)
        link.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-m", "venv", "--without-pip", str(link)], check=True)
        (site_packages(link) / LINK_PTH).write_text(want)
        (link / RUNTIME_RECORD).write_text(record)
    exe = link / "bin" / "ckptgate"
    exe.write_text(f"#!{py}\nimport sys\nfrom ckptgate._cli import main\nsys.exit(main())\n")
    exe.chmod(0o755)
    return exe


def runtime_rows(support_json: Path, digest: str, lock_name: str) -> list[str]:
    """Statuses of the matrix rows about fixture ``digest`` qualified in runtime ``lock_name``."""
    try:
        rows = json.loads(support_json.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return []
    out = []
    for r in rows:
        env = r.get("environment") if isinstance(r, dict) else None
        runtime = env.get("runtime") if isinstance(env, dict) else None
        if r.get("fixture_digest") == digest and isinstance(runtime, dict) and runtime.get("lock") == lock_name:
            out.append(str(r.get("status")))
    return out


def traced(cmd: Sequence[str], trace: Path) -> list[str]:
    """``cmd`` run under strace, writing the trace to ``trace`` (scripts/seccomp_trace.py reads it)."""
    if shutil.which(STRACE[0]) is None:
        raise FileNotFoundError("strace is not installed (apt-get install strace); it measures the worker's calls")
    return [*STRACE, "-o", str(trace), *cmd]


__all__ = ["RUNTIME_RECORD", "checkout_id", "link_dir", "link_runtime", "record_text", "runtime_rows", "traced"]
