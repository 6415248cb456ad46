"""How the writer opens (:func:`open_sources`) and reads its sources: straight from held ones, or
checked against the chunk manifest.

The manifest is the sha256 of every :data:`COPY_CHUNK`-aligned chunk of each file, recorded as the
digest streams it (:class:`ChunkRecorder`).  Where a group of ranks is not bound by read leases, a
rank copies bytes another rank hashed; the writer then reads each source in whole chunks, each
checked against its recorded hash before any of its bytes are used (:class:`ChunkChecked`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from ckptgate.errors import RuntimeFailure

if TYPE_CHECKING:
    from ckptgate.consolidate.plan import ConsolidationPlan
    from ckptgate.inspect import SafeTree

__all__ = ["COPY_CHUNK", "ChunkChecked", "ChunkRecorder", "Read", "direct", "ended_early", "open_sources"]

#: The chunk manifest's granularity: 4 MiB, so a terabyte's manifest is about 8 MB of digests.
COPY_CHUNK = 4 << 20
#: At most this many sources' last chunks are kept by one output's reads (a tensor-parallel output
#: takes a row from each of its sources in turn); the writer counts them in its memory cap.
MAX_KEPT = 16
#: ``read(src, into, offset)``: fill ``into`` from source ``src`` at ``offset``, whole
#: (``runtime.copy.short_read`` where the source ends first).
Read = Callable[[str, memoryview, int], None]


class ChunkRecorder:
    """Records the sha256 of every :data:`COPY_CHUNK`-aligned chunk of one file as the digest streams it."""

    def __init__(self) -> None:
        self.hashes: list[str] = []
        self._h = hashlib.sha256()
        self._fill = 0

    def __call__(self, offset: int, view: memoryview) -> None:
        while view:
            n = min(len(view), COPY_CHUNK - self._fill)
            self._h.update(view[:n])
            self._fill += n
            view = view[n:]
            if self._fill == COPY_CHUNK:
                self.done()

    def done(self) -> None:
        if self._fill:
            self.hashes.append(self._h.hexdigest())
            self._h, self._fill = hashlib.sha256(), 0


@contextlib.contextmanager
def open_sources(tree: SafeTree, plan: ConsolidationPlan) -> Iterator[dict[str, int]]:
    """Every source ``plan`` reads, opened beneath ``tree``'s root: relpath -> fd, closed on exit."""
    fds: dict[str, int] = {}
    try:
        for src in plan.source_paths:
            fds[src] = tree.open_file(src)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def ended_early(src: str, offset: int) -> RuntimeFailure:
    return RuntimeFailure(
        "runtime.copy.short_read",
        f"{src}: the source ended early at byte {offset}",
        evidence={"source": src, "offset": offset},
    )


def direct(fds: Mapping[str, int]) -> Read:
    """Reads straight from sources the caller holds under read leases (it checks them after the copy)."""

    def read(src: str, into: memoryview, offset: int) -> None:
        done = 0
        while done < len(into):
            n = os.preadv(fds[src], [into[done:]], offset + done)
            if n <= 0:
                raise ended_early(src, offset + done)
            done += n

    return read


class ChunkChecked:
    """One output's reads (one thread's): each source read in whole chunks, each checked against
    ``manifest`` before use; the last chunk of each of the last few sources kept."""

    def __init__(self, fds: Mapping[str, int], manifest: Mapping[str, Sequence[str]], *, kept: int = MAX_KEPT) -> None:
        self._fds, self._manifest = fds, manifest
        self._limit = max(1, min(kept, MAX_KEPT))
        self._kept: dict[str, tuple[int, memoryview]] = {}

    def __call__(self, src: str, into: memoryview, offset: int) -> None:
        done = 0
        while done < len(into):
            i, at = divmod(offset + done, COPY_CHUNK)
            piece = self._chunk(src, i)[at : at + len(into) - done]
            if not piece:
                raise ended_early(src, offset + done)
            into[done : done + len(piece)] = piece
            done += len(piece)

    def _chunk(self, src: str, i: int) -> memoryview:
        kept = self._kept.pop(src, None)
        if kept is not None and kept[0] == i:
            self._kept[src] = kept  # the most recent last
            return kept[1]
        hashes = self._manifest[src]
        if i >= len(hashes):
            return memoryview(b"")  # past what was hashed: a short read
        data = os.pread(self._fds[src], COPY_CHUNK, i * COPY_CHUNK)
        if hashlib.sha256(data).hexdigest() != hashes[i]:
            raise RuntimeFailure(
                "runtime.copy.source_changed",
                f"{src}: chunk {i} no longer has the sha256 the digest pass recorded; nothing was published",
                evidence={"source": src, "chunk": i},
                advice=f"{src} changed while it was being taken in: take it in again with "
                "`ckptgate intake` from a copy that nothing else writes to.",
            )
        if len(self._kept) >= self._limit:
            del self._kept[next(iter(self._kept))]
        self._kept[src] = (i, memoryview(data))
        return self._kept[src][1]
