"""The sweep of abandoned staging directories beside a destination: a directory named like
the publish step's staging directories, owned by this user, that no live process holds
(its flock) is removed by the next intake that stages in the same parent."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat

from ckptgate.workdirs import lock_held

_STAGING = re.compile(r"^\..+\.ckptgate-staging-[A-Za-z0-9_]+$")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _held(parent_fd: int, name: str) -> bool:
    """Whether a live ckptgate still holds the staging directory (its flock); a dead one cannot."""
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except OSError:
        return True  # cannot tell: leave it alone
    try:
        return lock_held(fd)
    finally:
        os.close(fd)  # closing releases a lock we just took


def _ours(parent_fd: int, name: str) -> bool:
    """A real directory (not a symlink) owned by this user: only those are ever swept."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def remove_stale_staging(parent_fd: int) -> list[str]:
    """Remove staging directories in the directory ``parent_fd`` whose owner is gone (no one holds
    their lock); returns their names.

    Runs only with an exclusive lock on the parent itself; an intake holds that lock shared from
    creating its staging directory until it has locked it (:func:`staging`), so a directory
    that is not yet locked is never mistaken for a stale one.  If the lock is taken, the clean-up
    is left to a later intake.
    """
    removed: list[str] = []
    try:
        pfd = os.open(".", _DIR, dir_fd=parent_fd)  # a lock of our own: flock belongs to the open file
    except OSError:
        return removed
    try:
        try:
            fcntl.flock(pfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # taken (another intake is starting), or no flock here: that intake refuses it
            return removed
        with os.scandir(pfd) as it:
            names = sorted(e.name for e in it if _STAGING.match(e.name) and e.is_dir(follow_symlinks=False))
        for name in names:
            if _ours(pfd, name) and not _held(pfd, name):
                shutil.rmtree(name, dir_fd=pfd, ignore_errors=True)
                removed.append(name)
    finally:
        os.close(pfd)  # releases the lock
    return removed
