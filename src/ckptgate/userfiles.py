"""Files a user names on the command line or to the library: read one bounded, write one whole.

These are the attestations, trust data, keys and predicates ckptgate reads, and the reports and
keys it writes; never checkpoint files (those go through :class:`ckptgate.inspect.SafeTree`).

* :func:`read_regular_file` reads a regular file only, and at most one byte more than the
  caller allows: a FIFO (which would block until a writer came), ``/dev/zero`` or a directory is
  refused before any read, and an endless or huge file cannot exhaust memory.
* :func:`write_output_file` writes beside the target and renames it into place, so a failure
  leaves the old file or none, never half of one; it refuses a target inside an input (``verify
  --html`` into the checkpoint it reports on) and a missing or non-directory parent, with a
  typed :class:`~ckptgate.errors.UsageError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from ckptgate._fs import RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, is_within, openat2
from ckptgate.errors import UsageError

_AT_FDCWD = -100

__all__ = ["check_output_file", "io_advice", "read_regular_file", "replace_whole", "write_output_file"]


def io_advice(
    e: OSError, target: Path, *, elsewhere: str = "name a destination on another file system with --out"
) -> str:
    """What to do about a failed write of ``target``, by its errno: a full disk is the file system's,
    not a contained worker's resource limit, so the advice names the directory and `df`."""
    where = target.parent
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"Nothing was written. The file system holding {where} is full or over quota: free space there "
            f"(`df -h {where}`) or {elsewhere}, then run the command again."
        )
    if e.errno == errno.EFBIG:
        return (
            f"Nothing was written. A file grew past this process's file-size limit (`ulimit -f`) or that of the "
            f"file system holding {where}: raise the limit or {elsewhere}, then run the command again."
        )
    return (
        f"Nothing was written. Check the file system holding {where} (`dmesg` names I/O errors) or {elsewhere}, "
        "then run the command again."
    )


_READ_STEP = 1 << 20


def read_regular_file(
    path: Path | str, *, limit: int, dir_fd: int | None = None, follow_symlinks: bool = True
) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path``: one more than allowed, so the caller
    can tell that it is too large.  Raises :class:`OSError` (``EINVAL``, "not a regular file") for
    anything else, before reading; with ``follow_symlinks=False`` a symbolic link is ``ELOOP``.
    ``dir_fd`` is a directory descriptor ``path`` is relative to."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, _READ_STEP))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_output_file(path: Path | str, *, what: str, exclusive: bool = False, not_inside: Iterable[Path] = ()) -> Path:
    """Refuse a target :func:`write_output_file` would refuse, before the work that produces it;
    returns the target with its parent resolved."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise UsageError(
            "usage.output_path",
            f"{what}: {str(path)!r} does not name a file",
            advice=f"Name a file to write {what} to, such as ./out/name (not a directory or {str(path)!r}).",
        )
    parent = path.parent.absolute()
    try:
        problem = None if stat.S_ISDIR(os.stat(parent).st_mode) else "is not a directory"
    except (FileNotFoundError, NotADirectoryError):
        problem = "does not exist"
    except OSError as e:  # a name too long, a directory this user may not search: Path.is_dir would raise
        problem = f"cannot be used: {e.strerror or e}"
    if problem is not None:
        raise UsageError(
            "usage.output_parent",
            f"cannot write {what} {path}: {parent} {problem}",
            advice=f"Create the directory first (`mkdir -p {parent}`) or name a file in an existing one.",
        )
    target = parent.resolve() / path.name
    for root in not_inside:
        if target == root.resolve() or target.is_relative_to(root.resolve()):
            raise UsageError(
                "usage.output_inside_input",
                f"{what} {path} would be written inside {root}, an input of this command",
                advice=f"Write {what} to a path outside {root}.",
            )
    if os.path.lexists(target) and (exclusive or not stat.S_ISREG(os.lstat(target).st_mode)):
        raise UsageError(
            "usage.exists",
            f"{path} exists; refusing to overwrite" + ("" if exclusive else " something that is not a regular file"),
            advice=f"Name a new file, or move {path} away first if it may be replaced.",
        )
    return target


def write_output_file(
    path: Path | str,
    data: bytes,
    *,
    what: str,
    mode: int = 0o644,
    exclusive: bool = False,
    not_inside: Iterable[Path] = (),
) -> None:
    """Write ``data`` to ``path`` whole (:func:`replace_whole`), after :func:`check_output_file`.

    The parent is resolved once into a directory descriptor (``openat2`` with
    ``RESOLVE_NO_SYMLINKS``), proved on that descriptor to lie outside every input in
    ``not_inside`` (:func:`ckptgate._fs.is_within`: a parent swapped for a symlink into an input
    after the check by path cannot redirect the write), and the file is written relative to it.

    :param mode: permissions for a new file, less the umask (``0o600`` for a private key).
    :param exclusive: refuse an existing ``path`` (keys, signed envelopes) instead of replacing it.
    :param not_inside: inputs of the command; a ``path`` inside one of them is refused.
    """
    roots = list(not_inside)
    target = check_output_file(path, what=what, exclusive=exclusive, not_inside=roots)
    ids = []
    for root in roots:
        with contextlib.suppress(OSError):  # an input that is gone cannot be written into
            st = os.stat(root)
            ids.append((st.st_dev, st.st_ino))
    try:
        parent_fd = openat2(
            _AT_FDCWD,
            os.path.realpath(target.parent),
            os.O_RDONLY | os.O_DIRECTORY,
            resolve=RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        )
    except OSError as e:
        raise UsageError(
            "usage.output_parent",
            f"cannot open the directory of {what} {path}: {e.strerror}",
            advice=f"Name a file in a directory this user can open and write (`ls -ld {target.parent}`).",
        ) from None
    try:
        for root_id in ids:
            if is_within(parent_fd, root_id):
                raise UsageError(
                    "usage.output_inside_input",
                    f"{what} {path} would be written inside an input of this command",
                    advice=f"Write {what} to a path outside the inputs this command reads, not {path}.",
                )
        replace_whole(Path(target.name), data, mode=mode, exclusive=exclusive, dir_fd=parent_fd)
    except FileExistsError:
        raise UsageError(
            "usage.exists",
            f"{path} exists; refusing to overwrite",
            advice=f"Name a new file, or move {path} away first if it may be replaced.",
        ) from None
    except OSError as e:
        raise UsageError(
            "usage.output_unwritable",
            f"cannot write {what} {path}: {e.strerror}",
            evidence={"path": str(path), "errno": e.errno},
            advice=io_advice(e, Path(os.path.abspath(path)), elsewhere="write it to another directory"),
        ) from None
    finally:
        os.close(parent_fd)


#: What ``link`` fails with where the file system has no hard links (vfat, exFAT, some SMB and FUSE mounts).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})


def _create_new(target: Path, data: bytes, mode: int, at: dict[str, int]) -> None:
    """``target`` created (never replaced: ``FileExistsError``; the umask applies to ``mode``), written whole
    and flushed to disk, or removed again."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, **at)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(target, **at)
        raise


def replace_whole(
    target: Path, data: bytes, *, mode: int = 0o644, exclusive: bool = False, dir_fd: int | None = None
) -> None:
    """Write ``data`` to a temporary file beside ``target``, flush it, and rename it into place, so
    ``target`` is the old file or the new one, never half of one; raises :class:`OSError`.

    :param exclusive: link instead of rename, so an existing ``target`` is never replaced
        (``FileExistsError``); where the file system has no hard links, ``target`` is created exclusively
        and written in place instead (a reader may then see it before it is whole).
    :param dir_fd: a directory descriptor ``target`` (then a bare name) is relative to.
    """
    tmp = target.parent / f".ckptgate-{secrets.token_hex(8)}.tmp"  # short: any name the target may have fits
    at = {} if dir_fd is None else {"dir_fd": dir_fd}
    _create_new(tmp, data, mode, at)
    try:
        if exclusive:
            try:
                os.link(tmp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except OSError as e:
                if e.errno not in _NO_HARD_LINKS:
                    raise
                _create_new(target, data, mode, at)  # a file system without hard links (vfat, some FUSE mounts)
            os.unlink(tmp, **at)
        else:
            os.replace(tmp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, **at)
        raise
