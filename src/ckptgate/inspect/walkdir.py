"""The walk of a checkpoint directory beneath its root descriptor: what it holds, and what is refused.

Every directory below the root is opened relative to the root directory descriptor with
``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`` plus ``O_NOFOLLOW``
[R35], and listed with ``scandir``.  Each regular file becomes a :class:`FileEntry` (as first seen by
``fstatat``); symlinks, FIFOs, devices, sockets, hard links, names that are not UTF-8, too long,
with control characters or that collide by case or normalisation are findings.  Nothing is opened
for reading here (a FIFO is only ever ``fstatat``-ed, so it cannot block).  Exceeding a
:class:`WalkLimits` bound refuses the whole tree.  :meth:`~ckptgate.inspect.walk.SafeTree.open`
runs the walk and keeps its result.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from dataclasses import dataclass, field

from ckptgate._fs import openat2  # one openat2 for the whole project [R35]
from ckptgate.errors import InputRejected
from ckptgate.inspect.budget import WorkLimits
from ckptgate.inspect.findings import Finding, error

__all__ = ["FileEntry", "WalkLimits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WalkLimits:
    """Bounds on what one walk accepts, and on the tensors its inspection reads across the whole
    tree; exceeding one refuses the whole tree."""

    max_files: int = 100_000
    max_depth: int = 32
    max_name_bytes: int = 255
    max_total_bytes: int = 1 << 44  # 16 TiB of declared sizes
    max_tensors: int = 1 << 21  # safetensors and torch-zip tensors, all files together
    #: Work units per pickle stream and for the whole tree (budget.py).
    work: WorkLimits = field(default_factory=WorkLimits)

    def __post_init__(self) -> None:
        for name in ("max_files", "max_depth", "max_name_bytes", "max_total_bytes", "max_tensors"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"WalkLimits.{name} must be a positive int")
        if not isinstance(self.work, WorkLimits):
            raise ValueError("WalkLimits.work must be a WorkLimits")


@dataclass(frozen=True, slots=True, kw_only=True)
class FileEntry:
    """A regular file found beneath the root, as first seen by ``fstatat``."""

    path: str  # posix, relative to the root, UTF-8
    size: int
    dev: int
    ino: int

    def __post_init__(self) -> None:
        if not self.path or self.path.startswith("/") or ".." in self.path.split("/"):
            raise ValueError(f"bad relative path {self.path!r}")
        if self.size < 0:
            raise ValueError("negative size")


_KIND_NAMES = {
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFCHR: "char_device",
    stat.S_IFBLK: "block_device",
    stat.S_IFSOCK: "socket",
}


@dataclass(slots=True)
class _WalkState:
    limits: WalkLimits
    entries: list[FileEntry] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    total: int = 0
    count: int = 0


def _name_ok(name: str, rel: str, st: _WalkState) -> bool:
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        st.findings.append(
            error("walk.name_not_utf8", rel, "file name is not valid UTF-8; refused", name=repr(os.fsencode(name)))
        )
        return False
    if len(raw) > st.limits.max_name_bytes:
        st.findings.append(
            error(
                "walk.name_too_long",
                rel,
                "file name exceeds the name-length limit; refused",
                length=len(raw),
                limit=st.limits.max_name_bytes,
            )
        )
        return False
    if any(ord(c) < 0x20 or c == "\x7f" or c == "\\" for c in name):
        st.findings.append(
            error("walk.name_control_chars", rel, "file name contains control characters or a backslash; refused")
        )
        return False
    return True


def _walk_dir(dir_fd_rel_root: int, prefix: str, depth: int, st: _WalkState) -> None:
    if depth > st.limits.max_depth:
        raise InputRejected(
            "input.walk.too_deep",
            f"directory nesting exceeds {st.limits.max_depth}",
            evidence={"path": prefix, "limit": st.limits.max_depth},
        )
    if prefix:
        try:
            dfd = openat2(dir_fd_rel_root, prefix, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            st.findings.append(
                error("walk.dir_unreadable", prefix, f"cannot open directory: {e.strerror}", errno=e.errno)
            )
            return
    else:
        dfd = os.dup(dir_fd_rel_root)
    try:
        names: list[str] = []
        try:
            with os.scandir(dfd) as it:  # streamed, so a huge directory is refused before it is listed
                for de in it:
                    st.count += 1
                    if st.count > st.limits.max_files:
                        raise InputRejected(
                            "input.walk.too_many_files",
                            f"the tree holds more than {st.limits.max_files} entries",
                            evidence={"limit": st.limits.max_files},
                        )
                    names.append(de.name)
        except OSError as e:  # opened but not listable (EACCES from getdents, EIO, ESTALE): refused like one not opened
            st.findings.append(
                error("walk.dir_unreadable", prefix, f"cannot list directory: {e.strerror}", errno=e.errno)
            )
            return
        names.sort()
        seen: dict[str, str] = {}
        subdirs: list[str] = []
        for name in names:
            rel = f"{prefix}/{name}" if prefix else name
            if not _name_ok(name, rel, st):
                continue
            key = unicodedata.normalize("NFC", name).casefold()
            if key in seen:
                st.findings.append(
                    error(
                        "walk.name_collision",
                        rel,
                        "name collides with another by case or Unicode normalisation",
                        other=f"{prefix}/{seen[key]}" if prefix else seen[key],
                    )
                )
            else:
                seen[key] = name
            try:
                s = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError as e:
                st.findings.append(error("walk.stat_failed", rel, f"cannot stat: {e.strerror}", errno=e.errno))
                continue
            fmt = stat.S_IFMT(s.st_mode)
            if fmt == stat.S_IFDIR:
                subdirs.append(rel)
            elif fmt == stat.S_IFREG:
                if s.st_nlink > 1:
                    st.findings.append(
                        error(
                            "walk.hardlink",
                            rel,
                            "regular file has more than one hard link; its content may be "
                            "shared with a file outside the checkpoint",
                            nlink=s.st_nlink,
                        )
                    )
                st.total += s.st_size
                if st.total > st.limits.max_total_bytes:
                    raise InputRejected(
                        "input.walk.too_large",
                        f"the tree's files exceed {st.limits.max_total_bytes} bytes",
                        evidence={"limit": st.limits.max_total_bytes},
                    )
                st.entries.append(FileEntry(path=rel, size=s.st_size, dev=s.st_dev, ino=s.st_ino))
            else:
                kind = _KIND_NAMES.get(fmt, "unknown")
                st.findings.append(
                    error(
                        f"walk.{kind}",
                        rel,
                        f"{kind.replace('_', ' ')} refused; only regular files and directories are read",
                    )
                )
        for rel in subdirs:
            _walk_dir(dir_fd_rel_root, rel, depth + 1, st)
    finally:
        os.close(dfd)
