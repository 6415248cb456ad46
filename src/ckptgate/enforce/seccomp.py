"""The seccomp filter of the contained worker: an allowlist for the load phase [R32].

Built with ``pyseccomp`` (ctypes over the host's libseccomp 2.5.x) rather than hand-written BPF:
libseccomp resolves syscall numbers per architecture, emits the architecture check and the x32
guard, and orders the comparisons for us; a hand-written program would have to get each of those
right itself.  ``pyseccomp`` is pinned in ``pins.toml``.

The filter is an *allowlist*: a syscall that is not in :data:`ALLOWED`, :data:`KEPT` or
:data:`CONDITIONAL` fails with ``EPERM`` (the default action), so a syscall nobody thought of is
refused, not passed to the kernel.  The table was measured, not guessed: the pinned
``torch.load`` and the DeepSpeed loader classes were run in the worker under ``strace -f`` after
the pre-imports, and every syscall made after the filter was loaded is listed with the reason it
is needed (see ``docs/containment.md``).  Where a needed syscall is dangerous, its arguments are
restricted (:data:`CONDITIONAL`): threads but not processes or namespaces, no executable
mappings, limits and signals only for the worker itself, one ``prctl`` command.  Nothing that
names another process (``setpriority``, ``sched_set*``, ``ioprio_set``, ``ptrace``,
``process_vm_*``, ``pidfd_*``), System V or POSIX IPC, a socket, ``ioctl`` or ``fcntl`` is allowed.
EPERM rather than a kill as the default, because a call that a load makes but does not need
(``sched_getaffinity``, say) then fails softly instead of ending the load.

A few calls kill the whole worker instead (:data:`KILL`): starting a program or a process is the
classic payload, and no loader does it, so the attempt ends the load at once (``SIGSYS``) and the
parent reports it.

The filter is one containment layer, not a sandbox and not a validator [R32].
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import pyseccomp

from ckptgate.errors import RuntimeFailure

#: The filter's mode, as the worker reports it on the receipt.
MODE = "allowlist"
#: The default action, for every syscall the tables below do not name.
DEFAULT_ACTION = "EPERM"

CLONE_THREAD = 0x00010000
#: Namespace flags that a new thread must not carry (a thread in the worker's own user namespace
#: holds every capability there, so it could otherwise make new mount, IPC or UTS namespaces).
CLONE_NS_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
PROT_EXEC = 0x4

#: Syscalls allowed with any arguments, each with why the load phase needs it.  Measured: the
#: pinned torch 2.13 ``torch.load`` (zip and legacy formats, plan and bytes jobs, a 32 MiB tensor
#: and its transposed copy), DeepSpeed 0.19.8's ``LossScaler``, ``ZeroStageEnum`` and
#: ``fragment_address`` and torch's intra-op thread pool were run in the worker under
#: ``strace -f``; these are the calls made after the filter was loaded.  Each acts on the worker
#: itself or on a descriptor it already holds; ``newfstatat`` is the one that takes a path (see the
#: stat caveat in ``docs/containment.md``).
ALLOWED: Mapping[str, str] = MappingProxyType(
    {
        # the inputs and the output pipe: descriptors the parent handed over
        "read": "io.FileIO.read of an input descriptor (torch.load reads the zip and the pickle)",
        "pread64": "re-hashing the inputs; /proc/self/status through the descriptor opened before the filter",
        "lseek": "torch.load seeks in the zip archive and the legacy format",
        "write": "framed records on the output pipe; stderr",
        "close": "closing /proc/self/status before the load; the C runtime closing what it opened",
        "newfstatat": 'glibc\'s fstat is newfstatat(fd, "", AT_EMPTY_PATH): io.FileIO and the zip reader',
        # memory
        "brk": "the C heap",
        "munmap": "freeing tensors, arenas and thread stacks",
        "mremap": "growing large allocations (realloc)",
        "madvise": "a finished thread's stack is released with MADV_DONTNEED",
        # threads (torch's intra-op pool; mmap, mprotect and clone are in CONDITIONAL)
        "futex": "every lock, condition variable and thread join",
        "set_robust_list": "a new thread registers its robust futex list",
        "rseq": "a new thread registers restartable sequences (glibc >= 2.35)",
        "rt_sigprocmask": "thread creation blocks and restores signals",
        "gettid": "thread ids (CPython's thread module, torch's pools)",
        "getpid": "the worker's own pid (1 in its PID namespace)",
        "clock_nanosleep": "time.sleep and thread-pool back-off",
        "exit": "a thread ends",
        "exit_group": "the worker ends",
    }
)

#: Not seen in the measured loads, but kept: each concerns only the worker itself, and without it
#: a load on another host's C library or clock, or a load that fails, would end less cleanly.
KEPT: Mapping[str, str] = MappingProxyType(
    {
        "fstat": "glibc before 2.33 calls fstat, not newfstatat (a descriptor only, no path)",
        "clock_gettime": "the vDSO falls back to the syscall where the clock source has no vDSO support",
        "sched_yield": "spin-waits in OpenMP and the allocators yield the CPU; it names no other process",
        "rt_sigreturn": "returning from a signal handler (CPython's SIGINT handler, SIGXCPU)",
        "restart_syscall": "the kernel restarts a sleep interrupted by a stop and continue",
    }
)

#: Syscalls allowed only with these arguments: ``(name, ((arg index, op, value, value_b), ...),
#: why)``.  ``op`` is a pyseccomp operator name; ``SELF`` stands for the worker's own pid.
SELF = object()
CONDITIONAL: tuple[tuple[str, tuple[tuple[int, str, object, object | None], ...], str], ...] = (
    (
        "clone",
        ((0, "MASKED_EQ", CLONE_THREAD | CLONE_NS_FLAGS, CLONE_THREAD),),
        "new threads (torch's intra-op pool), never a new process and never a new namespace",
    ),
    ("mmap", ((2, "MASKED_EQ", PROT_EXEC, 0),), "allocations, tensors and thread stacks; never executable"),
    ("mprotect", ((2, "MASKED_EQ", PROT_EXEC, 0),), "a new thread's stack and guard page; never executable"),
    ("prctl", ((0, "EQ", 21, None),), "PR_GET_SECCOMP: the worker confirms its filter mode"),
    ("prlimit64", ((0, "EQ", 0, None), (2, "EQ", 0, None)), "resource.getrlimit: its own limits, read only"),
    ("kill", ((0, "EQ", SELF, None),), "a signal to itself (os.abort, raise): a failing load ends cleanly"),
    ("tgkill", ((0, "EQ", SELF, None),), "a signal to one of its own threads (raise, pthread_kill)"),
)

#: Syscalls that kill the worker at once (SIGSYS): no loader starts a program or a process.
KILL: tuple[str, ...] = ("execve", "execveat", "fork", "vfork")

#: Syscalls answered with another errno than EPERM, so that the C library falls back.
ERRNO_OTHER: Mapping[str, int] = MappingProxyType(
    {
        # clone3's flags live in memory seccomp cannot read; ENOSYS makes glibc fall back to clone,
        # whose flags the filter checks.
        "clone3": errno.ENOSYS,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterReport:
    """What :func:`build_filter` put in the filter, and which names this libseccomp does not know."""

    mode: str
    default: str
    allowed: tuple[str, ...]
    conditional: tuple[str, ...]
    kill: tuple[str, ...]
    unknown: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "default": self.default,
            "allowed": list(self.allowed),
            "conditional": list(self.conditional),
            "kill": list(self.kill),
            "unknown": list(self.unknown),
        }

    def digest(self) -> str:
        """sha256 of the rules as loaded: names which filter a receipt's worker ran under."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _resolve(name: str) -> int | None:
    try:
        nr = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)
    except (OSError, ValueError):
        return None
    return nr if isinstance(nr, int) and nr >= 0 else None


def _describe(name: str, conds: tuple[tuple[int, str, object, object | None], ...]) -> str:
    """``mmap(a2 MASKED_EQ 0x4 0x0)``: one conditional rule, for the report."""

    def val(v: object) -> str:
        return "self" if v is SELF else hex(v) if isinstance(v, int) else str(v)

    return f"{name}({', '.join(f'a{i} {op} {val(a)}' + ('' if b is None else f' {val(b)}') for i, op, a, b in conds)})"


def build_filter(*, self_pid: int | None = None) -> tuple[pyseccomp.SyscallFilter, FilterReport]:
    """The worker's allowlist filter (not loaded) and a report of its rules.

    ``self_pid`` is the pid that kill and tgkill may still target (default: this process, as it
    sees itself: 1 in a new PID namespace).
    """
    pid = os.getpid() if self_pid is None else self_pid
    f = pyseccomp.SyscallFilter(pyseccomp.ERRNO(errno.EPERM))
    # A syscall of a foreign architecture (e.g. int 0x80 on x86_64) kills the process.
    f.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
    # Every thread of the worker gets the filter (torch may have started its pool already).
    f.set_attr(pyseccomp.Attr.CTL_TSYNC, 1)
    unknown: list[str] = []
    allowed: list[str] = []
    conditional: list[str] = []
    kill: list[str] = []
    for name in (*ALLOWED, *KEPT):
        if _resolve(name) is None:
            unknown.append(name)
            continue
        f.add_rule(pyseccomp.ALLOW, name)
        allowed.append(name)
    for name, conds, _why in CONDITIONAL:
        if _resolve(name) is None:
            unknown.append(name)
            continue
        args = [
            pyseccomp.Arg(i, getattr(pyseccomp, op), pid if a is SELF else a, *(() if b is None else (b,)))
            for i, op, a, b in conds
        ]
        f.add_rule(pyseccomp.ALLOW, name, *args)
        conditional.append(_describe(name, conds))
    # clone without CLONE_THREAD is a new process: kill.
    f.add_rule(pyseccomp.KILL_PROCESS, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_THREAD, 0))
    kill.append("clone(!CLONE_THREAD)")
    for name in KILL:
        if _resolve(name) is None:
            unknown.append(name)
            continue
        f.add_rule(pyseccomp.KILL_PROCESS, name)
        kill.append(name)
    for name, err in ERRNO_OTHER.items():
        if _resolve(name) is not None:
            f.add_rule(pyseccomp.ERRNO(err), name)
            conditional.append(f"{name}(-> {errno.errorcode[err]})")
    return f, FilterReport(
        mode=MODE,
        default=DEFAULT_ACTION,
        allowed=tuple(allowed),
        conditional=tuple(conditional),
        kill=tuple(kill),
        unknown=tuple(unknown),
    )


def load_filter(*, self_pid: int | None = None) -> FilterReport:
    """Build and load the filter into this process (all threads must be ours; call it last).

    Requires ``no_new_privs`` (or CAP_SYS_ADMIN); raises :class:`RuntimeFailure` if the kernel
    refuses the filter.
    """
    try:
        f, report = build_filter(self_pid=self_pid)
        f.load()
    except OSError as e:
        raise RuntimeFailure(
            "runtime.seccomp.load_failed",
            f"the kernel refused the seccomp filter: {e.strerror or e}",
            evidence={"errno": e.errno},
        ) from e
    return report
