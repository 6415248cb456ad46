"""Inspection of a 1,000-shard HF safetensors checkpoint (headers only).

    python bench/bench_inspect.py [--shards 1000] [--tensors 8] [--runs 5]

Builds the checkpoint once in /tmp (tiny shards plus an index), then times ``inspect_tree``.
Target: well under a second.  Writes bench/results/bench_inspect.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import safetensors.numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report  # noqa: E402

from ckptgate.inspect import inspect_tree  # noqa: E402


def make(root: Path, shards: int, tensors: int) -> None:
    idx = root / "model.safetensors.index.json"
    if idx.exists() and len(list(root.glob("*.safetensors"))) == shards:
        return
    root.mkdir(parents=True, exist_ok=True)
    wm, total = {}, 0
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        arrays = {f"layers.{s}.w{t}": np.zeros((4, 4), np.float32) for t in range(tensors)}
        safetensors.numpy.save_file(arrays, str(root / name), metadata={"format": "pt"})
        for k, v in arrays.items():
            wm[k] = name
            total += v.nbytes
    idx.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=1000)
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/ckptgate-bench-inspect"))
    a = ap.parse_args()
    make(a.dir, a.shards, a.tensors)
    times = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        insp = inspect_tree(a.dir)
        times.append(time.perf_counter() - t0)
    assert insp.format == "hf-sharded-safetensors" and insp.clean, insp.findings[:3]
    med = statistics.median(times)
    rows = [["inspect_tree", a.shards, a.shards * a.tensors, f"{med:.3f}", f"{min(times):.3f}"]]
    report("bench_inspect", ["what", "shards", "tensors", "median s", "best s"], rows,
           {"shards": a.shards, "tensors": a.shards * a.tensors, "median_s": med, "best_s": min(times),
            "runs": a.runs, "target_s": 1.0, "met": med < 1.0})


if __name__ == "__main__":
    main()
