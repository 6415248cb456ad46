"""Megatron -> Hugging Face benchmark (issue #39 item 7): ``intake --hf-config`` against ckptgate's
own name-preserving Megatron intake of the same checkpoint, and against the script a user writes
today (``bench/user_megatron_to_hf.py``: ``dcp_to_torch_save`` to one file, ``torch.load``, rename
and split by the same family table, ``safetensors.torch.save_file`` in shards, ``sync``).

The checkpoint: a Llama-shaped bf16 ``GPTModel`` saved by megatron-core at tp2 with no optimizer
state (``bench/_megatron_hf_producer.py``), generated once under --workdir/cache.  The issue asks
for about 2 GiB; on the 2-core development machine the default is hidden 1024 x 8 layers (about
300 MB, 156M params), so that 3 sides x 5 runs finish in a few minutes; pass --hidden 2048
--layers 16 for about 1.9 GiB.

Each side runs in its own subprocess under a small launcher (peak RSS: ``wait4``'s ``ru_maxrss`` of
that process tree), --repeat times, the sides interleaved, each after ``sync`` with its previous
output removed; the table shows median wall times and peak RSS, and the two ratios:
``mapped / names`` (target <= 1.1) and ``user_script / mapped`` (target >= 3) with
``mapped RSS / user_script RSS`` (target <= 1/8).

    .venv/bin/python bench/bench_hf_mapping.py --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))

from _common import report  # noqa: E402
from bench_consolidate import run_measured  # noqa: E402  (the same launcher and RSS measure)

_SIDE = r"""
import json, sys, time
from pathlib import Path
side, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t0 = time.perf_counter()
if side in ("mapped", "names"):
    sys.path.insert(0, sys.argv[4])
    from pipeline_helpers import Signer
    import ckptgate.pipeline as pipeline
    s = Signer(key_path=Path(sys.argv[5]), trust_file=Path(sys.argv[6]))
    hf = Path(sys.argv[8]) if side == "mapped" else None
    pipeline.intake(src, dst, attestations=[Path(sys.argv[7])], options=s.options, max_shard_bytes=2 << 30,
                    hf_config=hf)
print(json.dumps({"wall_s": time.perf_counter() - t0}))
"""


def _attest(src: Path, workdir: Path) -> tuple[Path, Path, Path]:
    """A throwaway signer trusted for qualifications, and its qualification of ``src`` by megatron-core
    0.16.1 at tp2 (the topology the producer used)."""
    from pipeline_helpers import make_signer, qualification

    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import sign_statement

    signer = make_signer(workdir)
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    meta = {"versions": {"megatron-core": "0.16.1"},
            "topology": {"tp": 2, "pp": 1, "dp": 1, "ep": 1, "world_size": 2}}
    statement = qualification(src, digest, fmt="megatron-torch-dist", meta=meta)
    att = workdir / "att.json"
    att.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    return signer.key_path, signer.trust_file, att


def _generate(cache: Path, hidden: int, layers: int) -> Path:
    out = cache / f"megatron-llama-h{hidden}-l{layers}"
    if (out / "checkpoint" / ".metadata").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(HERE / "_megatron_hf_producer.py"), str(out), str(hidden), str(layers)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ckptgate-bench-hf"))
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    made = _generate(args.workdir / "cache", args.hidden, args.layers)
    src, cfg = made / "checkpoint", made / "hf_config"
    size = sum(p.stat().st_size for p in src.iterdir() if p.is_file())
    key, trust, att = _attest(src, args.workdir)
    py = sys.executable
    sides: dict[str, list[str]] = {
        "mapped": [py, "-c", _SIDE, "mapped", str(src), "", str(REPO / "tests"), str(key), str(trust), str(att),
                   str(cfg)],
        "names": [py, "-c", _SIDE, "names", str(src), "", str(REPO / "tests"), str(key), str(trust), str(att)],
        "user_script": [py, str(HERE / "user_megatron_to_hf.py"), str(src), "", str(cfg)],
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for i in range(args.repeat):
        for name, argv in sides.items():
            dst = args.workdir / f"out-{name}"
            shutil.rmtree(dst, ignore_errors=True)
            argv = [dst.as_posix() if a == "" else a for a in argv]
            os.sync()
            runs[name].append(run_measured(argv))
            print(f"run {i + 1} {name}: {runs[name][-1]['wall_s']:.2f} s, "
                  f"{runs[name][-1]['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    rss = {k: max(r["peak_rss_bytes"] for r in v) for k, v in runs.items()}
    doc = {
        "checkpoint_bytes": size, "hidden": args.hidden, "layers": args.layers, "repeat": args.repeat,
        "median_wall_s": med, "peak_rss_bytes": rss, "runs": runs,
        "ratios": {
            "mapped_vs_names": med["mapped"] / med["names"],
            "user_script_vs_mapped": med["user_script"] / med["mapped"],
            "mapped_rss_vs_user_script_rss": rss["mapped"] / rss["user_script"],
        },
        "targets": {"mapped_vs_names": "<= 1.1", "user_script_vs_mapped": ">= 3",
                    "mapped_rss_vs_user_script_rss": "<= 0.125"},
    }
    print(f"\ncheckpoint {size / 2**20:.0f} MiB (bf16, tp2), median of {args.repeat} interleaved runs")
    rows: list[list[Any]] = [[k, med[k], round(rss[k] / 2**20)] for k in sides]
    rows += [[f"ratio {k} (target {doc['targets'][k]})", v, ""] for k, v in doc["ratios"].items()]
    report("hf_mapping", ["side", "median wall s", "peak RSS MiB"], rows, doc)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
