"""Atomic publication: DST is either absent, or complete, fsynced and carrying its receipt.

DST's parent is resolved once (:func:`open_destination`: the user's path, symlinks and all, is
resolved to a canonical path, which ``openat2(RESOLVE_NO_SYMLINKS)`` then opens) into a directory
descriptor; everything after that is relative to that descriptor, never to a path: the staging
directory is created, locked, filled (:mod:`ckptgate.consolidate.writer` creates its files
relative to the staging directory's descriptor), fsynced and renamed to DST with
``renameat2(RENAME_NOREPLACE)`` against it.  Swapping DST's parent (or any directory above it)
for a symlink after that changes nothing: the output goes to the directory that was opened.
That neither the parent nor the staging directory lies inside the source checkpoint is proved on
the descriptors (:func:`ckptgate._fs.is_within`: ``..`` by descriptor up to the root, comparing
``(st_dev, st_ino)`` with the source root's), when DST is opened, when the staging directory is
made and again just before the rename.

Files are written into a private staging directory beside DST (same file system), every file
and the directory are fsynced, the receipt is written last, and the staging directory is
renamed to DST with ``renameat2(RENAME_NOREPLACE)``, so an existing DST is never replaced and a
crash or ``kill -9`` at any point leaves DST absent.  That rename is the commit point
(:mod:`ckptgate.interrupts`): SIGHUP, SIGINT or SIGTERM before it aborts the run and removes the
staging directory; one during it is held until it is done; one after it finds DST published.  A
staging directory has a random name, is recorded in the per-user registry (:mod:`ckptgate.workdirs`)
and flock-ed by its owner while in use; one that no live process holds is removed by the next run
that starts, whatever its destination (beside DST: under an exclusive flock of the parent, which an
intake holds shared until its own directory is locked).  Atomic publication is ckptgate's
responsibility, not an upstream guarantee [R12].
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate import interrupts
from ckptgate._fs import RENAME_NOREPLACE, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, is_within, openat2, renameat2
from ckptgate.errors import Error, RuntimeFailure, UsageError
from ckptgate.publish.sweep import remove_stale_staging
from ckptgate.verify.dsse import Signer, sign_payload
from ckptgate.workdirs import registered, sweep_registry

RECEIPT_NAME = "ckptgate-receipt.json"
RECEIPT_SIGNATURE_NAME = "ckptgate-receipt.dsse.json"
RECEIPT_PAYLOAD_TYPE = "application/vnd.ckptgate.receipt+json"
_AT_FDCWD = -100
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PublishError(Error):
    default_advice = (
        "Nothing was published; DST is unchanged. `ckptgate doctor` lists a staging directory left beside it "
        "(`ckptgate doctor --clean` removes a stale one); then run the intake again."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    """DST resolved once: its parent open as a directory descriptor, and its last name.

    Only :func:`open_destination` makes one; the descriptor lives as long as its ``with`` block.
    """

    path: Path
    """DST as the user named it (absolute): for messages and the receipt, never opened."""
    parent_fd: int
    """DST's parent directory; staging, fsync and the final rename are relative to it."""
    name: str
    """DST's last path component, the name the output gets in the parent."""
    source_root: tuple[int, int] | None = None
    """``(st_dev, st_ino)`` of the source checkpoint's root, which the output may not lie inside."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """A private staging directory in DST's parent, open as :attr:`fd` and locked while in use."""

    fd: int
    """The staging directory: the outputs and the receipt are created relative to it."""
    name: str
    """Its name in the parent (relative to :attr:`Destination.parent_fd`)."""
    destination: Destination

    @property
    def path(self) -> Path:
        """Where the staging directory was made, for messages only: never opened by ckptgate."""
        return self.destination.path.parent / self.name


def _inside_source(dst: Path) -> UsageError:
    return UsageError(
        "usage.dst_inside_source",
        f"{dst} is inside the checkpoint; publishing there would change what was measured",
        evidence={"destination": str(dst)},
        advice=f"Name a destination outside the checkpoint with --out, such as {dst.parent.parent / (dst.name)}.",
    )


def _exists(dst: Path) -> UsageError:
    return UsageError(
        "usage.dst_exists",
        f"{dst} already exists; ckptgate never replaces a published output",
        evidence={"destination": str(dst)},
        advice=f"Name a new directory with --out (for example {dst.name}-2 beside it), or check the published "
        f"one with `ckptgate receipt verify {dst} --key RECEIPT.pub.pem`.",
    )


def _parent_advice(dst: Path) -> str:
    return (
        f"ckptgate creates DST itself but not its parent: `mkdir -p {dst.parent}`, then run the command again, "
        "or name a destination in an existing directory with --out."
    )


def _probe(path: Path, *, follow_symlinks: bool = False) -> os.stat_result | None:
    """``path``'s status, ``None`` when it does not exist (or its parent is a file); any other failure
    (a name longer than the file system allows, a directory on the way this user may not search, a
    link loop) refuses DST by its cause, where ``Path.exists`` would raise it untyped."""
    try:
        return os.stat(path, follow_symlinks=follow_symlinks)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise UsageError(
            "usage.dst_unusable",
            f"{path} cannot be used as a destination: {e.strerror or e}",
            evidence={"destination": str(path), "errno": e.errno},
            advice=f"Name a destination with --out whose path this user can search and whose names the file "
            f"system allows (`ls -ld {path.parent}` shows the directory's owner and mode).",
        ) from None


def check_destination(dst: Path, *, source: Path | None = None) -> Path:
    """Refuse a DST that exists, whose parent is missing, or that lies inside ``source`` (publishing
    there would change the checkpoint just measured), before any work is done.

    This is the early answer, by path; the binding one is :func:`open_destination`'s, on the
    descriptors that are then used.
    """
    dst = Path(os.path.abspath(dst))
    if _probe(dst) is not None:
        raise _exists(dst)
    parent = _probe(dst.parent, follow_symlinks=True)
    if parent is None or not stat.S_ISDIR(parent.st_mode):
        raise UsageError(
            "usage.dst_parent_missing",
            f"the parent of {dst} {'is not a directory' if parent is not None else 'does not exist'}",
            evidence={"destination": str(dst)},
            advice=_parent_advice(dst),
        )
    if source is not None and (dst.parent.resolve() / dst.name).is_relative_to(source.resolve()):
        raise _inside_source(dst)
    return dst


@contextmanager
def open_destination(dst: Path, *, source_root: tuple[int, int] | None = None) -> Iterator[Destination]:
    """Resolve DST's parent once into a directory descriptor and check DST against it.

    The parent's path is made canonical (the user's symlinks resolved) and opened with
    ``openat2(RESOLVE_NO_SYMLINKS)``: a symlink that appears on that path in between refuses
    (``usage.dst_parent_changed``) rather than being followed.  Then, on the descriptor: DST must
    not exist in it (``usage.dst_exists``), and the parent must not be, or lie beneath, the
    directory ``source_root`` (``usage.dst_inside_source``).
    """
    dst = Path(os.path.abspath(dst))
    if dst.name in ("", ".", ".."):
        raise UsageError(
            "usage.dst_invalid",
            f"{dst} names no directory entry to publish as",
            advice="Name the new directory to publish with --out, such as ./published (not '.', '..' or '/').",
        )
    parent = os.path.realpath(dst.parent)
    try:
        parent_fd = openat2(
            _AT_FDCWD, parent, os.O_RDONLY | os.O_DIRECTORY, resolve=RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
        )
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise UsageError(
                "usage.dst_parent_missing",
                f"the parent of {dst} is not a directory or does not exist: {e.strerror}",
                evidence={"destination": str(dst)},
                advice=_parent_advice(dst),
            ) from None
        if e.errno == errno.ELOOP:
            raise UsageError(
                "usage.dst_parent_changed",
                f"the parent of {dst} changed while it was being "
                "opened (a symlink appeared on its path); nothing was published",
                evidence={"destination": str(dst), "resolved_parent": parent},
                advice=f"Something is changing the path to {parent}: check who writes there (`ls -la {parent}`), "
                "then run the command again, or name a destination under a directory only you write with --out.",
            ) from None
        raise UsageError(
            "usage.dst_parent_unusable",
            f"cannot open the parent of {dst}: {e.strerror}",
            evidence={"destination": str(dst), "errno": e.errno},
            advice=f"Name a destination under a directory this user can open and write with --out "
            f"(`ls -ld {parent}` shows its owner and mode).",
        ) from None
    try:
        try:
            os.stat(dst.name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise UsageError(
                "usage.dst_unusable",
                f"{dst} cannot be used as a destination: {e.strerror or e}",
                evidence={"destination": str(dst), "errno": e.errno},
                advice=f"Name a destination with --out whose name the file system holding {parent} allows.",
            ) from None
        else:
            raise _exists(dst)
        if source_root is not None and is_within(parent_fd, source_root):
            raise _inside_source(dst)
        yield Destination(path=dst, parent_fd=parent_fd, name=dst.name, source_root=source_root)
    finally:
        os.close(parent_fd)


def _stage_name(dest: Destination) -> str:
    return f".{dest.name}.ckptgate-staging-{secrets.token_hex(16)}"


def _make_stage_dir(dest: Destination, name: str) -> None:
    """Create the staging directory ``name`` (mode 0700) in the parent."""
    try:
        os.mkdir(name, 0o700, dir_fd=dest.parent_fd)
    except FileExistsError:  # 128 random bits: someone made it on purpose
        raise PublishError(
            "publish.staging_exists",
            f"a staging directory beside {dest.path} already had the new random name; nothing was published",
        ) from None


def _remove_stage(dest: Destination, name: str, fd: int) -> None:
    """Remove the staging directory ``name`` if it still is the one open as ``fd``; a signal that
    arrives meanwhile is held until it is gone (:func:`ckptgate.interrupts.critical`)."""
    with interrupts.critical():
        _remove_stage_now(dest, name, fd)


def _remove_stage_now(dest: Destination, name: str, fd: int) -> None:
    try:
        s = os.stat(name, dir_fd=dest.parent_fd, follow_symlinks=False)
    except OSError:
        return  # published (renamed to DST), or gone
    here = os.fstat(fd)
    if stat.S_ISDIR(s.st_mode) and (s.st_dev, s.st_ino) == (here.st_dev, here.st_ino):
        shutil.rmtree(name, dir_fd=dest.parent_fd, ignore_errors=True)


@contextmanager
def staging(dest: Destination) -> Iterator[Stage]:
    """A private staging directory in DST's parent (by descriptor); removed unless :func:`publish`
    consumed it."""
    if dest.source_root is not None and is_within(dest.parent_fd, dest.source_root):
        raise _inside_source(dest.path)  # the parent was moved into the source since it was opened
    sweep_registry()  # what killed intakes left beside any other DST
    remove_stale_staging(dest.parent_fd)
    name = _stage_name(dest)
    with registered("staging", Path(os.path.realpath(dest.path.parent)) / name):  # before it exists
        yield from _staged(dest, name)


#: What ``flock``/``renameat2`` fail with where the file system lacks them (some NFS set-ups, FUSE).
_UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
_FS_ADVICE = (
    "Nothing was published. ckptgate publishes only where the file system holding DST's parent gives "
    "flock and renameat2(RENAME_NOREPLACE), so that an existing DST is never replaced and a live "
    "staging directory is never swept; choose a DST on a local file system or one that gives both "
    "(docs/scale-out.md#file-systems)."
)


def _flock(fd: int, op: int, dest: Destination) -> None:
    """``flock``; a file system without it is a typed refusal (``runtime.fs.no_flock``)."""
    try:
        fcntl.flock(fd, op)
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        raise RuntimeFailure(
            "runtime.fs.no_flock",
            f"the file system holding {dest.path.parent} refuses flock: {e.strerror}",
            evidence={"errno": e.errno, "destination": str(dest.path)},
            advice=_FS_ADVICE,
        ) from None


def _probe_rename_noreplace(stage_fd: int, dest: Destination) -> None:
    """Inside the new staging directory, rename one empty file onto another with
    ``RENAME_NOREPLACE``, which must fail with ``EEXIST`` (and remove both), so that a file system
    that lacks the flag, or accepts it and replaces anyway, is refused before anything is written."""
    a, b = ".ckptgate-probe-a", ".ckptgate-probe-b"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        for name in (a, b):
            os.close(os.open(name, flags, 0o600, dir_fd=stage_fd))
        try:
            renameat2(stage_fd, a, stage_fd, b, RENAME_NOREPLACE)
        except OSError as e:
            if e.errno == errno.EEXIST:
                return
            if e.errno not in _UNSUPPORTED:
                raise
            why = e.strerror
        else:
            why = "it replaced an existing file"
        raise RuntimeFailure(
            "runtime.fs.no_rename_noreplace",
            f"the file system holding {dest.path.parent} does not keep renameat2(RENAME_NOREPLACE): {why}",
            evidence={"destination": str(dest.path)},
            advice=_FS_ADVICE,
        )
    finally:
        for name in (a, b):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=stage_fd)


def _staged(dest: Destination, name: str) -> Iterator[Stage]:
    pfd = os.open(".", _DIR, dir_fd=dest.parent_fd)  # our own open file for the shared lock
    try:
        _flock(pfd, fcntl.LOCK_SH, dest)  # no clean-up runs until our directory is locked
        _make_stage_dir(dest, name)
        try:
            lock = os.open(name, _DIR, dir_fd=dest.parent_fd)
        except OSError as e:
            raise PublishError(
                "publish.staging_changed",
                f"the staging directory beside {dest.path} was replaced before it could be opened: {e.strerror}",
            ) from None
        try:
            _flock(lock, fcntl.LOCK_EX, dest)  # held until we are done: marks the directory as live
        except BaseException:
            try:
                _remove_stage(dest, name, lock)
            finally:
                os.close(lock)
            raise
    finally:
        os.close(pfd)
    try:
        if dest.source_root is not None and is_within(lock, dest.source_root):
            raise _inside_source(dest.path)
        _probe_rename_noreplace(lock, dest)
        yield Stage(fd=lock, name=name, destination=dest)
    finally:
        try:
            _remove_stage(dest, name, lock)
        finally:
            os.close(lock)


def _write_new(stage: Stage, name: str, raw: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=stage.fd)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(stage: Stage, receipt: dict[str, Any], *, signer: Signer | None = None) -> Path:
    """Write the receipt into ``stage`` (and, with ``signer``, a DSSE envelope over its exact bytes
    as :data:`RECEIPT_SIGNATURE_NAME`), fsync everything, and rename ``stage`` to DST, all relative
    to the descriptors; returns DST's path."""
    dest = stage.destination
    raw = (json.dumps(receipt, indent=2, sort_keys=True, default=str) + "\n").encode()
    _write_new(stage, RECEIPT_NAME, raw)
    if signer is not None:
        _write_new(stage, RECEIPT_SIGNATURE_NAME, sign_payload(raw, [signer], payload_type=RECEIPT_PAYLOAD_TYPE))
    with os.scandir(stage.fd) as it:  # the one fsync of each output: the writer leaves durability to us
        names = [e.name for e in it if e.is_file(follow_symlinks=False)]
    for name in names:
        ffd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stage.fd)
        try:
            os.fsync(ffd)
        finally:
            os.close(ffd)
    os.fchmod(stage.fd, 0o755)
    os.fsync(stage.fd)
    if dest.source_root is not None and is_within(dest.parent_fd, dest.source_root):
        raise _inside_source(dest.path)  # the parent was moved into the source meanwhile
    # The commit point: a signal before this block aborts (nothing published); one inside it is held
    # until the rename is done; from the rename on, DST is published and a signal is only noted.
    with interrupts.critical():
        try:
            renameat2(dest.parent_fd, stage.name, dest.parent_fd, dest.name, RENAME_NOREPLACE)
        except OSError as e:
            if e.errno == errno.EEXIST:
                raise _exists(dest.path) from None
            raise PublishError(
                "publish.rename_failed", f"could not publish to {dest.path}: {e.strerror}", evidence={"errno": e.errno}
            ) from None
        interrupts.committed()
    os.fsync(dest.parent_fd)
    return dest.path


def open_stage(destination: Destination, name: str) -> int:
    """The staging directory rank 0 made beside DST, opened by name relative to DST's parent."""
    if not isinstance(name, str) or "/" in name or not name.startswith(f".{destination.name}.ckptgate-staging-"):
        raise RuntimeFailure("runtime.distributed.stage", f"rank 0 named no staging directory of this DST: {name!r}")
    try:
        fd = os.open(name, _DIR, dir_fd=destination.parent_fd)
    except FileNotFoundError:
        raise RuntimeFailure(
            "runtime.distributed.not_shared",
            f"rank 0 made its staging directory beside {destination.path}, and this rank does not see it: "
            "DST's parent is not one file system shared by every rank; nothing was published",
            evidence={"destination": str(destination.path), "staging": name},
            advice="Give every rank the same DST on one shared file system (docs/scale-out.md#file-systems).",
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise RuntimeFailure("runtime.distributed.stage", f"the staging directory {name!r} is not this user's")
    return fd
