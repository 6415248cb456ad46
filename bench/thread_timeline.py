"""Which threads of a command use the CPU, and when: a timeline in bins (issue #36).

Runs COMMAND, samples ``/proc/<pid>/task/*/stat`` of it and of every descendant (the embedded
OPA, a contained worker) every ``--sample`` seconds, and prints, per ``--bin``, how many cores
were busy and the busiest threads by name.  Python before 3.14 gives its threads no kernel name,
so a ``sitecustomize`` put first on the command's ``PYTHONPATH`` names each ``threading.Thread``
after its Python name (``ckptgate-digest_0`` -> ``ckptgate-digest``), truncated to the kernel's
15 characters (it takes the place of any ``sitecustomize`` the interpreter has).  Resolution is
the kernel's clock tick (10 ms here); the sampler's own CPU is not counted, nor a thread's CPU
after its last sample.  Used in ``docs/benchmarks.md`` (issue #36) to find idle cores and a copy that fell
behind the digest.

    .venv/bin/python bench/thread_timeline.py [--bin 0.1] [--json OUT] -- .venv/bin/python SCRIPT ARGS...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_NAMING = """\
import ctypes, threading
_libc = ctypes.CDLL(None)
_run = threading.Thread.run
def _named_run(self):
    _libc.prctl(15, self.name.rstrip("0123456789_").encode()[:15], 0, 0, 0)
    return _run(self)
threading.Thread.run = _named_run
"""
_TICK = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[tuple[int, str], float]:
    """(tid, name) -> CPU seconds of every thread of ``pid``."""
    out: dict[tuple[int, str], float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{t}/stat").read_text()
            name = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[(int(t), name)] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _tree(pid: int) -> list[int]:
    found = [pid]
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            for child in Path(f"/proc/{pid}/task/{t}/children").read_text().split():
                found += _tree(int(child))
    except OSError:
        pass
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=float, default=0.1, help="seconds per row (default 0.1)")
    ap.add_argument("--sample", type=float, default=0.02, help="seconds between samples (default 0.02)")
    ap.add_argument("--top", type=int, default=5, help="threads named per row (default 5)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("name the command after --")
    with tempfile.TemporaryDirectory(prefix="thread-timeline-") as shim:
        Path(shim, "sitecustomize.py").write_text(_NAMING)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))}
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, env=env)
        samples: list[tuple[float, dict[tuple[int, str], float]]] = []
        while proc.poll() is None:
            now: dict[tuple[int, str], float] = {}
            for pid in _tree(proc.pid):
                now.update(_threads(pid))
            samples.append((time.perf_counter() - t0, now))
            time.sleep(args.sample)
        wall = time.perf_counter() - t0
    bins: dict[int, dict[str, float]] = {}
    last: dict[tuple[int, str], float] = {}
    for at, now in samples:
        row = bins.setdefault(int(at / args.bin), {})
        for key, cpu in now.items():
            if cpu > last.get(key, 0.0):
                name = f"{key[1]}:{key[0]}"
                row[name] = row.get(name, 0.0) + cpu - last.get(key, 0.0)
            last[key] = cpu
    rows = []
    for b in sorted(bins):
        busy = sum(bins[b].values()) / args.bin
        top = sorted(bins[b].items(), key=lambda kv: -kv[1])[: args.top]
        rows.append({"at_s": round(b * args.bin, 3), "busy_cores": round(busy, 2),
                     "threads": {k: round(v / args.bin, 2) for k, v in top}})
        named = "  ".join(f"{k}={v / args.bin:.2f}" for k, v in top)
        print(f"{b * args.bin:6.1f} s  busy {busy:4.2f} cores | {named}")
    total = sum(last.values())
    print(f"wall {wall:.2f} s, exit {proc.returncode}, CPU {total:.2f} s ({total / wall:.2f} cores on average)")
    if args.json:
        args.json.write_text(json.dumps({"wall_s": wall, "cpu_s": total, "rows": rows}, indent=1))
    sys.exit(proc.returncode if proc.returncode >= 0 else 128 - proc.returncode)


if __name__ == "__main__":
    main()
