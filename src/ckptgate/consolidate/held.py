"""The writer's held mode: each output assembled front to back from sources the caller holds
(read leases) or checks chunk by chunk against the chunk manifest (a rank of a group).

Page-aligned windows, a ring of :data:`RING` per output: the header, then every placed range
read from its source with ``preadv`` straight into place; each full window is hashed and
written (``O_DIRECT`` where the file system takes it) while the next one is filled
(:mod:`ckptgate.consolidate.writer` describes both modes).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ckptgate.consolidate import diskwrite as disk
from ckptgate.consolidate.cast import convert
from ckptgate.consolidate.chunks import Read
from ckptgate.consolidate.segments import Segment, runs_in_output_order
from ckptgate.errors import RuntimeFailure

__all__ = ["RING", "CopyCancelled", "copy_in_order"]

RING = 4  # windows per output in held mode: one being filled, the others being hashed and written
_ALIGN = 4096  # O_DIRECT: buffer address, file offset and length in whole blocks


class CopyCancelled(Exception):
    """The caller cancelled the copy (its ``cancel`` event was set): the output is incomplete."""


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
                disk.pwrite_all(self.fd, data[:n], offset)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this file system's direct I/O wants other alignment
                    raise
                n = 0
        if n < len(data):
            if self.direct:  # the unaligned tail, or the rest after EINVAL: buffered from here on
                _set_direct(self.fd, False)
                self.direct = False
            disk.write_back(self.fd, data[n:], offset + n)


def _set_direct(fd: int, on: bool) -> bool:
    """Turn ``O_DIRECT`` on or off for ``fd``; whether that worked."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
    except OSError:
        return False
    return True


def copy_in_order(
    name: str,
    fd: int,
    size: int,
    head: bytes,
    pieces: list[tuple[str, Segment]],
    read: Read,
    chunk_size: int,
    on_bytes: Callable[[int], None] | None,
    cancel: threading.Event | None = None,
) -> str:
    """Write output ``name`` front to back from its sources, each read with ``read`` (held ones
    directly, or checked against the chunk manifest: :mod:`~ckptgate.consolidate.chunks`); return
    its sha256.

    ``pieces`` are ``(src, segment)``; the runs of the segments, expanded one at a time in output
    order, must tile ``[0, size)`` exactly together with the header.  The output is assembled in
    page-aligned windows of about ``chunk_size`` bytes: the header, then every placed range read
    with ``preadv`` straight into its place.  Each full window is hashed on one thread and written
    (:class:`_Sink`) on another while this thread fills the next, through a ring of :data:`RING`
    windows.  A piece with ``conv`` (a cast the user asked for) is read in whole elements, converted
    (:func:`~ckptgate.consolidate.cast.convert`) and taken like the header.  Setting ``cancel``
    stops the copy at its next window (:class:`CopyCancelled`).
    """
    window = max(_ALIGN, chunk_size - chunk_size % _ALIGN)
    ring = [mmap.mmap(-1, window) for _ in range(RING)]  # anonymous maps: page-aligned, as O_DIRECT needs
    views = [memoryview(m) for m in ring]
    pending: list[tuple[Future[None], ...]] = [()] * RING
    h = hashlib.sha256()
    sink = _Sink(fd)
    k = fill = base = 0  # window k holds the output bytes [base, base + fill)
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptgate-hash") as hasher,  # FIFO: in order
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptgate-write") as writer,
    ):

        def ship() -> None:
            nonlocal k, fill, base
            if cancel is not None and cancel.is_set():
                raise CopyCancelled(name)
            view = views[k][:fill]
            pending[k] = (hasher.submit(h.update, view), writer.submit(sink.write, view, base))
            k, base, fill = (k + 1) % RING, base + fill, 0
            for f in pending[k]:  # the next window is free once it is hashed and written
                f.result()

        def take(src: str, from_src: bool, src_off: int, length: int, mem: bytes = head) -> None:
            nonlocal fill
            while length:
                n = min(window - fill, length)
                if not from_src:
                    views[k][fill : fill + n] = mem[src_off : src_off + n]
                else:
                    read(src, views[k][fill : fill + n], src_off)
                    if on_bytes:
                        on_bytes(n)
                fill, src_off, length = fill + n, src_off + n, length - n
                if fill == window:
                    ship()

        def take_converted(src: str, src_off: int, length: int, conv: tuple[str, str]) -> int:
            """Read whole elements into ``scratch``, convert them and take the result; return its size."""
            out_len = 0
            while length:
                n = min(len(scratch), length)
                read(src, scratch[:n], src_off)
                out = convert(scratch[:n], *conv)
                take(src, False, 0, len(out), out)
                if on_bytes:
                    on_bytes(len(out))  # progress counts output bytes, as the plan's total does
                out_len, src_off, length = out_len + len(out), src_off + n, length - n
            return out_len

        # a multiple of 8: whole elements
        scratch = memoryview(bytearray(window if any(g.conv for _, g in pieces) else 0))
        take(name, False, 0, len(head))
        pos = len(head)
        for src, run in runs_in_output_order(pieces):
            out_off, src_off, length, conv = run.out_offset, run.src_offset, run.length, run.conv
            if out_off != pos:
                raise RuntimeFailure(
                    "runtime.copy.not_tiled",
                    f"{name}: the plan leaves a gap or an overlap at byte {min(pos, out_off)}",
                    evidence={"output": name, "at": pos, "next": out_off},
                )
            if conv is None:
                take(src, True, src_off, length)
                pos += length
            else:
                pos += take_converted(src, src_off, length, conv)
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
