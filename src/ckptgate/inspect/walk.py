"""The open checkpoint tree (:class:`SafeTree`): every open goes through ``openat2`` beneath the root.

:meth:`SafeTree.open` opens the root directory and walks it (the walk, its records
:class:`FileEntry` and :class:`WalkLimits`, and what it refuses: :mod:`ckptgate.inspect.walkdir`).
Every walked file is later reopened relative to the root directory descriptor with
``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` plus ``O_NOFOLLOW``
[R35], and refused if it is no longer the file that was walked.  Where ``openat2`` is unavailable
the tree refuses with ``input.walk.openat2_unavailable``: there is no fallback to a weaker path
resolution.

Inspection reads only through :meth:`SafeTree.reader`, which records the sha256 of every chunk
it reads; the fixture digest checks those chunks against its own single pass
(:mod:`ckptgate.inspect.hashed`).  That binding does not depend on leases.

:meth:`SafeTree.hold` is what lets the copy read only the placed bytes once more, without
hashing them again: it takes a read lease (``fcntl(F_SETLEASE, F_RDLCK)``) on one open file
description per file.  The kernel grants a read lease only while no one has the file open for
writing, and breaks it as soon as anyone opens it for writing or truncates it (that opener then
waits for us, up to ``/proc/sys/fs/lease-break-time``).  So while :meth:`SafeTree.intact` is
true, every byte read through the tree since :meth:`~SafeTree.hold` comes from one unchanging
snapshot.  Where the kernel refuses a lease (another owner without ``CAP_LEASE``, NFS, leases
disabled, a writer that keeps a file open), and on any file system that is not a local one
(where a write from another host need not break a lease), ``hold`` returns False and the copy
hashes every byte it reads and compares with the manifest before anything is published; a contained loader
always reads a sealed in-memory copy that was hashed as it was made.  The leases live here, with
the opens, because a held file's reads go through its leased descriptor (:meth:`SafeTree.open_file`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import signal
import stat
import threading
from pathlib import Path
from types import TracebackType

from ckptgate._fs import LOCAL_FILE_SYSTEMS, file_id, fs_magic, openat2  # one openat2 for the whole project [R35]
from ckptgate.errors import InputRejected
from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.hashed import HashedFile, ReadLedger
from ckptgate.inspect.walkdir import FileEntry, WalkLimits, _walk_dir, _WalkState

__all__ = ["FileEntry", "SafeTree", "WalkLimits", "openat2"]

#: The limits of a walk when the caller names none (frozen, so one instance serves every call).
_DEFAULT_LIMITS = WalkLimits()


class SafeTree:
    """An open checkpoint root: the walked regular files and the findings of the walk.

    Use :meth:`open`; close with :meth:`close` or a ``with`` block.
    """

    __slots__ = ("_by_path", "_held", "_ledgers", "_prev_sigio", "_root_fd", "entries", "findings", "limits", "root")

    def __init__(
        self,
        *,
        root: Path,
        root_fd: int,
        entries: tuple[FileEntry, ...],
        findings: tuple[Finding, ...],
        limits: WalkLimits,
    ) -> None:
        self.root = root
        self._root_fd: int | None = root_fd
        self.entries = entries
        self.findings = findings
        self.limits = limits
        self._by_path = {e.path: e for e in entries}
        self._ledgers = {e.path: ReadLedger(e.path, e.size) for e in entries}
        self._held: dict[str, int] = {}
        self._prev_sigio: object = None

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def open(cls, root: Path, limits: WalkLimits = _DEFAULT_LIMITS) -> SafeTree:
        """Open ``root`` (a directory) and walk it beneath its own descriptor."""
        root = Path(root)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            root_fd = os.open(root, flags)
        except OSError as e:
            raise InputRejected(
                "input.walk.root_unreadable",
                f"cannot open {root} as a directory (not following symlinks): {e.strerror}",
                evidence={"root": str(root), "errno": e.errno},
            ) from None
        try:
            try:
                probe = openat2(root_fd, ".", os.O_RDONLY | os.O_DIRECTORY)
                os.close(probe)
            except OSError as e:
                if e.errno in (errno.ENOSYS, errno.EPERM):
                    raise InputRejected(
                        "input.walk.openat2_unavailable",
                        "openat2 with RESOLVE_BENEATH is not available on this kernel; refusing to read "
                        "an untrusted tree without root-confined path resolution [R35]",
                        evidence={"errno": e.errno},
                        advice=f"Run ckptgate on Linux 5.6 or later (this kernel is {os.uname().release}) without "
                        "a seccomp filter denying openat2.",
                    ) from None
                raise
            st = _WalkState(limits=limits)
            _walk_dir(root_fd, "", 0, st)
            if not st.entries and not st.findings:
                st.findings.append(
                    error("walk.empty", "", "the directory holds no files: there is no checkpoint to inspect")
                )
            entries = tuple(sorted(st.entries, key=lambda e: e.path))
            return cls(root=root, root_fd=root_fd, entries=entries, findings=tuple(st.findings), limits=limits)
        except BaseException:
            os.close(root_fd)
            raise

    # -- use --------------------------------------------------------------------------------------
    @property
    def root_fs_magic(self) -> int | None:
        """``statfs.f_type`` of the file system the root directory is on (None if unknown)."""
        if self._root_fd is None:
            raise InputRejected("input.walk.closed", "the tree has been closed")
        return fs_magic(self._root_fd)

    @property
    def root_id(self) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of the root directory that was walked, from its descriptor."""
        if self._root_fd is None:
            raise InputRejected("input.walk.closed", "the tree has been closed")
        return file_id(self._root_fd)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def entry(self, relpath: str) -> FileEntry | None:
        return self._by_path.get(relpath)

    def reader(self, relpath: str) -> HashedFile:
        """Open a walked file for inspection: every byte read is recorded in its ledger, which the
        fixture digest checks against its own pass (:mod:`ckptgate.inspect.hashed`)."""
        return HashedFile(self.open_file(relpath), self._ledgers[relpath])

    def ledger(self, relpath: str) -> ReadLedger:
        """What inspection read of ``relpath`` (chunk digests), for the digest to check and seal."""
        return self._ledgers[relpath]

    def open_file(self, relpath: str) -> int:
        """Open a walked regular file read-only beneath the root; the caller closes the fd.

        Refuses (``input.walk.changed``) when the file is no longer the one that was walked.
        """
        if self._root_fd is None:
            raise InputRejected("input.walk.closed", "the tree has been closed")
        known = self._by_path.get(relpath)
        if known is None:
            raise InputRejected(
                "input.walk.not_in_tree", f"{relpath!r} is not a walked regular file", evidence={"path": relpath}
            )
        if relpath in self._held:  # the same open file description, under its lease
            return os.dup(self._held[relpath])
        try:
            fd = openat2(self._root_fd, relpath, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise InputRejected(
                "input.walk.open_refused",
                f"cannot open {relpath!r} beneath the root: {e.strerror}",
                evidence={"path": relpath, "errno": e.errno},
            ) from None
        try:
            s = os.fstat(fd)
            if not stat.S_ISREG(s.st_mode) or s.st_dev != known.dev or s.st_ino != known.ino or s.st_size != known.size:
                raise InputRejected(
                    "input.walk.changed",
                    f"{relpath!r} changed between the walk and the read",
                    evidence={"path": relpath, "size": s.st_size, "walked_size": known.size},
                )
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def hold(self) -> bool:
        """Take a read lease on every walked file; True when all of them are held.

        Call it before reading anything.  A lease breaks when anyone opens the file for writing or
        truncates it; :meth:`intact` says whether every lease still holds.  Returns False (and
        holds nothing) where the kernel refuses a lease on any file, off the main thread (the
        lease-break signal, ``SIGIO``, can only be handled there), when one descriptor per file
        would take more than half of ``RLIMIT_NOFILE``, or when the root is not on a local file
        system (:data:`~ckptgate._fs.LOCAL_FILE_SYSTEMS`): on a network file system or FUSE a
        kernel may grant a lease that a write from another host never breaks.
        """
        if self._held:
            return True
        if (
            not self.entries
            or threading.current_thread() is not threading.main_thread()
            or not _room_for(len(self.entries))
            or self.root_fs_magic not in LOCAL_FILE_SYSTEMS
        ):
            return False
        self._prev_sigio = signal.signal(signal.SIGIO, _lease_broken)  # default action would kill us
        try:
            for e in self.entries:
                fd = self.open_file(e.path)
                self._held[e.path] = fd
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError:  # EAGAIN (open for writing), EACCES (not ours), EINVAL (no leases here)
            self._release()
            return False
        except BaseException:
            self._release()
            raise
        return True

    def intact(self) -> bool:
        """Whether every file :meth:`hold` took is still held: nobody opened one for writing since."""
        return bool(self._held) and all(_lease(fd) == fcntl.F_RDLCK for fd in self._held.values())

    @property
    def held(self) -> bool:
        """Whether :meth:`hold` took the files (they may have been opened for writing since)."""
        return bool(self._held)

    def _release(self) -> None:
        for fd in self._held.values():
            os.close(fd)  # the last descriptor of the description: the lease goes with it
        self._held = {}
        if self._prev_sigio is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGIO, self._prev_sigio)  # type: ignore[arg-type]
            self._prev_sigio = None

    def close(self) -> None:
        self._release()
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None

    def __enter__(self) -> SafeTree:
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - safety net
        try:
            self.close()
        except Exception:
            pass


def _room_for(files: int) -> bool:
    """Whether one descriptor per file fits in half of ``RLIMIT_NOFILE``, raising the soft limit
    towards the hard one when that makes it fit (the common soft limit of 1024 is a default for
    ``select``, which ckptgate does not use)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or files <= soft // 2:
        return True
    want = 2 * files + 64
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError):
            return False
    return files <= want // 2


def _lease_broken(signum: int, frame: object) -> None:
    """SIGIO: someone opened a held file for writing.  :meth:`SafeTree.intact` will say so."""


def _lease(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE)
    except OSError:
        return fcntl.F_UNLCK
