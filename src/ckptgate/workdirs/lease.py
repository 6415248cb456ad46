"""Making a live directory and holding it: registered first, then created and locked
(:func:`create`, :func:`registered`), and released by its :class:`Lease`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from ckptgate.errors import EngineUnavailable
from ckptgate.workdirs.places import _KINDS, LOCK_NAME, registry_dir, runtime_dir


class Lease:
    """A live directory this process owns: its lock and its registry entry, both held until
    :meth:`release`.  Not a record: it holds open descriptors.

    The owner's lock is a shared ``flock`` (a sweep's exclusive test fails on it as on an exclusive
    one).  A process forked from the owner inherits the lease but holds no share of it: its
    :meth:`release` does nothing (its exit never removes the owner's directory), unless it takes a
    share with :meth:`share_after_fork`.  A lease shared so is removed by the last of its holders to
    release it; one whose last holder left without releasing it (``os._exit``, a kill) is a dead
    owner's, which the next sweep removes."""

    def __init__(self, path: Path, kind: str, lock_fd: int, entry: Path, entry_fd: int) -> None:
        self.path, self.kind = path, kind
        self._lock_fd, self._entry, self._entry_fd = lock_fd, entry, entry_fd
        self._released = False
        self._holder = os.getpid()  # the process whose share this is
        self._shared = False  # whether another process may hold a share (:meth:`share_after_fork`)

    def share_after_fork(self, *, child: bool) -> None:
        """Call in both processes right after a fork (``os.register_at_fork``): from then on the directory
        stays until both have released it.  The child takes a share of its own (a new open file, flock-ed
        shared) and closes the descriptor it inherited, which never unlocks the parent's."""
        if self._released or (os.getpid() != self._holder and not child):  # a parent that holds no share
            return
        self._shared = True
        if not child:
            return
        self._holder = os.getpid()
        inherited, self._lock_fd = self._lock_fd, -1
        try:
            fd = _open_lock(self.path, self.kind)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise
            self._lock_fd = fd
        except OSError:
            pass  # gone, or swept: this process holds no share, and its release leaves the directory alone
        finally:
            if inherited >= 0:
                os.close(inherited)

    def release(self, *, remove: bool = True) -> None:
        """Remove the directory (unless ``remove`` is false: it was published, or another process still
        holds a share of it), then drop the registry entry and the locks.  A kill at any point leaves
        something a sweep removes.  In a process that holds no share (forked from the owner), nothing."""
        if self._released or os.getpid() != self._holder:
            return
        self._released = True
        if self._shared:  # the last holder out removes the directory and the entry
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            if self._others_hold():
                os.close(self._entry_fd)  # the entry stays locked while another holder keeps its descriptor
                return
        if remove and os.path.lexists(self.path):
            _rmtree(self.path)
        with contextlib.suppress(OSError):
            self._entry.unlink()
        os.close(self._entry_fd)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)

    def _others_hold(self) -> bool:
        """Whether another process still holds a share: the directory's lock cannot be taken exclusively."""
        try:
            fd = _open_lock(self.path, self.kind)
        except OSError:
            return False  # gone: nothing to keep
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False


def _open_lock(path: Path, kind: str) -> int:
    """A new open file (``O_CLOEXEC``) of what a live directory of ``kind`` is locked on: its lock file, or itself."""
    if _KINDS[kind][1]:
        return os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


@contextlib.contextmanager
def _flocked(path: Path, how: int) -> Iterator[bool]:
    """``path`` (a directory) open and flock-ed with ``how``; yields False when ``LOCK_NB`` found it busy.
    A symlink is followed: DST's parent may well be reached through one."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _register(kind: str, path: Path) -> tuple[Path, int]:
    """A registry entry naming ``path``, created and locked under the registry's shared lock."""
    reg = registry_dir()
    with _flocked(reg, fcntl.LOCK_SH):
        entry = reg / f"{secrets.token_hex(16)}.json"
        fd = os.open(entry, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(
                fd, json.dumps({"kind": kind, "path": str(path), "pid": os.getpid(), "created": time.time()}).encode()
            )
        except BaseException:
            os.close(fd)
            entry.unlink()
            raise
    return entry, fd


@contextlib.contextmanager
def registered(kind: str, path: Path) -> Iterator[None]:
    """``path`` recorded in the registry, its entry locked, for the ``with`` block: for a directory
    its caller makes and locks itself (the staging directory, relative to DST's parent descriptor).
    Register before making the directory, so a kill in between leaves an entry a sweep can act on."""
    assert _KINDS[kind][0].fullmatch(path.name), path.name
    entry, entry_fd = _register(kind, path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            entry.unlink()
        os.close(entry_fd)


def create(parent: Path, name: str, kind: str) -> Lease:
    """Make ``parent/name`` (mode 0700) and hold it: registered first, then created and locked under
    the parent's shared lock, so neither a kill nor a concurrent sweep can leave it unaccounted for."""
    pattern, lock_file = _KINDS[kind]
    assert pattern.fullmatch(name), name
    path = Path(os.path.realpath(parent)) / name  # canonical, as the registry sweep requires
    entry, entry_fd = _register(kind, path)
    lock_fd = -1
    try:
        with _flocked(parent, fcntl.LOCK_SH):
            os.mkdir(path, 0o700)
            if lock_file:
                lock_fd = os.open(
                    path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
                )
            else:
                lock_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # new, so never busy; shared: see Lease
    except BaseException:
        if lock_fd >= 0:
            os.close(lock_fd)
        _rmtree(path)
        with contextlib.suppress(OSError):
            entry.unlink()
        os.close(entry_fd)
        raise
    return Lease(path, kind, lock_fd, entry, entry_fd)


def create_work_dir() -> Lease:
    """A fresh work directory for the embedded OPA in :func:`runtime_dir`."""
    base = runtime_dir()
    try:
        return create(base, f"opa-{secrets.token_hex(16)}", "work")
    except OSError as e:
        raise EngineUnavailable(
            "engine.workdir.unusable",
            f"a work directory could not be made in {base}: {e.strerror or e}",
            evidence={"path": str(base)},
        ) from None


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: never follows a symlink inside
