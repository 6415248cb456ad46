"""Distributed intake benchmark: ``ckptgate intake --distributed`` (gloo on loopback, one machine),
launched by ``torchrun --standalone`` and by setting the ``env://`` variables directly (as SLURM's
``srun`` or a Kubernetes PyTorchJob does, with no launcher agent importing torch first), against
the single-process intake of the same checkpoint.

The checkpoint is generated under --workdir: an HF sharded safetensors checkpoint of --files
files of about --size/--files bytes each (float32 tensors of random bytes), with an index.  A
throwaway key signs a qualification statement for its measured digest (``tests/pipeline_helpers``).
Each side runs the real CLI in its own process(es), after ``sync`` and with its previous output
removed, --repeat times interleaved; the table shows the median wall time.  The wall time of a
distributed run includes the launcher's start-up and every rank's ``import torch``, which on a small
checkpoint is most of it; the per-rank bytes hashed and written come from the receipt's
``topology`` record, and their max/min ratio is reported.

    .venv/bin/python bench/bench_distributed.py --size 256M --files 8 --ranks 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import report


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def make_checkpoint(root: Path, total: int, files: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    weight_map = {}
    total_size = 0
    per = total // files // 4
    for i in range(files):
        name = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        tensors = {f"model.layers.{i}.mlp.{k}.weight": rng.integers(0, 255, size=per // 2 * 4, dtype=np.uint8)
                   .view(np.float32).reshape(-1, 1) for k in ("up_proj", "down_proj")}
        save_file(tensors, str(root / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total_size += sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _env_launch(cmd: list[str], ranks: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Start ``ranks`` copies of ``cmd`` with torch.distributed's ``env://`` variables set, as SLURM's
    ``srun`` or a Kubernetes PyTorchJob does, and wait for all; rank 0's output is returned."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(ranks),
                                   "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port)})
             for r in range(ranks)]
    outs = [p.communicate() for p in procs]
    rc = next((p.returncode for p in procs if p.returncode), 0)
    return subprocess.CompletedProcess(cmd, rc, outs[0][0], "".join(e for _, e in outs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="256M")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-shard-size", default="32MiB")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ckptgate-bench-distributed"))
    a = ap.parse_args()
    from pipeline_helpers import attest, make_signer

    from ckptgate.inspect import SafeTree, inspect_open_tree

    shutil.rmtree(a.workdir, ignore_errors=True)
    src = a.workdir / "checkpoint"
    make_checkpoint(src, _bytes(a.size), a.files)
    signer = make_signer(a.workdir)
    with SafeTree.open(src) as tree:
        fmt = str(inspect_open_tree(tree).format)
    att = attest(signer, src, a.workdir / "att.json", fmt=fmt,
                 meta={"versions": {"huggingface_hub": "1.0", "safetensors": "0.5"}})
    env = {**os.environ, "CKPTGATE_DIST_SECRET": os.urandom(16).hex()}
    base = ["intake", str(src), "--out", str(a.workdir / "out"), "--attestation", str(att), "--trust",
            str(signer.trust_file), "--json", "--max-shard-size", a.max_shard_size]
    torchrun = f"{a.ranks} ranks, torchrun"
    direct = f"{a.ranks} ranks, env launcher"
    sides = {"single": [sys.executable, "-m", "ckptgate", *base],
             torchrun: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                        str(a.ranks), "-m", "ckptgate", *base, "--distributed"],
             direct: [sys.executable, "-m", "ckptgate", *base, "--distributed"]}
    walls: dict[str, list[float]] = {k: [] for k in sides}
    topology = None
    for _ in range(a.repeat):
        for name, cmd in sides.items():
            shutil.rmtree(a.workdir / "out", ignore_errors=True)
            subprocess.run(["sync"], check=False)
            t0 = time.perf_counter()
            if name == direct:  # as srun or a PyTorchJob start ranks: the environment, no launcher agent
                proc = _env_launch(cmd, a.ranks, env)
            else:
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            walls[name].append(time.perf_counter() - t0)
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
            if name != "single":
                topology = json.loads(proc.stdout)["receipt"]["topology"]
    assert topology is not None
    ranks = topology["ranks"]

    def spread(key: str) -> float:
        vals = [r[key] for r in ranks]
        return max(vals) / min(vals) if min(vals) else float("inf")

    med = {k: statistics.median(v) for k, v in walls.items()}
    ratios = {k: med[k] / med["single"] for k in sides if k != "single"}
    rows = [[r["rank"], r["files_hashed"], r["bytes_hashed"], r["outputs_written"], r["bytes_written"]] for r in ranks]
    doc = {"input_bytes": sum(p.stat().st_size for p in src.iterdir()), "files": a.files + 1, "ranks": a.ranks,
           "wall_s": walls, "median_wall_s": med, "distributed_vs_single": ratios,
           "bytes_hashed_max_over_min": spread("bytes_hashed"), "bytes_written_max_over_min": spread("bytes_written"),
           "topology": topology, "cores": os.cpu_count()}
    report("distributed", ["rank", "files hashed", "bytes hashed", "outputs written", "bytes written"], rows, doc)
    print(json.dumps({k: doc[k] for k in ("median_wall_s", "distributed_vs_single", "bytes_hashed_max_over_min",
                                          "bytes_written_max_over_min")}, indent=2))


if __name__ == "__main__":
    main()
