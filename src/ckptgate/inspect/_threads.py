"""A small thread pool for readers whose heavy part releases the GIL (``preadv``, CRC-32)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Below this many bytes an item's work is mostly Python (headers, opcodes), which threads only
#: slow down; such items run on the calling thread while the pool reads the large ones.
THREADED_MIN_BYTES = 4 << 20
_MAX_THREADS = 8


def usable_cores() -> int:
    """The cores this process may run on (its affinity: ``os.process_cpu_count`` where Python has
    it, else ``sched_getaffinity``), not the machine's."""
    count = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if count is not None:
        return int(count() or 1)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def map_in_threads(fn: Callable[[T], R], items: Sequence[T], size: Callable[[T], int]) -> list[R]:
    """``[fn(x) for x in items]``, in order.  Items of at least :data:`THREADED_MIN_BYTES` (by
    ``size``) run on up to one thread per core; the first exception in item order propagates."""
    big = [i for i, x in enumerate(items) if size(x) >= THREADED_MIN_BYTES]
    n = min(len(big), usable_cores(), _MAX_THREADS)
    if n < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="ckptgate-inspect") as pool:
        pooled = {i: pool.submit(fn, items[i]) for i in big}
        inline = {i: _now(fn, x) for i, x in enumerate(items) if i not in pooled}
    return [(pooled.get(i) or inline[i]).result() for i in range(len(items))]


def _now(fn: Callable[[T], R], x: T) -> Future[R]:
    f: Future[R] = Future()
    try:
        f.set_result(fn(x))
    except Exception as e:  # raised again by result(), in item order
        f.set_exception(e)
    return f
