"""Each rank's share of the consolidation's write, when a group of ranks writes one plan.

The ranks split the plan's outputs between them (:func:`assign_by_size`), check that they derived
the same plan (:func:`plan_sha256`), and each hands its own outputs (:func:`share_of`) to the one
writer (:func:`ckptgate.consolidate.writer.write_plan`) into the one staging directory, its
sources read under this rank's read leases (checked after the copy) or checked chunk by chunk
against the chunk manifest (:mod:`ckptgate.consolidate.chunks`): so the bytes one rank copies are
the bytes another rank hashed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Sequence

from ckptgate.consolidate.plan import ConsolidationPlan
from ckptgate.consolidate.writer import header_bytes

__all__ = ["assign_by_size", "output_sizes", "plan_sha256", "share_of"]


def assign_by_size(items: Sequence[tuple[str, int]], world: int, *, first: Collection[str] = ()) -> list[list[str]]:
    """Items to ranks, largest first to the rank with the fewest bytes so far (ties: by name, then
    the lowest rank): deterministic on every rank.  The items named in ``first`` (the files that
    need a framework load) are spread before all others, so that the framework loads are shared out first."""
    loads = [0] * world
    out: list[list[str]] = [[] for _ in range(world)]
    early = set(first)
    for name, size in sorted(items, key=lambda x: (x[0] not in early, -x[1], x[0])):
        r = min(range(world), key=lambda k: (loads[k], k))
        out[r].append(name)
        loads[r] += size
    return out


def plan_sha256(plan: ConsolidationPlan) -> str:
    """The sha256 of everything the plan makes the ranks write (headers, placements, copies, index)."""
    doc = {
        "shards": [
            {
                "file": s.filename,
                "header": hashlib.sha256(header_bytes(s)).hexdigest(),
                "placements": [
                    [
                        t.source_dtype,
                        [
                            [p.src, p.src_offset, p.dst_offset, p.length, p.count, p.src_stride, p.dst_stride]
                            for p in t.placements
                        ],
                    ]
                    for t in s.tensors
                ],
            }
            for s in plan.shards
        ],
        "copies": [[c.src, c.filename, c.size] for c in plan.copies],
        "index": [plan.write_index, dict(plan.index_metadata), plan.total_size],
        "report": dict(plan.report),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def output_sizes(plan: ConsolidationPlan) -> list[tuple[str, int]]:
    """Every output of ``plan`` with the bytes it will have (what the ranks split)."""
    return [(s.filename, len(header_bytes(s)) + s.nbytes) for s in plan.shards] + [
        (c.filename, c.size) for c in plan.copies
    ]


def share_of(plan: ConsolidationPlan, mine: Collection[str]) -> ConsolidationPlan:
    """The part of ``plan`` that writes the outputs named in ``mine``, without the index (rank 0
    writes it once the shares are in): what one rank hands the one writer."""
    return dataclasses.replace(
        plan,
        shards=tuple(s for s in plan.shards if s.filename in mine),
        copies=tuple(c for c in plan.copies if c.filename in mine),
        write_index=False,
    )
