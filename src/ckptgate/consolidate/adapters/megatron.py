"""Megatron Core ``torch_dist`` into HF safetensors [R04, R05, R07].

The checkpoint is DCP underneath: each ``ShardedTensor``'s chunks carry global offsets, so
placement is the DCP adapter's.  Homogeneous layers are saved stacked on a prepended layer
axis; by default the global tensors are kept as saved.  Offsets establish placement, not model
semantics [R04]: fused QKV (``linear_qkv``) and the W/V concatenation of a gated (SwiGLU)
``linear_fc1`` are reported in the plan, never split.  Splitting the layer axis into per-layer
tensors happens only when the caller declares the ``megatron-unstack-layers`` mapping; a
model-family mapping (Megatron Bridge style [R07]) is not guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptgate.consolidate.adapters import dcp
from ckptgate.consolidate.adapters._common import slice_placements
from ckptgate.consolidate.adapters.registry import Static, register
from ckptgate.consolidate.plan import ConsolidationPlan, OutputTensor, PlanError, no_tensors, shard_tensors

if TYPE_CHECKING:
    pass


UNSTACK_LAYERS = "megatron-unstack-layers"
_STACKED = re.compile(r"(^|\.)layers\.(?!\d+\.)(?=[A-Za-z_])")
_SEMANTICS = (
    (
        re.compile(r"linear_qkv\.(weight|bias)$"),
        "fused_qkv",
        "query, key and value projections fused in one tensor (grouped per query group); not split",
    ),
    (
        re.compile(r"linear_fc1\.(weight|bias)$"),
        "fc1_may_be_gated",
        "with a gated activation (SwiGLU) fc1 holds W then V concatenated on dim 0; not split",
    ),
)


def semantics(names: list[str]) -> list[dict[str, str]]:
    """What is known about model-family layout from tensor names, reported, not acted on."""
    out = []
    for name in sorted(names):
        for pattern, kind, note in _SEMANTICS:
            if pattern.search(name):
                out.append({"tensor": name, "kind": kind, "note": note})
    return out


def unstack(t: OutputTensor) -> list[OutputTensor]:
    """Split a layer-stacked tensor ``...layers.<sub>`` of shape ``[L, ...]`` into ``...layers.<i>.<sub>``."""
    if not _STACKED.search(t.name) or len(t.shape) < 1:
        raise PlanError("plan.megatron.not_stacked", f"{t.name!r} is not a layer-stacked tensor")
    layers, rest = t.shape[0], t.shape[1:]
    per = t.nbytes // layers if layers else 0
    out = []
    for i in range(layers):
        name = _STACKED.sub(f"\\g<1>layers.{i}.", t.name, count=1)
        placements = slice_placements(t.placements, i * per, per) if per else ()
        out.append(OutputTensor(name=name, dtype=t.dtype, shape=rest, placements=placements))
    return out


def plan(layout: Mapping[str, Any], *, max_shard_bytes: int, mapping: str | None = None) -> ConsolidationPlan:
    if mapping not in (None, UNSTACK_LAYERS):
        raise PlanError(
            "plan.mapping.unknown",
            f"no qualified mapping adapter named {mapping!r}",
            evidence={"known": [UNSTACK_LAYERS]},
        )
    inner = layout.get("dcp")
    if not isinstance(inner, Mapping):
        raise PlanError("plan.megatron.layout", "the torch_dist layout has no DCP metadata")
    tensors = dcp.torch_save_tensors(inner)
    stacked = set(layout.get("layer_stacked", []))
    if mapping == UNSTACK_LAYERS:
        tensors = [u for t in tensors for u in (unstack(t) if t.name in stacked else [t])]
    if not tensors:
        raise no_tensors()
    report: dict[str, Any] = {
        "adapter": "megatron-torch-dist",
        "mapping": mapping,
        "layer_stacked": sorted(stacked),
        "layer_axis": "unstacked" if mapping == UNSTACK_LAYERS else "kept as saved (prepended layer axis)",
        "model_family_semantics": semantics(sorted({t.name for t in tensors} | stacked)),
        "skipped_bytes_items": sorted(inner.get("bytes_items", [])),
    }
    return shard_tensors(tensors, max_shard_bytes=max_shard_bytes, report=report)


#: ``megatron-torch-dist``: Megatron-Core torch_dist, optionally through a declared mapping.
register(
    Static(
        "megatron-torch-dist",
        ("megatron-torch-dist",),
        lambda i, size, mapping, _s: plan(i.layout, max_shard_bytes=size, mapping=mapping),
        mappings=(UNSTACK_LAYERS,),
    )
)
