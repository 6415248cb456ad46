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
