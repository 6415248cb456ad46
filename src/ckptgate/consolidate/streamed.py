"""Writing the outputs from bytes someone else reads: intake's one pass (:class:`StreamedPlan`).

The digest hands every chunk it hashes, in the input's read order, to :meth:`StreamedPlan.feeder`;
the placed bytes are written where the plan puts them, and each output is hashed as its bytes
arrive in order (:class:`_InOrderHash`, within one :class:`_Budget` of waiting bytes; past it,
an output's rest is read back from its file after the pass).  The other writers are
:mod:`ckptgate.consolidate.writer`'s.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ckptgate.consolidate.diskwrite import pwrite_all, start_write_back
from ckptgate.consolidate.plan import ConsolidationPlan
from ckptgate.consolidate.segments import Segment, in_order
from ckptgate.consolidate.writer import DEFAULT_CHUNK, PENDING_CAP, WrittenFile, hash_back, lay_out
from ckptgate.errors import RuntimeFailure

__all__ = ["StreamedPlan"]


class _Budget:
    """Bytes that pieces waiting to be hashed may hold, shared by every output of a plan."""

    __slots__ = ("_left", "_lock")

    def __init__(self, cap: int) -> None:
        self._left, self._lock = cap, threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if n > self._left:
                return False
            self._left -= n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self._left += n


class _InOrderHash:
    """The sha256 of one output, taken from the bytes as they are written when they arrive in order.

    Pieces that arrive ahead of the hashed prefix wait, copied, while the plan's shared
    :class:`_Budget` has room; when it has none, this output's waiting pieces are dropped and the
    rest of it is read back from its file after the pass (:meth:`StreamedPlan.finish`), from
    where the prefix ends.  Memory stays bounded either way.  Called from the digest's threads:
    one lock per output.
    """

    __slots__ = ("_budget", "_h", "_lock", "_pending", "_waiting", "lost", "pos")

    def __init__(self, budget: _Budget) -> None:
        self._h = hashlib.sha256()
        self._lock = threading.Lock()
        self._pending: dict[int, bytes] = {}
        self._waiting = 0
        self._budget, self.lost, self.pos = budget, False, 0

    def _drop(self) -> None:
        self._budget.give(self._waiting)
        self.lost, self._pending, self._waiting = True, {}, 0

    def add(self, offset: int, data: memoryview | bytes) -> None:
        with self._lock:
            if self.lost:
                return
            if offset < self.pos:  # an overlap, which a checked plan cannot have: hash it all back
                self._drop()
                self._h, self.pos = hashlib.sha256(), 0
                return
            if offset > self.pos:
                if self._budget.take(len(data)):
                    self._pending[offset] = bytes(data)
                    self._waiting += len(data)
                else:
                    self._drop()
                return
            self._h.update(data)
            self.pos += len(data)
            while (nxt := self._pending.pop(self.pos, None)) is not None:
                self._waiting -= len(nxt)
                self._budget.give(len(nxt))
                self._h.update(nxt)
                self.pos += len(nxt)

    def finish(self, fd: int, chunk_size: int) -> str:
        """The output's sha256: the hashed prefix, then the rest read back from ``fd``."""
        return hash_back(fd, chunk_size, self._h, self.pos)


class StreamedPlan:
    """A plan written from bytes that someone else reads: the digest's one pass over the input.

    The output files are created in ``out_fd`` at their final sizes with their headers when this is
    made.  :meth:`feeder` gives, per source, the callable the digest hands every chunk it has
    just hashed, ``(offset, bytes)`` in order (:func:`ckptgate.digest.fixture_digest`'s ``also``);
    the placed parts of that very buffer are written at their output offsets (buffered, with
    write-back started at once per output for the chunk, :func:`start_write_back`), so the bytes
    written are the bytes hashed,
    and each output is hashed as its bytes arrive in order (:class:`_InOrderHash`).
    :meth:`finish` checks that every placed byte came, hashes what could not be hashed in order
    (outputs in parallel, on ``threads`` threads) and returns the outputs.  Pieces waiting for
    their turn to be hashed hold at most ``pending_cap`` bytes for the whole plan.  Durability stays
    publication's job.  Casts (``source_dtype``) are not streamed: such a plan is refused here.
    """

    def __init__(
        self, plan: ConsolidationPlan, out_fd: int, *, chunk_size: int = DEFAULT_CHUNK, pending_cap: int = PENDING_CAP
    ) -> None:
        if any(t.source_dtype for s in plan.shards for t in s.tensors):
            raise ValueError("a plan with casts cannot be streamed")
        self._plan, self._chunk = plan, chunk_size
        self._opened: dict[str, int] = {}
        try:
            self._segments, self._sizes, heads = lay_out(plan, out_fd, self._opened, write_heads=True)
        except BaseException:
            self.close()
            raise
        budget = _Budget(pending_cap)
        self._hashes = {fd: _InOrderHash(budget) for fd in self._opened.values()}
        for name, head in heads.items():
            self._hashes[self._opened[name]].add(0, head)
        self._written = dict.fromkeys(self._segments, 0)
        self._fed: dict[str, int] = {}  # per source: how far the one pass has handed bytes over
        self._lock = threading.Lock()

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(sorted(self._segments))

    def feeder(self, src: str) -> Callable[[int, memoryview], None] | None:
        """The callable for the chunks of ``src`` in read order; ``None`` if the plan reads none of it."""
        segs = self._segments.get(src)
        if not segs:
            return None
        if src in self._fed:
            raise ValueError(f"{src}: a source has one feeder, fed once from start to end")
        self._fed[src] = 0
        # Strided segments are expanded run by run as the pass reaches them: O(segments) held.
        order = in_order(segs, key=lambda r: r.src_offset)
        pending = next(order, None)  # the next run the pass has not reached yet
        active: list[Segment] = []
        hashes = self._hashes

        def feed(pos: int, view: memoryview) -> None:
            nonlocal active, pending
            if pos != self._fed[src]:  # the digest's one pass: contiguous, in order, each byte once
                raise RuntimeFailure(
                    "runtime.copy.out_of_order",
                    f"{src}: the pass handed over byte {pos}, expected {self._fed[src]}",
                    evidence={"source": src, "offset": pos},
                )
            end = pos + len(view)
            self._fed[src] = end
            while pending is not None and pending.src_offset < end:
                active.append(pending)
                pending = next(order, None)
            done = 0
            spans: dict[int, tuple[int, int]] = {}  # per output: the range this chunk's pieces wrote
            for s in active:
                lo, hi = max(pos, s.src_offset), min(end, s.src_offset + s.length)
                if lo < hi:
                    piece, at = view[lo - pos : hi - pos], s.out_offset + (lo - s.src_offset)
                    pwrite_all(s.out_fd, piece, at)
                    hashes[s.out_fd].add(at, piece)
                    a, b = spans.get(s.out_fd, (at, at + len(piece)))
                    spans[s.out_fd] = (min(a, at), max(b, at + len(piece)))
                    done += hi - lo
            # write-back started once per output and chunk, not per piece: a strided placement
            # (a row split over TP) is thousands of pieces of a few KB per chunk
            for fd, (a, b) in spans.items():
                start_write_back(fd, a, b - a)
            active = [s for s in active if s.src_offset + s.length > end]
            with self._lock:
                self._written[src] += done

        return feed

    def finish(self, *, threads: int = 4) -> dict[str, WrittenFile]:
        """Every output, by name, once the pass is over; ``runtime.copy.short_read`` if a placed
        byte never came."""
        for src, segs in self._segments.items():
            want = sum(s.count * s.length for s in segs)
            if self._written[src] != want:
                raise RuntimeFailure(
                    "runtime.copy.short_read",
                    f"{src}: {self._written[src]} of the {want} placed bytes were read",
                    evidence={"source": src},
                )
        names = list(self._opened)
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(names)))) as pool:
            digests = list(
                pool.map(lambda n: self._hashes[self._opened[n]].finish(self._opened[n], self._chunk), names)
            )
        return {n: WrittenFile(filename=n, size=self._sizes[n], sha256=d) for n, d in zip(names, digests, strict=True)}

    def close(self) -> None:
        for fd in self._opened.values():
            os.close(fd)
        self._opened = {}

    def __enter__(self) -> StreamedPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
