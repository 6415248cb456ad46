"""Consolidation benchmark: ckptgate intake against the tool a user would use, and ``cp``.

``cp`` leaves its copy in the page cache; ``cp+sync`` (``cp -r`` then ``sync -f`` of the
destination's file system) is reported beside it, because ckptgate returns with its output on
disk, and ``dd oflag=direct`` of the same bytes (the disk's speed for them).  Each peer tool is
also run followed by ``sync -f`` of its output (``TOOL+sync``), since its output is not durable
when it returns.

Cases (generated under --workdir at --size bytes each, 2 gloo ranks on CPU):

* ``dcp-torch-save``: an FSDP2-style ``DTensor`` ``Shard(0)`` state dict saved with DCP's
  FileSystemWriter; the tool is ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``.
* ``dcp-hf``: the same saved with ``HuggingFaceStorageWriter``; the tool is torch's
  ``consolidate_safetensors_files`` (1 and 2 threads).
* ``deepspeed-zero3``: a ZeRO-3 bf16 checkpoint of a model with about --size bytes of bf16 params
  (``bench/_zero3_producer.py``: 1 AdamW step, ``engine.save_checkpoint``; about 12 bytes per param
  on disk, so 256M gives ~134M params and ~1.6 GB); generated once and cached under
  --workdir/cache.  The tool is DeepSpeed's ``convert_zero_checkpoint_to_fp32_state_dict``
  (safetensors output).  Before timing, one untimed run of each side checks that ckptgate's output
  equals DeepSpeed's bit for bit (names, dtype, shape, bytes of every tensor).

``ckptgate_wN`` is the whole ``pipeline.intake`` with ``workers=N`` (``--workers``, one side per
value, default 1 and 2): walk, inspect, sha256 digest of every input byte, a signed qualification
statement verified, the embedded OPA decision, the plan, the write with the output sha256 and
atomic publication.  ``--baseline DIR`` adds ``ckptgate@baseline``, the same intake from another
``src/`` (``git archive main src policies pyproject.toml | tar -x -C DIR``, then ``DIR/src``), for
a before/after in one run.  Every side
runs in its own subprocess; its wall time, CPU time (user + system) and peak RSS come from
``wait4`` (its waited-for descendants included, e.g. the embedded OPA).  Each side runs --repeat
times, the sides interleaved, each run after ``sync`` and with its previous output removed; the
table shows medians (every run's wall time is in the JSON), the CPU seconds, and the input's GB
per CPU-second ("GB/s per core used": less noisy than the wall time on a shared machine).  The
outputs of the worker counts must be the same bytes, or the bench fails.

The targets are issue #36's (:func:`targets`): the floor is the largest of ``dd oflag=direct``
of the output (the ``dd`` side copies the input; its rate, printed beside every result, is
scaled to the output's bytes), the input's and the output's
sha256 spread over the cores, and one core's sha256 of the largest output shard; the process
start is the time from exec to the first byte read (``start_s``, measured in the side).
ckptgate's side also reports the gate (inspect, digest, decide; in one pass the staged copy runs
beside the digest) and the copy step (the rest of the write, the index, publication).

    .venv/bin/python bench/bench_consolidate.py --size 512M
    .venv/bin/python bench/bench_consolidate.py --size 256M --cases deepspeed-zero3
"""

from __future__ import annotations

import argparse
import importlib.metadata
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

_GEN = r"""
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
import torch.distributed.checkpoint as dcp
kind, out, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
n_tensors = 16
rows = max(world, size // n_tensors // (4 * 4096) // world * world)
sd = {}
for i in range(n_tensors):  # each rank makes only its own shard: memory is the rank's share, not the model
    g = torch.Generator().manual_seed(i * world + rank)
    local = torch.randn(rows // world, 4096, generator=g)
    sd[f"layers.{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
if kind == "hf":
    from torch.distributed.checkpoint import HuggingFaceStorageWriter as Writer
    kw = {"save_distributed": True}
else:
    Writer, kw = dcp.FileSystemWriter, {}
class InTurn(Writer):  # one rank serializes at a time: HuggingFaceStorageWriter holds ~3x its shard while it does
    def write_data(self, plan, planner):
        for turn in range(world):
            if turn == rank:
                done = super().write_data(plan, planner)
                done.wait()
            dist.barrier()
        return done
dcp.save(sd, storage_writer=InTurn(out, **kw))
print(f"rank {rank} saved", flush=True)
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
"""

_SIDE = r"""
import json, os, sys, time
from pathlib import Path
side, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t0 = time.perf_counter()
phases = {}
def timed(name, fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
    return run
if side.startswith("ckptgate"):
    sys.path.insert(0, sys.argv[4])
    from pipeline_helpers import Signer
    import ckptgate.grouped as grouped
    import ckptgate.pipeline as pipeline
    from ckptgate.inspect import SafeTree
    opened = SafeTree.open.__func__
    def first_open(cls, *a, **k):  # the process start: from exec (the launcher's clock) to the first byte read
        phases.setdefault("start_s", time.time() - float(os.environ["BENCH_EXEC_AT"]))
        return opened(cls, *a, **k)
    SafeTree.open = classmethod(first_open)
    # the gate (inspect, digest, decide; in one pass the staged copy runs beside the digest), then
    # the copy step (the rest of the write, the index, publication)
    grouped.measure = timed("gate_s", grouped.measure)
    grouped.judge = timed("gate_s", grouped.judge)
    grouped.write_all = timed("copy_s", grouped.write_all)
    grouped.OnePass.finish = timed("copy_s", grouped.OnePass.finish)
    grouped.published = timed("copy_s", grouped.published)
    s = Signer(key_path=Path(sys.argv[5]), trust_file=Path(sys.argv[6]))
    kw = {"workers": int(sys.argv[8])} if len(sys.argv) > 8 else {}
    pipeline.intake(src, dst, attestations=[Path(sys.argv[7])], options=s.options, max_shard_bytes=2 << 30, **kw)
elif side == "dcp_to_torch_save":
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    dst.mkdir()
    dcp_to_torch_save(str(src), str(dst / "model.pt"))
elif side.startswith("consolidate_safetensors_files"):
    import torch.distributed.checkpoint._consolidate_hf_safetensors as c
    from safetensors import safe_open
    dst.mkdir()
    names = set()
    for f in src.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            names.update(h.keys())
    c.consolidate_safetensors_files(str(src), str(dst), fqn_to_index_mapping={n: 1 for n in names},
                                    num_threads=int(side.rsplit("_t", 1)[1]))
elif side == "zero_to_fp32":
    from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
    convert_zero_checkpoint_to_fp32_state_dict(str(src), str(dst), safe_serialization=True)
print(json.dumps({"wall_s": time.perf_counter() - t0, **phases}))
"""

#: Compare two safetensors output directories tensor by tensor (one tensor in memory at a time).
_SAME = r"""
import json, sys
from pathlib import Path
from safetensors import safe_open
def index(d):
    out = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: f for k in h.keys()})
    return out
a, b = index(sys.argv[1]), index(sys.argv[2])
if sorted(a) != sorted(b):
    raise SystemExit(f"tensor names differ: {sorted(set(a) ^ set(b))[:10]}")
n, dtypes = 0, set()
for k in sorted(a):
    with safe_open(str(a[k]), "pt") as ha, safe_open(str(b[k]), "pt") as hb:
        x, y = ha.get_tensor(k), hb.get_tensor(k)
    if (x.dtype, tuple(x.shape)) != (y.dtype, tuple(y.shape)):
        raise SystemExit(f"{k}: {x.dtype} {tuple(x.shape)} != {y.dtype} {tuple(y.shape)}")
    if x.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes() != \
            y.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes():
        raise SystemExit(f"{k}: bytes differ")
    n += x.numel()
    dtypes.add(str(x.dtype))
print(json.dumps({"tensors": len(a), "numel": n, "dtypes": sorted(dtypes)}))
"""


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


#: A small, fresh launcher forks the measured command, so the command's ru_maxrss starts from the
#: launcher's few MB and not from this (torch-importing) process's RSS, which fork would carry in.
_LAUNCH = r"""
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.environ["BENCH_EXEC_AT"] = repr(time.time())
    os.execv(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
sys.stderr.write("\n" + json.dumps({"rc": os.waitstatus_to_exitcode(status), "wall_s": time.perf_counter() - t0,
                                    "maxrss_kib": ru.ru_maxrss, "cpu_s": ru.ru_utime + ru.ru_stime}) + "\n")
"""


def run_measured(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run argv under the launcher; its wall time, peak RSS and CPU seconds (user + system) (``wait4``
    of that one process tree: the process and every descendant it waited for).  On a shared machine
    the CPU seconds move less than the wall time: they do not count the time spent waiting for a core."""
    proc = subprocess.run([sys.executable, "-I", "-c", _LAUNCH, *argv], capture_output=True, check=False,
                          env=None if env is None else {**os.environ, **env})
    err = proc.stderr.decode()
    rec = json.loads(err.strip().splitlines()[-1])
    if rec["rc"] != 0:
        raise SystemExit(f"{argv[:4]} failed ({rec['rc']}):\n{err[-3000:]}")
    out = proc.stdout.decode().strip()
    inner = json.loads(out.splitlines()[-1]) if out else {}
    return {"wall_s": rec["wall_s"], "inner_s": inner.get("wall_s"), "peak_rss_bytes": rec["maxrss_kib"] * 1024,
            "cpu_s": rec["cpu_s"], **{k: v for k, v in inner.items() if k in ("gate_s", "copy_s", "start_s")}}


def _torchrun(argv: list[str]) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           *argv], check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(f"generator {argv[0]} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")


def generate(kind: str, out: Path, size: int) -> None:
    script = _write(out.parent / f"gen_{kind}.py", _GEN)
    _torchrun([str(script), kind, str(out), str(size)])


def generate_zero3(cache: Path, size: int) -> Path:
    """The ZeRO-3 checkpoint for ``size`` bytes of bf16 params, generated once under ``cache``."""
    src = cache / f"deepspeed-zero3-{size}" / "checkpoint"
    done = src.parent / "done"
    if not done.exists():
        shutil.rmtree(src.parent, ignore_errors=True)
        src.parent.mkdir(parents=True)
        _torchrun([str(HERE / "_zero3_producer.py"), str(src), str(size)])
        done.write_text("ok\n")
    return src


def largest_tensor_bytes(out: Path) -> int:
    """The largest tensor in a safetensors output directory, from the headers' data offsets."""
    best = 0
    for f in out.glob("*.safetensors"):
        with f.open("rb") as h:
            header = json.loads(h.read(int.from_bytes(h.read(8), "little")))
        best = max([best, *(e - b for k, v in header.items() if k != "__metadata__"
                            for b, e in [v["data_offsets"]])])
    return best


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


#: ``dd oflag=direct`` of every input file (same bytes, same tree shape) into $2, 4 MiB blocks.
_DD = ('cd "$1" && find . -type d -exec mkdir -p "$2/{}" \\; && '
       'find . -type f -exec dd if={} of="$2/{}" bs=4M oflag=direct status=none \\;')

#: case -> (format for the attestation, the tools a user would use).
CASES: dict[str, tuple[str, list[str]]] = {
    "dcp-torch-save": ("dcp-torch-save", ["dcp_to_torch_save"]),
    "dcp-hf": ("dcp-hf-safetensors", ["consolidate_safetensors_files_t1", "consolidate_safetensors_files_t2"]),
    "deepspeed-zero3": ("deepspeed-zero3", ["zero_to_fp32"]),
}
MIB = 1 << 20


#: In a fresh process: how long ckptgate's embedded OPA takes from its launch (its policies staged
#: and signed, ``opa run``) until it answers its health check; Python's start and imports excluded.
_ENGINE = r"""
import time
from ckptgate.decide.engine import EmbeddedOpa
t0 = time.perf_counter()
EmbeddedOpa().close()
print(time.perf_counter() - t0)
"""


def floor(src: Path, out: Path, repeat: int = 3) -> dict[str, Any]:
    """The least time any intake like ckptgate's can take here and now: the decision needs the
    input's digest and a running policy engine; the output's sha256 can only follow it.

    * Input: the plainest ``preadv`` + sha256 loop over every input file from the page cache
      (:func:`_common.plain_sha256_seconds`), as the fixture digest must read them; the fastest
      way to read and hash a file measured on this machine (``docs/benchmarks.md``).
    * Engine: the embedded OPA, launched with ckptgate's policies in a fresh process, until it
      answers its health check (Python's start and imports not counted). It can run beside the
      input's hash, so the decision comes no sooner than the later of the two.
    * Output: every output byte at one core's sha256 speed on a buffer in its cache, the fastest
      sha256 goes, one stream per output file, the files spread over the cores.

    So the floor is ``max(input, engine) + output``. Copying, writing, verifying the signature and
    the interpreter's start on the input's side come on top.
    """
    from _common import plain_sha256_seconds, single_core_sha256

    from ckptgate.inspect._threads import usable_cores

    ins = [p for p in src.rglob("*") if p.is_file()]
    sizes = [p.stat().st_size for p in out.glob("*.safetensors")]
    cores = usable_cores()
    in_s = statistics.median(plain_sha256_seconds(ins, cores) for _ in range(repeat))
    engine_s = statistics.median(float(subprocess.run([sys.executable, "-I", "-c", _ENGINE], capture_output=True,
                                                      check=True, text=True).stdout) for _ in range(repeat))
    rate = max(single_core_sha256(256 << 10) for _ in range(repeat))
    out_s = max(max(sizes), sum(sizes) / cores) / rate
    return {"input_s": in_s, "engine_s": engine_s, "output_s": out_s, "floor_s": max(in_s, engine_s) + out_s,
            "threads": cores, "sha256_in_cache_Bps": rate}


def targets(case: str, res: dict[str, Any], tools: list[str], gate: str) -> dict[str, Any]:
    """Issue 36's targets for a case (``gate`` names the ckptgate side they are held against):
    measured value, met or not, and the time the target allows.

    * ckptgate at most 1.3x (the floor + the process start).  The floor is the largest of
      ``dd oflag=direct`` of the output (the bench's ``dd`` side copies the input, which gives
      the disk's durable speed; the term scales it to the output's bytes: a ZeRO-3 checkpoint's
      output is a third of its input), the input's and the
      output's sha256 spread over the cores, and one core's sha256 of the largest output shard
      (each shard's hash is serial), at sha256's in-cache speed; the process start is the bench's
      measured time from exec to the first byte read (``start_s``);
    * at least 3x faster than each peer tool followed by ``sync`` (equal durability);
    * peak RSS at most 256 MB + the largest tensor (for every ckptgate side, whatever its workers);
    * on a slow disk (the output's ``dd oflag=direct`` slower than the sha256 terms), within 1.1x of it.

    Beside the first target it records the least wall time the gate side's own CPU allows here if
    its start runs on one core and the rest at best on all of them, ``cpu_bound_s`` = start +
    (CPU-seconds - start) / cores (the medians of the runs' CPU and start), and that bound's ratio:
    where the ratio is above 1.3, the target is out of reach at the CPU ckptgate spends, however
    well its threads are scheduled after the start.
    """
    g = res[gate]
    h = res["floor"]
    rate, cores = h["sha256_in_cache_Bps"], h["threads"]
    out_bytes = res["output_bytes"]
    terms = {"dd_direct_s": res["dd_direct"]["wall_s"] * out_bytes / res["input_bytes"],
             "sha256_spread_s": (res["input_bytes"] + out_bytes) / (cores * rate),
             "sha256_largest_shard_s": res["largest_output_shard_bytes"] / rate}
    floor36 = max(terms.values())
    start = g.get("start_s") or 0.0
    allowed = 1.3 * (floor36 + start)
    bound = start + (g["cpu_s"] - start) / cores  # the start on one core, the rest on all of them
    out: dict[str, Any] = {"le_1.3x_floor_plus_start": {
        "value": g["wall_s"] / (floor36 + start), "met": g["wall_s"] <= allowed, "allowed_s": allowed,
        "floor_s": floor36, "start_s": start, "floor_terms": terms,
        "cpu_bound_s": bound, "cpu_bound_ratio": bound / (floor36 + start),
        "disk_regime": "slow" if terms["dd_direct_s"] >= max(terms.values()) else "fast"}}
    if out["le_1.3x_floor_plus_start"]["disk_regime"] == "slow":
        out["le_1.1x_dd_direct_on_a_slow_disk"] = {"value": g["wall_s"] / terms["dd_direct_s"],
                                                   "met": g["wall_s"] <= 1.1 * terms["dd_direct_s"]}
    budget = 256 * 10**6 + res["largest_tensor_bytes"]
    for name, r in res.items():
        if isinstance(r, dict) and name.startswith("ckptgate") and "peak_rss_bytes" in r:
            out[f"peak_rss_le_256MB_plus_largest_tensor ({name})"] = {
                "value_bytes": r["peak_rss_bytes"], "limit_bytes": budget, "met": r["peak_rss_bytes"] <= budget}
    for tool in tools:
        speed = res[f"{tool}+sync"]["wall_s"] / g["wall_s"]
        out[f"speedup_ge_3x_vs_{tool}+sync"] = {"value": speed, "met": speed >= 3,
                                                "allowed_s": res[f"{tool}+sync"]["wall_s"] / 3}
    if case == "deepspeed-zero3":
        rss = g["peak_rss_bytes"] / res[tools[0]]["peak_rss_bytes"]
        out["peak_rss_le_one_eighth_of_zero_to_fp32"] = {"value": rss, "met": rss <= 1 / 8}
    return out


def main() -> None:
    from _common import report
    from pipeline_helpers import attest, make_signer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="checkpoint size per DCP case, bf16 param bytes for "
                                                  "deepspeed-zero3 (e.g. 256M, 2G; default 2G)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ckptgate-bench-consolidate"))
    ap.add_argument("--cases", default="dcp-torch-save,dcp-hf,deepspeed-zero3")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every side, interleaved; the median wall time "
                                                          "and the highest peak RSS are reported (default 3)")
    ap.add_argument("--workers", default="1,2", help="ckptgate sides, one per --workers value (comma-separated; "
                                                     "default 1,2); the targets are held against the last")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a src/ directory of another ckptgate (`git archive main src policies pyproject.toml "
                         "| tar -x -C DIR`, then DIR/src): "
                         "run it as one more side, ckptgate@baseline, for a before/after in one run")
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints under --workdir "
                                                        "(and reuse them when they are there)")
    args = ap.parse_args()
    size = parse_size(args.size)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    os.environ["DS_ACCELERATOR"] = "cpu"
    signer = make_signer(work)
    side_py = _write(work / "side.py", _SIDE)
    same_py = _write(work / "same.py", _SAME)
    py = sys.executable
    versions = {"versions": {"torch": __import__("torch").__version__.split("+")[0],
                             "deepspeed": importlib.metadata.version("deepspeed")}}
    worker_counts = [int(w) for w in args.workers.split(",")]
    gate = f"ckptgate_w{worker_counts[-1]}"
    rows: list[list[Any]] = []
    doc: dict[str, Any] = {"size_bytes": size, "cases": {}, "workers": worker_counts}
    for case in args.cases.split(","):
        fmt, tools = CASES[case]
        if case == "deepspeed-zero3":
            shutil.rmtree(work / case, ignore_errors=True)
            (work / case).mkdir()
            src = generate_zero3(work / "cache", size)
        else:
            src = work / case / "checkpoint"
            if not (args.keep and (work / case / "generated").exists()):
                shutil.rmtree(work / case, ignore_errors=True)
                (work / case).mkdir()
                generate("hf" if case == "dcp-hf" else "ts", src, size)
                (work / case / "generated").write_text("ok\n")
        nbytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        att = attest(signer, src, work / case / "att.json", fmt=fmt, meta=versions)
        gate_argv = [py, str(side_py), "ckptgate", str(src), "OUT",
                     str(REPO / "tests"), str(signer.key_path), str(signer.trust_file), str(att)]
        res: dict[str, Any] = {"input_bytes": nbytes}
        if case == "deepspeed-zero3":  # untimed: the outputs must agree bit for bit before timing
            run_measured([*gate_argv[:4], str(work / case / "out-ckptgate"), *gate_argv[5:]])
            run_measured([py, str(side_py), tools[0], str(src), str(work / case / f"out-{tools[0]}")])
            same = subprocess.run([py, str(same_py), str(work / case / "out-ckptgate"),
                                   str(work / case / f"out-{tools[0]}")], capture_output=True, check=False)
            if same.returncode != 0:
                raise SystemExit(f"ckptgate and {tools[0]} outputs differ: {same.stderr.decode()[-2000:]}")
            res["bit_exact_vs_" + tools[0]] = json.loads(same.stdout.decode().strip().splitlines()[-1])
            print(f"{case}: ckptgate output equals {tools[0]} output bit for bit "
                  f"({res['bit_exact_vs_' + tools[0]]})")
            for p in (work / case).glob("out-*"):
                shutil.rmtree(p)
        cp = shutil.which("cp") or "/bin/cp"
        sh = shutil.which("sh") or "/bin/sh"
        none: dict[str, str] | None = None
        # the baseline's src/ on the path first; this checkout's OPA, which a bare src/ cannot find
        opa_bin = REPO / ".tools" / "bin" / "opa"
        opa = {"CKPTGATE_OPA": str(opa_bin)} if opa_bin.exists() else {}
        baseline_env = {"PYTHONPATH": str(args.baseline.resolve()), **opa} if args.baseline else None
        sides: dict[str, tuple[list[str], Path, dict[str, str] | None]] = {
            "cp": ([cp, "-r", str(src), str(work / case / "cp")], work / case / "cp", none),
            # ckptgate returns with its output on disk; this is cp held to the same
            "cp+sync": ([sh, "-c", f'"{cp}" -r "$1" "$2" && sync -f "$2"', "sh", str(src),
                         str(work / case / "cp-sync")], work / case / "cp-sync", none),
            # the disk's own speed for the same bytes: each file written with O_DIRECT
            "dd_direct": ([sh, "-c", _DD, "sh", str(src), str(work / case / "dd")], work / case / "dd", none),
            **{f"ckptgate_w{w}": ([*gate_argv[:4], str(work / case / f"out-w{w}"), *gate_argv[5:], str(w)],
                                  work / case / f"out-w{w}", none) for w in worker_counts},
            **({"ckptgate@baseline": ([*gate_argv[:4], str(work / case / "out-base"), *gate_argv[5:]],
                                      work / case / "out-base", baseline_env)}
               if args.baseline else {}),
            **{tool: ([py, str(side_py), tool, str(src), str(work / case / f"out-{tool}")],
                      work / case / f"out-{tool}", none) for tool in tools},
            **{f"{tool}+sync": ([sh, "-c", '"$1" "$2" "$3" "$4" "$5" && sync -f "$5"', "sh", py, str(side_py),
                                 tool, str(src), str(work / case / f"out-{tool}-sync")],
                                work / case / f"out-{tool}-sync", none) for tool in tools}}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        first = work / case / f"out-w{worker_counts[0]}"
        outs: dict[str, dict[str, str]] = {}
        for rep in range(args.repeat):  # interleaved, so a slow spell of the machine hits every side
            for name, (argv, out, env) in sides.items():
                shutil.rmtree(out, ignore_errors=True)
                subprocess.run(["sync"], check=False)  # every side starts with no dirty pages to flush
                runs[name].append(run_measured(argv, env))
                if name.startswith("ckptgate_w") and rep == args.repeat - 1:
                    outs[name] = {p.name: _sha256_file(p) for p in sorted(out.glob("*.safetensors"))}
                if out != first:  # all the sides' outputs at once outgrow the disk at 8 GiB
                    shutil.rmtree(out, ignore_errors=True)
        if len({json.dumps(o, sort_keys=True) for o in outs.values()}) != 1:
            raise SystemExit(f"{case}: the outputs differ between worker counts: {outs}")
        for name, rs in runs.items():
            res[name] = {"wall_s": statistics.median(r["wall_s"] for r in rs), "walls_s": [r["wall_s"] for r in rs],
                         "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                         "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rs),
                         **{k: statistics.median(r[k] for r in rs) for k in ("gate_s", "copy_s", "start_s")
                            if k in rs[0]}}
            res[name]["input_GBps"] = nbytes / res[name]["wall_s"] / 1e9
            res[name]["cores_used"] = res[name]["cpu_s"] / res[name]["wall_s"]
            res[name]["GBps_per_core_used"] = nbytes / res[name]["cpu_s"] / 1e9
        res["largest_tensor_bytes"] = largest_tensor_bytes(first)
        res["largest_output_shard_bytes"] = max(p.stat().st_size for p in first.glob("*.safetensors"))
        res["output_bytes"] = sum(p.stat().st_size for p in first.glob("*.safetensors"))
        res["floor"] = floor(src, first)
        res["disk_dd_direct_MBps"] = nbytes / res["dd_direct"]["wall_s"] / 1e6
        res["targets"] = targets(case, res, tools, gate)
        doc["cases"][case] = res
        disk = res["disk_dd_direct_MBps"]
        for name in sides:
            r = res[name]
            rows.append([case, name, round(r["wall_s"], 2), round(r["cpu_s"], 2), round(r["GBps_per_core_used"], 3),
                         round(r["peak_rss_bytes"] / MIB), round(r["wall_s"] / res[gate]["wall_s"], 2), round(disk)])
        t = res["targets"]["le_1.3x_floor_plus_start"]
        rows.append([case, "floor + start (issue 36)", round(t["floor_s"] + t["start_s"], 2), "", "", "",
                     round((t["floor_s"] + t["start_s"]) / res[gate]["wall_s"], 2), round(disk)])
        for _, out, _ in sides.values():  # every side's output goes; --keep keeps only the checkpoint
            shutil.rmtree(out, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(work / case, ignore_errors=True)
        print(f"{case}: input {nbytes / MIB:.0f} MiB, largest tensor {res['largest_tensor_bytes'] / MIB:.0f} MiB, "
              f"disk (dd oflag=direct) {disk:.0f} MB/s, targets: {json.dumps(res['targets'])}")
    report("bench_consolidate", ["case", "side", "median s", "CPU s", "GB/s per core-second", "peak MiB",
                                 "its s / ckptgate s", "disk MB/s (dd)"], rows, doc)


def _sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


if __name__ == "__main__":
    main()
