"""Whose files may configure ckptgate: the invoking user, root and ``$CKPTGATE_SAFE_OWNERS``, and
only files no one else can write (git's ``safe.directory`` rule)."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from ckptgate.errors import ConfigError

#: Names or uids of owners, besides the invoking user and root, whose files may configure ckptgate.
SAFE_OWNERS_ENV = "CKPTGATE_SAFE_OWNERS"


def safe_owners() -> set[int]:
    """The uids whose files may configure ckptgate: the invoking user, root, and ``$CKPTGATE_SAFE_OWNERS``
    (a comma-separated list of user names or uids)."""
    owners = {os.geteuid(), 0}
    for name in (os.environ.get(SAFE_OWNERS_ENV) or "").split(","):
        name = name.strip()
        if not name:
            continue
        if name.isdigit():
            owners.add(int(name))
            continue
        try:
            owners.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise ConfigError(
                "usage.config.safe_owner",
                f"{SAFE_OWNERS_ENV} names {name!r}, which is no user on this host",
                evidence={"owner": name},
                advice=f"Set {SAFE_OWNERS_ENV} to user names or uids of this host, separated by commas.",
            ) from None
    return owners


def check_owner(path: Path, what: str) -> None:
    """Refuse ``path`` (and, for a directory, every file under it) unless it is owned by a safe owner
    (:func:`safe_owners`) and not writable by group or others: a file another user can write could
    configure the gate that judges their checkpoint (git's ``safe.directory`` rule)."""
    owners = safe_owners()
    for p in [path, *(sorted(path.rglob("*")) if path.is_dir() else [])]:
        try:
            st = p.stat()
        except OSError as e:
            raise ConfigError(
                "usage.config.unreadable", f"cannot read {what} {p}: {e.strerror}", evidence={"file": str(p)}
            ) from None
        if st.st_uid not in owners:
            try:
                owner = pwd.getpwuid(st.st_uid).pw_name
            except KeyError:
                owner = str(st.st_uid)
            raise ConfigError(
                "usage.config.unsafe_owner",
                f"{what} {p} is owned by {owner}, not by the invoking user or root: another user's file "
                "cannot configure ckptgate",
                evidence={"file": str(p), "owner": owner, "uid": st.st_uid},
                advice=f"Remove it, or run with --isolated (or --config PATH); if {owner} is trusted, "
                f"set {SAFE_OWNERS_ENV}={owner}.",
            )
        writable_by_group = bool(st.st_mode & stat.S_IWGRP) and not _private_group(st.st_gid, st.st_uid)
        if st.st_mode & stat.S_IWOTH or writable_by_group:
            raise ConfigError(
                "usage.config.unsafe_mode",
                f"{what} {p} is writable by group or others (mode {stat.filemode(st.st_mode)}): "
                "another user could change how ckptgate decides",
                evidence={"file": str(p), "mode": oct(stat.S_IMODE(st.st_mode))},
                advice=f"Run `chmod go-w {p}`.",
            )


def _private_group(gid: int, uid: int) -> bool:
    """Whether group ``gid`` is ``uid``'s own private group (the user-private-group scheme of Debian and
    Ubuntu, whose umask 002 makes every file group-writable): no other user is a member of it or has it
    as their primary group, so its write bit gives no one else a way in."""
    try:
        members = grp.getgrgid(gid).gr_mem
    except KeyError:
        return False
    for name in members:
        try:
            if pwd.getpwnam(name).pw_uid != uid:
                return False
        except KeyError:
            return False
    return all(p.pw_uid == uid for p in pwd.getpwall() if p.pw_gid == gid)
