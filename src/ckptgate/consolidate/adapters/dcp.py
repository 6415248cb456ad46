"""PyTorch DCP, both storage layouts, into full tensors [R01, R02, R18].

* torch_save storage (``.metadata`` + ``__<rank>_<n>.distcp``): inspection read ``.metadata``
  with the static pickle reader and located, for each chunk, the torch-zip item in its
  ``.distcp`` file and the stored (uncompressed) tensor bytes in it.  Each chunk is placed by its
  ``offsets``/``sizes``: a chunk of a tensor sharded on dim 0 is one contiguous range; a chunk
  split on another dim (a tensor-parallel ``Shard(1)``) is a regular run of rows, one strided
  placement (:func:`~ckptgate.consolidate.runs.chunk_strided_runs`).
* HF-safetensors storage (``shard-*-model-*.safetensors``): each shard's ``DCP_SHARDING_INFO``
  gives ``saved_offsets`` per tensor; the full shape is the largest ``offset + size`` (there is
  no ``.metadata``), and the plan invariants refuse any gap or overlap, which torch's own
  ``consolidate_safetensors_files`` does not check.

BYTE_IO items (non-tensor values) are never unpickled here; they are listed in the plan report
as skipped.  FSDP2 ``DTensor`` ``Shard(0)`` state dicts saved through DCP take this path [R03].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckptgate.consolidate.adapters._common import record_segment
from ckptgate.consolidate.adapters.registry import Static, register
from ckptgate.consolidate.plan import (
    DTYPE_SIZES,
    MAX_PLAN_RUNS,
    ConsolidationPlan,
    OutputTensor,
    Placement,
    PlanError,
    chunk_placement_count,
    chunk_strided_runs,
    merge_placements,
    no_tensors,
    numel,
    shard_tensors,
    st_dtype,
    strided,
)
from ckptgate.decide.decision import Selection

if TYPE_CHECKING:
    pass


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise PlanError("plan.dcp.layout", f"{what} is not a list of integers")
    return tuple(v)


def _chunk_placements(
    fqn: str,
    full: tuple[int, ...],
    offsets: tuple[int, ...],
    sizes: tuple[int, ...],
    src: str,
    base: int,
    itemsize: int,
) -> list[Placement]:
    return [
        strided(
            src=src,
            src_offset=base + s * itemsize,
            dst_offset=d * itemsize,
            length=n * itemsize,
            count=k,
            src_stride=ss * itemsize,
            dst_stride=ds * itemsize,
        )
        for s, d, n, k, ss, ds in chunk_strided_runs(full, offsets, sizes)
    ]


def _tensors(
    layout: Mapping[str, Any],
    locate: Callable[[str, str, Mapping[str, Any], tuple[int, ...], tuple[int, ...], int], tuple[str, int]],
    what: tuple[str, str],
) -> list[OutputTensor]:
    """Output tensors of a DCP layout; ``locate`` gives each non-empty chunk's (file, byte offset)."""
    out: list[OutputTensor] = []
    runs = 0
    for t in layout.get("tensors", []):
        fqn = t["fqn"]
        dtype = st_dtype(t["dtype"], what=fqn)
        full = _ints(t["size"], f"{fqn}: size")
        size = DTYPE_SIZES[dtype]
        placements: list[Placement] = []
        for c in t["chunks"]:
            offsets = _ints(c["offsets"], f"{fqn}: {what[0]}")
            sizes = _ints(c["sizes"], f"{fqn}: {what[1]}")
            runs += chunk_placement_count(full, offsets, sizes)  # counted before any is built
            if runs > MAX_PLAN_RUNS:
                raise PlanError(
                    "plan.too_many_runs",
                    f"{fqn}: the layout splits its tensors into more than {MAX_PLAN_RUNS:,} placements",
                    evidence={"tensor": fqn, "limit": MAX_PLAN_RUNS},
                    advice=f"{fqn} is split on several leading dimensions, which needs a placement per index "
                    "of them; ckptgate bounds the plan's memory instead of building them. Save it again sharded "
                    "on its first dimension only (`Shard(0)`), then take that in.",
                )
            src, base = locate(fqn, dtype, c, offsets, sizes, size)
            if numel(sizes):
                placements += _chunk_placements(fqn, full, offsets, sizes, src, base, size)
        out.append(OutputTensor(name=fqn, dtype=dtype, shape=full, placements=merge_placements(placements)))
    return out


def torch_save_tensors(layout: Mapping[str, Any]) -> list[OutputTensor]:
    """Output tensors of a DCP torch_save layout (``Inspection.layout`` of ``dcp-torch-save``)."""
    items: dict[tuple[str, tuple[int, ...]], Mapping[str, Any]] = {}
    for it in layout.get("items", []):
        if it.get("kind") == "tensor" and it.get("chunk_offsets") is not None:
            items[(it["fqn"], tuple(it["chunk_offsets"]))] = it

    def locate(
        fqn: str, dtype: str, c: Mapping[str, Any], offsets: tuple[int, ...], sizes: tuple[int, ...], size: int
    ) -> tuple[str, int]:
        if numel(sizes) == 0:
            return "", 0
        item = items.get((fqn, offsets))
        if item is None or "tensor" not in item:
            raise PlanError(
                "plan.dcp.chunk_without_item",
                f"{fqn}: chunk {list(offsets)} has no located storage item",
                evidence={"tensor": fqn, "offsets": list(offsets)},
            )
        rec = item["tensor"]
        if tuple(rec["shape"]) != sizes or st_dtype(rec["dtype"], what=fqn) != dtype:
            raise PlanError(
                "plan.dcp.item_mismatch",
                f"{fqn}: the item at chunk {list(offsets)} does not match the chunk's shape or dtype",
                evidence={"tensor": fqn},
            )
        seg = record_segment(item["path"], rec, what=fqn)
        return seg.src, seg.offset

    return _tensors(layout, locate, ("chunk offsets", "chunk sizes"))


def hf_storage_tensors(layout: Mapping[str, Any]) -> list[OutputTensor]:
    """Output tensors of a DCP HF-storage layout (``Inspection.layout`` of ``dcp-hf-safetensors``)."""

    def locate(
        fqn: str, dtype: str, c: Mapping[str, Any], offsets: tuple[int, ...], sizes: tuple[int, ...], size: int
    ) -> tuple[str, int]:
        begin, end = _ints(c["data_offsets"], f"{fqn}: data_offsets")
        if end - begin != numel(sizes) * size:
            raise PlanError(
                "plan.dcp.item_mismatch",
                f"{fqn}: a chunk's byte range does not match its shape",
                evidence={"tensor": fqn, "path": c["path"]},
            )
        return c["path"], begin

    return _tensors(layout, locate, ("saved_offsets", "shape"))


def select(
    tensors: Sequence[OutputTensor], skipped: Sequence[str], selection: Selection
) -> tuple[list[OutputTensor], list[str], dict[str, Any]]:
    """The entries under ``selection.prefix + "."``, named without it (``model.0.weight`` ->
    ``0.weight``, as ``get_model_state_dict`` names them), the BYTE_IO items under it, and the
    report of what was left out (never written)."""
    head = selection.prefix + "."
    kept = [dataclasses.replace(t, name=t.name[len(head) :]) for t in tensors if t.name.startswith(head)]
    if not kept:
        raise PlanError(
            "plan.selection.empty",
            f"no tensor of this tree is under {selection.prefix!r}",
            evidence={"prefix": selection.prefix},
        )
    left = [t.name for t in tensors if not t.name.startswith(head)]
    report = {
        **selection.to_json(),
        "excluded_tensors": len(left),
        "excluded_bytes_items": sum(1 for s in skipped if not s.startswith(head)),
    }
    return kept, [s[len(head) :] for s in skipped if s.startswith(head)], report


def plan(
    fmt: str, layout: Mapping[str, Any], *, max_shard_bytes: int, selection: Selection | None = None
) -> ConsolidationPlan:
    """The plan of a DCP tree: whole, or only the subtree ``selection`` names (decided by policy)."""
    if fmt == "dcp-torch-save":
        tensors = torch_save_tensors(layout)
        skipped: Sequence[str] = sorted(layout.get("bytes_items", []))
    elif fmt == "dcp-hf-safetensors":
        tensors, skipped = hf_storage_tensors(layout), ()
    else:
        raise PlanError("plan.format.unsupported", f"{fmt!r} is not a DCP layout")
    if not tensors:
        raise no_tensors()
    report: dict[str, Any] = {"adapter": "dcp", "format": fmt}
    if selection is not None:
        tensors, skipped, report["selection"] = select(tensors, skipped, selection)
    if skipped:
        report["skipped_bytes_items"] = list(skipped)
    return shard_tensors(tensors, max_shard_bytes=max_shard_bytes, report=report)


#: ``dcp``: torch.distributed.checkpoint with torch.save or HF safetensors storage.
register(
    Static(
        "dcp",
        ("dcp-torch-save", "dcp-hf-safetensors"),
        lambda i, size, _m, selection: plan(i.format or "", i.layout, max_shard_bytes=size, selection=selection),
        selects=True,
    )
)
