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
    :meth:`release`.  Not a record: it holds open descriptors."""

    def __init__(self, path: Path, kind: str, lock_fd: int, entry: Path, entry_fd: int) -> None:
        self.path, self.kind = path, kind
        self._lock_fd, self._entry, self._entry_fd = lock_fd, entry, entry_fd
        self._released = False

    def release(self, *, remove: bool = True) -> None:
        """Remove the directory (unless ``remove`` is false: it was published), then drop the
        registry entry and the locks.  A kill at any point leaves something a sweep removes."""
        if self._released:
            return
        self._released = True
        if remove and os.path.lexists(self.path):
            _rmtree(self.path)
        with contextlib.suppress(OSError):
            self._entry.unlink()
        os.close(self._entry_fd)
        os.close(self._lock_fd)


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
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new, so never busy
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
