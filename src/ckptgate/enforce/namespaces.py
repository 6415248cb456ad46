"""Namespaces: enter new user, network, IPC and PID namespaces, and check from
``/proc/self/ns`` that each one changed.

:func:`enter_namespaces` unshares them in a single-threaded process; :func:`fork_into_pid_namespace`
forks the process that lives in the new PID namespace, the caller staying behind as its reaper.
Both the preflight child and the contained worker use them.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import socket
from collections.abc import Mapping
from types import MappingProxyType
from typing import NoReturn

from ckptgate.enforce.process_controls import PR_SET_NO_NEW_PRIVS, _libc

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
#: The namespaces the worker enters, by their /proc/self/ns link name, with their clone flag.
NAMESPACES: Mapping[str, int] = MappingProxyType(
    {"user": CLONE_NEWUSER, "net": CLONE_NEWNET, "ipc": CLONE_NEWIPC, "pid": CLONE_NEWPID}
)
PR_SET_PDEATHSIG = 1


def namespace_ids() -> dict[str, str | None]:
    """This process's namespace links (``user:[4026531837]``), by name, as ``/proc/self/ns`` shows them."""
    return {ns: _ns_link(ns) for ns in NAMESPACES}


def enter_namespaces(*, pid: bool = True) -> tuple[dict[str, bool], dict[str, str]]:
    """``unshare`` new user, network and IPC namespaces (and, with ``pid``, a PID namespace for
    this process's children) in this single-threaded process.

    Returns ``(held, details)`` for ``user_ns``, ``net_ns``, ``ipc_ns`` and ``pid_ns``, each checked
    by comparing the namespace links before and after; the network must have only ``lo`` and the
    IPC namespace no System V objects.  ``pid_ns`` here means only that ``pid_for_children``
    changed: the PID namespace holds for a child forked afterwards (:func:`fork_into_pid_namespace`),
    never for this process.  A namespace the host refuses is recorded as not held, with why.
    """
    names = ("user", "net", "ipc", *(("pid",) if pid else ()))
    held = {f"{ns}_ns": False for ns in NAMESPACES}
    details: dict[str, str] = {}
    before = namespace_ids()
    before["pid"] = _ns_link("pid_for_children")
    flags = 0
    for ns in names:
        flags |= NAMESPACES[ns]
    done = 0  # the flags whose unshare succeeded
    if _libc.unshare(flags) == 0:
        done = flags
    else:
        # The host may refuse one of them (PID namespaces are often refused in containers): try
        # again without PID, then each alone, so the profile says exactly which is missing.
        reason = (
            f"unshare({'|'.join('CLONE_NEW' + n.upper() for n in names)}) failed: {os.strerror(ctypes.get_errno())}"
        )
        rest = flags & ~CLONE_NEWPID
        if pid and _libc.unshare(rest) == 0:
            done = rest
        for ns in names:
            if not done & NAMESPACES[ns]:
                if _libc.unshare(NAMESPACES[ns]) == 0:
                    done |= NAMESPACES[ns]
                else:
                    details[f"{ns}_ns"] = (
                        f"{reason}; unshare(CLONE_NEW{ns.upper()}) alone failed: {os.strerror(ctypes.get_errno())}"
                    )
    after = namespace_ids()
    after["pid"] = _ns_link("pid_for_children")
    for ns in names:
        if not done & NAMESPACES[ns]:
            continue
        if ns == "pid":
            # pid_for_children reads ENOENT until the namespace's first process exists; the child
            # forked into it confirms it (fork_into_pid_namespace).
            held["pid_ns"] = after["pid"] != before["pid"]
        else:
            held[f"{ns}_ns"] = before[ns] is not None and after[ns] is not None and after[ns] != before[ns]
        if not held[f"{ns}_ns"]:
            details[f"{ns}_ns"] = f"the {ns} namespace did not change after unshare"
    if not pid:
        details["pid_ns"] = "a PID namespace was not asked for"
    if held["net_ns"]:
        names_now = sorted(n for _, n in socket.if_nameindex())
        if names_now != ["lo"]:
            held["net_ns"] = False
            details["net_ns"] = f"the new network namespace has interfaces {names_now}, expected only lo"
    if held["ipc_ns"]:
        objects = _sysv_objects()
        if objects:
            held["ipc_ns"] = False
            details["ipc_ns"] = f"the new IPC namespace shows System V objects: {objects}"
    return held, details


def _sysv_objects() -> dict[str, int]:
    """How many System V shared-memory segments, queues and semaphore sets this IPC namespace has."""
    out: dict[str, int] = {}
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as f:
                n = len(f.read().splitlines()) - 1
        except OSError:
            continue
        if n > 0:
            out[kind] = n
    return out


def fork_into_pid_namespace(before: str | None) -> tuple[bool, str]:
    """Fork after ``unshare(CLONE_NEWPID)``: the child, PID 1 of the new namespace, returns
    ``(held, detail)``; this process becomes its reaper and never returns.

    ``before`` is the PID namespace link before ``unshare``.  The reaper closes every descriptor
    but stderr, waits for the child and ends the same way: the child's exit status, or the child's
    fatal signal raised again (without a core dump), so the parent sees ``SIGSYS`` as before.
    The child dies with its reaper (``PR_SET_PDEATHSIG``).
    """
    child = os.fork()
    if child == 0:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        now = _ns_link("pid")
        if os.getpid() == 1 and now is not None and now != before:
            return True, ""
        return False, f"after the fork the worker is pid {os.getpid()} in namespace {now}"
    _reap(child)


def _reap(child: int) -> NoReturn:
    """The reaper's whole life: hold nothing, wait for ``child``, end as it ended."""
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.close(0)
        os.close(1)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        while True:
            _, status = os.waitpid(child, 0)
            if os.WIFEXITED(status):
                os._exit(os.WEXITSTATUS(status))
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
                os.kill(os.getpid(), sig)
                os._exit(128 + sig)
    except BaseException:  # the reaper must never continue as a worker
        os._exit(126)


def _ns_link(ns: str) -> str | None:
    try:
        return os.readlink(f"/proc/self/ns/{ns}")
    except OSError:
        return None
