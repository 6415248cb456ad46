"""The typed refusals of consolidation planning: a plan that breaks an invariant
(:class:`PlanError`), a checkpoint with nothing to consolidate (:class:`EmptyCheckpoint`), and one that
cannot be consolidated without guessing (:class:`NotConsolidatable`)."""

from __future__ import annotations

from ckptgate.errors import InputRejected


class PlanError(InputRejected):
    """A placement plan violates an invariant. The layout came from the checkpoint, so this is an
    input the gate rejects (exit 4): a gap, an overlap, a size or padding that does not add up."""

    default_advice = (
        "The checkpoint's layout does not describe every output tensor exactly once; "
        "nothing was written. Run `ckptgate inspect` to see the layout."
    )


class EmptyCheckpoint(InputRejected):
    """The checkpoint holds no tensors to consolidate: an input problem, not a plan bug."""

    default_advice = "Check that the directory is the checkpoint itself, not a parent or a partial copy."


def no_tensors(what: str = "tensors") -> EmptyCheckpoint:
    return EmptyCheckpoint(
        "input.empty",
        f"the checkpoint holds no {what}",
        advice=f"Check that SRC is the checkpoint itself, not a parent or a partial copy: `ckptgate inspect SRC` "
        f"lists the files it holds and the {what} in them.",
    )


class NotConsolidatable(InputRejected):
    """The checkpoint cannot be consolidated without guessing (e.g. FSDP flat_param shards, an
    unpinned PEFT base); nothing is loaded or written."""

    default_advice = (
        "ckptgate refuses to guess what the checkpoint does not record. Save it again in a "
        "consolidatable form (see docs/consolidation.md), or supply the missing facts."
    )
