"""Placement plans: which source bytes become which bytes of which output tensor.

A plan is split into independent per-output-shard tasks (:class:`ShardTask`): each names its
output file, its tensors, and for every tensor the source byte ranges that fill it.  A task needs
nothing but readable source files, so the same plan can later be spread over nodes by an
existing engine (e.g. ``torch.distributed``); ckptgate does not run a cluster of its own.

This module holds the plan's records and how a plan is packed into shards (:func:`shard_tensors`)
and recast (:func:`cast_plan`).  Invariants are checked when a record is built: every output tensor
is covered exactly once (a gap or an overlap is an error; the placements and that check are
:mod:`ckptgate.consolidate.placement`'s, the chunk geometry :mod:`ckptgate.consolidate.runs`'s),
dtypes and shapes are consistent with the byte counts, and shard and tensor names are unique.  The
typed refusals are :mod:`ckptgate.consolidate.planerrors`'; every name is re-exported here.

Dtypes are preserved: the writer moves raw bytes.  Only when the user asks (:func:`cast_plan`)
does a floating-point tensor carry a ``source_dtype``: its placements are then bytes of that
dtype, which the writer converts element by element.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckptgate.consolidate.placement import Placement, _tiled_end, merge_placements, strided
from ckptgate.consolidate.planerrors import EmptyCheckpoint, NotConsolidatable, PlanError, no_tensors
from ckptgate.consolidate.runs import (
    MAX_PLAN_RUNS,
    chunk_placement_count,
    chunk_run_count,
    chunk_runs,
    chunk_strided_runs,
    numel,
)
from ckptgate.dtypes import CASTABLE, PLAN_ITEMSIZE, TORCH_TO_SAFETENSORS
from ckptgate.errors import UsageError

__all__ = [
    "DTYPE_SIZES",
    "MAX_PLAN_RUNS",
    "ConsolidationPlan",
    "CopiedFile",
    "EmptyCheckpoint",
    "NotConsolidatable",
    "OutputTensor",
    "Placement",
    "PlanError",
    "ShardTask",
    "cast_plan",
    "check_cast",
    "chunk_placement_count",
    "chunk_run_count",
    "chunk_runs",
    "chunk_strided_runs",
    "merge_placements",
    "no_tensors",
    "numel",
    "shard_tensors",
    "st_dtype",
    "strided",
]

#: safetensors code -> bytes per element, for the dtypes a plan may write (:mod:`ckptgate.dtypes`).
DTYPE_SIZES: Mapping[str, int] = PLAN_ITEMSIZE
_SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.safetensors$")
_EXTRA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def st_dtype(torch_dtype: str, *, what: str) -> str:
    """The safetensors code of a torch dtype name; an unknown one is a typed error."""
    code = TORCH_TO_SAFETENSORS.get(torch_dtype)
    if code is None:
        raise PlanError(
            "plan.tensor.dtype",
            f"{what}: dtype {torch_dtype!r} has no safetensors equivalent",
            evidence={"dtype": torch_dtype},
        )
    return code


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_tensor_name(name: str) -> None:
    """Refuse an output tensor name that a safetensors header cannot carry as one distinct tensor: empty,
    ``__metadata__`` (the header's own key), a control character (a NUL ends the name for a C reader, so two
    names can read as one) or a lone surrogate (not UTF-8)."""
    try:
        name.encode("utf-8")
        malformed = not name or name == "__metadata__" or _CONTROL.search(name) is not None
    except UnicodeEncodeError:
        malformed = True
    if malformed:
        raise PlanError(
            "plan.tensor.name",
            f"the checkpoint names a tensor {name!r}, which a safetensors header cannot carry as a tensor of its own",
            evidence={"tensor": ascii(name)},
            advice=f"Rename the tensor {name!r} in the producer's state dict (an empty name, `__metadata__`, a "
            "control character or an unpaired surrogate is refused) and save the checkpoint again; nothing was "
            "written.",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputTensor:
    """One tensor of an output shard, and the placements that fill it.

    With ``source_dtype`` the placements are bytes of that dtype (offsets and lengths in its
    units), converted to ``dtype`` as they are written; without it they are ``dtype``'s own bytes.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    placements: tuple[Placement, ...]
    source_dtype: str | None = None

    def __post_init__(self) -> None:
        check_tensor_name(self.name)
        if self.dtype not in DTYPE_SIZES:
            raise PlanError("plan.tensor.dtype", f"{self.name}: unknown dtype {self.dtype!r}")
        if self.source_dtype is not None and not {self.source_dtype, self.dtype} <= CASTABLE:
            raise PlanError(
                "plan.tensor.cast",
                f"{self.name}: cannot convert {self.source_dtype} to {self.dtype}",
                evidence={"tensor": self.name, "from": self.source_dtype, "to": self.dtype},
            )
        size = DTYPE_SIZES[self.source_dtype or self.dtype]
        if self.source_dtype is not None and any(
            p.dst_offset % size or p.length % size or p.dst_stride % size for p in self.placements
        ):
            raise PlanError(
                "plan.tensor.cast",
                f"{self.name}: a placement splits a {self.source_dtype} element",
                evidence={"tensor": self.name},
            )
        if any(d < 0 for d in self.shape):
            raise PlanError("plan.tensor.shape", f"{self.name}: negative dimension")
        covered = _tiled_end(self.name, self.placements)
        want = math.prod(self.shape) * size
        if covered != want:
            kind = "gap" if covered < want else "overflow"
            raise PlanError(
                f"plan.tensor.{kind}",
                f"{self.name}: placements cover {covered} bytes, the tensor has {want}",
                evidence={"tensor": self.name, "covered": covered, "nbytes": want},
            )

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor in the output."""
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardTask:
    """One output file: independent of every other task."""

    filename: str
    tensors: tuple[OutputTensor, ...]
    metadata: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({"format": "pt"}))

    def __post_init__(self) -> None:
        if not _SHARD_NAME.match(self.filename):
            raise PlanError("plan.shard.name", f"bad output shard name {self.filename!r}")
        names = [t.name for t in self.tensors]
        if len(set(names)) != len(names):
            raise PlanError("plan.shard.duplicate_tensor", f"{self.filename}: a tensor name repeats")

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True, slots=True, kw_only=True)
class CopiedFile:
    """A small non-tensor file copied verbatim (e.g. a PEFT ``adapter_config.json``)."""

    src: str
    filename: str
    size: int

    def __post_init__(self) -> None:
        if not _EXTRA_NAME.match(self.filename) or self.filename.endswith(".safetensors"):
            raise PlanError("plan.copy.name", f"bad copied file name {self.filename!r}")
        if self.size < 0:
            raise PlanError("plan.copy.size", f"bad size for {self.filename!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsolidationPlan:
    """Every output shard task, plus what the index needs.

    ``index_metadata`` goes into ``model.safetensors.index.json`` (written unless ``write_index``
    is false, as for a passed-through PEFT adapter); ``report`` is what the adapter observed but did
    not act on (model-family semantics, skipped items), for the receipt and ``--json`` output.
    """

    shards: tuple[ShardTask, ...]
    index_metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    copies: tuple[CopiedFile, ...] = ()
    write_index: bool = True
    report: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        files = [s.filename for s in self.shards] + [c.filename for c in self.copies]
        if self.write_index:
            files.append("model.safetensors.index.json")
        if len(set(files)) != len(files):
            raise PlanError("plan.shard.duplicate_file", "two shard tasks write the same file")
        for shard in self.shards:
            for t in shard.tensors:
                if t.name in seen:
                    raise PlanError(
                        "plan.tensor.duplicate",
                        f"tensor {t.name!r} is in {seen[t.name]} and {shard.filename}",
                        evidence={"tensor": t.name},
                    )
                seen[t.name] = shard.filename

    @property
    def total_size(self) -> int:
        return sum(s.nbytes for s in self.shards)

    @property
    def weight_map(self) -> dict[str, str]:
        return {t.name: s.filename for s in self.shards for t in s.tensors}

    @property
    def source_paths(self) -> tuple[str, ...]:
        """Every source relpath the writer reads (placements and copied files), sorted."""
        paths = {p.src for s in self.shards for t in s.tensors for p in t.placements}
        paths.update(c.src for c in self.copies)
        return tuple(sorted(paths))


def shard_tensors(
    tensors: Iterable[OutputTensor],
    *,
    max_shard_bytes: int,
    metadata: Mapping[str, str] | None = None,
    index_metadata: Mapping[str, Any] | None = None,
    report: Mapping[str, Any] | None = None,
) -> ConsolidationPlan:
    """Pack tensors, in name order, into ``model-XXXXX-of-YYYYY.safetensors`` tasks of at most
    ``max_shard_bytes`` each (a single larger tensor gets a shard of its own).  The output is
    always sharded-with-index, even with one shard, so consumers see one layout."""
    if max_shard_bytes <= 0:
        raise PlanError("plan.shard.size", "the maximum shard size must be positive")
    groups: list[list[OutputTensor]] = [[]]
    size = 0
    for t in sorted(tensors, key=lambda t: t.name):
        if groups[-1] and size + t.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    n = len(groups)
    meta = MappingProxyType(dict(metadata or {"format": "pt"}))
    shards = tuple(
        ShardTask(filename=f"model-{i + 1:05d}-of-{n:05d}.safetensors", tensors=tuple(g), metadata=meta)
        for i, g in enumerate(groups)
    )
    return ConsolidationPlan(
        shards=shards,
        index_metadata=MappingProxyType(dict(index_metadata or {})),
        report=MappingProxyType(dict(report or {})),
    )


def _numpy_installed() -> bool:
    try:
        return importlib.util.find_spec("numpy") is not None
    except (ImportError, ValueError):
        return False


def check_cast(dtype: str | None) -> None:
    """``dtype`` must be ``None`` (preserve) or one of :data:`CASTABLE`: checked where a request
    names it, before anything is measured, and again by :func:`cast_plan`."""
    if dtype is not None and dtype not in CASTABLE:
        raise PlanError("plan.cast.dtype", f"cannot cast to {dtype!r}: one of {', '.join(sorted(CASTABLE))}")
    if dtype is not None and not _numpy_installed():
        raise UsageError(
            "usage.dtype.numpy_missing",
            f"casting to {dtype} needs numpy, which is not installed",
            advice="Install the extra: pip install 'ckptgate[dtype]'; or leave --dtype out to keep every dtype.",
        )


def cast_plan(plan: ConsolidationPlan, dtype: str | None, *, max_shard_bytes: int) -> ConsolidationPlan:
    """``plan`` with every floating-point tensor (:data:`CASTABLE`) converted to ``dtype``; other
    dtypes are never touched.  ``None`` returns ``plan`` itself.  A sharded output is packed again
    at ``max_shard_bytes`` (the tensors changed size); a pass-through output (no index, e.g. a PEFT
    adapter) keeps its files.  The plan's report records the cast."""
    check_cast(dtype)
    if dtype is None:
        return plan

    def one(t: OutputTensor) -> OutputTensor:
        src = t.source_dtype or t.dtype
        if src not in CASTABLE or t.dtype == dtype:
            return t
        return OutputTensor(
            name=t.name, dtype=dtype, shape=t.shape, placements=t.placements, source_dtype=None if src == dtype else src
        )

    shards = [(s, tuple(one(t) for t in s.tensors)) for s in plan.shards]
    n_cast = sum(t.source_dtype is not None for _, ts in shards for t in ts)
    report = MappingProxyType({**plan.report, "cast": {"dtype": dtype, "tensors": n_cast}})
    if plan.write_index and plan.shards:
        packed = shard_tensors(
            [t for _, ts in shards for t in ts],
            max_shard_bytes=max_shard_bytes,
            metadata=plan.shards[0].metadata,
            index_metadata=plan.index_metadata,
            report=report,
        )
        return ConsolidationPlan(
            shards=packed.shards,
            index_metadata=packed.index_metadata,
            copies=plan.copies,
            write_index=True,
            report=report,
        )
    return ConsolidationPlan(
        shards=tuple(ShardTask(filename=s.filename, tensors=ts, metadata=s.metadata) for s, ts in shards),
        index_metadata=plan.index_metadata,
        copies=plan.copies,
        write_index=plan.write_index,
        report=report,
    )
