"""Reads that inspection may decide on: every byte is bound to the bytes the digest hashes.

Inspection never reads a checkpoint file through a bare descriptor.  It reads through a
:class:`HashedFile`, which reads whole aligned chunks of :data:`LEDGER_CHUNK` bytes and records
the sha256 of each chunk it read in the file's :class:`ReadLedger`.  The fixture digest
(:func:`ckptgate.digest.fixture_digest`) then seals every ledger before it hashes that file, and
checks each recorded chunk against the bytes of its own single pass
(:meth:`ReadLedger.checker`).  So a header, a pickle, a ``.metadata`` or an index JSON that
inspection parsed is, chunk by chunk, the very bytes that went into the fixture digest, whether
or not the kernel granted a read lease: a file rewritten in place between inspection and the
digest (same inode, same size) is ``input.walk.changed``, never a layout read from one file and a
digest of another.

Two reads of one chunk inside inspection must agree too (each is hashed and compared), and a
read of a chunk the digest did not see, after the ledger was sealed, is a bug that fails closed
(``internal.read_after_digest``).  Bulk reads that can only add findings and decide no output
(the CRC-32 pass of ``ckptgate inspect``, which has no digest after it) use
:meth:`HashedFile.read_unrecorded`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from ckptgate.errors import Error, InputRejected

__all__ = ["LEDGER_CHUNK", "HashedFile", "ReadLedger"]

#: 64 KiB: small enough that a header read costs little beyond its own bytes, large enough that
#: the ledger of a header-heavy file stays small (32 bytes of digest per chunk read).
LEDGER_CHUNK = 64 << 10
_CACHE = 8  # chunks kept per open file, so neighbouring small reads (zip headers) hash each chunk once


class _ReadAfterDigest(Error):
    """Inspection read bytes the digest had already passed: an ordering bug, never allowed."""


def changed(path: str, **evidence: object) -> InputRejected:
    return InputRejected(
        "input.walk.changed",
        f"{path!r} changed while it was taken in: the bytes inspected are not the bytes hashed",
        evidence={"path": path, **evidence},
        advice=f"{path} changed while it was taken in: copy the checkpoint to a directory that nothing else "
        "writes to (`cp -a SRC COPY`), and take that copy in.",
    )


class ReadLedger:
    """The sha256 of every :data:`LEDGER_CHUNK`-aligned chunk of one file that inspection read."""

    __slots__ = ("_chunks", "_lock", "_sealed", "path", "size")

    def __init__(self, path: str, size: int) -> None:
        self.path, self.size = path, size
        self._chunks: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._sealed = False

    def record(self, index: int, digest: bytes) -> None:
        """Record (or, for a chunk read before, compare) the digest of chunk ``index``."""
        with self._lock:
            known = self._chunks.get(index)
            if known is None:
                if self._sealed:
                    raise _ReadAfterDigest(
                        "internal.read_after_digest",
                        f"{self.path!r}: inspection read chunk {index} after the digest had "
                        "hashed the file; refusing to decide on bytes that were not hashed",
                        evidence={"path": self.path, "chunk": index},
                    )
                self._chunks[index] = digest
            elif known != digest:
                raise changed(self.path, chunk=index, offset=index * LEDGER_CHUNK)

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    def recorded(self) -> dict[int, bytes]:
        """A copy of what was recorded: chunk index -> sha256 (to check it elsewhere, as another
        rank of a distributed intake does in its own digest pass)."""
        with self._lock:
            return dict(self._chunks)

    def checker(self) -> Callable[[int, memoryview], None] | None:
        """Seal the ledger and return a callable for the digest's pass over this file.

        The digest hands it every chunk it reads, ``(offset, bytes)``, in order from the first
        byte to the last; it raises ``input.walk.changed`` at the first recorded chunk whose bytes
        differ.  ``None`` when inspection read nothing of this file.
        """
        with self._lock:
            self._sealed = True
            want = sorted(self._chunks.items())
        if not want:
            return None
        return _Check(self.path, self.size, want)


class _Check:
    """Compares the recorded chunks with a stream of ``(offset, bytes)`` read in order."""

    __slots__ = ("_h", "_k", "_path", "_size", "_want")

    def __init__(self, path: str, size: int, want: list[tuple[int, bytes]]) -> None:
        self._path, self._size, self._want = path, size, want
        self._k = 0
        self._h: hashlib._Hash | None = None  # the hashlib type

    def __call__(self, offset: int, view: memoryview) -> None:
        end = offset + len(view)
        while self._k < len(self._want):
            index, digest = self._want[self._k]
            lo_c, hi_c = index * LEDGER_CHUNK, min(self._size, (index + 1) * LEDGER_CHUNK)
            if lo_c >= end:
                return
            lo, hi = max(lo_c, offset), min(hi_c, end)
            if self._h is None:
                self._h = hashlib.sha256()
            if lo < hi:
                self._h.update(view[lo - offset : hi - offset])
            if hi < hi_c:
                return  # the chunk continues in the next piece
            if self._h.digest() != digest:
                raise changed(self._path, chunk=index, offset=lo_c)
            self._h = None
            self._k += 1


class HashedFile:
    """A walked file opened for inspection: ``pread`` reads are chunk-hashed into its ledger.

    Close it (or use ``with``); the descriptor never leaves this object.
    """

    __slots__ = ("_cache", "_fd", "_ledger", "path", "size")

    def __init__(self, fd: int, ledger: ReadLedger) -> None:
        self._fd: int | None = fd
        self._ledger = ledger
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self.path, self.size = ledger.path, ledger.size

    @classmethod
    def over(cls, fd: int, path: str = "<fd>") -> HashedFile:
        """A reader of the file open on ``fd`` (duplicated; the caller keeps and closes ``fd``) with
        a ledger of its own: for reading a file outside a walked tree, where no digest follows."""
        return cls(os.dup(fd), ReadLedger(path, os.fstat(fd).st_size))

    def pread(self, n: int, offset: int) -> bytes:
        """Up to ``n`` bytes at ``offset`` (fewer only at the end of the file), every one of them
        recorded in the ledger."""
        if n <= 0 or offset < 0 or offset >= self.size:
            return b""
        end = min(self.size, offset + n)
        first, last = offset // LEDGER_CHUNK, (end - 1) // LEDGER_CHUNK
        lo = offset - first * LEDGER_CHUNK
        if first == last:
            return self._chunk(first)[lo : lo + end - offset]
        data = b"".join(self._chunk(i) for i in range(first, last + 1))
        return data[lo : lo + end - offset]

    def read_unrecorded(self, view: memoryview, offset: int) -> int:
        """``preadv`` into ``view`` without recording: only for checks that can add findings and
        decide no output (see the module docstring)."""
        return os.preadv(self._open_fd(), [view], offset)

    def _chunk(self, index: int) -> bytes:
        hit = self._cache.get(index)
        if hit is not None:
            self._cache.move_to_end(index)
            return hit
        start = index * LEDGER_CHUNK
        want = min(LEDGER_CHUNK, self.size - start)
        fd = self._open_fd()
        parts, got = [], 0
        while got < want:
            b = os.pread(fd, want - got, start + got)
            if not b:
                raise changed(self.path, offset=start + got, reason="shorter than when it was walked")
            parts.append(b)
            got += len(b)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self._ledger.record(index, hashlib.sha256(data).digest())
        self._cache[index] = data
        if len(self._cache) > _CACHE:
            self._cache.popitem(last=False)
        return data

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path!r} is closed")
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._cache.clear()

    def __enter__(self) -> HashedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
