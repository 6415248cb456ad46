"""The measured seccomp facts per runtime environment (``qualification/seccomp/<env>.json``,
issue #31 item 2) against the worker's allowlist, and the trace reader that makes them.

A fact file records which system calls the contained worker made after its filter was loaded,
measured with strace in that environment (``scripts/farm.py run --measure-seccomp``).  These tests
re-classify every recorded call with the filter's current tables: when the allowlist changes, or a
file is edited by hand, they fail and name the file to measure again.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FACTS = REPO / "qualification" / "seccomp"
LOCKS = REPO / "qualification" / "locks"


def _load():  # scripts/seccomp_trace.py is a script, not a package
    spec = importlib.util.spec_from_file_location("ckptgate_seccomp_trace", REPO / "scripts" / "seccomp_trace.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


st = _load()
FILES = sorted(FACTS.glob("*.json"))
RUNTIME_LOCKS = sorted(p for p in LOCKS.glob("*.toml") if tomllib.loads(p.read_text()).get("kind") == "runtime")


def _farm():
    from tests.test_farm import farm

    return farm


def test_every_runtime_lock_has_its_measured_seccomp_facts() -> None:
    assert RUNTIME_LOCKS, "no runtime lock under qualification/locks/"
    missing = [p.stem for p in RUNTIME_LOCKS if not (FACTS / f"{p.stem}.json").is_file()]
    assert not missing, f"measure them: python3 scripts/farm.py run --measure-seccomp --only {missing[0]}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_measured_facts_agree_with_the_current_allowlist(path: Path) -> None:
    doc = json.loads(path.read_text())
    assert doc["facts_version"] == st.FACTS_VERSION and doc["method"] == st.METHOD
    lock = _farm().parse_lock(LOCKS / f"{doc['environment']}.toml")
    # measured in exactly the committed environment
    assert doc["lock_sha256"] == lock.digest, f"{path.name}: the lock changed since; measure again"
    assert doc["torch"] == lock.version("torch") and doc["deepspeed"] == lock.version("deepspeed")
    assert doc["loads"] and {ld["fixture"] for ld in doc["loads"]} == {q.fixture for q in lock.qualify}
    assert any(ld["worker_calls"] for ld in doc["loads"]), "no worker call was traced: the trace did not see the worker"
    tables = st.filter_tables()
    # drift: the recorded rules, missing calls and probes are what the current tables make of the calls
    again = st.classify({n: s["results"] for n, s in doc["syscalls"].items()}, tables)
    rerun = f"{path.name} was classified with other tables; rerun scripts/farm.py run --measure-seccomp"
    assert doc["tables_sha256"] == again["tables_sha256"], rerun
    for key in ("syscalls", "missing", "probes", "refused_by_arguments"):
        assert doc[key] == again[key], f"{path.name}: {key} differs ({rerun})"
    # the worker's own probes are refused, as the filter must refuse them
    assert doc["probes"] and all(doc["syscalls"][n]["results"] == ["EPERM"] for n in doc["probes"])


TRACE = """\
100 1.000000 execve("/env/bin/python", ["python", "-I", "-B", "-m", "ckptgate.enforce._worker_main"], 0x1) = 0
100 1.100000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD) = 1 /* 101 in strace's PID NS */
101 1.200000 clone(child_stack=0x7f, flags=CLONE_VM|CLONE_THREAD) = 2 /* 102 in strace's PID NS */
101 1.300000 openat(AT_FDCWD, "/usr/lib/x.so", O_RDONLY) = 3
102 1.350000 futex(0x7f, FUTEX_WAIT, 0, NULL <unfinished ...>
101 1.400000 seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, {len=75, filter=0x5} <unfinished ...>
101 1.410000 <... seccomp resumed>) = 0
101 1.500000 openat(AT_FDCWD, "/", O_RDONLY) = -1 EPERM (Operation not permitted)
101 1.510000 syscall_0x3fff(0, 0) = -1 EPERM (Operation not permitted)
101 1.600000 read(5, "PK", 4) = 4
102 1.650000 <... futex resumed>) = 0
102 1.700000 sched_getaffinity(0, 8, 0x7f) = -1 EPERM (Operation not permitted)
101 1.800000 mmap(NULL, 4096, PROT_READ|PROT_EXEC, MAP_PRIVATE, -1, 0) = -1 EPERM (Operation not permitted)
100 1.900000 wait4(101, NULL, 0, NULL) = 101
200 1.000000 execve("/env/bin/python", ["python", "-I", "-B", "-m", "ckptgate.enforce.containment"], 0x1) = 0
200 1.100000 seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, {len=75, filter=0x5}) = 0
200 1.200000 ioctl(1, TCGETS, 0x7f) = -1 EPERM (Operation not permitted)
"""


def test_the_trace_reader_takes_the_worker_threads_after_the_filter_only() -> None:
    calls = st.parse_trace(TRACE.splitlines())
    # before the filter (the library open) and the unfiltered PID-namespace parent (wait4) are not
    # judged, nor the containment probe child (ioctl); a thread's futex resumed after it is
    assert calls == {
        "futex": ["ok"],
        "mmap": ["EPERM"],
        "openat": ["EPERM"],
        "read": ["ok"],
        "sched_getaffinity": ["EPERM"],
        "syscall_0x3fff": ["EPERM"],
    }
    tables = {"allowed": ["futex", "read"], "conditional": ["mmap"], "kill": ["execve"],
              "errno_other": {"clone3": "ENOSYS"}, "default": "EPERM"}
    judged = st.classify(calls, tables)
    assert judged["missing"] == ["sched_getaffinity"]
    assert judged["probes"] == ["openat", "syscall_0x3fff"]
    assert judged["refused_by_arguments"] == ["mmap"]
    assert judged["syscalls"]["clone3" if "clone3" in calls else "read"]["rule"] == "allow"
    assert st.rule_of("clone3", tables) == "errno:ENOSYS" and st.rule_of("execve", tables) == "kill"


def test_a_filter_load_on_one_line_counts_the_same() -> None:
    whole = TRACE.replace(" <unfinished ...>\n101 1.410000 <... seccomp resumed>) = 0", ") = 0")
    assert whole != TRACE and st.parse_trace(whole.splitlines()) == st.parse_trace(TRACE.splitlines())


def test_a_trace_without_a_worker_has_no_judged_calls() -> None:
    assert st.parse_trace([line for line in TRACE.splitlines() if not line.startswith(("100 ", "101 ", "102 "))]) == {}
