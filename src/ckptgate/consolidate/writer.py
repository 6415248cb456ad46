"""The streaming safetensors writer: executes shard tasks by moving raw bytes.

Each task is written with ``pread``/``pwrite`` through one reused buffer of ``chunk_size``
bytes, hashing the output as it goes, so peak memory is bounded by the chunk (per worker
thread), never by the model.  Source bytes come from file descriptors that the caller opened
(and hashed) earlier: what was verified is what is copied.  Tasks are independent and run on a
small thread pool (``os.pread``/``os.pwrite`` and ``hashlib`` release the GIL).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile, ShardTask
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


def write_shard(task: ShardTask, out_dir: Path, sources: Mapping[str, int], *,
                chunk_size: int = DEFAULT_CHUNK, on_bytes: Callable[[int], None] | None = None) -> WrittenFile:
    """Write one shard file into ``out_dir``; ``sources`` maps source relpaths to open fds."""
    head = header_bytes(task)
    h = hashlib.sha256(head)
    buf = bytearray(min(chunk_size, max(task.nbytes, 1)))
    view = memoryview(buf)
    fd = os.open(out_dir / task.filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, head)
        pos = len(head)
        for t in task.tensors:
            for p in sorted(t.placements, key=lambda p: p.dst_offset):
                src = sources.get(p.src)
                if src is None:
                    raise RuntimeFailure("runtime.copy.source_missing", f"no open source for {p.src!r}")
                done = 0
                while done < p.length:
                    n = min(len(buf), p.length - done)
                    got = os.preadv(src, [view[:n]], p.src_offset + done)
                    if got != n:
                        raise RuntimeFailure("runtime.copy.short_read",
                                             f"{p.src}: the source ended early at byte {p.src_offset + done + got}",
                                             evidence={"source": p.src, "offset": p.src_offset + done})
                    h.update(view[:n])
                    written = 0
                    while written < n:
                        written += os.pwrite(fd, view[written:n], pos + written)
                    pos += n
                    done += n
                    if on_bytes:
                        on_bytes(n)
        os.fsync(fd)
    finally:
        os.close(fd)
    return WrittenFile(filename=task.filename, size=pos, sha256=h.hexdigest())


def copy_file(item: CopiedFile, out_dir: Path, sources: Mapping[str, int], *,
              chunk_size: int = DEFAULT_CHUNK) -> WrittenFile:
    """Copy one small non-tensor file verbatim (exactly ``item.size`` bytes), hashing it."""
    src = sources.get(item.src)
    if src is None:
        raise RuntimeFailure("runtime.copy.source_missing", f"no open source for {item.src!r}")
    h = hashlib.sha256()
    fd = os.open(out_dir / item.filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        pos = 0
        while pos < item.size:
            data = os.pread(src, min(chunk_size, item.size - pos), pos)
            if not data:
                raise RuntimeFailure("runtime.copy.short_read", f"{item.src}: the source ended early at byte {pos}",
                                     evidence={"source": item.src, "offset": pos})
            h.update(data)
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], pos + written)
            pos += len(data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return WrittenFile(filename=item.filename, size=item.size, sha256=h.hexdigest())


def write_plan(plan: ConsolidationPlan, out_dir: Path, sources: Mapping[str, int], *,
               chunk_size: int = DEFAULT_CHUNK, threads: int = 2,
               on_bytes: Callable[[int], None] | None = None) -> tuple[WrittenFile, ...]:
    """Write every shard task, the copied files and the index into ``out_dir`` (which must be empty)."""
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        futures = [pool.submit(write_shard, task, out_dir, sources, chunk_size=chunk_size, on_bytes=on_bytes)
                   for task in plan.shards]
        written = [f.result() for f in futures]
    written.extend(copy_file(c, out_dir, sources, chunk_size=chunk_size) for c in plan.copies)
    if not plan.write_index:
        return tuple(written)
    index = {"metadata": {**dict(plan.index_metadata), "total_size": plan.total_size},
             "weight_map": dict(sorted(plan.weight_map.items()))}
    raw = (json.dumps(index, indent=2, sort_keys=False) + "\n").encode()
    fd = os.open(out_dir / INDEX_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    written.append(WrittenFile(filename=INDEX_NAME, size=len(raw), sha256=hashlib.sha256(raw).hexdigest()))
    return tuple(written)
