"""Private working directories, and what a killed run leaves of them.

ckptgate makes two kinds of directory while it works: the embedded OPA's **work directory** (the
staged, signed policy bundle, its public verification key and ``opa.log``) and the **staging
directory** beside DST that :mod:`ckptgate.publish` renames into place.  A ``kill -9`` cannot be
handled in the process it kills, so each directory is cleaned up by whichever ckptgate runs next:

* **Proof of death, not a guess.**  The owner holds an exclusive ``flock`` on the directory for
  its whole lifetime (on the file ``.lock`` inside a work directory; on the directory itself for
  a staging directory, whose every file is published), through a descriptor opened ``O_CLOEXEC``
  that OPA and the contained worker never inherit.  The kernel drops the lock when the owner
  dies, however it dies.  A sweep takes the lock without waiting: when it gets it, the owner is
  provably gone and the directory goes; when it does not, the directory is left alone.  PIDs,
  which are reused, are never consulted.
* **No half-made directory is swept.**  A directory is created and locked while its creator
  holds a shared ``flock`` on the parent; a sweep of the parent runs only under an exclusive one,
  taken without waiting (if it is busy, the sweep is left to a later run).
* **A registry finds them anywhere.**  Before a directory is made, its path is recorded in an
  entry under ``$XDG_STATE_HOME/ckptgate/live/`` (default ``~/.local/state/ckptgate/live/``),
  which the owner also holds locked for its lifetime.  Any later run, into any destination,
  sweeps the directories of entries whose owner is dead, then the entries.
* **Where work directories live.**  In ``$XDG_RUNTIME_DIR/ckptgate/`` when ``$XDG_RUNTIME_DIR``
  is set and usable (a directory owned by this user, mode 0700, not a symlink); otherwise in a
  private per-user directory ``$TMPDIR/ckptgate-<uid>/`` (``/tmp/ckptgate-<uid>/``), created 0700.
  One owned by someone else, a symlink, or open to others is refused
  (``engine.workdir.unsafe``); it is never used and never removed.
* **Only this user's.**  A sweep removes only directories owned by the user running it, with the
  names ckptgate gives them.

Work directories of ckptgate versions before this one (``$TMPDIR/ckptgate-opa-*``) carry no
lock, so nothing proves their owner dead: they are never swept automatically.  ``ckptgate
doctor`` lists them, and ``doctor --clean`` removes one only when it is *quiet*: no process
this user can see has a file in it open (or as its working directory), and nothing in it
changed for :data:`LEGACY_QUIET_S` seconds.  (An old embedded OPA keeps ``opa.log`` open for its
whole life; an old ckptgate staging a bundle changes the directory.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ckptgate._json import loads_strict
from ckptgate.errors import EngineUnavailable, UsageError

LOCK_NAME = ".lock"
LEGACY_QUIET_S = 600.0
WORK = re.compile(r"opa-[0-9a-f]{32}")  # names are matched whole (fullmatch)
STAGING = re.compile(r"\..+\.ckptgate-staging-[A-Za-z0-9_]+", re.DOTALL)
LEGACY = re.compile(r"ckptgate-opa-[A-Za-z0-9_]+")
_ENTRY = re.compile(r"[0-9a-f]{32}\.json")
_ENTRY_LIMIT = 1 << 16
_KINDS = {"work": (WORK, True), "staging": (STAGING, False)}  # kind -> (name pattern, lock file inside?)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Leftover:
    """A directory or registry entry that ``ckptgate doctor`` found.

    ``state`` is ``live`` (its owner holds the lock), ``stale`` (its owner is provably dead) or
    ``legacy`` (made by an older ckptgate, without a lock); ``removable`` says whether
    ``doctor --clean`` removes it (stale, or legacy and quiet).
    """

    kind: str  # work | staging | registry | legacy
    path: Path
    state: str
    removable: bool
    size: int
    detail: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "state": self.state,
            "removable": self.removable,
            "bytes": self.size,
            "detail": self.detail,
        }


# ---- where directories live ----------------------------------------------------------------------------------


def _private(path: Path) -> str | None:
    """Why ``path`` is not a private directory of ours (``None`` when it is one)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be examined: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return f"is open to other users (mode {stat.S_IMODE(st.st_mode):04o}, not 0700)"
    return None


def _private_dir(
    path: Path, *, create: bool, error: type[EngineUnavailable] | type[UsageError], code: str, what: str
) -> Path:
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise error(
                code, f"{what} {path} cannot be created: {e.strerror or e}", evidence={"path": str(path)}
            ) from None
    why = _private(path)
    if why is not None:
        raise error(
            code,
            f"{what} {path} {why}; ckptgate refuses to use it",
            evidence={"path": str(path)},
            advice=f"Remove or fix {path} (it must be a directory of yours, mode 0700, not a symlink), "
            "or set XDG_RUNTIME_DIR / XDG_STATE_HOME to a private directory.",
        )
    return path


def _runtime_candidates() -> list[Path]:
    """Where work directories may live, preferred first."""
    out = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and _private(Path(xdg)) is None:
        out.append(Path(xdg) / "ckptgate")
    out.append(Path(tempfile.gettempdir()) / f"ckptgate-{os.getuid()}")
    return out


def runtime_dir(*, create: bool = True) -> Path:
    """The private per-user directory that holds the work directories (see the module notes)."""
    return _private_dir(
        _runtime_candidates()[0],
        create=create,
        error=EngineUnavailable,
        code="engine.workdir.unsafe",
        what="the work directory parent",
    )


def registry_dir(*, create: bool = True) -> Path:
    """``$XDG_STATE_HOME/ckptgate/live`` (default ``~/.local/state/ckptgate/live``)."""
    state = Path(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")) / "ckptgate"
    if create:
        try:
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise UsageError(
                "usage.state_dir_unusable",
                f"the state directory {state} cannot be created: {e.strerror or e}",
                advice="Set XDG_STATE_HOME to a private, writable directory.",
            ) from None
    return _private_dir(
        state / "live",
        create=create,
        error=UsageError,
        code="usage.state_dir_unusable",
        what="the registry of live directories",
    )


# ---- creating a live directory --------------------------------------------------------------------------------


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


# ---- sweeping -------------------------------------------------------------------------------------------------


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


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)  # fd-based on Linux: never follows a symlink inside


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
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if kind not in _KINDS or not path.is_absolute() or not _KINDS[kind][0].fullmatch(path.name):
        return None
    if os.path.realpath(path.parent) != str(path.parent):
        return None  # entries are written canonical: a symlink or `..` on the way is not ours to follow
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


# ---- ckptgate doctor ------------------------------------------------------------------------------------------


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def _open_somewhere_under(path: Path) -> bool:
    """Whether a process this user can see has a file under ``path`` open, or works in it."""
    prefix = str(path) + os.sep
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        links = [proc / "cwd"]
        with contextlib.suppress(OSError):
            links += list((proc / "fd").iterdir())
        for link in links:
            with contextlib.suppress(OSError):
                target = os.readlink(link)
                if target == str(path) or target.startswith(prefix):
                    return True
    return False


def _quiet(path: Path, now: float) -> bool:
    newest = 0.0
    for root, dirs, files in os.walk(path):
        for name in [".", *dirs, *files]:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
    return now - newest >= LEGACY_QUIET_S and not _open_somewhere_under(path)


def find_leftovers() -> list[Leftover]:
    """Every work directory, registered directory, registry entry and legacy work directory of
    this user, with whether its owner is alive.  Creates nothing, removes nothing."""
    found: list[Leftover] = []
    seen: set[Path] = set()
    with contextlib.suppress(UsageError, OSError):
        reg = registry_dir(create=False)
        with _flocked(reg, fcntl.LOCK_EX) as _:
            for e in _entries(reg, remove=False):
                state = "live" if e.live else "stale"
                if e.kind is not None and e.target is not None and _ours(e.target):
                    seen.add(e.target)
                    found.append(
                        Leftover(
                            kind=e.kind,
                            path=e.target,
                            state=state,
                            removable=not e.live,
                            size=_size(e.target),
                            detail=f"registered in {e.entry.name}",
                        )
                    )
                found.append(
                    Leftover(
                        kind="registry",
                        path=e.entry,
                        state=state,
                        removable=not e.live,
                        size=0,
                        detail=f"names {e.target}" if e.target else "unreadable entry",
                    )
                )
    for base in _runtime_candidates():
        if not os.path.lexists(base):
            continue
        why = _private(base)
        if why is not None:
            raise EngineUnavailable(
                "engine.workdir.unsafe",
                f"the work directory parent {base} {why}",
                evidence={"path": str(base)},
                advice=f"Remove or fix {base}, or set XDG_RUNTIME_DIR to a private directory.",
            )
        for p in sorted(base.iterdir()):
            if WORK.fullmatch(p.name) and _ours(p) and p not in seen:
                live = held(p, "work")
                found.append(
                    Leftover(kind="work", path=p, state="live" if live else "stale", removable=not live, size=_size(p))
                )
    now = time.time()
    tmp = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for p in sorted(tmp.iterdir()):
            if LEGACY.fullmatch(p.name) and _ours(p):
                quiet = _quiet(p, now)
                found.append(
                    Leftover(
                        kind="legacy",
                        path=p,
                        state="legacy",
                        removable=quiet,
                        size=_size(p),
                        detail="quiet" if quiet else f"in use or changed in the last {LEGACY_QUIET_S:g} s",
                    )
                )
    return found


def clean(found: list[Leftover]) -> list[Leftover]:
    """Remove what :func:`find_leftovers` marked removable; returns what is gone.  Stale
    directories are removed by the same locked sweeps as at start-up, which take each lock again:
    what was listed is never the proof."""
    sweep()
    now = time.time()
    for item in found:
        if item.kind == "legacy" and item.removable and _ours(item.path) and _quiet(item.path, now):
            _rmtree(item.path)
        elif item.kind == "staging" and item.removable:
            sweep_parent(item.path.parent, "staging")
    return [item for item in found if item.removable and not os.path.lexists(item.path)]
