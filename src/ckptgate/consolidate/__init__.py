"""Consolidate: placement plans per output shard, executed by a streaming writer.

:func:`plan_for` is the single entry point: it picks the adapter for the inspected format.
Adapters for pure-data and statically read formats use only what inspection read.  DeepSpeed
ZeRO is gated as a framework load (its loader is DeepSpeed's); when every state file stayed
inside the static reader's DeepSpeed allowlist, the plan is still built from the static reader
and no worker starts.  Otherwise :func:`framework_files` names the files that need the load, the
enforce step (:mod:`ckptgate.enforce`, which comes before this one) mints the permit and runs
the loader in the contained worker, and :func:`plan_for` receives what it loaded as
:class:`~ckptgate.enforce.load.LoadedTrees`: JSON placement trees (never a pickle), which the
adapter maps to byte ranges; the writer moves the raw bytes.  The plan's report says which
(``trees_from``) and, for the worker, the controls that were active inside it.  This package
never starts a process and never checks the decision's allow or loaders (enforce did).  See
``docs/consolidation.md``.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import TYPE_CHECKING

from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile, NotConsolidatable, PlanError
from ckptgate.decide.decision import Decision
from ckptgate.errors import PolicyDenied, RuntimeFailure
from ckptgate.inspect import Inspection

if TYPE_CHECKING:
    from ckptgate.enforce.load import LoadedTrees


def framework_files(inspection: Inspection) -> tuple[str, ...]:
    """The files of ``inspection`` that no plan can be built from without a framework load (the
    enforce step loads them in the contained worker); empty when the static reader read every one
    completely inside its allowlist."""
    if not inspection.consolidatable or inspection.format not in ("deepspeed-zero2", "deepspeed-zero3"):
        return ()
    from ckptgate.consolidate.adapters import deepspeed

    rels = deepspeed.zero_files(inspection.layout)
    return () if deepspeed.statically_readable({f.path: f for f in inspection.files}, rels) else tuple(rels)


def plan_for(inspection: Inspection, *, decision: Decision, max_shard_bytes: int, mapping: str | None = None,
             loaded: LoadedTrees | None = None) -> ConsolidationPlan:
    """The consolidation plan for an inspected checkpoint that the enforce step let through.

    :param decision: the allow decision (it names the companions); enforce checked it.
    :param mapping: a declared, qualified mapping adapter (only ``megatron-unstack-layers``).
    :param loaded: what the enforce step's contained worker loaded for :func:`framework_files`,
        or ``None`` when no worker ran.
    :raises PlanError: ``plan.*`` (a layout that does not cover every tensor exactly once).
    :raises NotConsolidatable: the checkpoint cannot be consolidated without guessing.
    :raises RuntimeFailure: the worker's trees are malformed (``runtime.plan.*``), or a framework
        load was needed and none was given (``runtime.plan.not_loaded``).

    The pure-data companions the decision names (``config.json``, the tokenizer files...) are
    added as whole-file copies, bound to the digest like every other source; resume state never
    is (it is not part of any layout an adapter reads).
    """
    plan = _adapter_plan(inspection, max_shard_bytes=max_shard_bytes, mapping=mapping, loaded=loaded)
    return with_companions(plan, inspection, decision)


def with_companions(plan: ConsolidationPlan, inspection: Inspection, decision: Decision) -> ConsolidationPlan:
    """``plan`` with a copy of each companion the decision names; each must be a file inspection
    checked as a companion (the policy cannot name anything else into DST)."""
    if not decision.companions:
        return plan
    files = {f.path: f for f in inspection.files}
    taken = {c.filename for c in plan.copies} | {s.filename for s in plan.shards}
    copies = list(plan.copies)
    for name in decision.companions:
        f = files.get(name)
        if f is None or f.role != "companion":
            raise PolicyDenied("enforce.companion_not_checked",
                               f"the decision names {name!r} as a companion, but inspection did not check it as one",
                               evidence={"companion": name})
        if name not in taken:
            copies.append(CopiedFile(src=name, filename=name, size=f.size))
    report = MappingProxyType({**plan.report, "companions": sorted(c.filename for c in copies
                                                                   if c.filename in decision.companions)})
    return dataclasses.replace(plan, copies=tuple(copies), report=report)


def _adapter_plan(inspection: Inspection, *, max_shard_bytes: int, mapping: str | None,
                  loaded: LoadedTrees | None) -> ConsolidationPlan:
    fmt = inspection.format
    layout = inspection.layout
    files = {f.path: f for f in inspection.files}
    if not inspection.consolidatable:
        raise NotConsolidatable("plan.format.not_consolidatable",
                                f"inspection found this {fmt} checkpoint not consolidatable",
                                evidence={"format": fmt, "findings": [f.code for f in inspection.findings
                                                                      if f.severity == "error"]})
    if mapping is not None and fmt != "megatron-torch-dist":
        raise PlanError("plan.mapping.unknown", f"mapping {mapping!r} does not apply to format {fmt!r}")
    if fmt in ("hf-sharded-safetensors", "safetensors"):
        from ckptgate.consolidate.adapters import safetensors

        return safetensors.plan(inspection, max_shard_bytes=max_shard_bytes)
    if fmt in ("dcp-torch-save", "dcp-hf-safetensors"):
        from ckptgate.consolidate.adapters import dcp

        return dcp.plan(fmt, layout, max_shard_bytes=max_shard_bytes)
    if fmt in ("fsdp-full", "fsdp-local"):
        from ckptgate.consolidate.adapters import fsdp

        return fsdp.plan(fmt, layout, max_shard_bytes=max_shard_bytes)
    if fmt == "megatron-torch-dist":
        from ckptgate.consolidate.adapters import megatron

        return megatron.plan(layout, max_shard_bytes=max_shard_bytes, mapping=mapping)
    if fmt is not None and fmt.startswith("peft"):
        from ckptgate.consolidate.adapters import peft

        return peft.plan(layout, files)
    if fmt == "deepspeed-universal":
        from ckptgate.consolidate.adapters import deepspeed

        return deepspeed.universal_plan(layout, files, max_shard_bytes=max_shard_bytes)
    if fmt in ("deepspeed-zero2", "deepspeed-zero3"):
        from ckptgate.consolidate.adapters import deepspeed

        rels = deepspeed.zero_files(layout)
        if deepspeed.statically_readable(files, rels):  # less than the decision permits: no worker at all
            return deepspeed.zero_plan(layout, deepspeed.static_trees(files, rels), files,
                                       max_shard_bytes=max_shard_bytes, trees_from="static_reader")
        if loaded is None:
            raise RuntimeFailure("runtime.plan.not_loaded", "this DeepSpeed checkpoint needs a framework load, "
                                 "and the enforce step loaded nothing for it", evidence={"files": rels})
        return deepspeed.zero_plan(layout, loaded.trees, files, max_shard_bytes=max_shard_bytes,
                                   trees_from="contained_worker",
                                   worker={"job": loaded.job, "controls": dict(loaded.controls),
                                           "measured": dict(loaded.measured),
                                           "wall_s": round(loaded.wall_s, 3)})
    raise PlanError("plan.format.unsupported", f"no consolidation adapter for format {fmt!r}",
                    advice="Run `ckptgate inspect` to see what the checkpoint is; see docs/consolidation.md.")


__all__ = ["ConsolidationPlan", "NotConsolidatable", "PlanError", "framework_files", "plan_for", "with_companions"]
