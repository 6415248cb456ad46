"""How much memory reading each source byte once would need, for a checkpoint's consolidation plan (issue #36).

The one pass hashes every input file in its own order (a file's sha256 is sequential) and writes
every output file in its order (so is the output's sha256).  Where the two orders differ, a single
read must hold bytes from the moment they are read until the other order reaches them; the held
copy instead reads the placed bytes a second time (from the page cache).  For each checkpoint given,
this computes the peak of bytes held by the two ways of reading once:

* ``file_order``: every source read front to back (as the digest reads), each placed range held
  until the output, written front to back, takes it;
* ``output_order``: the placed ranges read in the output's order (as the held copy reads), each
  held until its file's hash reaches it (the bytes no output takes are read when the hash needs
  them, and held for no time).

Both read each source as lazily as their order allows, and take the outputs as one order (the
held copy writes several outputs at once).  A range placed twice is held until its first use, and
ranges that overlap are counted apart.  The plan is the one intake makes
(``adapter_plan`` over the static inspection); nothing is loaded.  Prints one JSON document.

    .venv/bin/python bench/read_once_memory.py CHECKPOINT [CHECKPOINT ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ckptgate.consolidate import adapter_plan
from ckptgate.consolidate.plan import ConsolidationPlan
from ckptgate.consolidate.segments import Segment, runs_in_output_order
from ckptgate.inspect import SafeTree, inspect_open_tree


def output_runs(plan: ConsolidationPlan) -> list[tuple[str, int, int]]:
    """``(source, offset, length)`` of every placed run, in the order the held copy takes them
    (the writer's own :func:`~ckptgate.consolidate.segments.runs_in_output_order`), output by output."""
    if any(t.source_dtype for s in plan.shards for t in s.tensors):
        raise SystemExit("a plan with a cast: placements in the source dtype's units are not modelled")
    runs: list[tuple[str, int, int]] = []
    for k, shard in enumerate(plan.shards):
        base, pieces = 0, []
        for t in shard.tensors:
            for p in t.placements:
                seg = Segment(p.src_offset, p.length, k, base + p.dst_offset, None, p.count, p.src_stride, p.dst_stride)
                pieces.append((p.src, seg))
            base += t.nbytes
        runs += [(src, g.src_offset, g.length) for src, g in runs_in_output_order(pieces)]
    runs += [(c.src, 0, c.size) for c in plan.copies if c.size]
    return runs


def peaks(runs: list[tuple[str, int, int]]) -> dict[str, int]:
    """The peak bytes held by each way of reading once (the module's docstring).  A range placed
    twice (tied weights) is held until its first use: the figures are lower bounds."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for src, off, n in runs:
        ranges.setdefault(src, []).append((off, n))
    ordered = {src: sorted(set(rs)) for src, rs in ranges.items()}  # each source's ranges, in file order
    rank = {src: {r: i for i, r in enumerate(rs)} for src, rs in ordered.items()}
    sizes = {src: [n for _, n in rs] for src, rs in ordered.items()}
    # file order: source s has been read up to its range read[s]; a range is held from its read to its use
    read = dict.fromkeys(ranges, 0)
    held = peak_file = 0
    # output order: ranges taken so far; each file's hash has reached its range hashed[s]
    taken: dict[str, set[int]] = {s: set() for s in ranges}
    hashed = dict.fromkeys(ranges, 0)
    waiting = peak_out = 0
    for src, off, n in runs:
        i = rank[src][(off, n)]
        if i in taken[src]:  # placed again: used from what was read for its first use
            continue
        while read[src] <= i:  # file order: read up to this range, holding each range read
            held += sizes[src][read[src]]
            read[src] += 1
        held -= n  # this range is used as it is read: what is held is what waits
        peak_file = max(peak_file, held)
        taken[src].add(i)  # output order: this range is read now and waits for its file's hash
        waiting += n
        while hashed[src] in taken[src]:
            waiting -= sizes[src][hashed[src]]
            hashed[src] += 1
        peak_out = max(peak_out, waiting)
    return {"file_order": peak_file, "output_order": peak_out}


def measure(root: Path) -> dict[str, Any]:
    with SafeTree.open(root) as tree:
        inspection = inspect_open_tree(tree)
        plan = adapter_plan(inspection, max_shard_bytes=5 << 30, hf=None)
        total = sum(e.size for e in tree.entries)
    runs = output_runs(plan)
    got = peaks(runs)
    least, placed = min(got.values()), sum(n for _, _, n in runs)
    return {
        "checkpoint": str(root),
        "input_bytes": total,
        "placed_bytes": placed,
        **{f"{k}_held_bytes": v for k, v in got.items()},
        "least_held_fraction_of_placed": round(least / placed, 3) if placed else 0.0,
    }


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(json.dumps([measure(Path(a)) for a in sys.argv[1:]], indent=2))


if __name__ == "__main__":
    main()
