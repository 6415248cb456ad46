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

The helpers that set the controls up, in the preflight child and inside the contained worker, live
in :mod:`ckptgate.enforce.namespaces` (:func:`enter_namespaces`, :func:`fork_into_pid_namespace`),
:mod:`ckptgate.enforce.process_controls` (:func:`apply_rlimits`, :func:`set_no_new_privs`,
:func:`seccomp_active`) and :mod:`ckptgate.enforce.cgroup` (:func:`cgroup_v2_slot`); they are
re-exported here.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckptgate._fs import openat2  # one openat2 for the whole project [R35]
from ckptgate.enforce.cgroup import CgroupV2Slot, cgroup_v2_slot
from ckptgate.enforce.namespaces import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    NAMESPACES,
    PR_SET_PDEATHSIG,
    _ns_link,
    enter_namespaces,
    fork_into_pid_namespace,
    namespace_ids,
)
from ckptgate.enforce.process_controls import (
    PR_GET_NO_NEW_PRIVS,
    PR_GET_SECCOMP,
    PR_SET_NO_NEW_PRIVS,
    RLIMITS,
    SECCOMP_MODE_FILTER,
    UNLISTED_SYSCALL,
    apply_rlimits,
    read_status,
    seccomp_active,
    set_no_new_privs,
)
from ckptgate.errors import RuntimeFailure

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "CONTROLS",
    "NAMESPACES",
    "PR_GET_NO_NEW_PRIVS",
    "PR_GET_SECCOMP",
    "PR_SET_NO_NEW_PRIVS",
    "PR_SET_PDEATHSIG",
    "RLIMITS",
    "SECCOMP_MODE_FILTER",
    "UNLISTED_SYSCALL",
    "CgroupV2Slot",
    "ContainmentProfile",
    "apply_rlimits",
    "cgroup_v2_slot",
    "enter_namespaces",
    "fork_into_pid_namespace",
    "namespace_ids",
    "openat2",
    "preflight",
    "read_status",
    "seccomp_active",
    "set_no_new_privs",
]

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

_PROBE_RLIMITS: Mapping[str, int] = MappingProxyType(
    {
        "AS": 64 << 30,
        "CPU": 60,
        "FSIZE": 4096,
        "NOFILE": 256,
        "NPROC": 256,
    }
)


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
