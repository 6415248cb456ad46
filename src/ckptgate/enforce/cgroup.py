"""cgroup v2: a child group with memory and pids limits for one worker, or why none can be made [R33]."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupV2Slot:
    """A child cgroup v2 group with memory and pids limits, for one worker [R33]."""

    path: str  # absolute path in the cgroup filesystem
    relpath: str  # as /proc/<pid>/cgroup shows it ("0::<relpath>")

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(f"{pid}\n")

    def remove(self) -> None:
        """Kill whatever is left in the group and remove it (best effort)."""
        try:
            with open(os.path.join(self.path, "cgroup.kill"), "w", encoding="ascii") as f:
                f.write("1\n")
        except OSError:
            pass
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def _v2_mount(mountinfo: str) -> str | None:
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            return left.split(" ")[4]
    return None


def _v2_relpath(proc_cgroup: str) -> str | None:
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def cgroup_v2_slot(*, memory_max: int, pids_max: int, root: str = "/") -> tuple[CgroupV2Slot | None, str]:
    """Create a child group with ``memory.max`` and ``pids.max`` set, or say why not.

    ``root`` prefixes ``/proc`` (for tests on a fake tree).
    """
    try:
        with open(os.path.join(root, "proc/self/mountinfo"), encoding="utf-8") as f:
            mount = _v2_mount(f.read())
        with open(os.path.join(root, "proc/self/cgroup"), encoding="utf-8") as f:
            rel = _v2_relpath(f.read())
    except OSError as e:
        return None, f"cannot read the process's cgroup information: {e}"
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if rel is None:
        return None, "this process has no cgroup v2 membership (no '0::' line)"
    base = os.path.join(root, mount.lstrip("/"), rel.lstrip("/"))
    try:
        with open(os.path.join(base, "cgroup.controllers"), encoding="ascii") as f:
            available = f.read().split()
    except OSError as e:
        return None, f"cannot read cgroup.controllers at {base}: {e}"
    missing = [c for c in ("memory", "pids") if c not in available]
    if missing:
        return None, (
            f"cgroup v2 at {mount} offers controllers {available or ['none']}; "
            f"{' and '.join(missing)} missing (they may be bound to cgroup v1)"
        )
    try:
        with open(os.path.join(base, "cgroup.subtree_control"), encoding="ascii") as f:
            enabled = f.read().split()
        if not {"memory", "pids"} <= set(enabled):
            with open(os.path.join(base, "cgroup.subtree_control"), "w", encoding="ascii") as f:
                f.write("+memory +pids\n")
    except OSError as e:
        return None, f"cannot enable memory and pids for child groups of {base}: {e}"
    name = f"ckptgate-{secrets.token_hex(6)}"
    path = os.path.join(base, name)
    try:
        os.mkdir(path, 0o755)
    except OSError as e:
        return None, f"cannot create a child group under {base}: {e}"
    slot = CgroupV2Slot(path=path, relpath=os.path.join(rel, name))
    try:
        for knob, value in (("memory.max", memory_max), ("memory.swap.max", 0), ("pids.max", pids_max)):
            knob_path = os.path.join(path, knob)
            if knob == "memory.swap.max" and not os.path.exists(knob_path):
                continue
            with open(knob_path, "w", encoding="ascii") as f:
                f.write(f"{value}\n")
    except OSError as e:
        slot.remove()
        return None, f"cannot set limits in {path}: {e}"
    return slot, ""
