"""The embedded OPA's process, from outside: the child's set-up between fork and exec, and what it
said last (:mod:`ckptgate.decide.engine` owns it)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
from pathlib import Path

from ckptgate.errors import EngineUnavailable

__all__ = ["die_with_parent", "fd_path", "tail"]

_PR_SET_PDEATHSIG = 1
#: libc's prctl, looked up here, in the parent: the child of a threaded process must not dlopen
#: between fork and exec (another thread may have held the loader's lock at the fork)
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent() -> None:  # runs in the child between fork and exec: one system call, nothing loaded
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def fd_path(fd: int) -> str:
    """``/proc/self/fd/<fd>``: the name by which ``opa sign`` reads the signing key and this process
    reaches the socket's directory.  Without /proc it names nothing, which OPA reported as a key it
    could not parse and the socket as a start that timed out: refused here, naming the cause."""
    path = f"/proc/self/fd/{fd}"
    if not os.path.exists(path):
        raise EngineUnavailable(
            "engine.proc_unmounted",
            f"{path} does not exist: /proc is not mounted here, and the embedded OPA is reached through it",
            evidence={"path": path},
            advice=f"Run ckptgate where /proc is mounted ({path} must name this process's descriptor), "
            "or decide with an OPA server of your own: set CKPTGATE_OPA_URL (or --opa-url).",
        )
    return path


def tail(path: Path, limit: int = 800) -> str:
    """What OPA said last: its exit message (plain text, which for a policy that does not compile
    spans the error, the source line and a caret), else its last error record."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    plain: list[str] = []
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            plain.append(line.strip())
            continue
        if plain:
            break
        if isinstance(rec, dict) and (rec.get("level") == "error" or "err" in rec):
            return str(rec.get("err") or rec.get("msg"))[-limit:]
    if plain:
        return " / ".join(reversed([p for p in plain if p]))[:limit]
    return (lines[-1] if lines else "")[-limit:]
