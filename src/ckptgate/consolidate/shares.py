"""Each rank's share of the consolidation's write, when a group of ranks writes one plan.

The ranks split the plan's outputs between them (:func:`assign_by_size`), check that they derived
the same plan (:func:`plan_sha256`), and each writes its own outputs front to back
(:func:`write_share`) into the one staging directory.  A source is read either under this rank's
read lease (checked after the copy), or in whole :data:`COPY_CHUNK`-aligned chunks, each checked
against the chunk manifest the digest pass recorded (:class:`ChunkRecorder`): so the bytes one
rank copies are the bytes another rank hashed.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ckptgate.consolidate.plan import ConsolidationPlan, Placement, ShardTask
from ckptgate.consolidate.writer import WrittenFile, header_bytes
from ckptgate.errors import RuntimeFailure
from ckptgate.inspect import SafeTree

__all__ = [
    "COPY_CHUNK",
    "ChunkRecorder",
    "Source",
    "assign_by_size",
    "output_sizes",
    "plan_sha256",
    "shard_pieces",
    "write_output",
    "write_share",
]

#: The chunk manifest's granularity: 4 MiB, so a terabyte's manifest is about 8 MB of digests.
COPY_CHUNK = 4 << 20
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def assign_by_size(items: Sequence[tuple[str, int]], world: int, *, first: Collection[str] = ()) -> list[list[str]]:
    """Items to ranks, largest first to the rank with the fewest bytes so far (ties: by name, then
    the lowest rank): deterministic on every rank.  The items named in ``first`` (the files that
    need a framework load) are spread before all others, so that the framework loads are shared out first."""
    loads = [0] * world
    out: list[list[str]] = [[] for _ in range(world)]
    early = set(first)
    for name, size in sorted(items, key=lambda x: (x[0] not in early, -x[1], x[0])):
        r = min(range(world), key=lambda k: (loads[k], k))
        out[r].append(name)
        loads[r] += size
    return out


def plan_sha256(plan: ConsolidationPlan) -> str:
    """The sha256 of everything the plan makes the ranks write (headers, placements, copies, index)."""
    doc = {
        "shards": [
            {
                "file": s.filename,
                "header": hashlib.sha256(header_bytes(s)).hexdigest(),
                "placements": [
                    [
                        t.source_dtype,
                        [
                            [p.src, p.src_offset, p.dst_offset, p.length, p.count, p.src_stride, p.dst_stride]
                            for p in t.placements
                        ],
                    ]
                    for t in s.tensors
                ],
            }
            for s in plan.shards
        ],
        "copies": [[c.src, c.filename, c.size] for c in plan.copies],
        "index": [plan.write_index, dict(plan.index_metadata), plan.total_size],
        "report": dict(plan.report),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


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


class Source:
    """A source a rank copies from: with ``chunks`` (the chunk manifest), read in whole chunks, each
    checked against its hash before use; without, read directly under this rank's read lease, which
    the caller checks after the copy (``SafeTree.intact``)."""

    def __init__(self, path: str, fd: int, size: int, chunks: Sequence[str] | None) -> None:
        self.path, self.fd, self.size, self.chunks = path, fd, size, chunks
        self._index, self._data = -1, b""

    def _chunk(self, i: int, chunks: Sequence[str]) -> bytes:
        if i != self._index:
            lo = i * COPY_CHUNK
            want = min(COPY_CHUNK, self.size - lo)
            data = os.pread(self.fd, want, lo)
            if len(data) != want or i >= len(chunks) or hashlib.sha256(data).hexdigest() != chunks[i]:
                raise RuntimeFailure(
                    "runtime.copy.source_changed",
                    f"{self.path}: chunk {i} no longer has the sha256 the digest pass recorded; nothing was published",
                    evidence={"source": self.path, "chunk": i},
                    advice=f"{self.path} changed while it was being taken in: take it in again with "
                    "`ckptgate intake` from a copy that nothing else writes to.",
                )
            self._index, self._data = i, data
        return self._data

    def _direct(self, offset: int, length: int) -> bytes:
        data = os.pread(self.fd, min(length, COPY_CHUNK), offset)
        if not data:
            raise RuntimeFailure(
                "runtime.copy.short_read",
                f"{self.path}: the source ended early at byte {offset}",
                evidence={"source": self.path, "offset": offset},
            )
        return data

    def read(self, offset: int, length: int) -> Iterator[bytes]:
        if offset < 0 or offset + length > self.size:
            raise RuntimeFailure(
                "runtime.copy.short_read",
                f"{self.path}: the plan reads past the end of the file",
                evidence={"source": self.path, "size": self.size},
            )
        while length:
            if self.chunks is None:
                piece = self._direct(offset, length)
            else:
                i, at = divmod(offset, COPY_CHUNK)
                piece = self._chunk(i, self.chunks)[at : at + length]
            yield piece
            offset, length = offset + len(piece), length - len(piece)


def write_output(
    stage_fd: int,
    name: str,
    head: bytes,
    pieces: Iterable[tuple[str, int, int]],
    sources: Mapping[str, Source],
) -> WrittenFile:
    """Write output ``name`` front to back (``head``, then each ``(src, offset, length)``), hashing it."""
    fd = os.open(name, _CREATE, 0o644, dir_fd=stage_fd)
    h = hashlib.sha256()
    pos = 0
    try:

        def put(data: bytes) -> None:
            nonlocal pos
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
            h.update(data)

        put(head)
        for src, off, length in pieces:
            for data in sources[src].read(off, length):
                put(data)
    finally:
        os.close(fd)
    return WrittenFile(filename=name, size=pos, sha256=h.hexdigest())


def shard_pieces(task: ShardTask) -> Iterator[tuple[str, int, int]]:
    """``(src, offset, length)`` for every run of ``task``, in output order; a strided placement is
    expanded one run at a time.  A gap or an overlap raises when it is reached (before its bytes)."""
    plain: list[tuple[int, str, int, int]] = []
    strided: list[Iterator[tuple[int, str, int, int]]] = []
    base = 0
    for t in task.tensors:
        for p in t.placements:
            if p.count == 1:
                plain.append((base + p.dst_offset, p.src, p.src_offset, p.length))
            else:
                strided.append(_runs(base, p))
        base += t.nbytes
    plain.sort()
    pos = 0
    for out_off, src, off, length in heapq.merge(plain, *strided):
        if out_off != pos:
            raise RuntimeFailure(
                "runtime.copy.not_tiled",
                f"{task.filename}: the plan leaves a gap or an overlap at byte {min(pos, out_off)}",
                evidence={"output": task.filename},
            )
        yield src, off, length
        pos += length
    if pos != task.nbytes:
        raise RuntimeFailure(
            "runtime.copy.not_tiled",
            f"{task.filename}: the plan covers {pos} of {task.nbytes} bytes",
            evidence={"output": task.filename},
        )


def _runs(base: int, p: Placement) -> Iterator[tuple[int, str, int, int]]:
    for k in range(p.count):
        yield base + p.dst_offset + k * p.dst_stride, p.src, p.src_offset + k * p.src_stride, p.length


def open_checked_sources(
    tree: SafeTree,
    sources: dict[str, Source],
    paths: set[str],
    chunks: dict[str, list[str]] | None,
) -> None:
    """Open each source in ``paths`` once: under the lease (``chunks`` is None), or checked against
    its chunk manifest."""
    for p in sorted(paths - set(sources)):
        entry = tree.entry(p)
        if entry is None or (chunks is not None and p not in chunks):
            raise RuntimeFailure(
                "runtime.copy.source_missing", f"no measured source for {p!r}", evidence={"missing": [p]}
            )
        fd = tree.open_file(p)
        sources[p] = Source(p, fd, entry.size, None if chunks is None else chunks[p])


def output_sizes(plan: ConsolidationPlan) -> list[tuple[str, int]]:
    """Every output of ``plan`` with the bytes it will have (what the ranks split)."""
    return [(s.filename, len(header_bytes(s)) + s.nbytes) for s in plan.shards] + [
        (c.filename, c.size) for c in plan.copies
    ]


def write_share(
    tree: SafeTree,
    stage_fd: int,
    plan: ConsolidationPlan,
    mine: Collection[str],
    chunks: dict[str, list[str]] | None,
) -> dict[str, Any]:
    """Write the outputs of ``plan`` named in ``mine`` into ``stage_fd``, reading sources under the
    lease (``chunks`` is None) or checked against the chunk manifest; what was written, as JSON."""
    t0 = time.perf_counter()
    sources: dict[str, Source] = {}
    written = []
    try:
        for s in plan.shards:
            if s.filename in mine:
                open_checked_sources(tree, sources, {p.src for t in s.tensors for p in t.placements}, chunks)
                written.append(write_output(stage_fd, s.filename, header_bytes(s), shard_pieces(s), sources))
        for c in plan.copies:
            if c.filename in mine:
                open_checked_sources(tree, sources, {c.src}, chunks)
                written.append(write_output(stage_fd, c.filename, b"", [(c.src, 0, c.size)] if c.size else [], sources))
    finally:
        for source in sources.values():
            os.close(source.fd)
    return {"written": [[w.filename, w.size, w.sha256] for w in written], "seconds": round(time.perf_counter() - t0, 3)}
