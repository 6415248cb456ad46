"""The streaming safetensors writer: executes a plan by moving raw bytes.

It is the one writer of a plan's outputs from their sources: a single process's, and each rank's
share of a group's plan (:func:`ckptgate.consolidate.shares.share_of`).  It runs in one of two
modes; neither holds more than a few ``chunk_size`` buffers per output being written (a ring of
:data:`~ckptgate.consolidate.held.RING` in held mode, within :data:`HELD_WINDOWS_CAP` bytes for
all outputs together; with ``chunks``, also the last checked chunk of a few sources), never the model:

* **Held sources** (``expected=None``): the caller holds every source unchanged
  (:meth:`ckptgate.inspect.SafeTree.hold`: read leases, checked with ``intact()`` after the
  write), so the bytes read here are the bytes that were inspected and hashed; or, with
  ``chunks`` (a rank of a group whose leases do not bind it to the rank that hashed), every
  source is read in whole chunks, each checked against the chunk manifest before use
  (:class:`~ckptgate.consolidate.chunks.ChunkChecked`).  Each output file
  is assembled front to back in page-aligned windows: its header, then every placed range read
  from its source with ``preadv`` straight into place.  Each full window is hashed (so the
  receipt's sha256 costs no second pass) and written, with ``O_DIRECT`` where the file system
  takes it, while the next one is filled.  Only the placed bytes are read.
* **Verified sources** (``expected`` = the fixture manifest): every source file is read once,
  from its first byte to its last; each chunk is hashed and the parts of it that the plan places
  are written into the outputs at their offsets.  At the end of the pass the source's sha256 must
  equal the manifest's, or nothing is published (``runtime.copy.source_changed``), even if
  someone rewrote the file in place meanwhile.  The outputs are then read back and hashed.

A strided placement (a tensor-parallel chunk: one run per row) stays one record until here; both
modes expand it run by run as they reach it, merging the runs of every placement of an output
(held mode) or of a source (verified mode) in order, so the writer too holds O(placements).

A third way, :mod:`ckptgate.consolidate.streamed`, writes from bytes someone else reads: intake's one pass,
where the fixture digest hands it each chunk it has just hashed (``ckptgate.onepass.OnePass``).

Durability is publication's job (:func:`ckptgate.publish.publish` fsyncs every staged file
once).  Which write path, by a fixed rule rather than a measurement at start:

* an output assembled front to back in page-aligned windows (held mode) is written with
  ``O_DIRECT`` where the file system takes it (no page cache to fill, nothing left for fsync),
  buffered for the unaligned tail or where it is refused;
* an output written in the input's read order (verified mode, :mod:`~ckptgate.consolidate.streamed`) receives
  pieces at unaligned offsets, which ``O_DIRECT`` cannot take without copying them again into
  aligned windows; it is written through the page cache, and the writer asks the kernel to start
  writing each piece back at once (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not
  wait), so that the disk works while the input is still being read and fsync finds little left.

``os.pread``/``os.pwrite`` and ``hashlib`` release the GIL, so files are processed on a small
thread pool.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate import interrupts
from ckptgate.consolidate import diskwrite as disk
from ckptgate.consolidate.cast import convert
from ckptgate.consolidate.chunks import COPY_CHUNK, MAX_KEPT, ChunkChecked, direct, ended_early
from ckptgate.consolidate.held import RING, CopyCancelled, copy_in_order
from ckptgate.consolidate.plan import DTYPE_SIZES, ConsolidationPlan, ShardTask
from ckptgate.consolidate.segments import Segment, in_order
from ckptgate.errors import RuntimeFailure

#: 4 MiB, measured: on the 2-core development VM, held-mode windows of 2-4 MiB copied 2 GB 15-20%
#: faster than 8 MiB ones, and 1 MiB ones more slowly (interleaved A/B in whole intakes, 2026-11-30).
DEFAULT_CHUNK = 4 << 20
#: The bytes a streamed plan may hold for outputs whose pieces arrive out of order (all outputs
#: together); beyond it, the rest of such an output is hashed by reading it back.
PENDING_CAP = 128 << 20
INDEX_NAME = "model.safetensors.index.json"
#: The held mode's windows in flight, all outputs together (each output being written holds a ring
#: of :data:`~ckptgate.consolidate.held.RING` windows): at most this many bytes, whatever the
#: thread count, so that peak RSS stays within 256 MB + the largest tensor at 16 workers (issue #36).
HELD_WINDOWS_CAP = 128 << 20


def held_outputs_at_once(threads: int, chunk_size: int, kept_chunks: int = 0) -> int:
    """How many outputs held mode writes at once: at most ``threads``, and few enough that their
    windows (and, checked against a chunk manifest, the ``kept_chunks`` source chunks each keeps)
    stay within :data:`HELD_WINDOWS_CAP`; at least one."""
    per_output = RING * chunk_size + min(kept_chunks, MAX_KEPT) * COPY_CHUNK
    return max(1, min(threads, HELD_WINDOWS_CAP // per_output))


_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True, kw_only=True)
class WrittenFile:
    filename: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """The file as a receipt lists it among the outputs."""
        return {"file": self.filename, "size": self.size, "sha256": self.sha256}


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


def lay_out(
    plan: ConsolidationPlan, out_fd: int, opened: dict[str, int], *, write_heads: bool
) -> tuple[dict[str, list[Segment]], dict[str, int], dict[str, bytes]]:
    """Create every output file at its final size (headers written if ``write_heads``); return the
    segments per source, the sizes and the headers."""
    segments: dict[str, list[Segment]] = {}
    sizes: dict[str, int] = {}
    heads: dict[str, bytes] = {}

    def create(name: str, size: int) -> int:
        # a plain name, relative to the output directory's fd
        fd = os.open(name, os.O_RDWR | _CREATE, 0o644, dir_fd=out_fd)
        opened[name] = fd
        os.ftruncate(fd, size)
        sizes[name] = size
        return fd

    for task in plan.shards:
        head = heads[task.filename] = header_bytes(task)
        fd = create(task.filename, len(head) + task.nbytes)
        if write_heads:
            disk.pwrite_all(fd, head, 0)
        base = len(head)
        for t in task.tensors:
            conv = (t.source_dtype, t.dtype) if t.source_dtype else None
            scale = (DTYPE_SIZES[t.dtype], DTYPE_SIZES[t.source_dtype]) if t.source_dtype else (1, 1)
            for p in t.placements:
                segments.setdefault(p.src, []).append(
                    Segment(
                        p.src_offset,
                        p.length,
                        fd,
                        base + p.dst_offset * scale[0] // scale[1],
                        conv,
                        p.count,
                        p.src_stride,
                        p.dst_stride * scale[0] // scale[1],
                    )
                )
            base += t.nbytes
    for c in plan.copies:
        fd = create(c.filename, c.size)
        if c.size:
            segments.setdefault(c.src, []).append(Segment(0, c.size, fd, 0))
    return segments, sizes, heads


def _scatter_source(
    src: str,
    fd: int,
    segments: list[Segment],
    expected_sha256: str,
    chunk_size: int,
    on_bytes: Callable[[int], None] | None,
    stop: threading.Event | None = None,
) -> None:
    """Read ``src`` once from start to end, hashing it and writing the placed parts; setting
    ``stop`` ends it at its next chunk (:class:`~ckptgate.consolidate.held.CopyCancelled`)."""
    size = os.fstat(fd).st_size
    if any(s.src_end > size for s in segments):
        raise RuntimeFailure(
            "runtime.copy.short_read",
            f"{src}: the plan reads past the end of the file",
            evidence={"source": src, "size": size},
        )
    order = in_order(segments, key=lambda s: s.src_offset)
    upcoming = next(order, None)
    carry: dict[int, tuple[bytes, int]] = {}  # a converting segment: (its partial element, output written)
    h = hashlib.sha256()
    buf = bytearray(max(1, min(chunk_size, size)))
    view = memoryview(buf)
    pos, active = 0, []
    while pos < size:
        if stop is not None and stop.is_set():
            raise CopyCancelled(src)
        got = os.preadv(fd, [view[: min(len(buf), size - pos)]], pos)
        if got <= 0:
            raise ended_early(src, pos)
        end = pos + got
        h.update(view[:got])
        while upcoming is not None and upcoming.src_offset < end:
            active.append(upcoming)
            upcoming = next(order, None)
        for s in active:
            lo, hi = max(pos, s.src_offset), min(end, s.src_offset + s.length)
            if lo < hi and s.conv is None:
                disk.write_back(s.out_fd, view[lo - pos : hi - pos], s.out_offset + (lo - s.src_offset))
                if on_bytes:
                    on_bytes(hi - lo)
            elif lo < hi and s.conv is not None:  # whole elements only: a chunk may end inside one
                part, done = carry.get(id(s), (b"", 0))
                data = part + view[lo - pos : hi - pos].tobytes()
                whole = len(data) - len(data) % DTYPE_SIZES[s.conv[0]]
                out = convert(data[:whole], *s.conv)
                disk.write_back(s.out_fd, memoryview(out), s.out_offset + done)
                carry[id(s)] = (data[whole:], done + len(out))
                if on_bytes:
                    on_bytes(len(out))
        for s in active:
            if s.src_offset + s.length <= end:
                carry.pop(id(s), None)  # done: its id may be reused by a run built later
        active = [s for s in active if s.src_offset + s.length > end]
        pos = end
    if h.hexdigest() != expected_sha256:
        raise RuntimeFailure(
            "runtime.copy.source_changed",
            f"{src} no longer has the sha256 that was measured and decided on; nothing was published",
            evidence={"source": src, "expected": expected_sha256, "actual": h.hexdigest()},
            advice=f"{src} changed while it was being taken in: copy the checkpoint to a directory that nothing "
            "else writes to (`cp -a SRC COPY`), and take that copy in.",
        )


def hash_back(
    fd: int, chunk_size: int, h: hashlib._Hash | None = None, pos: int = 0, stop: threading.Event | None = None
) -> str:
    """The sha256 of output ``fd`` read back from byte ``pos`` on, after ``h`` (what came before);
    setting ``stop`` ends it at its next chunk (:class:`~ckptgate.consolidate.held.CopyCancelled`)."""
    h = h or hashlib.sha256()
    size = os.fstat(fd).st_size
    buf = memoryview(bytearray(max(1, min(chunk_size, size - pos))))
    while pos < size and (n := os.preadv(fd, [buf[: size - pos]], pos)) > 0:
        if stop is not None and stop.is_set():
            raise CopyCancelled(str(fd))
        h.update(buf[:n])
        pos += n
    return h.hexdigest()


def write_index(plan: ConsolidationPlan, out_fd: int) -> WrittenFile | None:
    """Write ``model.safetensors.index.json`` for ``plan`` into ``out_fd``; ``None`` if it has none."""
    if not plan.write_index:
        return None
    index = {
        "metadata": {**dict(plan.index_metadata), "total_size": plan.total_size},
        "weight_map": dict(sorted(plan.weight_map.items())),
    }
    raw = (json.dumps(index, indent=2, sort_keys=False) + "\n").encode()
    fd = os.open(INDEX_NAME, os.O_WRONLY | _CREATE, 0o644, dir_fd=out_fd)
    try:
        disk.pwrite_all(fd, raw, 0)
    finally:
        os.close(fd)
    return WrittenFile(filename=INDEX_NAME, size=len(raw), sha256=hashlib.sha256(raw).hexdigest())


def write_plan(
    plan: ConsolidationPlan,
    out_dir: int | Path,
    sources: Mapping[str, int],
    *,
    expected: Mapping[str, str] | None,
    chunks: Mapping[str, Sequence[str]] | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    threads: int = 2,
    on_bytes: Callable[[int], None] | None = None,
    index: bool = True,
    cancel: threading.Event | None = None,
) -> tuple[WrittenFile, ...]:
    """Write every shard, copied file and (unless ``index`` is false) the index into ``out_dir``
    (which must be empty).  Setting ``cancel`` stops the copy at its next window (held mode) or
    chunk (two passes), as does a failed output, or an exception here (a signal), for the outputs
    still being written; what has not started never starts.

    :param out_dir: a directory descriptor (an intake passes its staging directory's,
        :class:`ckptgate.publish.Stage`), or a path, opened once as one.  Every output is created
        relative to that descriptor, by its plain name, never by a path.
    :param sources: source relpath -> an fd opened beneath the checkpoint root.
    :param expected: source relpath -> the sha256 recorded in the fixture manifest; every source
        the plan reads must have one, and must still have it when its single pass ends.  ``None``
        only when the caller holds every source unchanged and checks that after this returns
        (:meth:`ckptgate.inspect.SafeTree.intact`), or passes ``chunks``.
    :param chunks: with ``expected=None``, source relpath -> the sha256 of each of its chunks (the
        chunk manifest): each chunk read is checked before use.  A rank of a group writes its share
        this way where read leases do not bind its copy to another rank's digest.
    """
    missing = sorted(set(plan.source_paths) - set(sources))
    for measured in [m for m in (expected, chunks) if m is not None]:
        missing += sorted(set(plan.source_paths) - set(measured))
    if missing:
        raise RuntimeFailure(
            "runtime.copy.source_missing", f"no open, measured source for {missing[0]!r}", evidence={"missing": missing}
        )
    own = not isinstance(out_dir, int)
    if isinstance(out_dir, int):
        out_fd = out_dir
    else:
        out_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        written = _write_plan(
            plan,
            out_fd,
            sources,
            expected=expected,
            chunks=chunks,
            chunk_size=chunk_size,
            threads=threads,
            on_bytes=on_bytes,
            cancel=cancel,
        )
        return _with_index(plan, out_fd, written) if index else written
    finally:
        if own:
            os.close(out_fd)


def _with_index(plan: ConsolidationPlan, out_fd: int, written: tuple[WrittenFile, ...]) -> tuple[WrittenFile, ...]:
    made = write_index(plan, out_fd)
    return written if made is None else (*written, made)


def _write_plan(
    plan: ConsolidationPlan,
    out_fd: int,
    sources: Mapping[str, int],
    *,
    expected: Mapping[str, str] | None,
    chunks: Mapping[str, Sequence[str]] | None,
    chunk_size: int,
    threads: int,
    on_bytes: Callable[[int], None] | None,
    cancel: threading.Event | None,
) -> tuple[WrittenFile, ...]:
    opened: dict[str, int] = {}
    try:
        segments, sizes, heads = lay_out(plan, out_fd, opened, write_heads=expected is not None)
        pieces: dict[int, list[tuple[str, Segment]]] = {fd: [] for fd in opened.values()}
        for src, segs in segments.items():
            for g in segs:
                pieces[g.out_fd].append((src, g))
        # with chunks, each output also keeps the last checked chunk of each source it interleaves
        kept = max((len({src for src, _ in p}) for p in pieces.values()), default=1) if chunks is not None else 0
        at_once = threads if expected is not None else held_outputs_at_once(threads, chunk_size, kept)
        stop = cancel or threading.Event()
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            try:
                if expected is None:
                    futures = {
                        name: pool.submit(
                            copy_in_order,
                            name,
                            fd,
                            sizes[name],
                            heads.get(name, b""),
                            pieces[fd],
                            direct(sources) if chunks is None else ChunkChecked(sources, chunks, kept=kept),
                            chunk_size,
                            on_bytes,
                            stop,
                        )
                        for name, fd in opened.items()
                    }
                else:
                    interrupts.all_done(
                        [
                            pool.submit(
                                _scatter_source, src, sources[src], segs, expected[src], chunk_size, on_bytes, stop
                            )
                            for src, segs in sorted(segments.items())
                        ]
                    )
                    futures = {name: pool.submit(hash_back, fd, chunk_size, stop=stop) for name, fd in opened.items()}
                interrupts.all_done(futures.values())  # the first failure, as soon as it happens
            except BaseException:  # a failed output, or this process stopped: the others stop at their
                stop.set()  # next window or chunk, and what has not started never starts
                pool.shutdown(cancel_futures=True)
                raise
            digests = {name: f.result() for name, f in futures.items()}
    finally:
        for fd in opened.values():
            os.close(fd)
    return tuple(WrittenFile(filename=name, size=sizes[name], sha256=digests[name]) for name in opened)
