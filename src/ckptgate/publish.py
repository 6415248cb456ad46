"""Atomic publication: DST is either absent, or complete, fsynced and carrying its receipt.

Files are written into a private staging directory beside DST (same file system), every file
and the directory are fsynced, the receipt is written last, and the staging directory is
renamed to DST with ``renameat2(RENAME_NOREPLACE)``, so an existing DST is never replaced and a
crash or ``kill -9`` at any point leaves DST absent.  A staging directory has a random name, is
recorded in the per-user registry and flock-ed by its owner while in use
(:mod:`ckptgate.workdirs`); one that no live process holds is removed by the next run that
starts, whatever its destination.  Atomic publication is ckptgate's responsibility, not an
upstream guarantee [R12].
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ckptgate.errors import Error, UsageError
from ckptgate.workdirs import create, sweep_parent, sweep_registry

RECEIPT_NAME = "ckptgate-receipt.json"
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


class PublishError(Error):
    default_advice = "Nothing was published; DST is unchanged."


def _renameat2_noreplace(src: Path, dst: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
    if rc != 0:
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise UsageError("usage.dst_exists", f"{dst} already exists; ckptgate never replaces a published output")
        raise PublishError("publish.rename_failed", f"could not publish to {dst}: {os.strerror(err)}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_staging(parent: Path) -> list[Path]:
    """Remove this user's staging directories in ``parent`` whose owner is gone (no one holds their
    lock), under an exclusive lock of ``parent`` (:func:`ckptgate.workdirs.sweep_parent`)."""
    return sweep_parent(parent, "staging")


def check_destination(dst: Path, *, source: Path | None = None) -> Path:
    """Refuse a DST that exists, whose parent is missing, or that lies inside ``source`` (publishing
    there would change the checkpoint just measured), before any work is done."""
    dst = Path(os.path.abspath(dst))
    if dst.exists() or dst.is_symlink():
        raise UsageError("usage.dst_exists", f"{dst} already exists; ckptgate never replaces a published output")
    if not dst.parent.is_dir():
        raise UsageError("usage.dst_parent_missing", f"the parent of {dst} "
                         f"{'is not a directory' if dst.parent.exists() else 'does not exist'}")
    if source is not None and (dst.parent.resolve() / dst.name).is_relative_to(source.resolve()):
        raise UsageError("usage.dst_inside_source", f"{dst} is inside the checkpoint {source}; publishing there "
                         "would change what was measured", advice="Choose a destination outside the checkpoint.")
    return dst


@contextmanager
def staging(dst: Path) -> Iterator[Path]:
    """A private staging directory beside ``dst``, registered and locked for as long as it is in
    use; removed unless :func:`publish` consumed it.  Staging directories that killed intakes left,
    beside this DST or any other, are swept first."""
    dst = check_destination(dst)
    sweep_registry()
    remove_stale_staging(dst.parent)
    lease = create(dst.parent, f".{dst.name}.ckptgate-staging-{secrets.token_hex(16)}", "staging")  # mode 0700
    try:
        yield lease.path
    finally:
        lease.release()  # removes the directory unless it was renamed to DST


def publish(stage: Path, dst: Path, receipt: dict[str, Any]) -> Path:
    """Write the receipt into ``stage``, fsync everything, and rename ``stage`` to ``dst``."""
    dst = Path(os.path.abspath(dst))
    raw = (json.dumps(receipt, indent=2, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(stage / RECEIPT_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    for p in stage.iterdir():  # the one fsync of each output: the writer leaves durability to us
        if p.is_file():
            ffd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(ffd)
            finally:
                os.close(ffd)
    os.chmod(stage, 0o755)
    _fsync_dir(stage)
    _renameat2_noreplace(stage, dst)
    _fsync_dir(dst.parent)
    return dst
