"""What ``ckptgate doctor`` lists and removes: every live, stale or legacy directory and registry
entry of this user (:func:`find_leftovers`), and the removal of the removable ones (:func:`clean`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ckptgate.errors import EngineUnavailable, UsageError
from ckptgate.workdirs.lease import _flocked, _rmtree
from ckptgate.workdirs.places import LEGACY, WORK, _private, _runtime_candidates, registry_dir
from ckptgate.workdirs.sweeping import _entries, _ours, held, sweep, sweep_parent

LEGACY_QUIET_S = 600.0


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
