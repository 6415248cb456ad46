"""The work budgets: hostile pickles cost work bounded by their bytes (docs/benchmarks.md).

    python bench/bench_inspect_budget.py [--sizes 4096,65536,1048576] [--runs 5]

1. Four copies of a 1.1 KB memo-expansion ("billion laughs") torch zip, inspected as one tree:
   refused (the whole-intake budget).  Target: under 1 s.
2. For each size N, hostile inputs of about N bytes (a torch zip whose data.pkl is the attack,
   padded with a storage where the attack is smaller than N) against clean ``torch.save`` checkpoints of
   about N bytes, timing ``inspect_tree`` (median of ``--runs``).  Two clean checkpoints: one
   mostly tensor bytes (one tensor), one mostly pickle (a state dict of many tiny tensors, the
   pickle-heaviest a real checkpoint gets).  Target: every hostile input at most 2x the clean one.

Writes bench/results/bench_inspect_budget.json.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report  # noqa: E402

from ckptgate.errors import InputRejected  # noqa: E402
from ckptgate.inspect import inspect_tree  # noqa: E402


def laughs(depth: int = 30, width: int = 10) -> bytes:
    out = bytearray(b"\x80\x02]q\x00")
    for i in range(1, depth + 1):
        out += b"0](" + (b"h" + bytes([i - 1])) * width + b"eq" + bytes([i])
    return bytes(out + b".")


def torch_zip(pkl: bytes, size: int = 0) -> bytes:
    """A torch zip around ``pkl``, padded to about ``size`` bytes with a storage (as a clean one's)."""
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")
        if size > len(pkl) + 600:
            z.writestr("archive/data/0", bytes(size - len(pkl) - 600))
    return b.getvalue()


# -- hostile data.pkl bodies of about n bytes ----------------------------------------------------
def h_laughs(n: int) -> bytes:
    """The deepest billion laughs that fits (levels of 10 memo references, 256 memo slots max)."""
    return laughs(depth=min(255, max(1, (n - 8) // 25)))


def h_shared_tuples(n: int) -> bytes:
    k = max(1, min(150, (n - 8) // 9))
    body = b"\x80\x04]\x940" + b"0".join(b"j" + struct.pack("<I", i) + b"j" + struct.pack("<I", i) + b"\x86\x94"
                                         for i in range(k))
    return body + b"."


def h_deep(n: int) -> bytes:
    d = max(2, (n - 4) // 2)
    return b"\x80\x02" + b"]" * d + b"a" * (d - 1) + b"."


def h_big_string(n: int) -> bytes:
    s = max(1, n // 2)
    refs = max(1, (n - s) // 2)
    return b"\x80\x02X" + struct.pack("<I", s) + b"x" * s + b"q\x00" + b"0](" + b"h\x00" * refs + b"e."


def h_big_key(n: int) -> bytes:
    s = max(1, n // 2)
    items = max(1, n - s - 16)
    return b"\x80\x02}X" + struct.pack("<I", s) + b"k" * s + b"](" + b"N" * items + b"es."


def h_appends(n: int) -> bytes:
    return b"\x80\x02](" + b"N" * max(1, n - 6) + b"e."


def h_builds(n: int) -> bytes:
    return b"\x80\x02ccollections\nOrderedDict\n)R" + b"}b" * max(1, (n - 40) // 2) + b"."


HOSTILE: dict[str, Callable[[int], bytes]] = {
    "billion laughs": h_laughs, "shared tuples": h_shared_tuples, "deep nesting": h_deep,
    "repeated big string": h_big_string, "repeated big key": h_big_key, "long APPENDS run": h_appends,
    "long BUILD run": h_builds,
}


def write_hostile(root: Path, name: str, n: int) -> None:
    root.mkdir(parents=True)
    if name == "many laughs files":
        one = torch_zip(laughs())
        for i in range(max(1, n // len(one))):
            (root / f"m{i}.pt").write_bytes(one)
        return
    (root / "model.pt").write_bytes(torch_zip(HOSTILE[name](n - 600), n))


def write_clean(root: Path, kind: str, n: int) -> None:
    import torch

    root.mkdir(parents=True)
    if kind == "tensor-heavy":
        sd = {"weight": torch.zeros(max(1, (n - 1200) // 4), dtype=torch.float32)}
    else:  # each tiny tensor costs ~150 bytes of pickle and ~70 of zip entry
        sd = {f"model.layers.{i}.mlp.w": torch.zeros(1, dtype=torch.float32) for i in range(max(1, n // 220))}
    torch.save(sd, root / "model.pt")


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def time_inspect(root: Path, runs: int) -> tuple[float, str]:
    times, outcome = [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        try:
            ins = inspect_tree(root)
            outcome = "clean" if ins.clean else ",".join(sorted({f.code for f in ins.findings if f.severity == "error"}))
        except InputRejected as e:
            outcome = f"{e.code} ({e.evidence.get('budget')})"
        times.append(time.perf_counter() - t0)
    return statistics.median(times), outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096,65536,1048576")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ckptgate-bench-budget-"))
    try:
        four = work / "four"
        four.mkdir()
        for i in range(4):
            (four / f"m{i}.pt").write_bytes(torch_zip(laughs()))
        t4, out4 = time_inspect(four, a.runs)
        rows: list[list[object]] = [["four billion-laughs files", tree_bytes(four), out4, f"{t4:.4f}", "", "",
                                     "yes" if t4 < 1.0 else "NO"]]
        cases: list[dict[str, object]] = []
        all_met = True
        for n in sizes:
            clean: dict[str, float] = {}
            for kind in ("tensor-heavy", "pickle-heavy"):
                root = work / f"clean-{kind}-{n}"
                write_clean(root, kind, n)
                clean[kind], outcome = time_inspect(root, a.runs)
                assert outcome == "clean", outcome
                rows.append([f"clean {kind}", tree_bytes(root), outcome, f"{clean[kind]:.4f}", "", "", ""])
            for name in [*HOSTILE, "many laughs files"]:
                root = work / f"{name.replace(' ', '-')}-{n}"
                write_hostile(root, name, n)
                t, outcome = time_inspect(root, a.runs)
                r_t, r_p = t / clean["tensor-heavy"], t / clean["pickle-heavy"]
                met = r_p <= 2.0
                all_met &= met
                rows.append([name, tree_bytes(root), outcome[:60], f"{t:.4f}", f"{r_t:.2f}", f"{r_p:.2f}",
                             "yes" if met else "NO"])
                cases.append({"input": name, "n": n, "bytes": tree_bytes(root), "outcome": outcome, "median_s": t,
                              "clean_tensor_heavy_s": clean["tensor-heavy"],
                              "clean_pickle_heavy_s": clean["pickle-heavy"],
                              "ratio_vs_tensor_heavy": r_t, "ratio_vs_pickle_heavy": r_p, "met": met})
        report("bench_inspect_budget",
               ["input", "bytes", "outcome", "median s", "x tensor-heavy", "x pickle-heavy", "<= 2x / < 1 s"], rows,
               {"four_files": {"bytes": tree_bytes(four), "outcome": out4, "median_s": t4, "target_s": 1.0,
                               "met": t4 < 1.0},
                "ratio_target": 2.0, "ratio_met_vs_pickle_heavy": all_met,
                "ratio_met_vs_tensor_heavy": all(c["ratio_vs_tensor_heavy"] <= 2.0 for c in cases),
                "cases": cases, "runs": a.runs})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
