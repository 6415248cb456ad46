"""Pure-data adapter: (sharded) safetensors in, resharded HF safetensors out.

Every source tensor becomes one output tensor with one placement: its byte range in the source
file.  The header was validated by :mod:`ckptgate.inspect.safetensors`; the index (if any) was
cross-checked by the format detector, so here each tensor name appears exactly once.
"""

from __future__ import annotations

import os

from ckptgate.consolidate.plan import ConsolidationPlan, OutputTensor, Placement, PlanError, shard_tensors
from ckptgate.inspect import SafeTree
from ckptgate.inspect.safetensors import read_header


def plan(tree: SafeTree, shard_files: list[str], *, max_shard_bytes: int) -> ConsolidationPlan:
    tensors: list[OutputTensor] = []
    for rel in shard_files:
        entry = tree.entry(rel)
        if entry is None:
            raise PlanError("plan.source.missing", f"shard {rel!r} is not in the checkpoint")
        fd = tree.open_file(rel)
        try:
            header = read_header(fd, entry.size, path=rel)
        finally:
            os.close(fd)
        for t in header.tensors:
            begin, end = t.data_offsets
            placements = () if end == begin else (
                Placement(src=rel, src_offset=header.data_start + begin, dst_offset=0, length=end - begin),)
            tensors.append(OutputTensor(name=t.name, dtype=t.dtype, shape=tuple(t.shape), placements=placements))
    return shard_tensors(tensors, max_shard_bytes=max_shard_bytes)
