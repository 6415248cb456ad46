"""Megatron -> Hugging Face benchmark (issue #39 item 7): ``intake --hf-config`` against ckptgate's
own name-preserving Megatron intake of the same checkpoint, and against the script a user writes
today (``bench/user_megatron_to_hf.py``: ``dcp_to_torch_save`` to one file, ``torch.load``, rename
and split by the same family table, ``safetensors.torch.save_file`` in shards, ``sync``).

The checkpoint: a Llama-shaped bf16 ``GPTModel`` saved by megatron-core at tp2 with no optimizer
state (``bench/_megatron_hf_producer.py``), generated once under --workdir/cache by
--producer-python (an interpreter with megatron-core, for example the farm's 0.16.1 environment;
the attested release is that interpreter's).  The default is hidden 1024 x 8 layers (about 300
MB); the issue's size, about 2 GiB, is ``--hidden 2048 --layers 22`` (2.05 GiB).

Each side runs in its own subprocess under a small launcher (peak RSS: ``wait4``'s ``ru_maxrss`` of
that process tree; CPU seconds: its ``ru_utime + ru_stime``), --repeat times, the sides
interleaved, each after ``sync`` with its previous output removed.  Beside the three sides:
``dd_direct`` (every input file written with ``O_DIRECT``: the disk's speed for these bytes) and,
after the runs, the machine's floor (``bench_consolidate.floor``: the input read and hashed by the
plainest loop, or the policy engine's start if later, then the output hashed).  The table shows
median wall and CPU seconds and peak RSS, and the ratios: ``mapped / names`` (target <= 1.1),
``user_script / mapped`` (target >= 3), ``mapped RSS / user_script RSS`` (target <= 1/8),
``mapped / floor``, and the same two time ratios in CPU seconds (which a shared machine moves less).

    .venv/bin/python bench/bench_hf_mapping.py --repeat 5
"""

from __future__ import annotations

import argparse
import json
import math
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
from bench_consolidate import _DD, floor, run_measured  # noqa: E402  (the same launcher, RSS measure, floor)

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


def _attest(src: Path, workdir: Path, release: str) -> tuple[Path, Path, Path]:
    """A throwaway signer trusted for qualifications, and its qualification of ``src`` by megatron-core
    ``release`` (the producer's) at tp2 (the topology the producer used)."""
    from pipeline_helpers import make_signer, qualification

    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import sign_statement

    signer = make_signer(workdir)
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    meta = {"versions": {"megatron-core": release},
            "topology": {"tp": 2, "pp": 1, "dp": 1, "ep": 1, "world_size": 2}}
    statement = qualification(src, digest, fmt="megatron-torch-dist", meta=meta)
    att = workdir / "att.json"
    att.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    return signer.key_path, signer.trust_file, att


def _release(python: str) -> str:
    """The megatron-core release of the producer's interpreter."""
    return subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('megatron-core'))"],
                          check=True, capture_output=True, text=True).stdout.strip()


def _generate(cache: Path, hidden: int, layers: int, python: str) -> Path:
    out = cache / f"megatron-llama-h{hidden}-l{layers}-mc{_release(python)}"
    if (out / "checkpoint" / ".metadata").is_file():
        return out
    shutil.rmtree(out, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    subprocess.run([python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(HERE / "_megatron_hf_producer.py"), str(out), str(hidden), str(layers)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return out


def _largest_tensor_bytes(out: Path) -> int:
    """The largest tensor of the published safetensors files (headers only)."""
    from ckptgate.evidence.logits import published_parameters

    return max(math.prod(shape) * 2 for shape in published_parameters(out).values())  # bf16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ckptgate-bench-hf"))
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    ap.add_argument("--producer-python", default=sys.executable,
                    help="the interpreter that has megatron-core (for example a farm environment's, "
                    "~/.cache/ckptgate/farm/envs/megatron-core-0.16.1-torch-2.13.0-<digest>/bin/python)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    release = _release(args.producer_python)
    made = _generate(args.workdir / "cache", args.hidden, args.layers, args.producer_python)
    src, cfg = made / "checkpoint", made / "hf_config"
    size = sum(p.stat().st_size for p in src.iterdir() if p.is_file())
    key, trust, att = _attest(src, args.workdir, release)
    py = sys.executable
    sides: dict[str, list[str]] = {
        "mapped": [py, "-c", _SIDE, "mapped", str(src), "", str(REPO / "tests"), str(key), str(trust), str(att),
                   str(cfg)],
        "names": [py, "-c", _SIDE, "names", str(src), "", str(REPO / "tests"), str(key), str(trust), str(att)],
        "user_script": [py, str(HERE / "user_megatron_to_hf.py"), str(src), "", str(cfg)],
        # the disk's own speed for the same bytes: each input file written with O_DIRECT
        "dd_direct": [shutil.which("sh") or "/bin/sh", "-c", _DD, "sh", str(src), ""],
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for i in range(args.repeat):
        for name, argv in sides.items():
            dst = args.workdir / f"out-{name}"
            shutil.rmtree(dst, ignore_errors=True)
            argv = [dst.as_posix() if a == "" else a for a in argv]
            os.sync()
            runs[name].append(run_measured(argv))
            print(f"run {i + 1} {name}: {runs[name][-1]['wall_s']:.2f} s ({runs[name][-1]['cpu_s']:.2f} s CPU), "
                  f"{runs[name][-1]['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
            if not (name == "mapped" and i == args.repeat - 1):  # the floor reads the last mapped output
                shutil.rmtree(dst, ignore_errors=True)  # one output on the (shared) disk at a time
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    rss = {k: max(r["peak_rss_bytes"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    # the least time any intake that hashes its input, asks the policy engine and hashes its
    # output can take here and now (bench_consolidate.floor), over the last mapped output
    low = floor(src, args.workdir / "out-mapped", repeat=args.repeat)
    largest = _largest_tensor_bytes(args.workdir / "out-mapped")
    doc = {
        "checkpoint_bytes": size, "hidden": args.hidden, "layers": args.layers, "repeat": args.repeat,
        "median_wall_s": med, "median_cpu_s": cpu, "peak_rss_bytes": rss, "runs": runs,
        "ratios": {
            "mapped_vs_names": med["mapped"] / med["names"],
            "user_script_vs_mapped": med["user_script"] / med["mapped"],
            "mapped_rss_vs_user_script_rss": rss["mapped"] / rss["user_script"],
            "mapped_vs_floor": med["mapped"] / low["floor_s"],
            "mapped_vs_dd_direct": med["mapped"] / med["dd_direct"],
            "cpu_mapped_vs_names": cpu["mapped"] / cpu["names"],
            "cpu_user_script_vs_mapped": cpu["user_script"] / cpu["mapped"],
        },
        "targets": {"mapped_vs_names": "<= 1.1", "user_script_vs_mapped": ">= 3",
                    "mapped_rss_vs_user_script_rss": "<= 0.125",
                    "mapped_rss_bytes": f"<= 256 MB + the largest output tensor ({largest} bytes)"},
        "floor": low,
        "mapped_rss_within_budget": rss["mapped"] <= 256 * 10**6 + largest,
        "disk_dd_direct_Bps": size / med["dd_direct"],
        "input_read_and_hash_Bps": size / low["input_s"],
        "release": release,
    }
    print(f"\ncheckpoint {size / 2**20:.0f} MiB (bf16, tp2), median of {args.repeat} interleaved runs")
    rows: list[list[Any]] = [[k, med[k], cpu[k], round(rss[k] / 2**20)] for k in sides]
    rows.append([f"floor (input hash {low['input_s']:.2f}, engine {low['engine_s']:.2f}, output hash "
                 f"{low['output_s']:.2f})", low["floor_s"], "", ""])
    rows += [[f"ratio {k} (target {doc['targets'].get(k, '-')})", v, "", ""] for k, v in doc["ratios"].items()]
    print(f"disk (dd oflag=direct) {doc['disk_dd_direct_Bps'] / 1e6:.0f} MB/s, input read+sha256 "
          f"{doc['input_read_and_hash_Bps'] / 1e6:.0f} MB/s on {low['threads']} threads, sha256 in cache "
          f"{low['sha256_in_cache_Bps'] / 1e6:.0f} MB/s per core; mapped peak RSS within 256 MB + largest tensor "
          f"({largest / 2**20:.0f} MiB): {doc['mapped_rss_within_budget']}")
    report("hf_mapping", ["side", "median wall s", "median CPU s", "peak RSS MiB"], rows, doc)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
