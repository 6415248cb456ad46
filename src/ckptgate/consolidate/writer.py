"""The streaming safetensors writer: executes a plan by moving raw bytes.

It runs in one of two modes; neither holds more than a few ``chunk_size`` buffers per output
being written (a ring of :data:`_RING` in held mode), never the model:

* **Held sources** (``expected=None``): the caller holds every source unchanged
  (:meth:`ckptgate.inspect.SafeTree.hold`: read leases, checked with ``intact()`` after the
  write), so the bytes read here are the bytes that were inspected and hashed.  Each output file
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
where the fixture digest hands it each chunk it has just hashed (``ckptgate.pipeline.OnePass``).

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

import ctypes
import errno
import fcntl
import hashlib
import heapq
import json
import mmap
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate.consolidate.cast import convert
from ckptgate.consolidate.plan import DTYPE_SIZES, ConsolidationPlan, ShardTask
from ckptgate.errors import RuntimeFailure

#: 4 MiB, measured: on the 2-core development VM, held-mode windows of 2-4 MiB copied 2 GB 15-20%
#: faster than 8 MiB ones, and 1 MiB ones more slowly (interleaved A/B in whole intakes, 2026-11-30).
DEFAULT_CHUNK = 4 << 20
#: The bytes a streamed plan may hold for outputs whose pieces arrive out of order (all outputs
#: together); beyond it, the rest of such an output is hashed by reading it back.
PENDING_CAP = 128 << 20
_RING = 4  # windows per output in held mode: one being filled, the others being hashed and written
_ALIGN = 4096  # O_DIRECT: buffer address, file offset and length in whole blocks
INDEX_NAME = "model.safetensors.index.json"
_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
_sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
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


def _runs_in_output_order(pieces: list[tuple[str, Segment]]) -> Iterator[tuple[str, Segment]]:
    """``(src, run)`` for every run of ``pieces``, by output offset; strided ones expanded lazily."""
    plain = sorted(((src, g) for src, g in pieces if g.count == 1), key=lambda p: p[1].out_offset)
    strided = [_tagged(src, g) for src, g in pieces if g.count > 1]
    return heapq.merge(plain, *strided, key=lambda p: p[1].out_offset) if strided else iter(plain)


def _tagged(src: str, segment: Segment) -> Iterator[tuple[str, Segment]]:
    for run in segment.runs():
        yield src, run


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
            _pwrite_all(fd, head, 0)
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


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def write_back(fd: int, data: memoryview, offset: int) -> None:
    """Write ``data`` at ``offset`` and start (never wait for) its write-back to the disk.

    The hint's result is ignored: where the file system refuses it, fsync simply does it all.
    """
    _pwrite_all(fd, data, offset)
    _sync_file_range(fd, offset, len(data), _SYNC_FILE_RANGE_WRITE)


def _scatter_source(
    src: str,
    fd: int,
    segments: list[Segment],
    expected_sha256: str,
    chunk_size: int,
    on_bytes: Callable[[int], None] | None,
) -> None:
    """Read ``src`` once from start to end, hashing it and writing the placed parts."""
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
        got = os.preadv(fd, [view[: min(len(buf), size - pos)]], pos)
        if got <= 0:
            raise RuntimeFailure(
                "runtime.copy.short_read",
                f"{src}: the source ended early at byte {pos}",
                evidence={"source": src, "offset": pos},
            )
        end = pos + got
        h.update(view[:got])
        while upcoming is not None and upcoming.src_offset < end:
            active.append(upcoming)
            upcoming = next(order, None)
        for s in active:
            lo, hi = max(pos, s.src_offset), min(end, s.src_offset + s.length)
            if lo < hi and s.conv is None:
                write_back(s.out_fd, view[lo - pos : hi - pos], s.out_offset + (lo - s.src_offset))
                if on_bytes:
                    on_bytes(hi - lo)
            elif lo < hi and s.conv is not None:  # whole elements only: a chunk may end inside one
                part, done = carry.get(id(s), (b"", 0))
                data = part + view[lo - pos : hi - pos].tobytes()
                whole = len(data) - len(data) % DTYPE_SIZES[s.conv[0]]
                out = convert(data[:whole], *s.conv)
                write_back(s.out_fd, memoryview(out), s.out_offset + done)
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
            advice="The checkpoint changed while it was being taken in. Take it in again "
            "from a copy that nothing else writes to.",
        )


def _hash_file(fd: int, chunk_size: int) -> str:
    h = hashlib.sha256()
    size = os.fstat(fd).st_size
    buf = memoryview(bytearray(max(1, min(chunk_size, size))))
    pos = 0
    while pos < size and (n := os.preadv(fd, [buf[: size - pos]], pos)) > 0:
        h.update(buf[:n])
        pos += n
    return h.hexdigest()


class _Sink:
    """One output file, written by one thread: whole aligned blocks with ``O_DIRECT`` where the file
    system takes it (no page cache to fill and no write-back left for the fsync; on this project's
    VM, page-cache writes vary several-fold in speed from one run to the next), the rest buffered."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.direct = _set_direct(fd, True)

    def write(self, data: memoryview, offset: int) -> None:
        n = len(data) & -_ALIGN if self.direct else 0
        if n:
            try:
                _pwrite_all(self.fd, data[:n], offset)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this file system's direct I/O wants other alignment
                    raise
                n = 0
        if n < len(data):
            if self.direct:  # the unaligned tail, or the rest after EINVAL: buffered from here on
                _set_direct(self.fd, False)
                self.direct = False
            write_back(self.fd, data[n:], offset + n)


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; whether that worked."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
    except OSError:
        return False
    return True


def _copy_in_order(
    name: str,
    fd: int,
    size: int,
    head: bytes,
    pieces: list[tuple[str, Segment]],
    sources: Mapping[str, int],
    chunk_size: int,
    on_bytes: Callable[[int], None] | None,
) -> str:
    """Write output ``name`` front to back from held sources; return its sha256.

    ``pieces`` are ``(src, segment)``; the runs of the segments, expanded one at a time in output
    order, must tile ``[0, size)`` exactly together with the header.  The output is assembled in
    page-aligned windows of about ``chunk_size`` bytes: the header, then every placed range read
    with ``preadv`` straight into its place.  Each full window is hashed on one thread and written
    (:class:`_Sink`) on another while this thread fills the next, through a ring of :data:`_RING`
    windows.  A piece with ``conv`` (a cast the user asked for) is read in whole elements, converted
    (:func:`~ckptgate.consolidate.cast.convert`) and taken like the header.
    """
    window = max(_ALIGN, chunk_size - chunk_size % _ALIGN)
    ring = [mmap.mmap(-1, window) for _ in range(_RING)]  # anonymous maps: page-aligned, as O_DIRECT needs
    views = [memoryview(m) for m in ring]
    pending: list[tuple[Future[None], ...]] = [()] * _RING
    h = hashlib.sha256()
    sink = _Sink(fd)
    k = fill = base = 0  # window k holds the output bytes [base, base + fill)
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptgate-hash") as hasher,  # FIFO: in order
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptgate-write") as writer,
    ):

        def ship() -> None:
            nonlocal k, fill, base
            view = views[k][:fill]
            pending[k] = (hasher.submit(h.update, view), writer.submit(sink.write, view, base))
            k, base, fill = (k + 1) % _RING, base + fill, 0
            for f in pending[k]:  # the next window is free once it is hashed and written
                f.result()

        def take(src: str, sfd: int | None, src_off: int, length: int, mem: bytes = head) -> None:
            nonlocal fill
            while length:
                n = min(window - fill, length)
                if sfd is None:
                    views[k][fill : fill + n] = mem[src_off : src_off + n]
                else:
                    n = os.preadv(sfd, [views[k][fill : fill + n]], src_off)
                    if n <= 0:
                        raise RuntimeFailure(
                            "runtime.copy.short_read",
                            f"{src}: the source ended early at byte {src_off}",
                            evidence={"source": src, "offset": src_off},
                        )
                    if on_bytes:
                        on_bytes(n)
                fill, src_off, length = fill + n, src_off + n, length - n
                if fill == window:
                    ship()

        def take_converted(src: str, sfd: int, src_off: int, length: int, conv: tuple[str, str]) -> int:
            """Read whole elements into ``scratch``, convert them and take the result; return its size."""
            out_len = 0
            while length:
                n = min(len(scratch), length)
                got = os.preadv(sfd, [scratch[:n]], src_off)
                if got != n:
                    raise RuntimeFailure(
                        "runtime.copy.short_read",
                        f"{src}: the source ended early at byte {src_off + max(got, 0)}",
                        evidence={"source": src, "offset": src_off},
                    )
                out = convert(scratch[:n], *conv)
                take(src, None, 0, len(out), out)
                if on_bytes:
                    on_bytes(len(out))  # progress counts output bytes, as the plan's total does
                out_len, src_off, length = out_len + len(out), src_off + n, length - n
            return out_len

        # a multiple of 8: whole elements
        scratch = memoryview(bytearray(window if any(g.conv for _, g in pieces) else 0))
        take(name, None, 0, len(head))
        pos = len(head)
        for src, run in _runs_in_output_order(pieces):
            out_off, src_off, length, conv = run.out_offset, run.src_offset, run.length, run.conv
            if out_off != pos:
                raise RuntimeFailure(
                    "runtime.copy.not_tiled",
                    f"{name}: the plan leaves a gap or an overlap at byte {min(pos, out_off)}",
                    evidence={"output": name, "at": pos, "next": out_off},
                )
            if conv is None:
                take(src, sources[src], src_off, length)
                pos += length
            else:
                pos += take_converted(src, sources[src], src_off, length, conv)
        if fill:
            ship()
        for fs in pending:
            for f in fs:
                f.result()
    if pos != size:
        raise RuntimeFailure(
            "runtime.copy.not_tiled",
            f"{name}: the plan covers {pos} of {size} bytes",
            evidence={"output": name, "covered": pos, "size": size},
        )
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
        _pwrite_all(fd, raw, 0)
    finally:
        os.close(fd)
    return WrittenFile(filename=INDEX_NAME, size=len(raw), sha256=hashlib.sha256(raw).hexdigest())


def write_plan(
    plan: ConsolidationPlan,
    out_dir: int | Path,
    sources: Mapping[str, int],
    *,
    expected: Mapping[str, str] | None,
    chunk_size: int = DEFAULT_CHUNK,
    threads: int = 2,
    on_bytes: Callable[[int], None] | None = None,
) -> tuple[WrittenFile, ...]:
    """Write every shard, copied file and the index into ``out_dir`` (which must be empty).

    :param out_dir: a directory descriptor (an intake passes its staging directory's,
        :class:`ckptgate.publish.Stage`), or a path, opened once as one.  Every output is created
        relative to that descriptor, by its plain name, never by a path.
    :param sources: source relpath -> an fd opened beneath the checkpoint root.
    :param expected: source relpath -> the sha256 recorded in the fixture manifest; every source
        the plan reads must have one, and must still have it when its single pass ends.  ``None``
        only when the caller holds every source unchanged and checks that after this returns
        (:meth:`ckptgate.inspect.SafeTree.intact`).
    """
    missing = sorted(set(plan.source_paths) - set(sources))
    if expected is not None:
        missing += sorted(set(plan.source_paths) - set(expected))
    if missing:
        raise RuntimeFailure(
            "runtime.copy.source_missing", f"no open, measured source for {missing[0]!r}", evidence={"missing": missing}
        )
    if isinstance(out_dir, int):
        return _write_plan(
            plan, out_dir, sources, expected=expected, chunk_size=chunk_size, threads=threads, on_bytes=on_bytes
        )
    out_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return _write_plan(
            plan, out_fd, sources, expected=expected, chunk_size=chunk_size, threads=threads, on_bytes=on_bytes
        )
    finally:
        os.close(out_fd)


def _write_plan(
    plan: ConsolidationPlan,
    out_fd: int,
    sources: Mapping[str, int],
    *,
    expected: Mapping[str, str] | None,
    chunk_size: int,
    threads: int,
    on_bytes: Callable[[int], None] | None,
) -> tuple[WrittenFile, ...]:
    opened: dict[str, int] = {}
    try:
        segments, sizes, heads = lay_out(plan, out_fd, opened, write_heads=expected is not None)
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            if expected is None:
                pieces: dict[int, list[tuple[str, Segment]]] = {fd: [] for fd in opened.values()}
                for src, segs in segments.items():
                    for g in segs:
                        pieces[g.out_fd].append((src, g))
                futures = {
                    name: pool.submit(
                        _copy_in_order,
                        name,
                        fd,
                        sizes[name],
                        heads.get(name, b""),
                        pieces[fd],
                        sources,
                        chunk_size,
                        on_bytes,
                    )
                    for name, fd in opened.items()
                }
                digests = {name: f.result() for name, f in futures.items()}
            else:
                for f in [
                    pool.submit(_scatter_source, src, sources[src], segs, expected[src], chunk_size, on_bytes)
                    for src, segs in sorted(segments.items())
                ]:
                    f.result()
                hashed = pool.map(lambda fd: _hash_file(fd, chunk_size), opened.values())
                digests = dict(zip(opened, hashed, strict=True))
    finally:
        for fd in opened.values():
            os.close(fd)
    written = [WrittenFile(filename=name, size=sizes[name], sha256=digests[name]) for name in opened]
    index = write_index(plan, out_fd)
    return tuple(written) if index is None else (*written, index)
