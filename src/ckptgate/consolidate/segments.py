"""Where a run of source bytes goes in an output (:class:`Segment`), and the order the writers take them in."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

__all__ = ["Segment", "in_order", "runs_in_output_order"]


@dataclass(frozen=True, slots=True)
class Segment:
    """``length`` source bytes at ``src_offset`` go to ``out_offset`` of ``out_fd``, converted from
    ``conv[0]`` to ``conv[1]`` when the user asked for a cast (the output length then differs).
    With ``count`` > 1, ``count`` such runs, each ``src_stride`` and ``out_stride`` after the last."""

    src_offset: int
    length: int
    out_fd: int
    out_offset: int
    conv: tuple[str, str] | None = None
    count: int = 1
    src_stride: int = 0
    out_stride: int = 0

    @property
    def src_end(self) -> int:
        return self.src_offset + (self.count - 1) * self.src_stride + self.length

    def runs(self) -> Iterator[Segment]:
        """Each run as a plain segment, built one at a time."""
        if self.count == 1:
            yield self
            return
        for k in range(self.count):
            yield Segment(
                self.src_offset + k * self.src_stride,
                self.length,
                self.out_fd,
                self.out_offset + k * self.out_stride,
                self.conv,
            )


def in_order(segments: Iterable[Segment], key: Callable[[Segment], int]) -> Iterator[Segment]:
    """Every run of ``segments``, ordered by ``key``: strided segments are expanded lazily."""
    segs = list(segments)
    plain = sorted((s for s in segs if s.count == 1), key=key)
    strided = [s.runs() for s in segs if s.count > 1]
    return heapq.merge(plain, *strided, key=key) if strided else iter(plain)


def runs_in_output_order(pieces: list[tuple[str, Segment]]) -> Iterator[tuple[str, Segment]]:
    """``(src, run)`` for every run of ``pieces``, by output offset; strided ones expanded lazily."""
    plain = sorted(((src, g) for src, g in pieces if g.count == 1), key=lambda p: p[1].out_offset)
    strided = [_tagged(src, g) for src, g in pieces if g.count > 1]
    return heapq.merge(plain, *strided, key=lambda p: p[1].out_offset) if strided else iter(plain)


def _tagged(src: str, segment: Segment) -> Iterator[tuple[str, Segment]]:
    for run in segment.runs():
        yield src, run
