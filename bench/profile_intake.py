"""Where a whole intake's CPU goes, step by step and thread by thread (issue #36).

Runs one ``pipeline.intake`` of SRC into DST in this process with the steps wrapped: every
``preadv`` (reads), every sha256 ``update`` (split by who made the hash: the input's digest, the
output's in-order hash, the output read back, the chunk checks), every ``pwrite`` and
``sync_file_range`` (the write and the start of its write-back), every ``fsync`` (publication),
the one pass's per-chunk callback (``feed``, whose CPU not spent in those calls is Python per
chunk and buffer copies) and the embedded OPA's process (its children's CPU).  For each it sums
the thread CPU (``time.thread_time``) and the wall time per thread; wall minus CPU inside a
call is waiting (the disk, a lock, the GIL).  ``--two-pass`` makes the one pass decline, so the
output is written after the decision; ``--streamed`` keeps the one pass's streamed writer even
where the sources are held (the one pass before issue #36).  Prints one JSON document.

    .venv/bin/python bench/profile_intake.py SRC DST ATTESTATION KEY TRUST [--two-pass | --streamed] [--workers N]
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

_STATS: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
_LOCK = threading.Lock()
_LOCAL = threading.local()


def _tname() -> str:
    return threading.current_thread().name.rstrip("0123456789_").rstrip("-") or "main"


def _add(step: str, cpu: float, wall: float, nbytes: int = 0) -> None:
    with _LOCK:
        s = _STATS[(step, _tname())]
        s[0] += cpu
        s[1] += wall
        s[2] += 1
        s[3] += nbytes


def timed(step: str, fn: Any, size: Any = None) -> Any:
    def run(*a: Any, **k: Any) -> Any:
        c, w = time.thread_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            cpu, wall = time.thread_time() - c, time.perf_counter() - w
            _add(step, cpu, wall, size(a, k) if size else 0)
            inner = getattr(_LOCAL, "inner", None)
            if inner is not None:  # inside an outer step: not part of its own time
                inner[0] += cpu
                inner[1] += wall

    return run


def outer(step: str, fn: Any) -> Any:
    """A step whose own time excludes the wrapped steps it calls."""

    def run(*a: Any, **k: Any) -> Any:
        saved = getattr(_LOCAL, "inner", [0.0, 0.0])
        _LOCAL.inner = [0.0, 0.0]
        c, w = time.thread_time(), time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            cpu, wall = time.thread_time() - c, time.perf_counter() - w
            inner = _LOCAL.inner
            _add(step, cpu - inner[0], wall - inner[1])
            _LOCAL.inner = [saved[0] + cpu, saved[1] + wall]

    return run


class _Hash:
    """A sha256 whose updates are timed under the step that made it."""

    __slots__ = ("_h", "_step")

    def __init__(self, step: str, data: Any = b"") -> None:
        self._h, self._step = _sha256(), step
        if data:
            self.update(data)

    def update(self, data: Any) -> None:
        c, w = time.thread_time(), time.perf_counter()
        self._h.update(data)
        cpu, wall = time.thread_time() - c, time.perf_counter() - w
        _add(self._step, cpu, wall, len(data))
        inner = getattr(_LOCAL, "inner", None)
        if inner is not None:
            inner[0] += cpu
            inner[1] += wall

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def digest(self) -> bytes:
        return self._h.digest()


_sha256 = hashlib.sha256


def _hash_by_caller(data: Any = b"") -> _Hash:
    f = sys._getframe(1)
    mod, fn = f.f_globals.get("__name__", ""), f.f_code.co_name
    step = {
        ("ckptgate.digest", "_hash_fd"): "input sha256",
        ("ckptgate.consolidate.streamed", "__init__"): "output sha256",
        ("ckptgate.consolidate.streamed", "_drop"): "output sha256",
        ("ckptgate.consolidate.streamed", "add"): "output sha256",
        ("ckptgate.consolidate.held", "copy_in_order"): "output sha256",
        ("ckptgate.consolidate.writer", "hash_back"): "output sha256 (read back)",
        ("ckptgate.consolidate.writer", "_scatter_source"): "input sha256 (second pass)",
    }.get((mod, fn), f"other sha256 ({mod}.{fn})")
    return _Hash(step, data)


def install() -> None:
    import ckptgate.consolidate.diskwrite as dw
    import ckptgate.consolidate.held as held
    import ckptgate.consolidate.streamed as streamed
    import ckptgate.consolidate.writer as writer
    import ckptgate.digest as digest
    import ckptgate.publish as publish

    for mod in (digest, streamed, held, writer):
        mod.hashlib = type("H", (), {"sha256": staticmethod(_hash_by_caller)})  # type: ignore[attr-defined]
    preadv = os.preadv
    os.preadv = timed("read (preadv)", preadv, lambda a, k: 0)  # type: ignore[assignment]
    os.pwrite = timed("write (pwrite)", os.pwrite, lambda a, k: len(a[1]))  # type: ignore[assignment]
    dw._sync_file_range = timed("sync_file_range (start write-back)", dw._sync_file_range)
    os.fsync = timed("fsync (publication)", os.fsync)  # type: ignore[assignment]
    digest._hash_fd = outer("digest loop, Python per chunk", digest._hash_fd)
    orig_feeder = streamed.StreamedPlan.feeder

    def feeder(self: Any, src: str) -> Any:
        feed = orig_feeder(self, src)
        return None if feed is None else outer("one-pass feed: Python per chunk + copies of waiting pieces", feed)

    streamed.StreamedPlan.feeder = feeder  # type: ignore[method-assign]
    streamed.StreamedPlan.finish = outer(  # type: ignore[method-assign]
        "one-pass finish (read-back of unhashed outputs)", streamed.StreamedPlan.finish)
    held.copy_in_order = outer("held copy: Python per window", held.copy_in_order)
    writer.copy_in_order = held.copy_in_order
    publish.publish = outer("publication (receipt, rename)", publish.publish)
    import ckptgate.outcome as outcome

    if hasattr(outcome, "publish"):
        outcome.publish = publish.publish

    run = threading.Thread.run

    def tracked(self: threading.Thread) -> None:
        try:
            run(self)
        finally:
            _add("thread total", time.thread_time(), 0.0)

    threading.Thread.run = tracked  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("attestation", type=Path)
    ap.add_argument("key", type=Path)
    ap.add_argument("trust", type=Path)
    ap.add_argument("--two-pass", action="store_true")
    ap.add_argument("--streamed", action="store_true", help="the one pass's streamed writer even where the "
                    "sources are held (the path before issue #36)")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--max-shard-bytes", type=int, default=2 << 30)
    args = ap.parse_args()
    t_start = time.perf_counter()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pipeline_helpers import Signer

    import ckptgate.pipeline as pipeline

    t_imported = time.perf_counter()
    install()
    if args.streamed:
        import ckptgate.onepass as onepass

        init = onepass.OnePass.__init__

        def no_tree(self: Any, *a: Any, **k: Any) -> None:
            init(self, *a, **{**k, "tree": None})

        onepass.OnePass.__init__ = no_tree  # type: ignore[method-assign]
    if args.two_pass:
        pipeline.OnePass.begin = lambda self, inspection: None  # type: ignore[method-assign]
    s = Signer(key_path=args.key, trust_file=args.trust)
    kw = {"workers": args.workers} if args.workers else {}
    c0, w0 = time.process_time(), time.perf_counter()
    pipeline.intake(args.src, args.dst, attestations=[args.attestation], options=s.options,
                    max_shard_bytes=args.max_shard_bytes, **kw)
    wall = time.perf_counter() - w0
    main_total = time.thread_time()
    ru_self, ru_kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    _add("thread total", main_total, 0.0)
    steps = {f"{k[0]} @ {k[1]}": {"cpu_s": round(v[0], 3), "wall_s": round(v[1], 3), "calls": v[2],
                                  "bytes": v[3]} for k, v in sorted(_STATS.items())}
    mode = "two-pass" if args.two_pass else "one-pass streamed" if args.streamed else "one-pass"
    print(json.dumps({"mode": mode, "intake_wall_s": round(wall, 3),
                      "intake_cpu_s": round(time.process_time() - c0, 3), "imports_s": round(t_imported - t_start, 3),
                      "process_cpu_user_s": ru_self.ru_utime, "process_cpu_sys_s": ru_self.ru_stime,
                      "children_cpu_s": ru_kids.ru_utime + ru_kids.ru_stime, "peak_rss_mib": ru_self.ru_maxrss / 1024,
                      "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
