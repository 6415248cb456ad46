"""The streaming safetensors writer: executes a plan by moving raw bytes, in one verified pass.

Every source file is read once, sequentially, from its first byte to its last, through one
reused buffer of ``chunk_size`` bytes per thread.  Each chunk is hashed and the parts of it that
the plan places are written (``pwrite``) into the output files at their offsets.  At the end of
the pass the source's sha256 must equal the one in the fixture manifest, or nothing is
published (``runtime.copy.source_changed``): the bytes copied are exactly the bytes that were
measured, attested and decided on, even if someone rewrote the file in place meanwhile.  Outputs
are fsynced, then hashed for the receipt.  Peak memory is bounded by the chunk (per thread),
never by the model.  ``os.pread``/``os.pwrite`` and ``hashlib`` release the GIL, so sources are
read on a small thread pool.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ckptgate.consolidate.plan import ConsolidationPlan, ShardTask
from ckptgate.errors import RuntimeFailure

DEFAULT_CHUNK = 8 << 20
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class WrittenFile:
    filename: str
    size: int
    sha256: str


def header_bytes(task: ShardTask) -> bytes:
    """The safetensors header for ``task``: JSON padded with spaces to a multiple of 8 bytes."""
    header: dict[str, object] = {"__metadata__": dict(task.metadata)} if task.metadata else {}
    offset = 0
    for t in task.tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


@dataclass(frozen=True, slots=True)
class _Segment:
    src_offset: int
    length: int
    out_fd: int
    out_offset: int


def _layout(plan: ConsolidationPlan, out_dir: Path, opened: dict[str, int]) -> tuple[
        dict[str, list[_Segment]], dict[str, int]]:
    """Create every output file at its final size, headers written; return the segments per source."""
    segments: dict[str, list[_Segment]] = {}
    sizes: dict[str, int] = {}

    def create(name: str, size: int) -> int:
        fd = os.open(out_dir / name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        opened[name] = fd
        os.ftruncate(fd, size)
        sizes[name] = size
        return fd

    for task in plan.shards:
        head = header_bytes(task)
        fd = create(task.filename, len(head) + task.nbytes)
        _pwrite_all(fd, head, 0)
        base = len(head)
        for t in task.tensors:
            for p in t.placements:
                segments.setdefault(p.src, []).append(_Segment(p.src_offset, p.length, fd, base + p.dst_offset))
            base += t.nbytes
    for c in plan.copies:
        fd = create(c.filename, c.size)
        if c.size:
            segments.setdefault(c.src, []).append(_Segment(0, c.size, fd, 0))
    return segments, sizes


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _scatter_source(src: str, fd: int, segments: list[_Segment], expected_sha256: str, chunk_size: int,
                    on_bytes: Callable[[int], None] | None) -> None:
    """Read ``src`` once from start to end, hashing it and writing the placed parts."""
    size = os.fstat(fd).st_size
    if any(s.src_offset + s.length > size for s in segments):
        raise RuntimeFailure("runtime.copy.short_read", f"{src}: the plan reads past the end of the file",
                             evidence={"source": src, "size": size})
    order = sorted(segments, key=lambda s: s.src_offset)
    h = hashlib.sha256()
    buf = bytearray(max(1, min(chunk_size, size)))
    view = memoryview(buf)
    pos, nxt, active = 0, 0, []
    while pos < size:
        got = os.preadv(fd, [view[:min(len(buf), size - pos)]], pos)
        if got <= 0:
            raise RuntimeFailure("runtime.copy.short_read", f"{src}: the source ended early at byte {pos}",
                                 evidence={"source": src, "offset": pos})
        end = pos + got
        h.update(view[:got])
        while nxt < len(order) and order[nxt].src_offset < end:
            active.append(order[nxt])
            nxt += 1
        for s in active:
            lo, hi = max(pos, s.src_offset), min(end, s.src_offset + s.length)
            if lo < hi:
                _pwrite_all(s.out_fd, view[lo - pos:hi - pos], s.out_offset + (lo - s.src_offset))
                if on_bytes:
                    on_bytes(hi - lo)
        active = [s for s in active if s.src_offset + s.length > end]
        pos = end
    if h.hexdigest() != expected_sha256:
        raise RuntimeFailure("runtime.copy.source_changed",
                             f"{src} no longer has the sha256 that was measured and decided on; nothing was "
                             "published", evidence={"source": src, "expected": expected_sha256,
                                                     "actual": h.hexdigest()},
                             advice="The checkpoint changed while it was being taken in. Take it in again "
                                    "from a copy that nothing else writes to.")


def _hash_file(fd: int, chunk_size: int) -> str:
    h = hashlib.sha256()
    pos = 0
    while data := os.pread(fd, chunk_size, pos):
        h.update(data)
        pos += len(data)
    return h.hexdigest()


def write_plan(plan: ConsolidationPlan, out_dir: Path, sources: Mapping[str, int], *,
               expected: Mapping[str, str], chunk_size: int = DEFAULT_CHUNK, threads: int = 2,
               on_bytes: Callable[[int], None] | None = None) -> tuple[WrittenFile, ...]:
    """Write every shard, copied file and the index into ``out_dir`` (which must be empty).

    :param sources: source relpath -> an fd opened beneath the checkpoint root.
    :param expected: source relpath -> the sha256 recorded in the fixture manifest; every source
        the plan reads must have one, and must still have it when its single pass ends.
    """
    missing = sorted(set(plan.source_paths) - set(sources)) + sorted(set(plan.source_paths) - set(expected))
    if missing:
        raise RuntimeFailure("runtime.copy.source_missing", f"no open, measured source for {missing[0]!r}",
                             evidence={"missing": missing})
    opened: dict[str, int] = {}
    try:
        segments, sizes = _layout(plan, out_dir, opened)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            futures = [pool.submit(_scatter_source, src, sources[src], segs, expected[src], chunk_size, on_bytes)
                       for src, segs in sorted(segments.items())]
            for f in futures:
                f.result()
        for fd in opened.values():
            os.fsync(fd)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            digests = dict(zip(opened, pool.map(lambda fd: _hash_file(fd, chunk_size), opened.values())))
    finally:
        for fd in opened.values():
            os.close(fd)
    written = [WrittenFile(filename=name, size=sizes[name], sha256=digests[name]) for name in opened]
    if not plan.write_index:
        return tuple(written)
    index = {"metadata": {**dict(plan.index_metadata), "total_size": plan.total_size},
             "weight_map": dict(sorted(plan.weight_map.items()))}
    raw = (json.dumps(index, indent=2, sort_keys=False) + "\n").encode()
    fd = os.open(out_dir / INDEX_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _pwrite_all(fd, raw, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    written.append(WrittenFile(filename=INDEX_NAME, size=len(raw), sha256=hashlib.sha256(raw).hexdigest()))
    return tuple(written)
