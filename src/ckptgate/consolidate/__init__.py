"""Consolidate: placement plans per output shard, executed by a streaming writer.

:func:`plan_for` picks the adapter for the inspected format.  Adapters for pure-data formats read
only validated headers; adapters for pickled formats require a :class:`~ckptgate.enforce.permit.Permit`
and run the framework loader in the contained worker, which returns a placement plan (never a
pickle); the parent then moves the raw bytes.
"""

from __future__ import annotations

from ckptgate.consolidate.plan import ConsolidationPlan, PlanError
from ckptgate.decide.decision import Decision
from ckptgate.inspect import Inspection, SafeTree


def plan_for(tree: SafeTree, inspection: Inspection, *, decision: Decision, fixture_digest: str,
             max_shard_bytes: int) -> ConsolidationPlan:
    """The consolidation plan for an inspected, allowed checkpoint."""
    if inspection.format in ("hf-sharded-safetensors", "safetensors"):
        from ckptgate.consolidate.adapters import safetensors

        return safetensors.plan(inspection, max_shard_bytes=max_shard_bytes)
    raise PlanError("plan.format.unsupported", f"no consolidation adapter for format {inspection.format!r} yet",
                    advice="Run `ckptgate inspect` to see what the checkpoint is; see the support matrix.")


__all__ = ["ConsolidationPlan", "PlanError", "plan_for"]
