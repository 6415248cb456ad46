"""The inspect and digest steps of the one sequence, over a :class:`~ckptgate.group.Group`.

Every rank inspects SRC itself; at a world above one the ranks exchange what inspection read (the
read ledgers) and split the files by bytes (:func:`~ckptgate.consolidate.shares.assign_by_size`):
each rank hashes its own share, checking every chunk any rank's inspection read.  At a world of
one the share is every file.  Beside the digest run the containment preflight (when a framework
load may follow) and, on rank 0, the policy's precheck: a precheck that refuses (or cannot be
asked), or a signal, stops the digest where it is.  Nothing else runs Python beside it: the
digest's and the copy's threads each take the GIL between their large reads, hashes and writes,
so a thread that computes in Python slows all of them (issue #36).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ckptgate import interrupts
from ckptgate.consolidate import framework_files, shares
from ckptgate.consolidate.chunks import ChunkRecorder
from ckptgate.decide import Precheck
from ckptgate.digest import DigestCancelled, FixtureDigest, ManifestEntry, hash_files, in_turn
from ckptgate.enforce.containment import ContainmentProfile
from ckptgate.errors import RuntimeFailure
from ckptgate.group import Group
from ckptgate.inspect import DeferredCrcs, Inspection, SafeTree, inspect_open_tree
from ckptgate.inspect.findings import finding_from_json
from ckptgate.inspect.leases import lease_facts, leases_bind
from ckptgate.judge import needs_profile, refuse_if, run_preflight

__all__ = ["NO_PROGRESS", "Also", "Asker", "Measured", "Progress", "Staged", "combine_also", "measure"]

#: What the digest hands each file's chunks to, besides its hash: ``path -> callable or None``.
Also = Callable[[str], Callable[[int, memoryview], None] | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """Byte counts as the digest hashes (``hash_plan``: this rank's total first) and as the output is written."""

    hash_plan: Callable[[int], None] | None = None
    hash_bytes: Callable[[int], None] | None = None
    plan: Callable[[int], None] | None = None
    written: Callable[[int], None] | None = None


NO_PROGRESS = Progress()
#: Rank 0's precheck of the policy, from the inspection alone.
Asker = Callable[[Inspection], Precheck | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """What the inspect and digest steps formed, the same on every rank (but ``containment``: rank 0's)."""

    tree: SafeTree
    inspection: Inspection
    digest: FixtureDigest
    containment: ContainmentProfile | None
    sizes: dict[str, int]
    framework_files: tuple[str, ...]
    owners: list[list[str]]  # who hashed which file
    leased: bool  # whether the ranks' read leases bind what one copies to what another hashed
    chunks: dict[str, list[str]] | None  # the chunk manifest, where leases do not bind a world above one
    hash_seconds: list[float]


@dataclass(frozen=True, slots=True, kw_only=True)
class Staged:
    """What a one pass staged before the digest (:class:`ckptgate.onepass.OnePass`): the ``also``
    that writes the output from the digest's own buffer, or ``copy_beside`` when the output is
    copied by a serial chain of its own beside the digest, to which the digest's threads yield
    (:func:`~ckptgate.digest.hash_files`, ``yielding``)."""

    also: Also | None = None
    copy_beside: bool = False

    def __post_init__(self) -> None:
        if (self.also is None) == (not self.copy_beside):
            raise ValueError("a one pass stages either through the digest's also or by a copy beside it")


def combine_also(*readers: Also | None) -> Also:
    """One ``also`` for the digest from several: each file's chunks go to each reader that wants them."""
    given = [r for r in readers if r is not None]

    def also(path: str) -> Callable[[int, memoryview], None] | None:
        return in_turn([f for f in (r(path) for r in given) if f is not None])

    return also


def _precheck(ask: Asker, inspection: Inspection, stop: threading.Event) -> Precheck | None:
    """The policy's precheck; a refusal, or a failure to ask, stops the digest (the failure is
    raised to the caller, as the decision's would be)."""
    try:
        found = ask(inspection)
    except BaseException:
        stop.set()
        raise
    if found is not None and found.refuse:
        stop.set()
    return found


def measure(
    group: Group,
    open_tree: Callable[[], tuple[SafeTree, bool]],
    *,
    ask: Asker | None = None,
    containment: ContainmentProfile | None = None,
    stage: Callable[[Inspection], Staged | None] | None = None,
    progress: Progress = NO_PROGRESS,
    workers: int | None = None,
) -> Measured:
    """Inspect and digest across ``group``.  ``open_tree`` opens SRC (and says whether it holds
    its files) in the inspect step; ``ask`` is rank 0's precheck; ``stage``, at a world of one, is
    handed the inspection before the digest and may stage the output in the digest's pass
    (:class:`Staged`, :class:`ckptgate.onepass.OnePass`).  ``workers`` threads hash
    (default: the cores this process may run on)."""
    rank, world = group.rank, group.world
    crcs = DeferredCrcs()
    state: dict[str, Any] = {}

    def look() -> dict[str, Any]:
        tree, held = open_tree()
        state["tree"] = tree
        inspection = state["inspection"] = inspect_open_tree(tree, verify_crc=crcs)
        ledgers = {  # what this rank's inspection read: every other rank checks it in its digest pass
            e.path: {str(i): d.hex() for i, d in sorted(tree.ledger(e.path).recorded().items())}
            for e in tree.entries
            if world > 1
        }
        return {
            "ledgers": ledgers,
            "files": sorted([e.path, e.size] for e in tree.entries),
            "framework_files": list(framework_files(inspection)),
            **lease_facts(tree, held),
        }

    seen = group.agree("inspect", look)
    if any(s["files"] != seen[0]["files"] or s["framework_files"] != seen[0]["framework_files"] for s in seen):
        raise RuntimeFailure(
            "runtime.distributed.tree_mismatch",
            "the ranks do not see the same files in SRC (is it on one shared file system?); nothing was published",
            evidence={"source": str(state["tree"].root)},
        )
    tree: SafeTree = state["tree"]
    # With leases that bind every rank, each rank copies the placed bytes under its own lease; at a
    # world above one without them, the digest pass records the chunk manifest and every copied
    # chunk is checked against it; one process re-hashes what it copies against the manifest.
    leased = leases_bind(seen)
    manifest = world > 1 and not leased
    needed: list[str] = seen[0]["framework_files"]
    owners = shares.assign_by_size([(p, s) for p, s in seen[0]["files"]], world, first=needed)

    def digest_pass() -> dict[str, Any]:
        inspection: Inspection = state["inspection"]
        mine = owners[rank]
        for other in seen if world > 1 else ():  # every rank's inspection reads of my files
            for path in mine:
                for i, d in other["ledgers"].get(path, {}).items():
                    tree.ledger(path).record(int(i), bytes.fromhex(d))
        recorders = {p: ChunkRecorder() for p in mine} if manifest else {}
        stop = threading.Event()  # set by a refusing precheck, or by a signal that aborts the run
        with (
            interrupts.cancelling(stop),
            ThreadPoolExecutor(max_workers=2, thread_name_prefix="ckptgate-beside-digest") as pool,
        ):
            wanted = rank == 0 and containment is None and needs_profile(inspection)
            profile = pool.submit(run_preflight) if wanted else None
            early = pool.submit(_precheck, ask, inspection, stop) if ask is not None and rank == 0 else None
            if progress.hash_plan is not None:
                progress.hash_plan(sum(e.size for e in tree.entries if e.path in set(mine)))
            staged = stage(inspection) if stage is not None else None
            also = combine_also(recorders.get, staged.also if staged is not None else None)
            t0 = time.perf_counter()
            try:
                entries = hash_files(
                    tree,
                    mine,
                    workers=workers,
                    also=also,
                    apart=crcs.reader,
                    cancel=stop,
                    progress=progress.hash_bytes,
                    yielding=staged is not None and staged.copy_beside,
                )
            except DigestCancelled:
                entries = None
            seconds = time.perf_counter() - t0
            refuse_if(interrupts.result(early) if early is not None else None)  # raises what the precheck raised
            assert entries is not None  # only a refusal or a failed precheck cancels it
            state["containment"] = interrupts.result(profile) if profile is not None else containment
        for r in recorders.values():
            r.done()
        own = set(mine)
        return {
            "entries": [e.to_json() for e in entries],
            "seconds": round(seconds, 3),
            "chunks": {p: r.hashes for p, r in recorders.items()},
            # the CRC-32 checks of the zip entries this rank streamed (a bad or unchecked CRC is an
            # error finding); another rank's files are that rank's to report
            "crc_findings": [f.to_json() for f in crcs.findings() if f.path in own],
        }

    hashed = group.agree("digest", digest_pass)
    found = [finding_from_json(f) for h in hashed for f in h["crc_findings"]]
    digest = FixtureDigest.from_manifest(
        [ManifestEntry(path=e["path"], size=e["size"], sha256=e["sha256"]) for h in hashed for e in h["entries"]]
    )
    group.bind_fixture(str(digest.digest))
    return Measured(
        tree=tree,
        inspection=state["inspection"].with_findings(found),
        digest=digest,
        containment=state.get("containment"),
        sizes=dict(seen[0]["files"]),
        framework_files=tuple(needed),
        owners=owners,
        leased=leased,
        chunks={p: c for h in hashed for p, c in h["chunks"].items()} if manifest else None,
        hash_seconds=[h["seconds"] for h in hashed],
    )
