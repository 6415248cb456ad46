"""Files whose sha256 the digest takes from the bytes another reader hands it: the input read once.

Where intake's one pass copies the output beside the digest from held sources
(:class:`ckptgate.onepass.OnePass`), the copy reads every placed byte of a source into its own
windows. For a source it adopts (:meth:`FedDigest.adopt`), the digest hashes those windows as the
copy hands them over (:meth:`FedDigest.tap`) instead of reading the file a second time (issue #36:
0.4 CPU-seconds per 2 GiB). Each handed chunk is hashed on a thread of this digest, never the
copy's, and checked as a chunk the digest read itself would be: the read ledger's checker, and the
deferred CRC-32 pass on a companion thread (:func:`ckptgate.digest.hash_files` says why apart).

The sha256 is of every byte of the file in order, whatever the copy hands over or fails to: the
bytes between placed ranges (headers, zip records), the bytes after the last one, and everything
left once the copy has ended (finished, failed or cancelled), this digest reads itself
(:func:`~ckptgate.digest.hash_range`). A chunk that starts past what is hashed first has the gap
read; a chunk already hashed (a source placed out of order) is let through unhashed, as in every
held copy, where the read lease binds the bytes copied to the bytes hashed.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from ckptgate import interrupts
from ckptgate.digest import DEFAULT_BUFFER, DigestCancelled, ManifestEntry, ends_at, hash_range
from ckptgate.inspect.walk import SafeTree

__all__ = ["FedDigest"]

#: ``check(offset, view)`` on a file's chunks, in order.
Check = Callable[[int, memoryview], None]


class _Fed:
    """One adopted file: its hash so far, and the chunks handed over that wait for their turn."""

    def __init__(self, path: str, size: int, fd: int, check: Check | None, aside: Check | None) -> None:
        self.path, self.size, self.fd, self.check, self.aside = path, size, fd, check, aside
        self.h = hashlib.sha256()
        self.pos = 0  # bytes [0, pos) are hashed
        self.queue: collections.deque[tuple[int, memoryview, Future[None]]] = collections.deque()
        self.running = False  # a thread drains the queue
        self.idle = threading.Event()
        self.idle.set()
        self.error: BaseException | None = None


class FedDigest:
    """The sha256 of each adopted file, from the chunks a copy hands over and what this reads itself.

    Use it as a context manager around the copy that feeds it: leaving the block resolves every
    chunk still waiting (so a copy never waits on a digest that is gone), stops the threads and
    closes the files.  ``workers`` threads hash; ``apart(path)`` is the deferred CRC-32 pass
    (:class:`ckptgate.inspect.DeferredCrcs`); ``cancel`` stops it at the next chunk
    (:class:`~ckptgate.digest.DigestCancelled` from :meth:`entries`).
    """

    def __init__(
        self,
        tree: SafeTree,
        *,
        workers: int,
        buffer_size: int = DEFAULT_BUFFER,
        progress: Callable[[int], None] | None = None,
        apart: Callable[[str], Check | None] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self._tree, self._buffer, self._apart, self._cancel = tree, buffer_size, apart, cancel
        self._progress = progress
        self._lock = threading.Lock()
        self._files: dict[str, _Fed] = {}
        self._ended = threading.Event()  # the copy hands over nothing more
        self._stop = threading.Event()  # the block is left: reads between chunks stop at their next chunk
        self._sealed = False  # entries() has begun: what is handed over now is let through
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="ckptgate-fed")
        self._companion = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptgate-apart")

    def __enter__(self) -> FedDigest:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            self._sealed = True
            waiting = [item for f in self._files.values() for item in f.queue]
            for f in self._files.values():
                f.queue.clear()
        for _, _, fut in waiting:
            if fut.set_running_or_notify_cancel():
                fut.set_result(None)
        self._ended.set()
        self._pool.shutdown(wait=True)
        self._companion.shutdown(wait=True)
        for f in self._files.values():
            os.close(f.fd)

    @property
    def paths(self) -> frozenset[str]:
        """The adopted files: hash every other file the usual way."""
        return frozenset(self._files)

    def adopt(self, paths: Iterable[str]) -> None:
        """Take over the sha256 of ``paths`` (walked files of the tree), before the copy starts:
        each one's read ledger is sealed here, as :func:`~ckptgate.digest.hash_files` seals it."""
        for path in paths:
            entry = self._tree.entry(path)
            if entry is None:
                raise ValueError(f"{path!r} is not a walked file of the tree")
            if path in self._files:
                continue
            check = self._tree.ledger(path).checker()
            aside = self._apart(path) if self._apart else None
            self._files[path] = _Fed(path, entry.size, self._tree.open_file(path), check, aside)

    def tap(self, path: str, offset: int, view: memoryview) -> Future[None] | None:
        """Hand over ``view``, bytes ``[offset, offset + len(view))`` of ``path`` just read: the
        caller keeps it unchanged until the returned future is done.  ``None`` where ``path`` is
        not adopted, or the digest no longer takes chunks."""
        f = self._files.get(path)
        if f is None:
            return None
        fut: Future[None] = Future()
        with self._lock:
            if self._sealed:
                return None
            f.queue.append((offset, view, fut))
            if not f.running:
                f.running = True
                f.idle.clear()
                self._pool.submit(self._drain, f)
        return fut

    def end(self) -> None:
        """The copy has ended (done, failed or cancelled): :meth:`entries` reads what is left."""
        self._ended.set()

    def entries(self) -> list[ManifestEntry]:
        """The adopted files' manifest entries, once the copy has ended (or ``cancel`` is set):
        what it did not hand over is read here, every file on a thread of its own."""
        if not self._files:
            return []
        while not self._ended.wait(0.05):  # short steps: a signal's handler runs on this thread
            if self._cancel is not None and self._cancel.is_set():
                raise DigestCancelled
        with self._lock:
            self._sealed = True
        rests = [self._pool.submit(self._rest, f) for f in self._files.values()]
        interrupts.all_done(rests)
        return [r.result() for r in rests]

    def _drain(self, f: _Fed) -> None:
        while True:
            with self._lock:
                if not f.queue:
                    f.running = False
                    f.idle.set()
                    return
                offset, view, fut = f.queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if f.error is None:
                    self._take(f, offset, view)
            except BaseException as e:  # raised once, by entries(), as hash_files would
                f.error = e
            fut.set_result(None)  # the copy's buffer is free; a failure is the digest's to raise

    def _take(self, f: _Fed, offset: int, view: memoryview) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise DigestCancelled
        if offset > f.pos:  # the bytes between placed ranges: read here
            self._read(f, offset)
        skip = f.pos - offset
        if skip >= len(view):
            return
        view, offset = view[max(0, skip) :], max(offset, f.pos)
        f.h.update(view)
        if f.check is not None:
            f.check(offset, view)
        if f.aside is not None:
            interrupts.result(self._companion.submit(f.aside, offset, view))
        f.pos += len(view)
        if self._progress is not None:
            with self._lock:
                self._progress(len(view))

    def _read(self, f: _Fed, end: int) -> None:
        """Hash ``[f.pos, end)``, read into this thread's own buffers."""
        bufs: tuple[memoryview, ...] | None = getattr(self._local, "bufs", None)
        if bufs is None:
            bufs = self._local.bufs = tuple(memoryview(bytearray(self._buffer)) for _ in range(2))

        def tick(n: int) -> None:
            if self._progress is not None:
                with self._lock:
                    self._progress(n)

        hash_range(
            f.fd,
            f.h,
            f.pos,
            end,
            bufs if f.aside is not None else bufs[:1],
            tick,
            f.check,
            (f.aside, self._companion) if f.aside is not None else None,
            self._stop,
            self._cancel,
        )
        f.pos = end

    def _rest(self, f: _Fed) -> ManifestEntry:
        f.idle.wait()
        if f.error is not None:
            raise f.error
        if f.pos < f.size:
            self._read(f, f.size)
        ends_at(f.fd, f.size)
        return ManifestEntry(path=f.path, size=f.size, sha256=f.h.hexdigest())
