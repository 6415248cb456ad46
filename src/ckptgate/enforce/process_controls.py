"""The controls a process sets on itself and reads back: rlimits, ``no_new_privs`` [R31], and
whether the loaded seccomp filter answers as an allowlist [R32].

Each setter returns ``(held, detail)``: it uses the control and checks that it took, rather than
trusting the call's return.  The filter itself is :mod:`ckptgate.enforce.seccomp`'s.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
from collections.abc import Mapping
from types import MappingProxyType

PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
PR_GET_SECCOMP = 21
SECCOMP_MODE_FILTER = 2
#: A syscall number that no kernel defines and no filter table names: the kernel answers ENOSYS,
#: an allowlist filter EPERM.  Below the x32 bit, so it is judged by the filter's own tables.
UNLISTED_SYSCALL = 0x3FFF

#: rlimit names used in job specs and the preflight, mapped to the ``resource`` constants.
RLIMITS: Mapping[str, int] = MappingProxyType(
    {
        "AS": resource.RLIMIT_AS,
        "CPU": resource.RLIMIT_CPU,
        "FSIZE": resource.RLIMIT_FSIZE,
        "NOFILE": resource.RLIMIT_NOFILE,
        "NPROC": resource.RLIMIT_NPROC,
    }
)

_libc = ctypes.CDLL(None, use_errno=True)


def apply_rlimits(limits: Mapping[str, int]) -> tuple[bool, str]:
    """Set each rlimit (soft = hard) and read it back; ``(held, detail)``."""
    if set(limits) != set(RLIMITS):
        return False, f"rlimits must name exactly {sorted(RLIMITS)}"
    for name, value in limits.items():
        res = RLIMITS[name]
        try:
            _, hard = resource.getrlimit(res)
            want = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(res, (want, want))
            if resource.getrlimit(res) != (want, want):
                return False, f"RLIMIT_{name} did not read back as {want}"
        except (OSError, ValueError) as e:
            return False, f"setrlimit(RLIMIT_{name}, {value}) failed: {e}"
    return True, ""


def set_no_new_privs() -> tuple[bool, str]:
    """Set ``no_new_privs`` and confirm it with prctl and ``/proc/self/status`` [R31]."""
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    if _libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        return False, "prctl(PR_GET_NO_NEW_PRIVS) does not report the flag"
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            status = f.read()
    except OSError as e:
        return False, f"cannot read /proc/self/status: {e}"
    if "NoNewPrivs:\t1" not in status:
        return False, "/proc/self/status does not show NoNewPrivs: 1"
    return True, ""


def seccomp_active() -> tuple[bool, str]:
    """Whether the worker's allowlist filter is loaded and answers as it should.

    ``PR_GET_SECCOMP`` reports filter mode, ``openat`` fails with EPERM, and a syscall number
    that no table names (:data:`UNLISTED_SYSCALL`) fails with EPERM, the allowlist's default,
    rather than ENOSYS, the kernel's answer: a deny list would pass it through.
    """
    if _libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0) != SECCOMP_MODE_FILTER:
        return False, "prctl(PR_GET_SECCOMP) does not report filter mode"
    try:
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    except PermissionError:
        pass
    except OSError as e:
        return False, f"openat failed with {errno.errorcode.get(e.errno or 0, e.errno)}, not EPERM"
    else:
        os.close(fd)
        return False, "openat still succeeds under the filter"
    if _libc.syscall(UNLISTED_SYSCALL) != -1 or ctypes.get_errno() != errno.EPERM:
        return False, (
            f"an unlisted syscall was not refused with EPERM "
            f"({errno.errorcode.get(ctypes.get_errno(), '?')}): the filter is not an allowlist"
        )
    return True, ""


def read_status(fd: int) -> dict[str, int]:
    """``Seccomp``, ``Seccomp_filters`` and ``NoNewPrivs`` from ``/proc/self/status``, read through
    a descriptor opened before the filter (opening it afterwards is refused)."""
    data = os.pread(fd, 1 << 16, 0).decode("ascii", "replace")
    out: dict[str, int] = {}
    for line in data.splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("Seccomp", "Seccomp_filters", "NoNewPrivs") and value.strip().isdigit():
            out[key] = int(value.strip())
    return out
