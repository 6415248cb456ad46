"""The plan of a Megatron ``torch_dist`` checkpoint mapped to a Hugging Face model, and what is
published beside it (the ``--hf-config`` files, byte for byte)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from typing import Any

from ckptgate.consolidate.adapters import dcp
from ckptgate.consolidate.hf.args import ArgsAgreement, agree, common_args
from ckptgate.consolidate.hf.engine import map_tensors
from ckptgate.consolidate.hf.source import HfConfig
from ckptgate.consolidate.hf.table import MappingRefused
from ckptgate.consolidate.plan import ConsolidationPlan, PlanError, no_tensors, shard_tensors
from ckptgate.consolidate.writer import WrittenFile
from ckptgate.dtypes import TORCH_TO_SAFETENSORS

__all__ = ["args_agreement", "check_dtype", "hf_plan", "layout_ep", "layout_tp", "mapping_facts", "write_config_files"]

_TORCH_NAME = {code: name for name, code in TORCH_TO_SAFETENSORS.items()}
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def layout_tp(layout: Mapping[str, Any]) -> int | None:
    """The tensor-parallel degree the layout shows: the chunks of ``linear_proj.weight`` (split
    on its input dim once per TP rank), or ``None`` when it has none."""
    for t in layout.get("tensors", []):
        if str(t.get("fqn", "")).endswith("self_attention.linear_proj.weight"):
            size = t["size"]
            return len({tuple(c["offsets"][len(size) - 1 :]) for c in t["chunks"]})
    return None


def args_agreement(layout: Mapping[str, Any], hf: HfConfig) -> ArgsAgreement:
    """The checkpoint's Megatron-LM ``args`` (if any) against the config, or a typed refusal."""
    inner = layout.get("dcp")
    tp = layout_tp(inner) if isinstance(inner, Mapping) else None
    return agree(common_args(layout), hf.declared, hf.config, layout_tp=tp)


def mapping_facts(layout: Mapping[str, Any], hf: HfConfig) -> dict[str, Any]:
    """``input.hf_mapping``: the config's facts, the TP the layout shows, and what the args agreed."""
    inner = layout.get("dcp")
    if not isinstance(inner, Mapping):
        return hf.facts(None, None, args_agreement(layout, hf))
    return hf.facts(layout_tp(inner), layout_ep(inner), args_agreement(layout, hf))


_WRITER = re.compile(r"^__([0-9]+)_[0-9]+\.distcp$")
#: the experts' linear_fc2: stacked (``...experts.experts.linear_fc2.weight``) or, saved with
#: singleton_local_shards, one key per expert (``...experts.experts.<e>.linear_fc2.weight``)
_EXPERT_FC2 = re.compile(r"^(.*\.experts\.experts\.)(?:[0-9]+\.)?linear_fc2\.weight$")


def layout_ep(layout: Mapping[str, Any]) -> int | None:
    """The expert-parallel degree the layout shows: the ranks that wrote the chunks of the
    experts' ``linear_fc2.weight`` of the first layer that has them (stacked, or every per-expert
    key of that layer; each EP rank writes its own experts; a replica along expert data
    parallelism is not written twice), over its tensor-parallel split (its input dim, per ETP
    rank); ``None`` when the checkpoint has no experts or its files are not named by rank."""
    found = [(m.group(1), t) for t in layout.get("tensors", []) if (m := _EXPERT_FC2.match(str(t.get("fqn", ""))))]
    if not found:
        return None
    first = min(prefix for prefix, _ in found)
    group = [t for prefix, t in found if prefix == first]
    fqns = {str(t["fqn"]) for t in group}
    ranks = set()
    for s in layout.get("storage", []):
        if s.get("fqn") in fqns:
            m = _WRITER.match(str(s.get("relative_path", "")))
            if m is None:
                return None
            ranks.add(int(m.group(1)))
    size = group[0]["size"]
    etp = len({tuple(c["offsets"][len(size) - 1 :]) for c in group[0]["chunks"]})
    return len(ranks) // etp if ranks and len(ranks) % etp == 0 else None


def hf_plan(fmt: str | None, layout: Mapping[str, Any], hf: HfConfig, *, max_shard_bytes: int) -> ConsolidationPlan:
    """The mapped plan (HF names, sharded at ``max_shard_bytes``), or a typed refusal."""
    if fmt != "megatron-torch-dist":
        raise MappingRefused(
            "mapping.format",
            f"--hf-config maps Megatron Core torch_dist checkpoints; this is {fmt!r}",
            evidence={"format": fmt},
        )
    inner = layout.get("dcp")
    if not isinstance(inner, Mapping):
        raise PlanError("plan.megatron.layout", "the torch_dist layout has no DCP metadata")
    agreement = args_agreement(layout, hf)
    tensors = dcp.torch_save_tensors(inner)
    if not tensors:
        raise no_tensors()
    items = [i for i in inner.get("items", []) if i.get("kind") == "bytes"]
    out, report = map_tensors(tensors, items, hf.declared)
    report = {
        "adapter": "megatron-torch-dist",
        "mapping": "hf",
        "hf_config": hf.to_json(),
        "layout_tp": layout_tp(inner),
        "megatron_args": agreement.to_json(),
        "layout_ep": layout_ep(inner),
        **report,
    }
    return shard_tensors(out, max_shard_bytes=max_shard_bytes, report=report)


def check_dtype(plan: ConsolidationPlan, hf: HfConfig) -> None:
    """The published ``config.json`` must declare the dtype of the published weights."""
    found = sorted({_TORCH_NAME.get(t.dtype, t.dtype) for s in plan.shards for t in s.tensors})
    declared = hf.declared.dtype
    if len(found) != 1 or declared != found[0]:
        raise MappingRefused(
            "mapping.config.dtype",
            f"config.json declares dtype {declared!r}; the weights are {', '.join(found)}",
            evidence={"declared": declared, "weights": found},
            advice="Declare the weights' dtype in config.json (dtype or torch_dtype), or cast with --dtype to the "
            "declared one.",
        )


def write_config_files(hf: HfConfig, out_fd: int) -> tuple[WrittenFile, ...]:
    """Write exactly the bytes read from ``--hf-config`` into ``out_fd``."""
    written = []
    for f in hf.files:
        fd = os.open(f.name, _CREATE, 0o644, dir_fd=out_fd)
        try:
            view = memoryview(f.data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        assert hashlib.sha256(f.data).hexdigest() == f.sha256
        written.append(WrittenFile(filename=f.name, size=f.size, sha256=f.sha256))
    return tuple(written)
