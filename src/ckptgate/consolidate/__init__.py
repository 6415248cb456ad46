"""Consolidate: placement plans per output shard, executed by a streaming writer.

:func:`plan_for` is the single entry point: it looks up the inspected format's adapter in
:mod:`ckptgate.consolidate.adapters.registry` and makes one call to it.
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

from ckptgate.consolidate.contained import LoadedPlans, WorkerOptions, load_plans
from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile, NotConsolidatable, PlanError
from ckptgate.decide.decision import Decision
from ckptgate.errors import PolicyDenied, RuntimeFailure
from ckptgate.inspect import Inspection, SafeTree

if TYPE_CHECKING:
    from ckptgate.digest import FixtureDigest

#: Framework loaders that consolidation may run in the worker, in order of preference.
WORKER_LOADERS = ("deepspeed", "torch_load")


def plan_for(tree: SafeTree, inspection: Inspection, *, decision: Decision,
             fixture_digest: FixtureDigest | str, max_shard_bytes: int, mapping: str | None = None,
             worker: WorkerOptions | None = None) -> ConsolidationPlan:
    """The consolidation plan for an inspected, allowed checkpoint.

    :param fixture_digest: the measured :class:`~ckptgate.digest.FixtureDigest`; a framework
        load needs it (not just the digest string) to check each file against the manifest.
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
                  fixture_digest: FixtureDigest | str, max_shard_bytes: int, mapping: str | None,
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
    if not inspection.consolidatable:
        raise NotConsolidatable("plan.format.not_consolidatable",
                                f"inspection found this {fmt} checkpoint not consolidatable",
                                evidence={"format": fmt, "findings": [f.code for f in inspection.findings
                                                                      if f.severity == "error"]})
    from ckptgate.consolidate.adapters import adapter_for

    adapter = adapter_for(fmt)
    if mapping is not None and (adapter is None or not adapter.mappings):
        raise PlanError("plan.mapping.unknown", f"mapping {mapping!r} does not apply to format {fmt!r}")
    if adapter is None:
        raise PlanError("plan.format.unsupported", f"no consolidation adapter for format {fmt!r}",
                        advice="Run `ckptgate inspect` to see what the checkpoint is; see docs/consolidation.md.")
    rels = adapter.framework_files(inspection)
    loaded = _framework_load(tree, inspection, rels, decision=decision, fixture_digest=fixture_digest,
                             worker=worker) if rels else None
    return adapter.plan(inspection, tree, max_shard_bytes=max_shard_bytes, mapping=mapping, loaded=loaded)


def _framework_load(tree: SafeTree, inspection: Inspection, rels: tuple[str, ...], *, decision: Decision,
                    fixture_digest: FixtureDigest | str, worker: WorkerOptions | None) -> LoadedPlans:
    """Load ``rels`` with a permitted framework loader in the contained worker, under a permit minted
    from the allow decision; the adapter plans from the trees it returns."""
    from ckptgate.enforce.permit import issue_permit

    if isinstance(fixture_digest, str):
        raise RuntimeFailure("runtime.worker.manifest_missing",
                             "a framework load needs the fixture digest's manifest to check each file "
                             "it hands to the worker; only the digest string was given")
    loader = next((name for name in WORKER_LOADERS if name in decision.permitted_loaders), None)
    if loader is None:
        raise PolicyDenied("enforce.permit.loader_not_permitted",
                           f"the decision permits no framework loader for this {inspection.format} checkpoint",
                           evidence={"permitted_loaders": list(decision.permitted_loaders)})
    permit = issue_permit(decision, fixture_digest=fixture_digest.digest, loader=loader)
    return load_plans(tree, inspection, list(rels), permit=permit, digest=fixture_digest,
                      options=worker or WorkerOptions())


__all__ = ["ConsolidationPlan", "NotConsolidatable", "PlanError", "WorkerOptions", "plan_for", "with_companions"]
