"""The seccomp filter of the contained worker [R32].

Built with ``pyseccomp`` (ctypes over the host's libseccomp 2.5.x) rather than hand-written BPF:
libseccomp resolves syscall numbers per architecture, emits the architecture check and the x32
guard, and orders the comparisons for us; a hand-written program would have to get each of those
right itself.  ``pyseccomp`` is pinned in ``pins.toml``.

The filter is a *deny list over an allowing default*: CPython and torch make many ordinary
syscalls (mmap, futex, read, ...), and an allow list that is exact for one torch build breaks on
the next.  It is one containment layer, not a sandbox and not a validator [R32]; see
``docs/containment.md``.

Two actions are used:

* ``EPERM`` for path and file-system calls (opening, creating, renaming, removing, linking,
  changing mode or owner, truncating) and for signals or limits aimed at other processes, so that
  a lazy import that was not pre-imported fails with a clean Python error;
* ``KILL_PROCESS`` for what no deserializer needs: exec, new processes, sockets, ptrace and
  process-memory access, mounts and namespaces, BPF, perf, keys, kexec, modules, io_uring (which
  could open files without passing through this filter) and user-fault handling.

``clone3`` answers ``ENOSYS`` (its flags live in memory that seccomp cannot read), so glibc falls
back to ``clone``, whose flags it can: a ``clone`` without ``CLONE_THREAD`` (a new process) is
killed, a new thread is allowed, because torch starts worker threads.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import pyseccomp

from ckptgate.errors import RuntimeFailure

CLONE_THREAD = 0x00010000

#: Path and file-system calls: EPERM.
EPERM_SYSCALLS: tuple[str, ...] = (
    "open", "openat", "openat2", "creat", "open_by_handle_at", "name_to_handle_at",
    "mkdir", "mkdirat", "mknod", "mknodat", "rmdir",
    "unlink", "unlinkat", "rename", "renameat", "renameat2",
    "link", "linkat", "symlink", "symlinkat",
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat",
    "truncate", "ftruncate", "fallocate",
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    "getxattr", "lgetxattr", "listxattr", "llistxattr",
    "utime", "utimes", "futimesat", "utimensat",
    "memfd_create", "memfd_secret", "inotify_init", "inotify_init1", "inotify_add_watch",
    "fanotify_init", "fanotify_mark", "chdir", "fchdir",
)

#: Calls that no deserializer needs: the whole worker is killed.
KILL_SYSCALLS: tuple[str, ...] = (
    # exec and new processes
    "execve", "execveat", "fork", "vfork",
    # sockets
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_open",
    "pidfd_getfd", "pidfd_send_signal", "kcmp",
    # mounts, roots and namespaces
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "unshare", "setns",
    # kernel surfaces
    "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "reboot", "swapon", "swapoff", "acct", "quotactl",
    "iopl", "ioperm", "syslog", "uselib", "vhangup", "lookup_dcookie", "nfsservctl",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
)

#: Calls aimed at a pid: EPERM unless the first argument is the worker itself.
SELF_ONLY_SYSCALLS: tuple[str, ...] = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
                                       "prlimit64")


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterReport:
    """What :func:`build_filter` put in the filter, and which names this libseccomp does not know."""

    eperm: tuple[str, ...]
    kill: tuple[str, ...]
    self_only: tuple[str, ...]
    unknown: tuple[str, ...]


def _resolve(name: str) -> int | None:
    try:
        nr = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    except (OSError, ValueError):
        return None
    return nr if isinstance(nr, int) and nr >= 0 else None


def build_filter(*, self_pid: int | None = None) -> tuple[pyseccomp.SyscallFilter, FilterReport]:
    """The worker's filter (not loaded) and a report of its rules.

    ``self_pid`` is the pid that kill/tgkill/prlimit64 may still target (default: this process).
    """
    pid = os.getpid() if self_pid is None else self_pid
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    # A syscall of a foreign architecture (e.g. int 0x80 on x86_64) kills the process.
    f.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
    unknown: list[str] = []
    eperm: list[str] = []
    kill: list[str] = []
    self_only: list[str] = []
    for names, action, args, report in ((EPERM_SYSCALLS, pyseccomp.ERRNO(errno.EPERM), (), eperm),
                                         (KILL_SYSCALLS, pyseccomp.KILL_PROCESS, (), kill),
                                         (SELF_ONLY_SYSCALLS, pyseccomp.ERRNO(errno.EPERM),
                                          (pyseccomp.Arg(0, pyseccomp.NE, pid),), self_only)):
        for name in names:
            if _resolve(name) is None:
                unknown.append(name)
                continue
            f.add_rule(action, name, *args)
            report.append(name)
    # clone: threads only.  clone3: ENOSYS, so that glibc falls back to clone.
    f.add_rule(pyseccomp.KILL_PROCESS, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_THREAD, 0))
    kill.append("clone(!CLONE_THREAD)")
    if _resolve("clone3") is not None:
        f.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
        eperm.append("clone3(ENOSYS)")
    # tkill has no thread-group argument to check; glibc uses tgkill.
    if _resolve("tkill") is not None:
        f.add_rule(pyseccomp.ERRNO(errno.EPERM), "tkill")
        eperm.append("tkill")
    return f, FilterReport(eperm=tuple(eperm), kill=tuple(kill), self_only=tuple(self_only),
                           unknown=tuple(unknown))


def load_filter(*, self_pid: int | None = None) -> FilterReport:
    """Build and load the filter into this process (all threads must be ours; call it last).

    Requires ``no_new_privs`` (or CAP_SYS_ADMIN); raises :class:`RuntimeFailure` if the kernel
    refuses the filter.
    """
    try:
        f, report = build_filter(self_pid=self_pid)
        f.load()
    except OSError as e:
        raise RuntimeFailure("runtime.seccomp.load_failed",
                             f"the kernel refused the seccomp filter: {e.strerror or e}",
                             evidence={"errno": e.errno}) from e
    return report
