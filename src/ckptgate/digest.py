"""The fixture digest: sha256 over a canonical manifest of (path, size, sha256) of every file.

Files are hashed from the descriptors :class:`~ckptgate.inspect.walk.SafeTree` opens, so what is
hashed is what is read, and the same pass checks that every chunk inspection decided on is a
chunk of these bytes (:mod:`ckptgate.inspect.hashed`).  Hashing runs in a thread pool across files
(``hashlib`` and ``preadv`` release the GIL), largest files first, each worker reusing one buffer:
memory stays bounded by ``workers x buffer``.  One file's sha256 is sequential by definition, so a single huge file is
hashed by one core while the others take the rest.

The digest is ``"sha256:" + sha256(canonical)`` where ``canonical`` is the UTF-8 JSON, with sorted
keys and no spaces, of ``{"algorithm": "sha256", "files": [{"path", "sha256", "size"}, ...]}`` with
files sorted by path.  A checksum is integrity, never trust on its own [R27-R29].

A digest is a :class:`Digest` value from here to the receipt: parsed once, strictly, at the edge
where a string comes in (:meth:`Digest.parse`, :meth:`Digest.from_hex`, :meth:`Digest.from_filename_stem`,
:meth:`Digest.from_user` for what a person types), and written in each wire form only through its
named methods (:meth:`Digest.prefixed`, :attr:`Digest.hex`, :meth:`Digest.filename_stem`,
:meth:`Digest.dsse_subject`).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from ckptgate import interrupts
from ckptgate.digestvalue import _HEX, ALGORITHM, Digest, MalformedDigest
from ckptgate.errors import InputRejected
from ckptgate.inspect._threads import usable_cores
from ckptgate.inspect.walk import SafeTree

__all__ = [
    "YIELD_NICENESS",
    "Digest",
    "DigestCancelled",
    "FixtureDigest",
    "MalformedDigest",
    "ManifestEntry",
    "canonical_manifest",
    "fixture_digest",
    "hash_files",
    "in_turn",
]

DEFAULT_BUFFER = 4 << 20
#: How much nicer a yielding digest's threads run (:func:`hash_files`): at 5, the kernel gives a
#: thread at the caller's niceness about three times their share of a contended core.
YIELD_NICENESS = 5


class DigestCancelled(Exception):
    """The caller cancelled the digest (its ``cancel`` event was set); nothing was returned."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if not self.path or self.path.startswith("/") or ".." in self.path.split("/"):
            raise ValueError(f"bad manifest path {self.path!r}")
        if self.size < 0 or not _HEX.match(self.sha256):
            raise ValueError("bad manifest entry")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True, slots=True, kw_only=True)
class FixtureDigest:
    algorithm: str
    digest: Digest
    manifest: tuple[ManifestEntry, ...]

    def __post_init__(self) -> None:
        if self.algorithm != ALGORITHM:
            raise ValueError("only sha256 is supported")
        if not isinstance(self.digest, Digest):
            raise TypeError("digest must be a Digest")
        if list(self.manifest) != sorted(self.manifest, key=lambda e: e.path):
            raise ValueError("manifest must be sorted by path")
        if self.digest.hex != hashlib.sha256(canonical_manifest(self.manifest)).hexdigest():
            raise ValueError("digest does not match the manifest")

    @property
    def file_count(self) -> int:
        return len(self.manifest)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.manifest)

    def file_hashes(self) -> dict[str, str]:
        """relpath -> sha256 of every file in the manifest."""
        return {e.path: e.sha256 for e in self.manifest}

    def to_facts(self) -> dict[str, Any]:
        """The ``fixture`` object of the OPA input."""
        return {
            "digest": self.digest.prefixed(),
            "algorithm": self.algorithm,
            "file_count": self.file_count,
            "total_bytes": self.total_bytes,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self.to_facts(), "manifest": [e.to_json() for e in self.manifest]}

    @classmethod
    def from_manifest(cls, manifest: list[ManifestEntry] | tuple[ManifestEntry, ...]) -> FixtureDigest:
        m = tuple(sorted(manifest, key=lambda e: e.path))
        return cls(
            algorithm=ALGORITHM, digest=Digest.from_hex(hashlib.sha256(canonical_manifest(m)).hexdigest()), manifest=m
        )


def canonical_manifest(manifest: tuple[ManifestEntry, ...] | list[ManifestEntry]) -> bytes:
    doc = {"algorithm": "sha256", "files": [e.to_json() for e in sorted(manifest, key=lambda e: e.path)]}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _hash_fd(
    fd: int,
    size: int,
    bufs: tuple[memoryview, ...],
    progress: Callable[[int], None] | None,
    also: Callable[[int, memoryview], None] | None,
    apart: tuple[Callable[[int, memoryview], None], ThreadPoolExecutor] | None,
    abandon: threading.Event | None,
    cancel: threading.Event | None,
) -> str:
    """The sha256 of ``size`` bytes of ``fd``, read into ``bufs`` in turn.  ``also`` sees every
    chunk on this thread; ``apart`` = ``(check, companion)`` sees it on the companion's thread,
    while this thread reads and hashes the next chunk into the other buffer (each buffer is
    reused only once the companion is done with it, and every hand-off is waited for before
    this returns or raises)."""
    h = hashlib.sha256()
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except OSError:  # pragma: no cover - advisory only
        pass
    handed: collections.deque[Future[None]] = collections.deque()
    off, turn = 0, 0
    try:
        while off < size:
            if cancel is not None and cancel.is_set():
                raise DigestCancelled
            if abandon is not None and abandon.is_set():
                raise _Abandoned
            if len(handed) == len(bufs):  # the companion still holds the buffer read next
                interrupts.result(handed[0])  # popped once done: an abort in the wait still waits for it below
                handed.popleft()
            buf = bufs[turn % len(bufs)]
            turn += 1
            n = os.preadv(fd, [buf[: min(len(buf), size - off)]], off)
            if n <= 0:
                break
            h.update(buf[:n])
            if also is not None:
                also(off, buf[:n])
            if apart is not None:
                handed.append(apart[1].submit(apart[0], off, buf[:n]))
            off += n
            if progress is not None:
                progress(n)
        while handed:
            interrupts.result(handed[0])
            handed.popleft()
    finally:
        for f in handed:  # on an error: nothing may still read a buffer once this returns
            f.cancel()
        wait(handed)
    extra = os.pread(fd, 1, off)
    if off != size or extra:
        raise InputRejected(
            "input.walk.changed", "a file changed size while it was hashed", evidence={"read": off, "expected": size}
        )
    return h.hexdigest()


class _Abandoned(Exception):
    """Another file of the same :func:`hash_files` failed: this one stops at its next chunk, and
    the caller gets that failure, never this."""


def _yield_cpu() -> None:
    """Make the calling (pool) thread :data:`YIELD_NICENESS` nicer; Linux keeps niceness per thread
    (elsewhere ``PRIO_PROCESS`` takes a process id, never a thread's: nothing is changed there).
    Advisory: where a sandbox refuses, the thread keeps its priority."""
    if sys.platform != "linux":  # pragma: no cover - the project's platform is Linux
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + YIELD_NICENESS))
    except (OSError, AttributeError):  # pragma: no cover - advisory only
        pass


def in_turn(checks: list[Callable[[int, memoryview], None]]) -> Callable[[int, memoryview], None] | None:
    """One callable that hands each ``(offset, chunk)`` to every one of ``checks`` in turn
    (``None`` for none, the check itself for one)."""
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]

    def both(offset: int, view: memoryview) -> None:
        for c in checks:
            c(offset, view)

    return both


def fixture_digest(
    tree: SafeTree,
    *,
    workers: int | None = None,
    buffer_size: int = DEFAULT_BUFFER,
    progress: Callable[[int], None] | None = None,
    also: Callable[[str], Callable[[int, memoryview], None] | None] | None = None,
    apart: Callable[[str], Callable[[int, memoryview], None] | None] | None = None,
    cancel: threading.Event | None = None,
) -> FixtureDigest:
    """Hash every walked file of ``tree`` and return the fixture digest.

    ``progress`` (thread-safe calls) receives byte counts as they are hashed.  ``also(path)`` may
    return a callable that is handed every chunk of that file as well, ``(offset, bytes)`` in
    order, on the thread hashing it: another check of the same bytes without another read.
    ``apart(path)`` is the same, on a companion thread (the deferred CRC pass,
    :class:`ckptgate.inspect.DeferredCrcs`: :func:`hash_files` says why).  Setting ``cancel``
    stops every thread at its next chunk and raises :class:`DigestCancelled`.

    Every byte inspection read through the tree (:meth:`~ckptgate.inspect.SafeTree.reader`) is
    checked against this pass, chunk by chunk: the bytes that decided the layout are the bytes
    hashed into the digest, or the file is ``input.walk.changed`` (:mod:`ckptgate.inspect.hashed`).
    """
    return FixtureDigest.from_manifest(
        hash_files(
            tree,
            [e.path for e in tree.entries],
            workers=workers,
            buffer_size=buffer_size,
            progress=progress,
            also=also,
            apart=apart,
            cancel=cancel,
        )
    )


def hash_files(
    tree: SafeTree,
    paths: list[str],
    *,
    workers: int | None = None,
    buffer_size: int = DEFAULT_BUFFER,
    progress: Callable[[int], None] | None = None,
    also: Callable[[str], Callable[[int, memoryview], None] | None] | None = None,
    apart: Callable[[str], Callable[[int, memoryview], None] | None] | None = None,
    cancel: threading.Event | None = None,
    yielding: bool = False,
) -> list[ManifestEntry]:
    """The manifest entries of the walked files ``paths`` of ``tree``, as :func:`fixture_digest`
    hashes them (each file's read ledger sealed and checked in the same pass): the per-file part
    of the digest, for a caller that hashes a share of the files (one rank of a distributed intake).

    ``apart(path)``, like ``also``, may return a check handed every chunk of that file in order,
    but on a companion thread of the hashing thread, never on the thread that computes the
    sha256: the deferred CRC-32 pass (:class:`ckptgate.inspect.DeferredCrcs`).  ISA-L's AVX-512
    CRC-32 returns without ``vzeroupper`` (``crc/crc32_gzip_refl_by16_10.asm``), and OpenSSL's
    SHA-NI sha256 on the same thread was then about a third slower (issue #36: 0.45 CPU-seconds
    per 2 GiB; docs/benchmarks.md).  A worker that has such a check fills two buffers in turn,
    so the check of one chunk goes on while the next is hashed.

    A failure in one file (a changed file, a check that raises, a cancel) stops the other files
    at their next chunk, and that first failure is what is raised.

    ``yielding``: the hashing threads (and their companions) run :data:`YIELD_NICENESS` nicer
    than the caller's other threads (their own threads, never the caller's), for a caller whose
    copy runs beside the digest.  That copy is one serial chain per output (read, hash, write at
    the disk's pace); the digest is parallel across files.  Where they share too few cores, the
    scheduler otherwise splits the cores evenly between the threads, the copy falls behind and
    finishes alone after the digest (issue #36: 0.4-0.8 s of a 2 GiB intake on 2 cores, one
    core idle)."""
    if buffer_size < 4096:
        raise ValueError("buffer_size must be at least 4096")
    n_workers = max(1, min(workers or usable_cores(), max(1, len(paths))))
    local = threading.local()
    lock = threading.Lock()
    companions: list[ThreadPoolExecutor] = []
    failed: list[str] = []  # the files that failed, first first: the others stop at their next chunk
    abandon = threading.Event()

    def tick(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    def buffers(two: bool) -> tuple[memoryview, ...]:
        bufs: tuple[memoryview, ...] | None = getattr(local, "bufs", None)
        if bufs is None:
            bufs = local.bufs = (memoryview(bytearray(buffer_size)),)
            if yielding:
                _yield_cpu()
        if two and len(bufs) == 1:
            bufs = local.bufs = (*bufs, memoryview(bytearray(buffer_size)))
        return bufs

    def companion() -> ThreadPoolExecutor:
        ex: ThreadPoolExecutor | None = getattr(local, "companion", None)
        if ex is None:
            # started from this (already yielding) thread, whose niceness Linux gives the new thread
            ex = local.companion = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptgate-apart")
            with lock:
                companions.append(ex)
        return ex

    def one(path: str) -> ManifestEntry:
        try:
            return hash_one(path)
        except _Abandoned:
            raise
        except BaseException:
            with lock:
                failed.append(path)
            abandon.set()
            raise

    def hash_one(path: str) -> ManifestEntry:
        entry = tree.entry(path)
        assert entry is not None
        checks = [c for c in (checkers[path], also(path) if also else None) if c is not None]
        aside = apart(path) if apart else None
        bufs = buffers(aside is not None)
        fd = tree.open_file(path)
        try:
            before = os.fstat(fd)
            digest = _hash_fd(
                fd,
                entry.size,
                bufs,
                tick if progress else None,
                in_turn(checks),
                (aside, companion()) if aside is not None else None,
                abandon,
                cancel,
            )
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if (before.st_mtime_ns, before.st_size) != (after.st_mtime_ns, after.st_size):
            # written in place while it was read (a preallocated file still being filled keeps its size):
            # the digest would be of bytes that were never on disk at one time.  Not the ctime: a chmod, an
            # xattr or a link changes it and no byte
            raise InputRejected(
                "input.walk.changed",
                f"{path!r} was written while it was hashed (its modification time changed)",
                evidence={"path": path, "mtime_ns": [before.st_mtime_ns, after.st_mtime_ns]},
            )
        return ManifestEntry(path=path, size=entry.size, sha256=digest)

    for path in paths:
        if tree.entry(path) is None:
            raise ValueError(f"{path!r} is not a walked file of the tree")
    order = sorted(paths, key=lambda p: (-tree.entry(p).size, p))  # type: ignore[union-attr]
    checkers = {p: tree.ledger(p).checker() for p in order}  # all sealed before any hashing begins
    try:
        if n_workers == 1 and not yielding:  # yielding threads are the pool's, never the caller's
            return [one(p) for p in order]
        with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="ckptgate-digest") as ex:
            futures = {p: ex.submit(one, p) for p in order}
            try:
                return [interrupts.result(f) for f in futures.values()]
            except Exception:  # a file failed, or was stopped by another's failure
                first = futures[failed[0]] if failed else None
                if first is None:
                    raise
            except BaseException:  # a signal on this thread: the others stop too
                abandon.set()
                raise
            finally:
                for f in futures.values():  # as Executor.map does: what has not started never starts
                    f.cancel()
            # the first file's failure, as its own thread raised it (its cause kept), once that
            # thread has finished raising it
            interrupts.result(first)
            raise AssertionError("unreachable: the first failure was raised above")
    finally:
        for c in companions:
            c.shutdown(wait=True)
