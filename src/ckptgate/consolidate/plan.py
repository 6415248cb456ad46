"""Placement plans: which source bytes become which bytes of which output tensor.

A plan is split into independent per-output-shard tasks (:class:`ShardTask`): each names its
output file, its tensors, and for every tensor the source byte ranges that fill it.  A task needs
nothing but readable source files, so the same plan can later be spread over nodes by an
existing engine (e.g. ``torch.distributed``); ckptgate does not run a cluster of its own.

Invariants are checked when a record is built: every output tensor is covered exactly once
(a gap or an overlap is an error), dtypes and shapes are consistent with the byte counts, and
shard and tensor names are unique.

A chunk of a tensor sharded on a dimension other than its first (a tensor-parallel ``Shard(1)``
weight) is a regular run of rows; it is one *strided* placement (start, count, source and
destination strides, run length), checked for gaps and overlaps as a whole and expanded run by
run only by the writer, so a plan holds O(tensors x ranks) records, not one per row.

Dtypes are preserved: the writer moves raw bytes.  Only when the user asks (:func:`cast_plan`)
does a floating-point tensor carry a ``source_dtype``: its placements are then bytes of that
dtype, which the writer converts element by element.
"""

from __future__ import annotations

import heapq
import importlib.util
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckptgate.dtypes import CASTABLE, PLAN_ITEMSIZE, TORCH_TO_SAFETENSORS
from ckptgate.errors import InputRejected, UsageError

#: safetensors code -> bytes per element, for the dtypes a plan may write (:mod:`ckptgate.dtypes`).
DTYPE_SIZES: Mapping[str, int] = PLAN_ITEMSIZE
_SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.safetensors$")
_EXTRA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


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


def numel(shape: Iterable[int]) -> int:
    return math.prod(shape)


#: The placement records one plan may hold. Each is a :class:`Placement` (about 170 bytes and
#: 3 us to build), so 2**24 bound a plan near 2.8 GB and 50 s. A regular run of rows is one
#: strided record, so only a chunk split on two or more leading dims needs more than one.
MAX_PLAN_RUNS = 1 << 24


def _run_dim(full: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    """Check a chunk against its tensor; the last dim it does not span fully (the dims after it
    merge into each run), or -1 for a scalar."""
    nd = len(full)
    if len(offsets) != nd or len(sizes) != nd:
        raise PlanError(
            "plan.chunk.rank",
            "chunk and tensor have different ranks",
            evidence={"shape": list(full), "offsets": list(offsets), "sizes": list(sizes)},
        )
    for d in range(nd):
        if offsets[d] < 0 or sizes[d] < 0 or offsets[d] + sizes[d] > full[d]:
            raise PlanError(
                "plan.chunk.bounds",
                f"chunk {list(offsets)}+{list(sizes)} lies outside {list(full)}",
                evidence={"shape": list(full), "offsets": list(offsets), "sizes": list(sizes)},
            )
    j = nd - 1
    while j > 0 and sizes[j] == full[j] and offsets[j] == 0:
        j -= 1
    return j


def chunk_run_count(full: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    """How many runs :func:`chunk_runs` yields for this chunk, without building them."""
    j = _run_dim(full, offsets, sizes)
    return 0 if numel(sizes) == 0 else numel(sizes[: max(j, 0)])


def chunk_runs(
    full: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]
) -> Iterable[tuple[int, int, int]]:
    """Contiguous element runs of a row-major chunk inside a row-major tensor.

    Yields ``(src_elem, dst_elem, n_elems)``: ``n`` elements at ``src_elem`` of the (contiguous)
    chunk go to ``dst_elem`` of the full tensor.  A chunk split only on dim 0 is one run; the
    trailing dims that the chunk spans fully are merged into each run.
    """
    j = _run_dim(full, offsets, sizes)
    if numel(sizes) == 0:
        return
    if j < 0:
        yield 0, 0, 1
        return
    nd = len(full)
    full_strides = [1] * nd
    for d in range(nd - 2, -1, -1):
        full_strides[d] = full_strides[d + 1] * full[d + 1]
    run = sizes[j] * full_strides[j]
    outer = sizes[:j]
    chunk_strides = [1] * j
    for d in range(j - 2, -1, -1):
        chunk_strides[d] = chunk_strides[d + 1] * sizes[d + 1]
    src_step = run  # consecutive runs are adjacent in the contiguous chunk
    base = offsets[j] * full_strides[j]
    src = 0
    for idx in _ndindex(outer):
        dst = base + sum((offsets[d] + idx[d]) * full_strides[d] for d in range(j))
        yield src, dst, run
        src += src_step


def _strided_dim(full: tuple[int, ...], sizes: tuple[int, ...], j: int) -> int:
    """The first outer dim of the chunk's uniform progression of runs: the dims after it, up to the
    run dim ``j``, are spanned fully, so stepping through them moves the destination by one row."""
    m = j - 1
    while m > 0 and sizes[m] == full[m]:
        m -= 1
    return max(m, 0)


def chunk_placement_count(full: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    """How many records :func:`chunk_strided_runs` yields for this chunk, without building them."""
    j = _run_dim(full, offsets, sizes)
    if numel(sizes) == 0:
        return 0
    return numel(sizes[: _strided_dim(full, sizes, j)]) if j > 0 else 1


def chunk_strided_runs(
    full: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]
) -> Iterable[tuple[int, int, int, int, int, int]]:
    """The runs of :func:`chunk_runs`, as few regular progressions as the chunk allows.

    Yields ``(src_elem, dst_elem, n_elems, count, src_stride, dst_stride)`` (elements): ``count``
    runs of ``n`` elements, run ``k`` at ``src_elem + k * src_stride`` of the chunk going to
    ``dst_elem + k * dst_stride`` of the tensor.  A chunk split on one dim yields one record
    whatever its number of rows; a chunk split on several leading dims yields one per index of
    the dims before the last partial one.
    """
    j = _run_dim(full, offsets, sizes)
    if numel(sizes) == 0:
        return
    nd = len(full)
    fs = [1] * nd
    for d in range(nd - 2, -1, -1):
        fs[d] = fs[d + 1] * full[d + 1]
    if j <= 0:  # split on dim 0 only (or a scalar): one contiguous range
        yield 0, (offsets[0] * fs[0] if j == 0 else 0), numel(sizes), 1, 0, 0
        return
    run = sizes[j] * fs[j]
    m = _strided_dim(full, sizes, j)
    count = numel(sizes[m:j])
    inner = sum(offsets[d] * fs[d] for d in range(m, j + 1))
    src = 0
    for idx in _ndindex(sizes[:m]):
        dst = inner + sum((offsets[d] + idx[d]) * fs[d] for d in range(m))
        yield src, dst, run, count, run, fs[j - 1]
        src += run * count


def _ndindex(shape: tuple[int, ...]) -> Iterable[tuple[int, ...]]:
    if not shape:
        yield ()
        return
    idx = [0] * len(shape)
    while True:
        yield tuple(idx)
        d = len(shape) - 1
        while d >= 0:
            idx[d] += 1
            if idx[d] < shape[d]:
                break
            idx[d] = 0
            d -= 1
        if d < 0:
            return


def merge_placements(placements: Iterable[Placement]) -> tuple[Placement, ...]:
    """Join placements that continue each other in both source and destination."""
    out: list[Placement] = []
    for p in sorted(placements, key=lambda p: p.dst_offset):
        last = out[-1] if out else None
        if (
            last is not None
            and last.count == 1
            and p.count == 1
            and last.src == p.src
            and last.dst_offset + last.length == p.dst_offset
            and last.src_offset + last.length == p.src_offset
        ):
            out[-1] = Placement(
                src=p.src, src_offset=last.src_offset, dst_offset=last.dst_offset, length=last.length + p.length
            )
        else:
            out.append(p)
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """``length`` bytes at ``src_offset`` of source file ``src`` go to ``dst_offset`` of the tensor.

    With ``count`` > 1 it is a strided placement: ``count`` runs of ``length`` bytes, run ``k``
    read at ``src_offset + k * src_stride`` and written at ``dst_offset + k * dst_stride``.  The
    runs of one placement never overlap, in the source or in the tensor (each stride is at least
    ``length``).  Build one with :func:`strided`, which gives a plain placement where the runs
    join up.
    """

    src: str
    src_offset: int
    dst_offset: int
    length: int
    count: int = 1
    src_stride: int = 0
    dst_stride: int = 0

    def __post_init__(self) -> None:
        if min(self.src_offset, self.dst_offset) < 0 or self.length <= 0:
            raise PlanError("plan.placement.range", f"bad byte range in placement from {self.src!r}")
        if (
            self.count < 1
            or (self.count == 1 and (self.src_stride or self.dst_stride))
            or (self.count > 1 and min(self.src_stride, self.dst_stride) < self.length)
        ):
            raise PlanError(
                "plan.placement.stride",
                f"bad strided placement from {self.src!r}: {self.count} runs "
                f"of {self.length} bytes, strides {self.src_stride} (source) and {self.dst_stride} "
                "(tensor); a stride below the run length makes runs overlap",
                evidence={
                    "source": self.src,
                    "count": self.count,
                    "length": self.length,
                    "src_stride": self.src_stride,
                    "dst_stride": self.dst_stride,
                },
            )

    @property
    def nbytes(self) -> int:
        """Bytes placed, over every run."""
        return self.count * self.length

    @property
    def dst_end(self) -> int:
        """One past the last tensor byte the last run writes."""
        return self.dst_offset + (self.count - 1) * self.dst_stride + self.length

    @property
    def src_end(self) -> int:
        """One past the last source byte the last run reads."""
        return self.src_offset + (self.count - 1) * self.src_stride + self.length

    def runs(self) -> Iterable[tuple[int, int, int]]:
        """``(src_offset, dst_offset, length)`` of each run, in order, built one at a time."""
        for k in range(self.count):
            yield self.src_offset + k * self.src_stride, self.dst_offset + k * self.dst_stride, self.length


def strided(
    *, src: str, src_offset: int, dst_offset: int, length: int, count: int = 1, src_stride: int = 0, dst_stride: int = 0
) -> Placement:
    """A :class:`Placement` of ``count`` runs; a plain one when there is one run or the runs join up
    in both the source and the tensor."""
    if count == 1 or (count > 1 and src_stride == dst_stride == length):
        return Placement(src=src, src_offset=src_offset, dst_offset=dst_offset, length=count * length)
    return Placement(
        src=src,
        src_offset=src_offset,
        dst_offset=dst_offset,
        length=length,
        count=count,
        src_stride=src_stride,
        dst_stride=dst_stride,
    )


def _hole(name: str, covered: int, at: int) -> PlanError:
    if at > covered:
        return PlanError(
            "plan.tensor.gap",
            f"{name}: bytes [{covered}, {at}) have no source",
            evidence={"tensor": name, "gap": [covered, at]},
        )
    return PlanError(
        "plan.tensor.overlap", f"{name}: bytes from {at} are placed twice", evidence={"tensor": name, "overlap_at": at}
    )


def _tiled_end(name: str, placements: Iterable[Placement]) -> int:
    """Check that the placements cover ``[0, end)`` once, each byte by one run; return ``end``.

    Plain placements are walked in order.  Strided ones whose first runs start within one
    destination period of each other form a group; a group whose members share count and stride
    (the chunks of one tensor-parallel split) tiles its span exactly when its first runs tile one
    period, so it is checked in O(members).  Any other group is checked by merging the runs of
    every remaining placement lazily: memory stays O(placements), time O(runs).
    """
    ps = sorted(placements, key=lambda p: (p.dst_offset, p.dst_end))
    covered, i = 0, 0
    while i < len(ps):
        p = ps[i]
        if p.dst_offset != covered:
            raise _hole(name, covered, p.dst_offset)
        if p.count == 1:
            covered, i = p.dst_end, i + 1
            continue
        period = p.dst_stride
        j = i + 1
        while j < len(ps) and ps[j].dst_offset < p.dst_offset + period:
            j += 1
        group = ps[i:j]
        if any(q.count != p.count or q.dst_stride != period for q in group):
            return _tiled_end_lazily(name, ps[i:], covered)
        for q in group:  # the first period: members in order, each run where the last ended
            if q.dst_offset != covered:
                raise _hole(name, covered, q.dst_offset)
            covered = q.dst_offset + q.length
        if covered != p.dst_offset + period:  # short: a gap before the next period; long: into it
            raise _hole(name, covered, p.dst_offset + period)
        covered, i = p.dst_offset + p.count * period, j
    return covered


def _tiled_end_lazily(name: str, placements: list[Placement], covered: int) -> int:
    for _, dst, n in heapq.merge(*(p.runs() for p in placements), key=lambda r: r[1]):
        if dst != covered:
            raise _hole(name, covered, dst)
        covered = dst + n
    return covered


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
