"""Plan memory at 70B scale: a synthetic tensor-parallel DCP layout made of sparse files.

The layout is Llama-3-70B's tensors in bf16 (80 layers, hidden 8192, MLP 28672, 8 KV heads,
vocabulary 128256: 723 tensors, 70.6B parameters, 141 GB), saved by 8 ranks as DCP HF storage
with every 2-D tensor split on dim 1 (row-parallel ``Shard(1)``: the worst case, a run per row
and rank) and every 1-D one on dim 0.  Each rank's file holds its chunks back to back; the files
are sparse (``ftruncate``), so the 141 GB take no disk and read back as zeros.

Each measurement runs in a fresh subprocess, which reports its own peak RSS (``ru_maxrss``):

* ``strided``: the DCP adapter plans the whole layout (``dcp.plan``, the plan invariants
  included), then the writer (held mode: it reads only placed bytes) writes a sample of the
  output shards: the one holding the largest tensor, then shards from the middle (decoder layers).
* ``per-row``: the plan as it was before strided placements, one placement per row and chunk,
  for ``--legacy-layers`` layers only (the whole model does not fit in this machine's memory);
  its time and memory per placement are scaled to the whole layout's 55.8M placements.

    .venv/bin/python bench/bench_plan_tp.py --workdir /tmp/ckptgate-bench-tp
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RANKS = 8
HIDDEN, MLP, KV, VOCAB, LAYERS = 8192, 28672, 1024, 128256, 80


def shapes(layers: int = LAYERS) -> dict[str, tuple[int, ...]]:
    """Llama-3-70B's tensors (HF names), ``layers`` decoder layers."""
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN),
                                       "model.norm.weight": (HIDDEN,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (KV, HIDDEN),
                    p + "self_attn.v_proj.weight": (KV, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                    p + "mlp.gate_proj.weight": (MLP, HIDDEN), p + "mlp.up_proj.weight": (MLP, HIDDEN),
                    p + "mlp.down_proj.weight": (HIDDEN, MLP), p + "input_layernorm.weight": (HIDDEN,),
                    p + "post_attention_layernorm.weight": (HIDDEN,)})
    return out


def layout(layers: int = LAYERS, ranks: int = RANKS, itemsize: int = 2) -> tuple[dict[str, Any], dict[str, int]]:
    """The DCP HF-storage layout (``Inspection.layout`` shape) and each rank file's size."""
    tensors, ends = [], [0] * ranks
    for fqn, full in shapes(layers).items():
        dim = 1 if len(full) == 2 else 0
        step = full[dim] // ranks
        chunks = []
        for r in range(ranks):
            offsets = [0] * len(full)
            sizes = list(full)
            offsets[dim], sizes[dim] = r * step, step
            n = itemsize
            for s in sizes:
                n *= s
            chunks.append({"path": f"shard-{r:05d}-model-00001-of-00001.safetensors", "offsets": offsets,
                           "sizes": sizes, "data_offsets": [ends[r], ends[r] + n]})
            ends[r] += n
        tensors.append({"fqn": fqn, "dtype": "bfloat16", "size": list(full), "chunks": chunks})
    return {"tensors": tensors}, {f"shard-{r:05d}-model-00001-of-00001.safetensors": ends[r] for r in range(ranks)}


def per_row_count(layers: int = LAYERS, ranks: int = RANKS) -> int:
    return sum(full[0] * ranks if len(full) == 2 else ranks for full in shapes(layers).values())


_CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import bench_plan_tp as b
from ckptgate.consolidate.adapters import dcp
from ckptgate.consolidate.plan import ConsolidationPlan, OutputTensor, Placement, chunk_runs, merge_placements
mode, work, layers, sample = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
lay, sizes = b.layout(layers)
base = rss()
t0 = time.perf_counter()
if mode == "strided":
    plan = dcp.plan("dcp-hf-safetensors", lay, max_shard_bytes=2 << 30)
    placements = sum(len(t.placements) for s in plan.shards for t in s.tensors)
else:  # the plan before strided placements: a placement per row and chunk
    tensors = []
    for t in lay["tensors"]:
        full = tuple(t["size"])
        ps = [Placement(src=c["path"], src_offset=c["data_offsets"][0] + s * 2, dst_offset=d * 2, length=n * 2)
              for c in t["chunks"] for s, d, n in chunk_runs(full, tuple(c["offsets"]), tuple(c["sizes"]))]
        tensors.append(OutputTensor(name=t["fqn"], dtype="BF16", shape=full, placements=merge_placements(ps)))
    placements = sum(len(t.placements) for t in tensors)
plan_s = time.perf_counter() - t0
out = {"mode": mode, "layers": layers, "tensors": len(lay["tensors"]), "placements": placements,
       "plan_s": plan_s, "rss_before_plan": base, "rss_after_plan": rss()}
if mode == "strided" and sample:
    from ckptgate.consolidate.writer import write_plan
    largest = max(plan.shards, key=lambda s: max(t.nbytes for t in s.tensors))
    picked = [largest] + [s for s in plan.shards[len(plan.shards) // 2:] if s is not largest][:sample - 1]
    sub = ConsolidationPlan(shards=tuple(picked), write_index=False)
    fds = {}
    for name, size in sizes.items():
        path = os.path.join(work, name)
        with open(path, "wb") as f:
            f.truncate(size)  # sparse: no data blocks
        fds[name] = os.open(path, os.O_RDONLY)
    dst = os.path.join(work, "out")
    os.mkdir(dst)
    t0 = time.perf_counter()
    written = write_plan(sub, dst, fds, expected=None)
    out.update(write_s=time.perf_counter() - t0, written_bytes=sum(w.size for w in written),
               written_shards=[w.filename for w in written], shards=len(plan.shards),
               largest_tensor=max(t.nbytes for s in plan.shards for t in s.tensors),
               total_bytes=plan.total_size, rss_after_write=rss())
print(json.dumps(out))
"""


def run(mode: str, work: Path, layers: int, sample: int) -> dict[str, Any]:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        res = subprocess.run([sys.executable, "-c", _CHILD, str(HERE), mode, str(work), str(layers), str(sample)],
                             check=True, capture_output=True, text=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    from _common import report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ckptgate-bench-tp"))
    ap.add_argument("--sample-shards", type=int, default=2, help="output shards written (0: plan only)")
    ap.add_argument("--legacy-layers", type=int, default=4, help="layers planned the per-row way")
    args = ap.parse_args()
    mib = 1 << 20
    new = run("strided", args.workdir, LAYERS, args.sample_shards)
    old = run("per-row", args.workdir, args.legacy_layers, 0)
    full_rows = per_row_count()
    scale = full_rows / old["placements"]
    old_full = {"placements": full_rows, "plan_s": old["plan_s"] * scale,
                "rss": old["rss_before_plan"] + (old["rss_after_plan"] - old["rss_before_plan"]) * scale}
    peak = new.get("rss_after_write", new["rss_after_plan"])
    bound = 256 * mib + new.get("largest_tensor", 0)
    rows = [
        ["strided (whole 70B layout)", new["placements"], f"{new['plan_s']:.3f}",
         f"{new['rss_after_plan'] / mib:.0f}", f"{peak / mib:.0f}",
         f"{new.get('written_bytes', 0) / mib:.0f} MiB in {new.get('write_s', 0):.1f} s"],
        [f"per-row ({args.legacy_layers} layers, measured)", old["placements"], f"{old['plan_s']:.3f}",
         f"{old['rss_after_plan'] / mib:.0f}", "-", "-"],
        ["per-row (whole layout, scaled)", full_rows, f"{old_full['plan_s']:.1f}", f"{old_full['rss'] / mib:.0f}",
         "-", "-"],
    ]
    targets = {"plan_under_5s": new["plan_s"] < 5.0, "peak_rss_bytes": peak, "rss_bound_bytes": bound,
               "rss_met": peak <= bound}
    report("plan_tp_70b", ["plan", "placements", "plan s", "RSS after plan MiB", "peak RSS MiB", "sample write"],
           rows, {"strided": new, "per_row_measured": old, "per_row_scaled": old_full, "targets": targets})
    print(json.dumps(targets))


if __name__ == "__main__":
    main()
