"""Placement plans: which source bytes become which bytes of which output tensor.

A plan is split into independent per-output-shard tasks (:class:`ShardTask`): each names its
output file, its tensors, and for every tensor the source byte ranges that fill it.  A task needs
nothing but readable source files, so the same plan can later be spread over nodes by an
existing engine (e.g. ``torch.distributed``); ckptgate does not run a cluster of its own.

Invariants are checked when a record is built: every output tensor is covered exactly once
(a gap or an overlap is an error), dtypes and shapes are consistent with the byte counts, and
shard and tensor names are unique.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckptgate.errors import Error

DTYPE_SIZES: Mapping[str, int] = MappingProxyType({
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
})
_SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.safetensors$")


class PlanError(Error):
    """A placement plan violates an invariant (a bug in an adapter, or an inconsistent input)."""

    default_advice = ("The checkpoint's layout does not describe every output tensor exactly once; "
                      "nothing was written. Run `ckptgate inspect` to see the layout.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """``length`` bytes at ``src_offset`` of source file ``src`` go to ``dst_offset`` of the tensor."""

    src: str
    src_offset: int
    dst_offset: int
    length: int

    def __post_init__(self) -> None:
        if min(self.src_offset, self.dst_offset) < 0 or self.length <= 0:
            raise PlanError("plan.placement.range", f"bad byte range in placement from {self.src!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputTensor:
    """One tensor of an output shard, and the placements that fill it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    placements: tuple[Placement, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_SIZES:
            raise PlanError("plan.tensor.dtype", f"{self.name}: unknown dtype {self.dtype!r}")
        if any(d < 0 for d in self.shape):
            raise PlanError("plan.tensor.shape", f"{self.name}: negative dimension")
        covered = 0
        for p in sorted(self.placements, key=lambda p: p.dst_offset):
            if p.dst_offset > covered:
                raise PlanError("plan.tensor.gap", f"{self.name}: bytes [{covered}, {p.dst_offset}) have no source",
                                evidence={"tensor": self.name, "gap": [covered, p.dst_offset]})
            if p.dst_offset < covered:
                raise PlanError("plan.tensor.overlap", f"{self.name}: bytes from {p.dst_offset} are placed twice",
                                evidence={"tensor": self.name, "overlap_at": p.dst_offset})
            covered = p.dst_offset + p.length
        if covered != self.nbytes:
            kind = "gap" if covered < self.nbytes else "overflow"
            raise PlanError(f"plan.tensor.{kind}",
                            f"{self.name}: placements cover {covered} bytes, the tensor has {self.nbytes}",
                            evidence={"tensor": self.name, "covered": covered, "nbytes": self.nbytes})

    @property
    def nbytes(self) -> int:
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
class ConsolidationPlan:
    """Every output shard task, plus what the index needs."""

    shards: tuple[ShardTask, ...]
    index_metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        files = [s.filename for s in self.shards]
        if len(set(files)) != len(files):
            raise PlanError("plan.shard.duplicate_file", "two shard tasks write the same file")
        for shard in self.shards:
            for t in shard.tensors:
                if t.name in seen:
                    raise PlanError("plan.tensor.duplicate", f"tensor {t.name!r} is in {seen[t.name]} and "
                                    f"{shard.filename}", evidence={"tensor": t.name})
                seen[t.name] = shard.filename

    @property
    def total_size(self) -> int:
        return sum(s.nbytes for s in self.shards)

    @property
    def weight_map(self) -> dict[str, str]:
        return {t.name: s.filename for s in self.shards for t in s.tensors}

    @property
    def largest_tensor(self) -> int:
        return max((t.nbytes for s in self.shards for t in s.tensors), default=0)


def shard_tensors(tensors: Iterable[OutputTensor], *, max_shard_bytes: int,
                  metadata: Mapping[str, str] | None = None,
                  index_metadata: Mapping[str, Any] | None = None) -> ConsolidationPlan:
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
        ShardTask(filename=f"model-{i + 1:05d}-of-{n:05d}.safetensors",
                  tensors=tuple(g), metadata=meta)
        for i, g in enumerate(groups))
    return ConsolidationPlan(shards=shards, index_metadata=MappingProxyType(dict(index_metadata or {})))
