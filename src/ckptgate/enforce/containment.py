"""Containment preflight: which OS controls actually hold on this host, measured in a child.

:func:`preflight` does not read configuration to guess: it starts a throwaway child
(``python -m ckptgate.enforce.containment``) that *uses* each control and reports whether it
held: ``openat2`` refuses ``../x`` with EXDEV [R35], new user, network and IPC namespaces can be
entered, and a PID namespace where the host allows it (the child forks into it, as the worker
does), the rlimits are set and read back (and RLIMIT_FSIZE really refuses a write), the
``no_new_privs`` flag shows in ``/proc/self/status`` [R31], and the worker's own allowlist
seccomp filter loads, makes ``openat`` and an unlisted syscall fail with EPERM and kills the child
on ``execve()`` [R32].  The parent
checks cgroup v2 itself: memory and pids controllers in a v2 hierarchy where it can create a child
group [R33].

The result, :class:`ContainmentProfile`, is the ``containment`` object of the OPA input.  It
records what held on this host at this time; it is not a claim that any load is safe, and it does
not carry over to another host or kernel [R30, claim rules 5 and 7].

The same helpers (:func:`enter_namespaces`, :func:`fork_into_pid_namespace`, :func:`apply_rlimits`,
:func:`set_no_new_privs`) set the controls up inside the contained worker.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn

from ckptgate._fs import openat2  # one openat2 for the whole project [R35]
from ckptgate.errors import RuntimeFailure

#: Every control the preflight measures, in the order the OPA input lists them.
CONTROLS: tuple[str, ...] = (
    "no_new_privs",
    "seccomp",
    "rlimits",
    "cgroup_v2",
    "user_ns",
    "net_ns",
    "ipc_ns",
    "pid_ns",
    "openat2",
)

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
#: The namespaces the worker enters, by their /proc/self/ns link name, with their clone flag.
NAMESPACES: Mapping[str, int] = MappingProxyType(
    {"user": CLONE_NEWUSER, "net": CLONE_NEWNET, "ipc": CLONE_NEWIPC, "pid": CLONE_NEWPID}
)
PR_SET_PDEATHSIG = 1
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

_PROBE_RLIMITS: Mapping[str, int] = MappingProxyType(
    {
        "AS": 64 << 30,
        "CPU": 60,
        "FSIZE": 4096,
        "NOFILE": 256,
        "NPROC": 256,
    }
)

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainmentProfile:
    """Which containment controls held in a preflight on this host.

    ``controls`` has exactly the names in :data:`CONTROLS`; ``details`` says, for a control that
    did not hold, why (and may say what was found for one that did).
    """

    controls: Mapping[str, bool]
    details: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    kernel: str

    def __post_init__(self) -> None:
        controls = dict(self.controls)
        if set(controls) != set(CONTROLS):
            raise ValueError(f"controls must be exactly {sorted(CONTROLS)}, got {sorted(controls)}")
        if not all(isinstance(v, bool) for v in controls.values()):
            raise ValueError("every control must be a bool")
        details = dict(self.details)
        if not set(details) <= set(CONTROLS) or not all(isinstance(v, str) for v in details.values()):
            raise ValueError("details must map control names to strings")
        if not isinstance(self.kernel, str) or not self.kernel:
            raise ValueError("kernel must be a non-empty string")
        object.__setattr__(self, "controls", MappingProxyType({c: controls[c] for c in CONTROLS}))
        object.__setattr__(self, "details", MappingProxyType(details))

    @property
    def active(self) -> tuple[str, ...]:
        """The controls that held."""
        return tuple(c for c in CONTROLS if self.controls[c])

    def to_facts(self) -> dict[str, Any]:
        """The ``containment`` object of the OPA input (``docs/architecture.md``)."""
        return {
            "preflighted": True,
            "controls": dict(self.controls),
            "details": dict(self.details),
            "kernel": self.kernel,
        }


# --------------------------------------------------------------------------- shared helpers


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


# --------------------------------------------------------------------------- cgroup v2


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupV2Slot:
    """A child cgroup v2 group with memory and pids limits, for one worker [R33]."""

    path: str  # absolute path in the cgroup filesystem
    relpath: str  # as /proc/<pid>/cgroup shows it ("0::<relpath>")

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(f"{pid}\n")

    def remove(self) -> None:
        """Kill whatever is left in the group and remove it (best effort)."""
        try:
            with open(os.path.join(self.path, "cgroup.kill"), "w", encoding="ascii") as f:
                f.write("1\n")
        except OSError:
            pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def _v2_mount(mountinfo: str) -> str | None:
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            return left.split(" ")[4]
    return None


def _v2_relpath(proc_cgroup: str) -> str | None:
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def cgroup_v2_slot(*, memory_max: int, pids_max: int, root: str = "/") -> tuple[CgroupV2Slot | None, str]:
    """Create a child group with ``memory.max`` and ``pids.max`` set, or say why not.

    ``root`` prefixes ``/proc`` (for tests on a fake tree).
    """
    try:
        with open(os.path.join(root, "proc/self/mountinfo"), encoding="utf-8") as f:
            mount = _v2_mount(f.read())
        with open(os.path.join(root, "proc/self/cgroup"), encoding="utf-8") as f:
            rel = _v2_relpath(f.read())
    except OSError as e:
        return None, f"cannot read the process's cgroup information: {e}"
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if rel is None:
        return None, "this process has no cgroup v2 membership (no '0::' line)"
    base = os.path.join(root, mount.lstrip("/"), rel.lstrip("/"))
    try:
        with open(os.path.join(base, "cgroup.controllers"), encoding="ascii") as f:
            available = f.read().split()
    except OSError as e:
        return None, f"cannot read cgroup.controllers at {base}: {e}"
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        return None, (
            f"cgroup v2 at {mount} offers controllers {available or ['none']}; "
            f"{' and '.join(missing)} missing (they may be bound to cgroup v1)"
        )
    try:
        with open(os.path.join(base, "cgroup.subtree_control"), encoding="ascii") as f:
            enabled = f.read().split()
        if not {"memory", "pids"} <= set(enabled):
            with open(os.path.join(base, "cgroup.subtree_control"), "w", encoding="ascii") as f:
                f.write("+memory +pids\n")
    except OSError as e:
        return None, f"cannot enable memory and pids for child groups of {base}: {e}"
    name = f"ckptgate-{secrets.token_hex(6)}"
    path = os.path.join(base, name)
    try:
        os.mkdir(path, 0o755)
    except OSError as e:
        return None, f"cannot create a child group under {base}: {e}"
    slot = CgroupV2Slot(path=path, relpath=os.path.join(rel, name))
    try:
        for knob, value in (("memory.max", memory_max), ("memory.swap.max", 0), ("pids.max", pids_max)):
            knob_path = os.path.join(path, knob)
            if knob == "memory.swap.max" and not os.path.exists(knob_path):
                continue
            with open(knob_path, "w", encoding="ascii") as f:
                f.write(f"{value}\n")
    except OSError as e:
        slot.remove()
        return None, f"cannot set limits in {path}: {e}"
    return slot, ""


# --------------------------------------------------------------------------- preflight


def preflight(*, timeout_s: float = 30.0) -> ContainmentProfile:
    """Measure every control in a throwaway child and return the profile of this host."""
    controls = dict.fromkeys(CONTROLS, False)
    details: dict[str, str] = {}
    slot, why = cgroup_v2_slot(memory_max=256 << 20, pids_max=16)
    if slot is not None:
        controls["cgroup_v2"] = True
        slot.remove()
    else:
        details["cgroup_v2"] = why
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-B", "-m", "ckptgate.enforce.containment"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=env,
            cwd="/",
            timeout=timeout_s,
            check=False,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeFailure(
            "runtime.preflight.timeout", f"the containment preflight child did not finish in {timeout_s:g} s"
        ) from e
    except OSError as e:
        raise RuntimeFailure("runtime.preflight.spawn_failed", f"cannot start the preflight child: {e}") from e
    seen: dict[str, tuple[bool, str]] = {}
    for raw in proc.stdout.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if (
            isinstance(rec, dict)
            and set(rec) == {"control", "ok", "detail"}
            and isinstance(rec["ok"], bool)
            and isinstance(rec["detail"], str)
        ):
            seen[str(rec["control"])] = (rec["ok"], rec["detail"])
    for name in ("openat2", "user_ns", "net_ns", "ipc_ns", "pid_ns", "rlimits", "no_new_privs"):
        ok, detail = seen.get(name, (False, "the preflight child did not report this control"))
        controls[name] = ok
        if detail:
            details[name] = detail
    # seccomp holds only if the allowlist answered EPERM *and* execve() then killed the child with SIGSYS.
    eperm_ok, eperm_detail = seen.get("seccomp", (False, "the preflight child did not report seccomp"))
    killed = proc.returncode == -signal.SIGSYS
    if eperm_ok and killed:
        controls["seccomp"] = True
    else:
        details["seccomp"] = eperm_detail or (
            f"execve() under the filter did not kill the child (exit status {proc.returncode})"
        )
    return ContainmentProfile(controls=controls, details=details, kernel=os.uname().release)


def _emit(control: str, ok: bool, detail: str = "") -> None:
    sys.stdout.write(json.dumps({"control": control, "ok": ok, "detail": detail}) + "\n")
    sys.stdout.flush()


def _probe_openat2(tmp: str) -> None:
    dirfd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with open(os.path.join(tmp, "inside"), "w", encoding="ascii") as f:
            f.write("x")
        os.symlink("inside", os.path.join(tmp, "link"))
        try:
            os.close(openat2(dirfd, "inside"))
        except OSError as e:
            _emit("openat2", False, f"openat2 of a plain file beneath the root failed: {e.strerror}")
            return
        for path, want in (("../x", errno.EXDEV), ("link", errno.ELOOP), ("/etc/hostname", errno.EXDEV)):
            try:
                os.close(openat2(dirfd, path))
            except OSError as e:
                if e.errno != want:
                    _emit(
                        "openat2",
                        False,
                        f"openat2({path!r}) failed with {errno.errorcode.get(e.errno or 0)}"
                        f", expected {errno.errorcode[want]}",
                    )
                    return
            else:
                _emit("openat2", False, f"openat2({path!r}) escaped the root")
                return
        _emit("openat2", True)
    finally:
        os.close(dirfd)


def _probe_rlimits(tmp: str) -> None:
    ok, detail = apply_rlimits(_PROBE_RLIMITS)
    if ok:
        # RLIMIT_FSIZE must really refuse a write past the limit (SIGXFSZ is ignored by CPython).
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        fd = os.open(os.path.join(tmp, "big"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            written = os.write(fd, b"\0" * (_PROBE_RLIMITS["FSIZE"] * 2))
            if written > _PROBE_RLIMITS["FSIZE"]:
                ok, detail = False, "RLIMIT_FSIZE did not stop a write past the limit"
        except OSError as e:
            if e.errno != errno.EFBIG:
                ok, detail = False, f"a write past RLIMIT_FSIZE failed with {e}, not EFBIG"
        finally:
            os.close(fd)
    _emit("rlimits", ok, detail)


def _probe_main() -> int:
    """Runs in the throwaway child: use each control, report, then die on execve()."""
    # pyseccomp raises at import on a host without libseccomp: only this child may fail on it, so
    # the parent's preflight still reports every other control (and seccomp as not held).
    from ckptgate.enforce.seccomp import load_filter  # noqa: PLC0415 - libseccomp may be absent

    with tempfile.TemporaryDirectory(prefix="ckptgate-preflight-") as tmp:
        _probe_openat2(tmp)
        before_pid = _ns_link("pid")
        held, details = enter_namespaces(pid=True)
        if held["pid_ns"]:  # the reaper stays behind in fork_into_pid_namespace
            held["pid_ns"], details["pid_ns"] = fork_into_pid_namespace(before_pid)
        for name in ("user_ns", "net_ns", "ipc_ns", "pid_ns"):
            _emit(name, held[name], details.get(name, ""))
        _probe_rlimits(tmp)
    ok, detail = set_no_new_privs()
    _emit("no_new_privs", ok, detail)
    try:
        load_filter()
    except RuntimeFailure as e:
        _emit("seccomp", False, e.message)
        return 0
    ok, detail = seccomp_active()
    _emit("seccomp", ok, detail)
    os.execv("/bin/true", ["true"])  # must be killed here (SIGSYS)
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main())
