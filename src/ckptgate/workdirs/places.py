"""Where ckptgate's private directories live and what they are called: the per-user runtime
directory that holds work directories, the registry of live directories, and the name patterns a
sweep recognises.  A directory that is not this user's, is a symlink or is open to others is refused."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from ckptgate.errors import EngineUnavailable, UsageError

LOCK_NAME = ".lock"
WORK = re.compile(r"opa-[0-9a-f]{32}")  # names are matched whole (fullmatch)
STAGING = re.compile(r"\..+\.ckptgate-staging-[A-Za-z0-9_]+", re.DOTALL)
LEGACY = re.compile(r"ckptgate-opa-[A-Za-z0-9_]+")
_ENTRY = re.compile(r"[0-9a-f]{32}\.json")
_ENTRY_LIMIT = 1 << 16
_KINDS = {"work": (WORK, True), "staging": (STAGING, False)}  # kind -> (name pattern, lock file inside?)


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
