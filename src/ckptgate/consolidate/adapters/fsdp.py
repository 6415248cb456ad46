"""FSDP state dicts [R03].

* ``SHARDED_STATE_DICT`` / FSDP2 ``DTensor`` ``Shard(0)`` saved through DCP: the DCP adapter.
* ``FULL_STATE_DICT`` saved with ``torch.save``: one torch zip; inspection's static reader
  located every tensor's storage bytes, so each output tensor is one byte range.
* ``LOCAL_STATE_DICT`` (``flat_param`` shards): the shards record no per-parameter names,
  shapes or padding, so they are refused (``plan.format.not_consolidatable``); nothing is guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptgate.consolidate.adapters._common import record_segment, segment_tensor
from ckptgate.consolidate.adapters.registry import Static, register
from ckptgate.consolidate.plan import (
    ConsolidationPlan,
    NotConsolidatable,
    OutputTensor,
    PlanError,
    no_tensors,
    shard_tensors,
    st_dtype,
)

if TYPE_CHECKING:
    pass


def full_tensors(layout: Mapping[str, Any]) -> list[OutputTensor]:
    """Output tensors of an ``fsdp-full`` layout (``{"file", "prefix", "tensors": [TensorRecord]}``)."""
    src = layout.get("file")
    if not isinstance(src, str):
        raise PlanError("plan.fsdp.layout", "the FULL_STATE_DICT layout names no file")
    out = []
    for rec in layout.get("tensors", []):
        name = rec["name"]
        seg = record_segment(src, rec, what=name)
        out.append(segment_tensor(name, st_dtype(rec["dtype"], what=name), rec["shape"], seg))
    return out


def plan(fmt: str, layout: Mapping[str, Any], *, max_shard_bytes: int) -> ConsolidationPlan:
    if fmt == "fsdp-local":
        raise NotConsolidatable(
            "plan.format.not_consolidatable",
            "FSDP LOCAL_STATE_DICT flat_param shards record no per-parameter names, shapes "
            "or padding; ckptgate does not guess them [R03]",
            evidence={"format": fmt, "files": list(layout.get("files", []))},
            advice="Save the model again with `StateDictType.SHARDED_STATE_DICT` through "
            "`torch.distributed.checkpoint.save`, or with `StateDictType.FULL_STATE_DICT`, then take that in.",
        )
    if fmt != "fsdp-full":
        raise PlanError("plan.format.unsupported", f"{fmt!r} is not an FSDP torch.save layout")
    tensors = full_tensors(layout)
    if not tensors:
        raise no_tensors()
    return shard_tensors(
        tensors,
        max_shard_bytes=max_shard_bytes,
        report={"adapter": "fsdp-full", "format": fmt, "prefix": layout.get("prefix")},
    )


#: ``fsdp-full``: FULL_STATE_DICT saved with torch.save, read statically.  ``fsdp-local`` is not
#: listed: inspection marks it not consolidatable, and the gates data names no adapter for it.
register(
    Static("fsdp-full", ("fsdp-full",), lambda i, size, _m, _s: plan(i.format or "", i.layout, max_shard_bytes=size))
)
