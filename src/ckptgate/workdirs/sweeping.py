"""Sweeping what killed runs left: the directories whose owner is provably dead (its lock can be
taken), found through the registry or in their parent, and the registry entries that named them."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ckptgate._json import loads_strict
from ckptgate.errors import UsageError
from ckptgate.workdirs.lease import _flocked, _rmtree
from ckptgate.workdirs.places import (
    _ENTRY,
    _ENTRY_LIMIT,
    _KINDS,
    LOCK_NAME,
    _private,
    _runtime_candidates,
    registry_dir,
)


def _ours(path: Path) -> bool:
    """A real directory (not a symlink) owned by this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def held(path: Path, kind: str) -> bool:
    """Whether a live process holds ``path``'s lock.  A work directory without its lock file was
    left by a creator that died before locking it (callers ensure no creator is still at work)."""
    lock_file = _KINDS[kind][1]
    try:
        if lock_file:
            fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: leave it alone
    try:
        return lock_held(fd)
    finally:
        os.close(fd)


def lock_held(fd: int) -> bool:
    """Whether another open file holds a ``flock`` on ``fd``'s file: it is busy, or cannot be
    tested (leave it alone).  A lock this call takes goes when the caller closes ``fd``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # BlockingIOError: a live owner; anything else: cannot tell
        return True
    return False


def sweep_parent(parent: Path, kind: str) -> list[Path]:
    """Remove the directories of ``kind`` in ``parent`` that are ours and whose owner is dead.
    Runs only under an exclusive lock of ``parent``; if that is busy, nothing is done."""
    pattern = _KINDS[kind][0]
    removed: list[Path] = []
    try:
        with _flocked(parent, fcntl.LOCK_EX | fcntl.LOCK_NB) as got:
            if not got:
                return removed
            for p in parent.iterdir():
                if pattern.fullmatch(p.name) and _ours(p) and not held(p, kind):
                    _rmtree(p)
                    removed.append(p)
    except OSError:
        pass  # a parent we cannot open or list: a later run, or `ckptgate doctor`, will see it
    return removed


def _read_entry(fd: int) -> tuple[str, Path] | None:
    try:
        raw = os.read(fd, _ENTRY_LIMIT)
        doc = loads_strict(raw, what="a registry entry")
        kind, path = doc["kind"], Path(doc["path"])
        if not isinstance(kind, str) or kind not in _KINDS or not path.is_absolute():
            return None
        if not _KINDS[kind][0].fullmatch(path.name):
            return None
        if os.path.realpath(path.parent) != str(path.parent):
            return None  # entries are written canonical: a symlink or `..` on the way is not ours to follow
    except (OSError, ValueError, KeyError, TypeError):  # ValueError: a NUL byte in the path, among others
        return None
    return kind, path


@dataclass(frozen=True, slots=True)
class _Entry:
    entry: Path
    live: bool
    kind: str | None
    target: Path | None


def _entries(reg: Path, *, remove: bool) -> list[_Entry]:
    """Every registry entry; with ``remove``, the dead ones' directories and the entries go.
    The caller holds the registry's exclusive lock."""
    out = []
    for entry in sorted(reg.iterdir()):
        if not _ENTRY.fullmatch(entry.name):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                read = _read_entry(fd)
                out.append(_Entry(entry, True, *(read or (None, None))))
                continue
            read = _read_entry(fd)
            kind, target = read or (None, None)
            out.append(_Entry(entry, False, kind, target))
            if not remove:
                continue
            if kind is not None and target is not None and os.path.lexists(target):
                if not _ours(target) or held(target, kind):
                    continue  # not ours to remove, or a child of the dead owner still holds it: keep the entry
                _rmtree(target)
                if os.path.lexists(target):
                    continue
            with contextlib.suppress(OSError):
                entry.unlink()
        finally:
            os.close(fd)
    return out


def sweep_registry() -> list[Path]:
    """Remove the directories of registry entries whose owner is dead, then those entries."""
    removed: list[Path] = []
    try:
        reg = registry_dir(create=False)
        with _flocked(reg, fcntl.LOCK_EX | fcntl.LOCK_NB) as got:
            if got:
                for e in _entries(reg, remove=True):
                    if not e.live and e.target is not None and not os.path.lexists(e.target):
                        removed.append(e.target)
    except (OSError, UsageError):
        pass  # no registry yet, or an unusable one: nothing to sweep from it
    return removed


def sweep() -> list[Path]:
    """The start-up sweep: the registry's dead entries, then the runtime directory.  Never raises."""
    removed = sweep_registry()
    for base in _runtime_candidates():
        if _private(base) is None:
            removed += [p for p in sweep_parent(base, "work") if p not in removed]
    return removed
