"""Consolidate: placement plans per output shard, executed by a streaming writer.

:func:`plan_for` is the single entry point: it picks the adapter for the inspected format.
Adapters for pure-data and statically read formats use only what inspection read.  DeepSpeed
ZeRO is gated as a framework load (its loader is DeepSpeed's); when every state file stayed
inside the static reader's DeepSpeed allowlist, the plan is still built from the static reader
and no worker starts.  Otherwise the plan needs a :class:`~ckptgate.enforce.permit.Permit`,
minted here from the allow decision, and runs the loader in the contained worker, which returns
JSON placement trees (never a pickle); the parent maps them to byte ranges and moves the raw
bytes.  The plan's report says which (``trees_from``) and, for the worker, the controls that
were active inside it.  See ``docs/consolidation.md``.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import TYPE_CHECKING

from ckptgate.consolidate.contained import WorkerOptions, load_plans
from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile, NotConsolidatable, PlanError
from ckptgate.decide.decision import Decision
from ckptgate.errors import PolicyDenied
from ckptgate.inspect import Inspection, SafeTree

if TYPE_CHECKING:
    from ckptgate.digest import FixtureDigest

#: Framework loaders that consolidation may run in the worker, in order of preference.
WORKER_LOADERS = ("deepspeed", "torch_load")


def plan_for(tree: SafeTree, inspection: Inspection, *, decision: Decision,
             fixture_digest: FixtureDigest, max_shard_bytes: int, mapping: str | None = None,
             worker: WorkerOptions | None = None) -> ConsolidationPlan:
    """The consolidation plan for an inspected, allowed checkpoint.

    :param fixture_digest: the measured :class:`~ckptgate.digest.FixtureDigest`; a framework
        load checks each file against its manifest.
    :param mapping: a declared, qualified mapping adapter (only ``megatron-unstack-layers``).
    :param worker: timeout, limits and containment profile for framework loads.
    :raises PlanError: ``plan.*`` (a layout that does not cover every tensor exactly once).
    :raises NotConsolidatable: the checkpoint cannot be consolidated without guessing.
    :raises PolicyDenied: a loader (pure data, static or framework) that the decision does not permit.
    :raises RuntimeFailure: the contained worker failed.

    The pure-data companions the decision names (``config.json``, the tokenizer files...) are
    added as whole-file copies, bound to the digest like every other source; resume state never
    is (it is not part of any layout an adapter reads).
    """
    plan = _adapter_plan(tree, inspection, decision=decision, fixture_digest=fixture_digest,
                         max_shard_bytes=max_shard_bytes, mapping=mapping, worker=worker)
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


def _adapter_plan(tree: SafeTree, inspection: Inspection, *, decision: Decision,
                  fixture_digest: FixtureDigest, max_shard_bytes: int, mapping: str | None,
                  worker: WorkerOptions | None) -> ConsolidationPlan:
    if not decision.allow:
        raise PlanError("plan.not_allowed", "no consolidation plan without an allow decision")
    unpermitted = sorted(set(inspection.loaders) - set(decision.permitted_loaders))
    if unpermitted:
        raise PolicyDenied("enforce.loader_not_permitted",
                           f"the decision does not permit the loaders this checkpoint needs: {', '.join(unpermitted)}",
                           evidence={"needed": list(inspection.loaders),
                                     "permitted": list(decision.permitted_loaders)})
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
        from ckptgate.enforce.permit import issue_permit

        rels = deepspeed.zero_files(layout)
        if deepspeed.statically_readable(files, rels):  # less than the decision permits: no worker at all
            return deepspeed.zero_plan(layout, deepspeed.static_trees(files, rels), files,
                                       max_shard_bytes=max_shard_bytes, trees_from="static_reader")
        loader = next((name for name in WORKER_LOADERS if name in decision.permitted_loaders), None)
        if loader is None:
            raise PolicyDenied("enforce.permit.loader_not_permitted",
                               "the decision permits no framework loader for this DeepSpeed checkpoint",
                               evidence={"permitted_loaders": list(decision.permitted_loaders)})
        permit = issue_permit(decision, fixture_digest=fixture_digest.digest.prefixed(), loader=loader)
        loaded = load_plans(tree, inspection, rels, permit=permit, digest=fixture_digest,
                            options=worker or WorkerOptions())
        return deepspeed.zero_plan(layout, loaded.trees, files, max_shard_bytes=max_shard_bytes,
                                   trees_from="contained_worker",
                                   worker={"job": loaded.job, "controls": dict(loaded.controls),
                                           "measured": dict(loaded.measured),
                                           "wall_s": round(loaded.wall_s, 3)})
    raise PlanError("plan.format.unsupported", f"no consolidation adapter for format {fmt!r}",
                    advice="Run `ckptgate inspect` to see what the checkpoint is; see docs/consolidation.md.")


__all__ = ["ConsolidationPlan", "NotConsolidatable", "PlanError", "WorkerOptions", "plan_for", "with_companions"]
