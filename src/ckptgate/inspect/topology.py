"""The parallel topology a checkpoint's layout records, measured from the inspection alone.

Each entry names a topology field of the training-provenance predicate (docs/attestations.md) and
the values the layout allows for it.  Only what the format itself records is measured: DCP and
Megatron ``torch_dist`` storage files are named ``__<rank>_<n>.distcp``, one rank per writer, so
they give the world size (and Megatron's ``linear_proj`` chunks the tensor-parallel degree);
DeepSpeed ZeRO writes one optimizer partition per data-parallel rank and marks stage 3 in its
model-state file names; the FSDP formats are one state-dict mode each.  A field the layout does
not record is absent: a declared value for it is neither confirmed nor contradicted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["TOPOLOGY_FIELDS", "contradictions", "empty_paths", "measured_topology", "rank_state_ranks"]

TOPOLOGY_FIELDS = ("tp", "pp", "dp", "ep", "etp", "cp", "world_size", "zero_stage", "fsdp_mode")
"""The topology fields of the training-provenance predicate, in order."""

_DISTCP = re.compile(r"^__([0-9]+)_[0-9]+\.distcp$")
_RANK_STATE = re.compile(r"^(?:rng_state_([0-9]{1,9})\.pth|random_states_([0-9]{1,9})\.pkl)$")
"""The per-process RNG state a ``transformers.Trainer`` save (``rng_state_<process>.pth``, only when it runs on
more than one process) and ``Accelerator.save_state`` (``random_states_<process>.pkl``) write, every process its
own, at the top of the checkpoint."""


def empty_paths(files: Iterable[Any]) -> tuple[str, ...]:
    """The paths of the empty files among ``files`` (anything with ``path`` and ``size``)."""
    return tuple(f.path for f in files if f.size == 0)


def rank_state_ranks(files: Iterable[str]) -> list[int]:
    """The process indices of the per-process RNG state files at the top of the checkpoint, sorted."""
    out = set()
    for path in files:
        if (m := _RANK_STATE.match(path)) is not None:
            out.add(int(m.group(1) or m.group(2)))
    return sorted(out)


def _dcp_world_size(dcp: Mapping[str, Any], empty_files: Iterable[str] = ()) -> int | None:
    """The ranks that wrote: those the ``.metadata`` names, and those whose ``__<rank>_<n>.distcp`` file is in
    the folder, empty, though it names none.  A rank whose items were all deduplicated to another (state
    replicated across ranks, as under DDP) still writes its file, empty, and the metadata never names it:
    counting the metadata alone measured such a two-rank save as one rank.  A file that holds data and that the
    metadata does not name is another save's, left in the folder (a save by more ranks before this one): it is
    not a writer of this save."""
    ranks = set()
    for s in dcp.get("storage", []) or []:
        m = _DISTCP.match(str(s.get("relative_path") or ""))
        if m is None:
            return None  # a file not named by rank: the writers cannot be counted
        ranks.add(int(m.group(1)))
    folder = str(dcp.get("folder") or "")
    pre = f"{folder}/" if folder else ""
    for path in empty_files:
        if path.startswith(pre) and (m := _DISTCP.match(path[len(pre) :])):
            ranks.add(int(m.group(1)))
    return len(ranks) or None


def _tp(dcp: Mapping[str, Any]) -> int | None:
    for t in dcp.get("tensors", []) or []:
        if str(t.get("fqn", "")).endswith("self_attention.linear_proj.weight"):
            size = t["size"]
            return len({tuple(c["offsets"][len(size) - 1 :]) for c in t["chunks"]})
    return None


def measured_topology(fmt: str, layout: Mapping[str, Any], empty_files: Iterable[str] = ()) -> dict[str, list[Any]]:
    """Topology field -> the values the layout of format ``fmt`` allows (sorted); empty when it records none.
    ``empty_files``: the paths of the checkpoint's empty files (a DCP rank that wrote no item is counted by its
    empty file).  The per-process RNG state of a Trainer or Accelerate save is not a measure: a save into a
    folder an earlier, larger run wrote holds more, and one called on the main process only holds one
    (:func:`rank_state_ranks` finds the gaps between them)."""
    empty_files = tuple(empty_files)
    out: dict[str, list[Any]] = {}
    if fmt in ("dcp-torch-save", "dcp-hf-safetensors"):
        ws = _dcp_world_size(layout, empty_files)
        if ws is not None:
            out["world_size"] = [ws]
    elif fmt == "megatron-torch-dist":
        inner = layout.get("dcp")
        if isinstance(inner, Mapping):
            ws = _dcp_world_size(inner, empty_files)
            if ws is not None:
                out["world_size"] = [ws]
            tp = _tp(inner)
            if tp is not None:
                out["tp"] = [tp]
    elif fmt in ("deepspeed-zero2", "deepspeed-zero3"):
        out["zero_stage"] = [3] if fmt == "deepspeed-zero3" else [1, 2]
        ranks = len(layout.get("optim_states", []) or [])
        models = len(layout.get("model_states", []) or [])
        # No model parallelism: one model-state file (stage 1/2) or one per partition (stage 3), so dp is
        # every rank; with more, the files do not say how the ranks divide.
        if ranks and models == (ranks if fmt == "deepspeed-zero3" else 1):
            out["dp"] = [ranks]
            out["world_size"] = [ranks]
    elif fmt == "fsdp-full":
        out["fsdp_mode"] = ["full_state_dict"]
    elif fmt == "fsdp-local":
        out["fsdp_mode"] = ["local_state_dict"]
    return out


def contradictions(declared: Mapping[str, Any], measured: Mapping[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """Fields whose declared value the layout contradicts: field -> ``{"declared", "measured"}``."""
    return {
        k: {"declared": declared[k], "measured": list(v)}
        for k, v in sorted(measured.items())
        if k in declared and declared[k] is not None and declared[k] not in v
    }
