"""Placements: which source byte ranges fill one output tensor, and the check that they fill it once.

A :class:`Placement` is a plain byte range or a *strided* one (a regular run of rows, as a
tensor-parallel chunk gives); strided placements are checked for gaps and overlaps as a whole
(:func:`_tiled_end`) and expanded run by run only by the writer.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from ckptgate.consolidate.planerrors import PlanError


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
