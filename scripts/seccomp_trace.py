#!/usr/bin/env python3
"""Measure the contained worker's system calls after its seccomp filter is loaded, per environment.

    <runtime venv>/bin/python scripts/seccomp_trace.py --env ENV --lock-sha256 HEX --out FILE \\
        --load FIXTURE ADAPTER STATUS TRACE [--load ...]

Each TRACE is the output of ``strace -f -ttt --pidns-translation -qq -o TRACE ckptgate qualify ...``
(``scripts/farm.py run --measure-seccomp`` makes them).  In each trace this finds every process that
ran ``python -I -B -m ckptgate.enforce._worker_main`` (the contained worker; the containment
preflight's probe child is not one), the process among them that loaded the seccomp filter
(``seccomp(SECCOMP_SET_MODE_FILTER, ...) = 0``), and every call that process and its threads made
from that instant on: the calls the filter judged.  Each call is classified against the filter's
own tables (:mod:`ckptgate.enforce.seccomp`), so a call the allowlist does not name is a *missing*
call, recorded, never guessed.  Nothing here needs root: strace traces its own children.

The output is the environment's committed fact file, ``qualification/seccomp/<env>.json``;
``tests/enforce/test_seccomp_facts.py`` re-classifies its calls against the current tables (drift).
It is run with the runtime environment's interpreter, which has pyseccomp (the tables import it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

FACTS_VERSION = 1
WORKER_MODULE = "ckptgate.enforce._worker_main"
METHOD = (
    "strace -f -ttt --pidns-translation of `ckptgate qualify` run with ckptgate in this environment; "
    "the calls of the contained worker process that loaded the seccomp filter, and of its threads, from "
    "the filter load on"
)
_LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(.*)$")
_CALL = re.compile(r"^([a-z_][a-z0-9_]*)\(")
_RESUMED = re.compile(r"^<\.\.\. ([a-z_][a-z0-9_]*) resumed>")
_RESULT = re.compile(r"\)\s+=\s+(-1 ([A-Z][A-Z0-9]*)|\?|-?[0-9]+|0x[0-9a-f]+)(?:\s.*)?$")
_FILTER_LOADED = re.compile(r"^seccomp\(SECCOMP_SET_MODE_FILTER,.*\)\s+=\s+0$")
_CHILD = ("clone", "clone3", "fork", "vfork")


@dataclass
class Process:
    pid: int
    parent: int | None = None
    worker: bool = False
    filtered_at: float | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)


def _result(rest: str) -> str | None:
    """``ok``, an errno name (``EPERM``), or None when the line has no result (unfinished)."""
    m = _RESULT.search(rest)
    if m is None:
        return None
    return m.group(2) or "ok"


def parse_trace(lines: Iterable[str]) -> dict[str, list[str]]:
    """{syscall: sorted result classes (``ok`` or an errno name)} of the calls the contained worker
    and its threads made after the worker loaded its seccomp filter.  A call still unfinished when
    the trace ends (a futex wait) is listed with no result."""
    procs: dict[int, Process] = {}
    exec_worker: dict[int, bool] = {}
    unfinished: dict[int, str] = {}  # pid -> the entry text of its call still in progress

    def proc(pid: int) -> Process:
        return procs.setdefault(pid, Process(pid))

    for raw in lines:
        m = _LINE.match(raw.rstrip("\n"))
        if m is None:
            continue
        pid, ts, rest = int(m.group(1)), float(m.group(2)), m.group(3)
        p = proc(pid)
        resumed = _RESUMED.match(rest)
        if resumed:
            name = resumed.group(1)
            # the call's arguments are on its entry line: ``seccomp(SECCOMP_SET_MODE_FILTER, ...`` is
            # split like that when another thread runs meanwhile (TSYNC)
            full = unfinished.pop(pid, name + "(") + rest[resumed.end():]
        else:
            call = _CALL.match(rest)
            if call is None:
                continue  # signals, exits
            name = call.group(1)
            full = rest
        if full.endswith("<unfinished ...>"):
            unfinished[pid] = full.removesuffix("<unfinished ...>").rstrip()
        result = None if full.endswith("<unfinished ...>") else _result(full)
        p.lines.append((ts, f"{name}\0{result or ''}"))
        if name == "execve" and not resumed:
            exec_worker[pid] = WORKER_MODULE in full  # the argv is on the entry line
        if name == "execve" and result == "ok" and exec_worker.pop(pid, False):
            p.worker = True
        if name in _CHILD and result == "ok":
            # in the worker's PID namespace the return value is its own pid there; strace adds ours
            r = re.search(r"/\* ([0-9]+) in strace's PID NS \*/", full) or re.search(
                r"\)\s+=\s+([0-9]+)(?:\s|$)", full
            )
            if r and int(r.group(1)) > 0:
                proc(int(r.group(1))).parent = pid
        if _FILTER_LOADED.match(full) and p.filtered_at is None:
            p.filtered_at = ts

    def worker_line(p: Process | None) -> bool:
        seen: set[int] = set()
        while p is not None and p.pid not in seen:
            if p.worker:
                return True
            seen.add(p.pid)
            p = procs.get(p.parent) if p.parent is not None else None
        return False

    out: dict[str, set[str]] = {}
    for root in procs.values():
        if root.filtered_at is None or not worker_line(root):
            continue
        members = {root.pid}
        grew = True
        while grew:
            grew = False
            for q in procs.values():
                if q.parent in members and q.pid not in members:
                    members.add(q.pid)
                    grew = True
        for pid in members:
            for ts, entry in procs[pid].lines:
                # the filter load is the root's line at filtered_at; threads' calls from then on are judged
                if ts < root.filtered_at or (pid == root.pid and ts == root.filtered_at):
                    continue
                name, result = entry.split("\0")
                results = out.setdefault(name, set())
                if result:
                    results.add(result)
    return {n: sorted(r) for n, r in sorted(out.items())}


def rule_of(name: str, tables: Mapping[str, object]) -> str:
    """How the filter treats ``name``: ``allow``, ``allow_if`` (arguments checked), ``kill``,
    ``errno:<NAME>`` or ``default`` (EPERM: the allowlist does not name it)."""
    if name in tables["allowed"]:  # type: ignore[operator]
        return "allow"
    if name in tables["conditional"]:  # type: ignore[operator]
        return "allow_if"
    if name in tables["kill"]:  # type: ignore[operator]
        return "kill"
    other = tables["errno_other"]
    if name in other:  # type: ignore[operator]
        return f"errno:{other[name]}"  # type: ignore[index]
    return "default"


def filter_tables() -> dict[str, object]:
    """The filter's tables as data (imports ckptgate.enforce.seccomp, hence pyseccomp)."""
    import errno

    from ckptgate.enforce import seccomp

    return {
        "allowed": sorted({*seccomp.ALLOWED, *seccomp.KEPT}),
        "conditional": sorted({name for name, _conds, _why in seccomp.CONDITIONAL}),
        "kill": sorted({*seccomp.KILL, "clone(!CLONE_THREAD)"}),
        "errno_other": {n: errno.errorcode[e] for n, e in sorted(seccomp.ERRNO_OTHER.items())},
        "default": seccomp.DEFAULT_ACTION,
    }


def tables_sha256(tables: Mapping[str, object]) -> str:
    return hashlib.sha256(json.dumps(tables, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


#: Calls the worker makes itself right after loading the filter, to measure that it holds
#: (``ckptgate.enforce.process_controls.seccomp_active``): ``openat`` and the unlisted syscall number
#: 0x3fff must fail with EPERM.  They are the filter working, not missing entries.
PROBES = ("openat", "syscall_0x3fff")


def classify(calls: Mapping[str, Iterable[str]], tables: Mapping[str, object]) -> dict[str, object]:
    """The judged part of a fact file: each call's rule, the calls the allowlist does not name
    (``missing``; the worker's own probes aside), and allowed-if calls the filter refused with the
    arguments the load used."""
    syscalls = {n: {"rule": rule_of(n, tables), "results": sorted(r)} for n, r in sorted(calls.items())}
    return {
        "tables_sha256": tables_sha256(tables),
        "syscalls": syscalls,
        "probes": sorted(n for n in syscalls if n in PROBES),
        "missing": sorted(n for n, s in syscalls.items() if s["rule"] == "default" and n not in PROBES),
        "refused_by_arguments": sorted(
            n for n, s in syscalls.items() if s["rule"] == "allow_if" and "EPERM" in s["results"]  # type: ignore[operator]
        ),
    }


def facts(env: str, lock_sha256: str, loads: list[dict[str, object]], calls: Mapping[str, Iterable[str]],
          tables: Mapping[str, object]) -> dict[str, object]:
    import importlib.metadata

    return {
        "facts_version": FACTS_VERSION,
        "environment": env,
        "lock_sha256": lock_sha256,
        "torch": importlib.metadata.version("torch"),
        "deepspeed": _version("deepspeed"),
        "python": platform.python_version(),
        "kernel": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "method": METHOD,
        "loads": loads,
        **classify(calls, tables),
    }


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def merge(into: dict[str, set[str]], calls: Mapping[str, Iterable[str]]) -> None:
    for n, results in calls.items():
        into.setdefault(n, set()).update(results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True)
    ap.add_argument("--lock-sha256", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--load", nargs=4, action="append", metavar=("FIXTURE", "ADAPTER", "STATUS", "TRACE"), default=[])
    ns = ap.parse_args(argv)
    calls: dict[str, set[str]] = {}
    loads = []
    for fixture, adapter, status, trace in ns.load:
        with open(trace, encoding="utf-8", errors="replace") as f:
            got = parse_trace(f)
        merge(calls, got)
        loads.append({"fixture": fixture, "adapter": adapter, "qualification": status, "worker_calls": len(got) > 0})
    # the committed fact is the set of calls and their results: counts vary from run to run (futex)
    doc = facts(ns.env, ns.lock_sha256, loads, calls, filter_tables())
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"{ns.out}: {len(calls)} calls after the filter, missing: {', '.join(doc['missing']) or 'none'}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
