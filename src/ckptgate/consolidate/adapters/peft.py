"""PEFT adapters: passed through as ``adapter_model.safetensors`` + ``adapter_config.json`` [R16].

An adapter is meaningless without its base model, so the base revision must be pinned in
``adapter_config.json``; a ``revision`` that is not a commit id (null, absent, or a branch or tag
name, which can move) is refused (``plan.peft.base_revision_missing``).  The tensors are re-written
byte for byte from the validated header; the config is copied verbatim.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ckptgate.consolidate.adapters._common import header_tensors
from ckptgate.consolidate.adapters.registry import Static, register
from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile, NotConsolidatable, PlanError, ShardTask
from ckptgate.inspect.formats.peft import pins_a_commit

if TYPE_CHECKING:
    pass


WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def plan(layout: Mapping[str, Any], files: Mapping[str, Any]) -> ConsolidationPlan:
    """``files`` maps relpaths to inspection ``FileFacts``."""
    adapters = layout.get("adapters", [])
    if len(adapters) != 1:
        raise NotConsolidatable(
            "plan.peft.adapters",
            f"expected exactly one adapter, found {len(adapters)}",
            evidence={"adapters": [a.get("config") for a in adapters]},
        )
    a = adapters[0]
    revision = (a.get("fields") or {}).get("revision")
    if not pins_a_commit(revision):
        raise NotConsolidatable(
            "plan.peft.base_revision_missing",
            f"the adapter's base model revision ({str(revision)[:80]!r}) is not a commit id; an adapter "
            "is published only with a pinned base [R16]",
            evidence={
                "config": a.get("config"),
                "base_model": (a.get("fields") or {}).get("base_model_name_or_path"),
                "revision": revision,
            },
            advice="Set `revision` in adapter_config.json to the immutable base revision "
            "(a commit hash) the adapter was trained on, and attest the new digest.",
        )
    wrel, crel = a.get("weights"), a.get("config")
    wf, cf = files.get(wrel), files.get(crel)
    if wf is None or wf.safetensors is None or cf is None:
        raise PlanError("plan.source.missing", "the adapter weights or config were not inspected")
    header = wf.safetensors
    tensors = header_tensors(wrel, header)
    meta = dict(header.metadata or {"format": "pt"})
    shard = ShardTask(filename=WEIGHTS, tensors=tuple(tensors), metadata=MappingProxyType(meta))
    return ConsolidationPlan(
        shards=(shard,),
        copies=(CopiedFile(src=crel, filename=posixpath.basename(crel) or CONFIG, size=cf.size),),
        write_index=False,
        report=MappingProxyType(
            {
                "adapter": "peft",
                "base_model": a["fields"].get("base_model_name_or_path"),
                "base_revision": revision,
                "peft_type": a["fields"].get("peft_type"),
            }
        ),
    )


register(Static("peft", ("peft", "peft-lora"), lambda i, _size, _m, _s: plan(i.layout, {f.path: f for f in i.files})))
