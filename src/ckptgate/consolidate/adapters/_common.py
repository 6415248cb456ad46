"""Helpers shared by adapters: byte ranges of torch-zip tensor records and flat segments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptgate.consolidate.plan import (
    DTYPE_SIZES,
    OutputTensor,
    Placement,
    PlanError,
    merge_placements,
    numel,
    st_dtype,
    strided,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """``count`` elements of ``itemsize`` bytes, contiguous at byte ``offset`` of source ``src``."""

    src: str
    offset: int
    count: int
    itemsize: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.count < 0 or self.itemsize <= 0:
            raise PlanError("plan.segment.range", f"bad segment in {self.src!r}")


def record_segment(src: str, rec: Mapping[str, Any], *, what: str) -> Segment:
    """The bytes of a contiguous tensor record (``TensorRecord.to_json()`` shape) in ``src``.

    The range is checked against the record's storage range: a tensor view that would read past
    its storage is an error, as is a dtype that differs from its storage's (no reinterpretation).
    """
    dtype = st_dtype(str(rec.get("dtype")), what=what)
    if rec.get("storage_dtype", rec.get("dtype")) != rec.get("dtype"):
        raise PlanError(
            "plan.tensor.storage_dtype",
            f"{what}: tensor dtype {rec.get('dtype')} differs from its storage dtype {rec.get('storage_dtype')}",
            evidence={"tensor": what},
        )
    shape = tuple(int(d) for d in rec["shape"])
    if not _contiguous(shape, tuple(int(s) for s in rec["stride"])):
        raise PlanError(
            "plan.tensor.not_contiguous",
            f"{what}: the saved tensor is a non-contiguous view; ckptgate copies contiguous byte ranges only",
            evidence={"tensor": what, "stride": list(rec["stride"])},
        )
    size = DTYPE_SIZES[dtype]
    begin, end = (int(x) for x in rec["storage_range"])
    start = begin + int(rec["storage_offset"]) * size
    n = numel(shape)
    if start < begin or start + n * size > end:
        raise PlanError(
            "plan.tensor.outside_storage",
            f"{what}: the tensor's bytes run outside its storage",
            evidence={"tensor": what, "storage_range": [begin, end], "start": start, "nbytes": n * size},
        )
    return Segment(src=src, offset=start, count=n, itemsize=size)


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    if len(shape) != len(stride):
        return False
    expect = 1
    for d, s in zip(reversed(shape), reversed(stride), strict=True):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def take(segments: Sequence[Segment], start: int, count: int, *, dst_elem: int = 0, what: str) -> list[Placement]:
    """Placements for elements ``[start, start + count)`` of the concatenation of ``segments``,
    written from element ``dst_elem`` of the output tensor."""
    out: list[Placement] = []
    pos = 0
    need_lo, need_hi = start, start + count
    for seg in segments:
        lo, hi = max(pos, need_lo), min(pos + seg.count, need_hi)
        if lo < hi:
            out.append(
                Placement(
                    src=seg.src,
                    src_offset=seg.offset + (lo - pos) * seg.itemsize,
                    dst_offset=(dst_elem + lo - need_lo) * seg.itemsize,
                    length=(hi - lo) * seg.itemsize,
                )
            )
        pos += seg.count
        if pos >= need_hi:
            break
    if pos < need_hi:
        raise PlanError(
            "plan.segment.short",
            f"{what}: the flat buffers hold {pos} elements, {need_hi} are needed",
            evidence={"tensor": what, "available": pos, "needed": need_hi},
        )
    return out


def slice_placements(placements: Iterable[Placement], start: int, length: int) -> tuple[Placement, ...]:
    """The placements of destination bytes ``[start, start + length)``, rebased to 0.

    A strided placement stays strided: its runs wholly inside the window are one record, and a run
    the window cuts becomes a plain placement of its part (at most two per placement).
    """
    out: list[Placement] = []
    end = start + length
    for p in sorted(placements, key=lambda p: p.dst_offset):
        if p.count == 1:
            lo, hi = max(p.dst_offset, start), min(p.dst_offset + p.length, end)
            if lo < hi:
                out.append(
                    Placement(
                        src=p.src, src_offset=p.src_offset + lo - p.dst_offset, dst_offset=lo - start, length=hi - lo
                    )
                )
            continue
        s, n = p.dst_stride, p.length
        first = max(0, (start - p.dst_offset - n) // s + 1)  # the first run that ends after start
        last = min(p.count - 1, -((p.dst_offset - end) // s) - 1)  # the last run that begins before end
        whole = [k for k in (first, last) if p.dst_offset + k * s >= start and p.dst_offset + k * s + n <= end]
        lo_k = first if first in whole else first + 1
        hi_k = last if last in whole else last - 1
        for k in sorted({first, last}):
            if first <= k <= last and not lo_k <= k <= hi_k:  # a run the window cuts
                d = p.dst_offset + k * s
                lo, hi = max(d, start), min(d + n, end)
                out.append(
                    Placement(
                        src=p.src,
                        src_offset=p.src_offset + k * p.src_stride + lo - d,
                        dst_offset=lo - start,
                        length=hi - lo,
                    )
                )
        if lo_k <= hi_k:
            out.append(
                strided(
                    src=p.src,
                    src_offset=p.src_offset + lo_k * p.src_stride,
                    dst_offset=p.dst_offset + lo_k * s - start,
                    length=n,
                    count=hi_k - lo_k + 1,
                    src_stride=p.src_stride,
                    dst_stride=s,
                )
            )
    return merge_placements(out)


def segment_tensor(name: str, dtype: str, shape: Sequence[int], seg: Segment) -> OutputTensor:
    """An output tensor that is the whole of one contiguous segment (none for zero elements)."""
    return OutputTensor(
        name=name,
        dtype=dtype,
        shape=tuple(int(d) for d in shape),
        placements=tuple(take([seg], 0, seg.count, what=name)) if seg.count else (),
    )


def header_tensors(rel: str, header: Any) -> list[OutputTensor]:
    """One output tensor per tensor of a validated safetensors header, each one byte range of ``rel``."""
    out = []
    for t in header.tensors:
        begin, end = t.data_offsets
        placements = (
            ()
            if end == begin
            else (Placement(src=rel, src_offset=header.data_start + begin, dst_offset=0, length=end - begin),)
        )
        out.append(OutputTensor(name=t.name, dtype=t.dtype, shape=tuple(t.shape), placements=placements))
    return out
