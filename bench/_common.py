"""Shared helpers for the benchmarks: timing, a table, and a JSON result file."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def time_calls(fn: Callable[[], Any], n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def summary_ms(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": 1000 * statistics.median(samples), "p99_ms": 1000 * percentile(samples, 99),
            "mean_ms": 1000 * statistics.fmean(samples), "n": len(samples)}


def report(name: str, columns: list[str], rows: list[list[Any]], doc: dict[str, Any]) -> Path:
    table = Table(title=name)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r])
    Console().print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    doc = {"benchmark": name, "machine": {"python": platform.python_version(), "platform": platform.platform()},
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **doc}
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    Console().print(f"wrote {out}")
    return out


def plain_sha256_seconds(paths: list[Path], threads: int) -> float:
    """Wall time of the plainest hasher there is: each file ``preadv``'d into one 4 MiB buffer and
    fed to ``hashlib.sha256``, one file per thread, largest first; no manifest, no checks.

    A tool that reads these files with ``read()`` and hashes every byte can hardly be faster; on
    this machine no other way in (buffer sizes, ``mmap``, ``O_DIRECT``) was, which makes it the
    floor to hold a speed target against (``docs/benchmarks.md``).
    """
    import hashlib
    import os
    from concurrent.futures import ThreadPoolExecutor

    def one(path: Path) -> None:
        buf, h, off = memoryview(bytearray(4 << 20)), hashlib.sha256(), 0
        fd = os.open(path, os.O_RDONLY)
        try:
            while n := os.preadv(fd, [buf], off):
                h.update(buf[:n])
                off += n
        finally:
            os.close(fd)

    order = sorted(paths, key=lambda p: -p.stat().st_size)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max(1, threads)) as ex:
        list(ex.map(one, order))
    return time.perf_counter() - t0


def single_core_sha256(size: int, seconds: float = 1.0) -> float:
    """Bytes per second of ``hashlib`` sha256 over one ``size``-byte buffer, again and again, on one
    core: in the core's cache for a small buffer, at memory speed for one far larger than the caches."""
    import hashlib
    import os

    data = os.urandom(size)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        hashlib.sha256(data).digest()
        n += len(data)
    return n / (time.perf_counter() - t0)
