"""Consolidation benchmark: ckptgate intake against the tool a user would use, and ``cp``.

Cases (generated under --workdir at --size bytes each, 2 gloo ranks on CPU):

* ``dcp-torch-save``: an FSDP2-style ``DTensor`` ``Shard(0)`` state dict saved with DCP's
  FileSystemWriter; the tool is ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``.
* ``dcp-hf``: the same saved with ``HuggingFaceStorageWriter``; the tool is torch's
  ``consolidate_safetensors_files`` (1 and 2 threads).

``ckptgate`` is the whole ``pipeline.intake``: walk, inspect, sha256 digest of every input byte,
a signed qualification statement verified, the embedded OPA decision, the plan, the streaming
writer and atomic publication.  Every side runs in its own subprocess; peak RSS is that
process's ``ru_maxrss`` from ``wait4`` (its waited-for descendants included, e.g. a worker).
The DeepSpeed ZeRO-3 case of issue 6 is not implemented here (see docs/consolidation.md).

    .venv/bin/python bench/bench_consolidate.py --size 512M
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from torch.distributed.tensor import distribute_tensor, Shard
import torch.distributed.checkpoint as dcp
kind, out, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
n_tensors = 16
rows = max(2, size // n_tensors // (4 * 4096))
g = torch.Generator().manual_seed(0)
sd = {}
for i in range(n_tensors):
    full = torch.randn(rows, 4096, generator=g)
    sd[f"layers.{i}.weight"] = distribute_tensor(full, mesh, [Shard(0)])
if kind == "hf":
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    writer = HuggingFaceStorageWriter(out, save_distributed=True)
else:
    writer = dcp.FileSystemWriter(out)
dcp.save(sd, storage_writer=writer)
dist.destroy_process_group()
"""

_SIDE = r"""
import json, sys, time
from pathlib import Path
side, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t0 = time.perf_counter()
if side == "ckptgate":
    sys.path.insert(0, sys.argv[4])
    from pipeline_helpers import Signer
    from ckptgate.pipeline import intake
    s = Signer(key_path=Path(sys.argv[5]), trust_file=Path(sys.argv[6]))
    intake(src, dst, attestations=[Path(sys.argv[7])], options=s.options, max_shard_bytes=2 << 30)
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
print(json.dumps({"wall_s": time.perf_counter() - t0}))
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
    os.execv(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
sys.stderr.write("\n" + json.dumps({"rc": os.waitstatus_to_exitcode(status), "wall_s": time.perf_counter() - t0,
                                    "maxrss_kib": ru.ru_maxrss}) + "\n")
"""


def run_measured(argv: list[str]) -> dict[str, Any]:
    """Run argv under the launcher; its wall time and peak RSS (``wait4`` of that one process tree:
    the process and every descendant it waited for)."""
    proc = subprocess.run([sys.executable, "-I", "-c", _LAUNCH, *argv], capture_output=True, check=False)
    err = proc.stderr.decode()
    rec = json.loads(err.strip().splitlines()[-1])
    if rec["rc"] != 0:
        raise SystemExit(f"{argv[:4]} failed ({rec['rc']}):\n{err[-3000:]}")
    out = proc.stdout.decode().strip()
    inner = json.loads(out.splitlines()[-1]) if out else {}
    return {"wall_s": rec["wall_s"], "inner_s": inner.get("wall_s"), "peak_rss_bytes": rec["maxrss_kib"] * 1024}


def generate(kind: str, out: Path, size: int) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    script = _write(out.parent / f"gen_{kind}.py", _GEN)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    str(script), kind, str(out), str(size)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def main() -> None:
    from _common import report
    from pipeline_helpers import attest, make_signer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G", help="checkpoint size per case (e.g. 256M, 2G; default 2G)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/ckptgate-bench-consolidate"))
    ap.add_argument("--cases", default="dcp-torch-save,dcp-hf")
    args = ap.parse_args()
    size = parse_size(args.size)
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    signer = make_signer(work)
    side_py = _write(work / "side.py", _SIDE)
    py = sys.executable
    rows: list[list[Any]] = []
    doc: dict[str, Any] = {"size_bytes": size, "cases": {}}
    for case in args.cases.split(","):
        src = work / case / "checkpoint"
        src.parent.mkdir()
        generate("hf" if case == "dcp-hf" else "ts", src, size)
        nbytes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        fmt = "dcp-hf-safetensors" if case == "dcp-hf" else "dcp-torch-save"
        meta = {"versions": {"torch": __import__("torch").__version__.split("+")[0]}}
        att = attest(signer, src, work / case / "att.json", fmt=fmt, meta=meta)
        tools = ["dcp_to_torch_save"] if case == "dcp-torch-save" else \
            ["consolidate_safetensors_files_t1", "consolidate_safetensors_files_t2"]
        res: dict[str, Any] = {"input_bytes": nbytes}
        subprocess.run(["sync"], check=False)
        res["cp"] = run_measured([shutil.which("cp") or "/bin/cp", "-r", str(src), str(work / case / "cp")])
        res["ckptgate"] = run_measured([py, str(side_py), "ckptgate", str(src), str(work / case / "out-ckptgate"),
                                        str(REPO / "tests"), str(signer.key_path), str(signer.trust_file),
                                        str(att)])
        for tool in tools:
            res[tool] = run_measured([py, str(side_py), tool, str(src), str(work / case / f"out-{tool}")])
        largest = max(p.stat().st_size for p in (work / case / "out-ckptgate").glob("*.safetensors"))
        res["largest_tensor_bytes"] = nbytes // 16
        res["largest_output_shard_bytes"] = largest
        doc["cases"][case] = res
        g = res["ckptgate"]
        for name in ["cp", *tools]:
            r = res[name]
            rows.append([case, name, r["wall_s"], r["peak_rss_bytes"] / 2**20, g["wall_s"],
                         g["peak_rss_bytes"] / 2**20, r["wall_s"] / g["wall_s"]])
        for p in (work / case).glob("out-*"):
            shutil.rmtree(p, ignore_errors=True)
        shutil.rmtree(work / case / "cp", ignore_errors=True)
    report("bench_consolidate", ["case", "vs", "its s", "its peak MiB", "ckptgate s",
                                 "ckptgate peak MiB", "its s / ckptgate s"], rows, doc)


if __name__ == "__main__":
    main()
