"""CRC-32 checks of a zip's entries: immediate (:func:`verify_crcs`) or left to a streaming reader.

Each entry's CRC-32 is streamed with ISA-L's CRC-32 through ``isal``: the same checksum as
``zlib.crc32``, several times faster, which matters because it covers every stored tensor byte.
Deflated entries are inflated on the way, within their declared size.  Entries come from
:func:`~ckptgate.inspect.zipcheck.check_zip`, whose structure checks run first.

The CRC pass is the only part of the zip check that reads every byte.  :class:`DeferredCrcs` lets
another reader that streams every file once anyway (the fixture digest) compute it from the same
bytes, so an intake reads its input one time fewer; its findings are the same as the immediate pass's.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable

from isal.isal_zlib import crc32

from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.zipview import _Z, ZipEntry, _Fail

__all__ = ["CrcMode", "DeferredCrcs", "verify_crcs"]

_CHUNK = 1 << 20
_STORED_CHUNK = 8 << 20


def _crc(z: _Z, e: ZipEntry) -> None:
    crc = 0
    left = e.compressed_size
    pos = e.data_offset
    if e.method == 0:  # stored: every tensor byte of a torch zip; one reused buffer, no copies
        if pos < 0 or pos + left > z.size:
            z.fail("zip.truncated", "a structure points beyond the end of the zip", offset=pos, length=left)
        buf = memoryview(bytearray(min(_STORED_CHUNK, left)))
        while left:
            n = z.src.read_unrecorded(buf[: min(len(buf), left)], z.base + pos)  # CRC only: adds findings
            if n <= 0:
                z.fail("zip.truncated", "short read", offset=pos, length=left)
            crc = crc32(buf[:n], crc)
            pos += n
            left -= n
    else:
        d = zlib.decompressobj(-15)
        out = 0
        while left:
            b = z.read(pos, min(_CHUNK, left))
            pos += len(b)
            left -= len(b)
            while b:
                chunk = d.decompress(b, _CHUNK)
                out += len(chunk)
                if out > e.size:
                    z.fail("zip.size_mismatch", "entry inflates beyond its declared size", name=e.name)
                crc = crc32(chunk, crc)
                b = d.unconsumed_tail
        out += len(d.flush())
        if out != e.size:
            z.fail("zip.size_mismatch", "entry inflates to a size other than declared", name=e.name)
    if crc != e.crc:
        z.err("zip.bad_crc", "CRC-32 of the entry does not match", name=e.name, expected=e.crc, actual=crc)


def verify_crcs(
    src: HashedFile, size: int, entries: tuple[ZipEntry, ...], *, path: str, base: int = 0
) -> tuple[Finding, ...]:
    """Stream the CRC-32 of already checked entries (run after the cheap structural checks)."""
    z = _Z(src, base, size, path)
    try:
        for e in entries:
            _crc(z, e)
    except _Fail:
        pass
    return tuple(z.findings)


class DeferredCrcs:
    """CRC-32 checks of stored zip entries, left to a reader that streams each file once, in order.

    Inspection adds (:meth:`add`) the entries of every torch zip it would otherwise CRC; the reader
    asks :meth:`reader` for a per-file callable and feeds it every chunk of that file, in order
    (the fixture digest does, from the same descriptors it hashes).  :meth:`findings` then gives
    what the immediate pass would have: ``zip.bad_crc``, plus ``zip.truncated`` for an entry the
    reader never reached and ``zip.crc_not_checked`` for a file it never streamed, so a check that
    was skipped is never read as one that passed.  Safe to use from several threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[str, list[tuple[int, ZipEntry]]] = {}
        self._files: dict[str, _StreamedCrcs] = {}

    def add(self, path: str, base: int, entries: tuple[ZipEntry, ...]) -> None:
        """Entries of the zip at offset ``base`` of ``path`` (stored entries only)."""
        if any(e.method != 0 for e in entries):
            raise ValueError("only stored entries can be checked from streamed bytes")
        with self._lock:
            self._spans.setdefault(path, []).extend((base + e.data_offset, e) for e in entries)

    def reader(self, path: str) -> Callable[[int, memoryview], None] | None:
        """The callable that takes ``(offset, chunk)`` of ``path`` in order; ``None`` if it has no entries."""
        with self._lock:
            spans = self._spans.get(path)
            if not spans:
                return None
            f = self._files[path] = _StreamedCrcs(path, spans)
        return f.update

    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        with self._lock:
            for path in sorted(self._spans):
                f = self._files.get(path)
                if f is None:
                    out.append(
                        error("zip.crc_not_checked", path, "the CRC-32 of this file's zip entries was never computed")
                    )
                else:
                    out.extend(f.findings())
        return out


#: ``True``: CRC every entry now; ``False``: do not; :class:`DeferredCrcs`: leave stored entries to it.
CrcMode = bool | DeferredCrcs


class _StreamedCrcs:
    def __init__(self, path: str, spans: list[tuple[int, ZipEntry]]) -> None:
        self.path = path
        self.spans = sorted(spans, key=lambda s: s[0])
        self.crcs = [0] * len(self.spans)
        self.pos = 0
        self.next = 0
        self.active: list[int] = []
        self.out_of_order = False

    def update(self, offset: int, chunk: memoryview) -> None:
        if offset != self.pos:
            self.out_of_order = True
            return
        end = offset + len(chunk)
        while self.next < len(self.spans) and self.spans[self.next][0] < end:
            self.active.append(self.next)
            self.next += 1
        for i in self.active:
            start, e = self.spans[i]
            lo, hi = max(offset, start), min(end, start + e.compressed_size)
            if lo < hi:
                self.crcs[i] = crc32(chunk[lo - offset : hi - offset], self.crcs[i])
        self.active = [i for i in self.active if self.spans[i][0] + self.spans[i][1].compressed_size > end]
        self.pos = end

    def findings(self) -> list[Finding]:
        if self.out_of_order:
            return [
                error(
                    "zip.crc_not_checked", self.path, "the file was not streamed in order; its CRC-32 cannot be trusted"
                )
            ]
        out = []
        for (start, e), crc in zip(self.spans, self.crcs, strict=True):
            if self.pos < start + e.compressed_size:
                out.append(
                    error(
                        "zip.truncated",
                        self.path,
                        "the file ended before this entry's data did",
                        name=e.name,
                        offset=start,
                        length=e.compressed_size,
                    )
                )
            elif crc != e.crc:
                out.append(
                    error(
                        "zip.bad_crc",
                        self.path,
                        "CRC-32 of the entry does not match",
                        name=e.name,
                        expected=e.crc,
                        actual=crc,
                    )
                )
        return out
