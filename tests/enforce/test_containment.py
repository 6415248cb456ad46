"""Containment preflight, the profile record, cgroup v2 slots and the seccomp filter."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ckptgate.enforce import cgroup, containment
from ckptgate.enforce.containment import CONTROLS, ContainmentProfile, cgroup_v2_slot, openat2, preflight
from ckptgate.enforce.seccomp import ALLOWED, CONDITIONAL, KEPT, KILL, build_filter
from ckptgate.errors import RuntimeFailure

# --------------------------------------------------------------------------- profile


def _controls(**overrides: bool) -> dict[str, bool]:
    out = {c: True for c in CONTROLS}
    out.update(overrides)
    return out


def test_profile_to_facts_is_the_opa_containment_object() -> None:
    p = ContainmentProfile(controls=_controls(cgroup_v2=False), details={"cgroup_v2": "no memory controller"},
                           kernel="6.18.0")
    facts = p.to_facts()
    assert facts == {"preflighted": True, "controls": _controls(cgroup_v2=False),
                     "details": {"cgroup_v2": "no memory controller"}, "kernel": "6.18.0"}
    assert list(facts["controls"]) == list(CONTROLS)
    assert "cgroup_v2" not in p.active and "seccomp" in p.active
    json.dumps(facts)  # JSON-serialisable
    with pytest.raises(TypeError):
        p.controls["seccomp"] = False  # type: ignore[index]


@pytest.mark.parametrize("kwargs", [
    {"controls": {"seccomp": True}, "kernel": "x"},
    {"controls": {**_controls(), "extra": True}, "kernel": "x"},
    {"controls": _controls(seccomp=1), "kernel": "x"},  # type: ignore[arg-type]
    {"controls": _controls(), "details": {"nope": "x"}, "kernel": "x"},
    {"controls": _controls(), "kernel": ""},
])
def test_profile_rejects_bad_records(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ContainmentProfile(**kwargs)


# --------------------------------------------------------------------------- preflight on this host


@pytest.fixture(scope="module")
def host_profile() -> ContainmentProfile:
    return preflight()


def test_preflight_measures_each_control_and_explains_every_missing_one(host_profile: ContainmentProfile) -> None:
    assert set(host_profile.controls) == set(CONTROLS)
    assert host_profile.kernel == os.uname().release
    for name, held in host_profile.controls.items():
        if not held:
            assert host_profile.details.get(name), f"{name} is missing without a reason"
    # These hold on every Linux host this project supports (kernel >= 5.6, libseccomp 2.5).
    for name in ("no_new_privs", "seccomp", "rlimits", "openat2"):
        assert host_profile.controls[name], host_profile.details.get(name)


def test_preflight_namespaces_agree_with_unshare_1(host_profile: ContainmentProfile) -> None:
    tool = shutil.which("unshare")
    if tool is None:
        pytest.skip("util-linux unshare is not installed")
    ok = subprocess.run([tool, "-U", "-n", "-i", "true"], capture_output=True, check=False).returncode == 0
    assert host_profile.controls["user_ns"] is ok
    assert host_profile.controls["net_ns"] is ok
    assert host_profile.controls["ipc_ns"] is ok
    pid_ok = subprocess.run([tool, "-U", "-n", "-i", "-p", "-f", "true"], capture_output=True,
                            check=False).returncode == 0
    assert host_profile.controls["pid_ns"] is pid_ok, host_profile.details.get("pid_ns")


def test_preflight_cgroup_v2_agrees_with_the_hierarchy(host_profile: ContainmentProfile) -> None:
    mount = cgroup._v2_mount(Path("/proc/self/mountinfo").read_text())
    rel = cgroup._v2_relpath(Path("/proc/self/cgroup").read_text())
    if mount is None or rel is None:
        assert host_profile.controls["cgroup_v2"] is False
        return
    controllers = (Path(mount) / rel.lstrip("/") / "cgroup.controllers").read_text().split()
    if not {"memory", "pids"} <= set(controllers):
        # This workplace's hosts: a hybrid hierarchy whose v2 part has only hugetlb.
        assert host_profile.controls["cgroup_v2"] is False
        assert "memory" in host_profile.details["cgroup_v2"]
    else:  # both offered: a limited child group can be made wherever this process may write
        writable = os.access(Path(mount) / rel.lstrip("/") / "cgroup.subtree_control", os.W_OK)
        assert host_profile.controls["cgroup_v2"] is writable, host_profile.details.get("cgroup_v2")


def _fake_child(monkeypatch: pytest.MonkeyPatch, lines: list[dict[str, Any]], returncode: int) -> None:
    def run(*a: Any, **k: Any) -> subprocess.CompletedProcess[bytes]:
        out = "".join(json.dumps(x) + "\n" for x in lines).encode()
        return subprocess.CompletedProcess(a[0], returncode, out, b"")

    monkeypatch.setattr(containment.subprocess, "run", run)


def _all_ok() -> list[dict[str, Any]]:
    return [{"control": c, "ok": True, "detail": ""}
            for c in ("openat2", "user_ns", "net_ns", "ipc_ns", "pid_ns", "rlimits", "no_new_privs", "seccomp")]


def test_preflight_seccomp_needs_the_kill_as_well_as_eperm(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_child(monkeypatch, _all_ok(), -signal.SIGSYS)
    assert preflight().controls["seccomp"] is True
    _fake_child(monkeypatch, _all_ok(), 0)  # execve() was not killed
    p = preflight()
    assert p.controls["seccomp"] is False and "did not kill" in p.details["seccomp"]


def test_preflight_reports_controls_the_child_did_not_confirm(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [x for x in _all_ok() if x["control"] != "net_ns"]
    lines[1] = {"control": "user_ns", "ok": False, "detail": "unshare failed: EPERM"}
    lines.append({"control": "rlimits", "ok": "yes", "detail": ""})  # malformed: ignored, not trusted
    _fake_child(monkeypatch, lines, -signal.SIGSYS)
    p = preflight()
    assert p.controls["user_ns"] is False and p.details["user_ns"] == "unshare failed: EPERM"
    assert p.controls["net_ns"] is False and "did not report" in p.details["net_ns"]


def test_preflight_timeout_is_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(*a: Any, **k: Any) -> Any:
        raise subprocess.TimeoutExpired(a[0], k["timeout"])

    monkeypatch.setattr(containment.subprocess, "run", run)
    with pytest.raises(RuntimeFailure) as ei:
        preflight(timeout_s=0.1)
    assert ei.value.code == "runtime.preflight.timeout"


# --------------------------------------------------------------------------- cgroup v2 (fake trees)


def _fake_cgroup_tree(tmp: Path, controllers: str, *, v2: bool = True) -> Path:
    (tmp / "proc/self").mkdir(parents=True)
    fstype = "cgroup2" if v2 else "cgroup"
    (tmp / "proc/self/mountinfo").write_text(
        "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        f"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - {fstype} {fstype} rw\n")
    (tmp / "proc/self/cgroup").write_text("4:memory:/x\n0::/jobs\n")
    base = tmp / "sys/fs/cgroup/unified/jobs"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text(controllers + "\n")
    (base / "cgroup.subtree_control").write_text("")
    return base


def test_cgroup_v2_without_memory_controller_is_explained(tmp_path: Path) -> None:
    _fake_cgroup_tree(tmp_path, "hugetlb")
    slot, why = cgroup_v2_slot(memory_max=1 << 30, pids_max=64, root=str(tmp_path))
    assert slot is None and "['hugetlb']" in why and "memory and pids missing" in why


def test_cgroup_v2_not_mounted_is_explained(tmp_path: Path) -> None:
    _fake_cgroup_tree(tmp_path, "memory pids", v2=False)
    slot, why = cgroup_v2_slot(memory_max=1 << 30, pids_max=64, root=str(tmp_path))
    assert slot is None and why == "no cgroup v2 hierarchy is mounted"


def test_cgroup_v2_slot_enables_controllers_and_writes_limits(tmp_path: Path) -> None:
    base = _fake_cgroup_tree(tmp_path, "cpu memory pids")
    slot, why = cgroup_v2_slot(memory_max=1 << 30, pids_max=64, root=str(tmp_path))
    assert slot is not None and why == ""
    assert (base / "cgroup.subtree_control").read_text() == "+memory +pids\n"
    group = Path(slot.path)
    assert group.parent == base and group.name.startswith("ckptgate-")
    assert slot.relpath == f"/jobs/{group.name}"
    assert (group / "memory.max").read_text() == f"{1 << 30}\n"
    assert (group / "pids.max").read_text() == "64\n"
    slot.add(1234)
    assert (group / "cgroup.procs").read_text() == "1234\n"


# --------------------------------------------------------------------------- openat2


def test_openat2_stays_beneath_its_root(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root/f").write_text("in")
    (tmp_path / "outside").write_text("out")
    (tmp_path / "root/link").symlink_to("../outside")
    dirfd = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = openat2(dirfd, "f")
        assert os.read(fd, 10) == b"in"
        os.close(fd)
        for path, want in (("../outside", errno.EXDEV), ("link", errno.ELOOP), (str(tmp_path / "outside"), errno.EXDEV)):
            with pytest.raises(OSError) as ei:
                openat2(dirfd, path)
            assert ei.value.errno == want, path
    finally:
        os.close(dirfd)


# --------------------------------------------------------------------------- seccomp filter


#: Calls that must never be allowed outright: each reaches another process, the host's IPC, the
#: network, the kernel's surfaces or the file system by path.
_NEVER_ALLOWED = (
    "open", "openat", "openat2", "creat", "mkdir", "unlink", "rename", "link", "symlink", "chmod", "chown",
    "truncate", "execve", "execveat", "fork", "vfork", "socket", "socketpair", "connect", "bind", "ptrace",
    "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf",
    "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load", "init_module", "io_uring_setup",
    "userfaultfd", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
    "ioprio_set", "shmget", "shmat", "msgget", "msgsnd", "semget", "mq_open", "pidfd_open", "kcmp", "clone3",
    "ioctl", "memfd_create", "pkey_mprotect",
)


def test_filter_is_an_allowlist_with_a_reason_for_every_entry() -> None:
    _, report = build_filter()
    assert report.mode == "allowlist" and report.default == "EPERM"
    assert report.unknown == () or set(report.unknown) <= {"membarrier", "rseq"}
    assert all(isinstance(why, str) and why for why in (*ALLOWED.values(), *KEPT.values()))
    assert all(why for *_, why in CONDITIONAL)
    assert not set(_NEVER_ALLOWED) & (set(ALLOWED) | set(KEPT))
    assert set(report.allowed) == (set(ALLOWED) | set(KEPT)) - set(report.unknown)
    conditional = {name for name, *_ in CONDITIONAL}
    assert not set(_NEVER_ALLOWED) & conditional
    for name in ("execve", "execveat", "fork", "vfork", "clone(!CLONE_THREAD)"):
        assert name in report.kill
    assert set(KILL) <= set(report.kill)
    assert len(report.digest()) == 64


_CHILD = textwrap.dedent('''
    import ctypes, errno, os, sys, threading
    import pyseccomp
    from ckptgate.enforce.containment import set_no_new_privs
    from ckptgate.enforce.seccomp import load_filter
    assert set_no_new_privs()[0]
    load_filter()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    mode = sys.argv[1]
    def report(**kw):
        print(__import__("json").dumps(kw), flush=True)
    def nr(name):
        return pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    def sys_(name, *args):
        r = libc.syscall(ctypes.c_long(nr(name)), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        return [r, ctypes.get_errno() if r == -1 else 0]
    if mode == "benign":
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("thread", True)); t.start(); t.join()
        for label, fn in (("open", lambda: os.open("/etc/hostname", os.O_RDONLY)),
                          ("mkdir", lambda: os.mkdir("/tmp/ckptgate-never")),
                          ("kill_other", lambda: os.kill(1, 0))):
            try:
                fn(); out[label] = "ok"
            except OSError as e:
                out[label] = e.errno
        out["kill_self"] = os.kill(os.getpid(), 0) is None
        out["clone3"] = sys_("clone3", None, 0)
        out["unlisted"] = [libc.syscall(0x3FFF), ctypes.get_errno()]
        out["mmap_exec"] = sys_("mmap", 0, 4096, 7, 0x22, -1, 0)
        out["mmap_rw"] = sys_("mmap", 0, 4096, 3, 0x22, -1, 0)[0] > 0
        out["affinity_self"] = sys_("sched_getaffinity", 0, 128, ctypes.create_string_buffer(128))
        out["setpriority_self"] = sys_("setpriority", 0, 0, 5)
        out["affinity_pid1"] = sys_("sched_getaffinity", 1, 128, ctypes.create_string_buffer(128))
        out["prctl_other"] = sys_("prctl", 4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
        out["socket"] = sys_("socket", 1, 1, 0)
        out["ptrace"] = sys_("ptrace", 16, 1, 0, 0)
        out["io_uring"] = sys_("io_uring_setup", 8, ctypes.create_string_buffer(120))
        # a thread with a namespace flag: the kernel itself says EINVAL, so EPERM is the filter
        out["clone_ns_thread"] = sys_("clone", 0x00010000 | 0x00000800 | 0x00000100 | 0x10000000, 0, 0, 0, 0)
        report(**out)
    elif mode == "fork":
        os.fork()
    elif mode == "clone_process":
        sys_("clone", 17, 0, 0, 0, 0)  # SIGCHLD: a new process
    elif mode == "exec":
        os.execv("/bin/true", ["true"])
    elif mode == "x32":
        libc.syscall(0x40000000 | 257, -100, b"/etc/hostname", 0)
    report(survived=True)
''')


def _child(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, timeout=60,
                          check=False)


def test_filter_allows_threads_and_refuses_the_rest_with_eperm() -> None:
    proc = _child("benign")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[0])
    assert out["thread"] is True and out["kill_self"] is True and out["mmap_rw"] is True
    assert out["open"] == errno.EPERM and out["mkdir"] == errno.EPERM and out["kill_other"] == errno.EPERM
    assert out["clone3"] == [-1, errno.ENOSYS]
    for label in ("unlisted", "mmap_exec", "affinity_self", "affinity_pid1", "setpriority_self", "prctl_other",
                  "socket", "ptrace", "io_uring",
                  "clone_ns_thread"):
        assert out[label] == [-1, errno.EPERM], (label, out[label])
    assert not Path("/tmp/ckptgate-never").exists()


@pytest.mark.parametrize("mode", ["fork", "clone_process", "exec", "x32"])
def test_filter_kills_the_process(mode: str) -> None:
    proc = _child(mode)
    assert proc.returncode == -signal.SIGSYS, (proc.returncode, proc.stdout, proc.stderr)
    assert "survived" not in proc.stdout
