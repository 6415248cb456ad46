"""Whether read leases bind the bytes across a group of ranks (:func:`leases_bind`).

A lease is the kernel's: it binds what one rank copies to what another hashed only when every rank
runs on one kernel, opened the very same inodes, on a local file system, and holds every file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptgate._fs import LOCAL_FILE_SYSTEMS, boot_id
from ckptgate.inspect.walk import SafeTree

__all__ = ["lease_facts", "leases_bind"]


def lease_facts(tree: SafeTree, held: bool) -> dict[str, Any]:
    """What this rank's leases are on (JSON, for :func:`leases_bind`)."""
    return {
        "held": held,
        "kernel": boot_id(),
        # what a lease is on: the inodes this rank opened, and the file system they are on
        "inodes": [list(tree.root_id), *([e.path, e.dev, e.ino] for e in tree.entries)],
        "local_fs": tree.root_fs_magic in LOCAL_FILE_SYSTEMS,
    }


def leases_bind(seen: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the ranks' read leases bind what one rank copies to what another hashed: every rank
    holds every file, on a local file system, on one kernel, and opened the very same inodes."""
    kernels = {s.get("kernel") for s in seen}
    return (
        bool(seen)
        and all(
            s.get("held") is True and s.get("local_fs") is True and s.get("inodes") == seen[0].get("inodes")
            for s in seen
        )
        and len(kernels) == 1
        and None not in kernels
    )
