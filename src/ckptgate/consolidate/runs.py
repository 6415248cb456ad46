"""Chunk geometry: the byte runs through which a row-major chunk fills its row-major tensor.

A chunk of a tensor sharded on a dimension other than its first (a tensor-parallel ``Shard(1)``
weight) is a regular run of rows; :func:`chunk_strided_runs` gives it as one strided progression
(start, count, source and destination strides, run length), so a plan holds O(tensors x ranks)
records, not one per row.  Bounds and ranks are checked here; the records themselves are
:mod:`ckptgate.consolidate.placement`'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ckptgate.consolidate.planerrors import PlanError


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
