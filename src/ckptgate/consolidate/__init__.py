"""Consolidate: placement plans per output shard, executed by a streaming writer.

:func:`plan_for` is the single entry point: it looks up the inspected format's adapter in
:mod:`ckptgate.consolidate.adapters.registry` and makes one call to it.
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

from ckptgate.consolidate.adapters import adapter_for
from ckptgate.consolidate.hf.plan import hf_plan
from ckptgate.consolidate.hf.source import HfConfig
from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile, NotConsolidatable, PlanError
from ckptgate.decide.decision import Decision, Selection
from ckptgate.errors import PolicyDenied, RuntimeFailure
from ckptgate.inspect import Inspection

if TYPE_CHECKING:
    from ckptgate.enforce.load import LoadedTrees


def framework_files(inspection: Inspection, *, worker: bool = False) -> tuple[str, ...]:
    """The files of ``inspection`` that no plan can be built from without a framework load (the
    enforce step loads them in the contained worker); empty when the plan needs only what inspection
    read.  The format's adapter answers.  ``worker``: the adapter's ``worker_files`` instead (the
    whole set its worker job takes, static reader or not), for a runtime qualification."""
    if not inspection.consolidatable:
        return ()
    adapter = adapter_for(inspection.format)
    if adapter is None:
        return ()
    every = getattr(adapter, "worker_files", None) if worker else None
    return tuple(every(inspection)) if callable(every) else adapter.framework_files(inspection)


def plan_for(
    inspection: Inspection,
    *,
    decision: Decision,
    max_shard_bytes: int,
    mapping: str | None = None,
    loaded: LoadedTrees | None = None,
    hf: HfConfig | None = None,
) -> ConsolidationPlan:
    """The consolidation plan for an inspected checkpoint that the enforce step let through.

    :param decision: the allow decision (it names the companions); enforce checked it.
    :param mapping: a declared, qualified mapping adapter (only ``megatron-unstack-layers``).
    :param loaded: what the enforce step's contained worker loaded for :func:`framework_files`,
        or ``None`` when no worker ran.
    :param hf: ``--hf-config``: map a Megatron checkpoint to that Hugging Face model
        (:mod:`ckptgate.consolidate.hf`) instead of keeping its names.
    :raises PlanError: ``plan.*`` (a layout that does not cover every tensor exactly once).
    :raises NotConsolidatable: the checkpoint cannot be consolidated without guessing.
    :raises RuntimeFailure: the worker's trees are malformed (``runtime.plan.*``), or a framework
        load was needed and none was given (``runtime.plan.not_loaded``).

    The pure-data companions the decision names (``config.json``, the tokenizer files...) are
    added as whole-file copies, bound to the digest like every other source; resume state never
    is (it is not part of any layout an adapter reads).
    """
    if hf is not None:
        _consolidatable(inspection)
        return hf_plan(inspection.format, inspection.layout, hf, max_shard_bytes=max_shard_bytes)
    plan = _adapter_plan(
        inspection, max_shard_bytes=max_shard_bytes, mapping=mapping, selection=decision.selection, loaded=loaded
    )
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
            raise PolicyDenied(
                "enforce.companion_not_checked",
                f"the decision names {name!r} as a companion, but inspection did not check it as one",
                evidence={"companion": name},
            )
        if name not in taken:
            copies.append(CopiedFile(src=name, filename=name, size=f.size))
    report = MappingProxyType(
        {**plan.report, "companions": sorted(c.filename for c in copies if c.filename in decision.companions)}
    )
    return dataclasses.replace(plan, copies=tuple(copies), report=report)


def adapter_plan(inspection: Inspection, *, max_shard_bytes: int, hf: HfConfig | None = None) -> ConsolidationPlan:
    """The adapter's plan without the decision's companions, for a format that needs no framework
    load (:func:`framework_files` is empty): known from the inspection alone, before the digest.
    With ``hf`` the mapped plan (no companions of the checkpoint travel with it)."""
    if hf is not None:
        _consolidatable(inspection)
        return hf_plan(inspection.format, inspection.layout, hf, max_shard_bytes=max_shard_bytes)
    return _adapter_plan(inspection, max_shard_bytes=max_shard_bytes, mapping=None, selection=None, loaded=None)


def _consolidatable(inspection: Inspection) -> None:
    if not inspection.consolidatable:
        raise NotConsolidatable(
            "plan.format.not_consolidatable",
            f"inspection found this {inspection.format} checkpoint not consolidatable",
            evidence={
                "format": inspection.format,
                "findings": [f.code for f in inspection.findings if f.severity == "error"],
            },
        )


def _adapter_plan(
    inspection: Inspection,
    *,
    max_shard_bytes: int,
    mapping: str | None,
    selection: Selection | None,
    loaded: LoadedTrees | None,
) -> ConsolidationPlan:
    fmt = inspection.format
    _consolidatable(inspection)
    adapter = adapter_for(fmt)
    if mapping is not None and (adapter is None or not adapter.mappings):
        raise PlanError("plan.mapping.unknown", f"mapping {mapping!r} does not apply to format {fmt!r}")
    if adapter is None:
        raise PlanError(
            "plan.format.unsupported",
            f"no consolidation adapter for format {fmt!r}",
            advice="Run `ckptgate inspect` to see what the checkpoint is; see docs/consolidation.md.",
        )
    if selection is not None and not adapter.selects:
        raise PlanError(
            "plan.selection.not_applicable",
            f"a selection does not apply to format {fmt!r}",
            evidence={"format": fmt, "prefix": selection.prefix},
        )
    needed = adapter.framework_files(inspection)
    if needed and loaded is None:
        raise RuntimeFailure(
            "runtime.plan.not_loaded",
            f"this {fmt} checkpoint needs a framework load, and the enforce step loaded nothing for it",
            evidence={"files": list(needed)},
        )
    return adapter.plan(
        inspection,
        max_shard_bytes=max_shard_bytes,
        mapping=mapping,
        selection=selection,
        # a worker load the qualification asked for (framework_files(worker=True)) is used too
        loaded=loaded,
    )


__all__ = [
    "ConsolidationPlan",
    "NotConsolidatable",
    "PlanError",
    "adapter_plan",
    "framework_files",
    "plan_for",
    "with_companions",
]
