"""Pure-data adapter: (sharded) safetensors in, resharded HF safetensors out.

Every source tensor becomes one output tensor with one placement: its byte range in the source
file.  It uses the headers that :mod:`ckptgate.inspect.safetensors` validated during inspection
(no second read), and the shard list the format detector cross-checked against the index.
"""

from __future__ import annotations

from ckptgate.consolidate.adapters._common import header_tensors
from ckptgate.consolidate.adapters.registry import Static, register
from ckptgate.consolidate.plan import ConsolidationPlan, OutputTensor, PlanError, no_tensors, shard_tensors
from ckptgate.inspect import Inspection


def source_files(inspection: Inspection) -> list[str]:
    """The safetensors files that hold the model: the index's shards, or the single file."""
    layout = inspection.layout
    if inspection.format == "hf-sharded-safetensors":
        return sorted({s["path"] for s in layout.get("shards", [])})
    if inspection.format == "safetensors":
        return [f["path"] for f in layout.get("files", [])]
    raise PlanError("plan.format.unsupported", f"{inspection.format!r} is not a safetensors layout")


def plan(inspection: Inspection, *, max_shard_bytes: int) -> ConsolidationPlan:
    by_path = {f.path: f for f in inspection.files}
    tensors: list[OutputTensor] = []
    for rel in source_files(inspection):
        facts = by_path.get(rel)
        if facts is None or facts.safetensors is None:
            raise PlanError("plan.source.missing", f"shard {rel!r} has no validated safetensors header")
        tensors += header_tensors(rel, facts.safetensors)
    if not tensors:
        raise no_tensors()
    return shard_tensors(tensors, max_shard_bytes=max_shard_bytes)


#: ``hf-safetensors``: single or index-sharded safetensors, pure data.
register(
    Static(
        "hf-safetensors",
        ("hf-sharded-safetensors", "safetensors"),
        lambda i, size, _m, _s: plan(i, max_shard_bytes=size),
    )
)
