"""The contained worker: malicious pickles loaded under a permit that allows the load cannot write,
connect, exec or read outside their descriptors; benign files give the right placement plan."""

from __future__ import annotations

import collections
import errno
import hashlib
import importlib.util
import io
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from ckptgate.decide.decision import Decision  # noqa: E402
from ckptgate.digest import Digest  # noqa: E402
from ckptgate.enforce import _worker_main as wm  # noqa: E402
from ckptgate.enforce import protocol as wp  # noqa: E402
from ckptgate.enforce.containment import (  # noqa: E402
    CONTROLS,
    ContainmentProfile,
    namespace_ids,
    openat2,
    preflight,
)
from ckptgate.enforce.permit import Permit, issue_permit  # noqa: E402
from ckptgate.enforce.worker import (  # noqa: E402
    OpenedInput,
    WorkerLimits,
    _Run,
    run_contained,
)
from ckptgate.errors import PolicyDenied, RuntimeFailure  # noqa: E402

pytestmark = pytest.mark.producers

DIGEST = Digest.parse("sha256:" + "ab" * 32)
WORKER_CONTROLS = ("no_new_privs", "seccomp", "rlimits", "user_ns", "net_ns", "ipc_ns", "openat2")
LIMITS = WorkerLimits(setup_timeout_s=90.0)


class _Reduce:
    """Pickles as ``fn(*args)``: the classic malicious ``__reduce__``."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.fn, self.args)


def _permit(*, digest: Digest = DIGEST, loader: str = "torch_load",
            required: tuple[str, ...] = WORKER_CONTROLS) -> Permit:
    decision = Decision(allow=True, plane="framework", permitted_loaders=(loader,), required_controls=required,
                        reasons=(), decision_id="test-decision", policy_revision="test", engine="test",
                        fixture_digest=digest)
    return issue_permit(decision, fixture_digest=digest, loader=loader)


@pytest.fixture(scope="module")
def profile() -> ContainmentProfile:
    p = preflight()
    missing = [c for c in WORKER_CONTROLS if not p.controls[c]]
    if missing:
        pytest.skip(f"this host lacks containment controls {missing}: {dict(p.details)}")
    return p


class _Inputs:
    """Opens files beneath a root with openat2, as the parent does, and closes them afterwards."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.fds: list[int] = []

    def open(self, name: str, *, sha256: str | None = None) -> OpenedInput:
        fd = openat2(self.dirfd, name)
        self.fds.append(fd)
        digest = sha256 or hashlib.sha256((self.root / name).read_bytes()).hexdigest()
        return OpenedInput(fd=fd, relpath=name, sha256=digest)

    def close(self) -> None:
        for fd in [*self.fds, self.dirfd]:
            os.close(fd)


@pytest.fixture
def inputs(tmp_path: Path) -> Any:
    root = tmp_path / "ckpt"
    root.mkdir()
    ins = _Inputs(root)
    yield ins
    ins.close()


def _run(ins: _Inputs, names: list[str], profile: ContainmentProfile, *, job: str = "torch_load",
         limits: WorkerLimits = LIMITS, timeout_s: float = 60.0, **kw: Any) -> Any:
    files = [ins.open(n) for n in names]
    return run_contained(job, files, permit=_permit(), profile=profile, limits=limits, timeout_s=timeout_s,
                         fixture_digest=DIGEST, **kw)


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --------------------------------------------------------------------------- benign


def test_benign_torch_save_gives_plan_with_storage_keys_and_bytes(inputs: _Inputs, profile: ContainmentProfile) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"model": {"w": base, "w_view": base[1:, 2:], "b": torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16)),
                       "e": torch.zeros(0, dtype=torch.int64)},
             "step": 7, "lr": 0.5, "name": "run-1", "opt": {0: {"exp_avg": torch.full((2,), 3.0)}}}
    path = inputs.root / "model.pt"
    torch.save(state, path)
    res = _run(inputs, ["model.pt"], profile, job="torch_load_bytes")

    assert dict(res.controls) == {c: (c in WORKER_CONTROLS) or (c == "pid_ns" and profile.controls["pid_ns"])
                                  for c in CONTROLS}
    # What the worker measured in itself: the allowlist in filter mode, NoNewPrivs, new namespaces.
    m = res.measured
    assert (m["seccomp"]["status"], m["seccomp"]["mode"], m["seccomp"]["default"], m["no_new_privs"]) == \
        (2, "allowlist", "EPERM", 1)
    for ns in ("user", "net", "ipc"):
        assert m["namespaces"][ns]["parent"] == os.readlink(f"/proc/self/ns/{ns}") != m["namespaces"][ns]["worker"]
    assert (m["pid"] == 1) is profile.controls["pid_ns"]
    tree = res.plans["model.pt"]
    assert tree["step"] == 7 and tree["lr"] == 0.5 and tree["name"] == "run-1"
    w, view = tree["model"]["w"]["__tensor__"], tree["model"]["w_view"]["__tensor__"]
    assert (w["dtype"], w["shape"], w["stride"], w["storage_offset"], w["storage_nbytes"]) == \
        ("float32", [4, 6], [6, 1], 0, 96)
    assert view["storage_key"] == w["storage_key"]
    assert (view["shape"], view["stride"], view["storage_offset"]) == ([3, 4], [6, 1], 8)
    b = tree["model"]["b"]["__tensor__"]
    assert (b["dtype"], b["shape"], b["parameter"]) == ("bfloat16", [3], True)
    # Non-string dict keys (optimizer state) survive as a map.
    [[key, entry]] = tree["opt"]["__map__"]
    assert key == 0 and entry["exp_avg"]["__tensor__"]["shape"] == [2]
    # Every storage key names a record data/<key> in the zip, with exactly storage_nbytes bytes.
    with zipfile.ZipFile(path) as z:
        sizes = {n.split("/data/", 1)[1]: z.getinfo(n).file_size for n in z.namelist() if "/data/" in n}
    for t in (w, b, tree["model"]["e"]["__tensor__"], entry["exp_avg"]["__tensor__"]):
        assert sizes[t["storage_key"]] == t["storage_nbytes"]
    # The streamed bytes equal the tensors, as contiguous copies.
    got = {(t.header.file, t.header.path): t for t in res.tensors}
    assert got[("model.pt", ("model", "w_view"))].data == base[1:, 2:].contiguous().numpy().tobytes()
    assert got[("model.pt", ("model", "b"))].data == state["model"]["b"].detach().view(torch.uint8).numpy().tobytes()
    assert got[("model.pt", ("model", "e"))].data == b""
    assert got[("model.pt", ("opt", 0, "exp_avg"))].header.shape == (2,)
    with pytest.raises(ProcessLookupError):
        os.kill(res.pid, 0)


def test_the_plan_load_records_each_storage_key_with_its_declared_size(tmp_path: Path) -> None:
    """The plan job loads under ``skip_data``; the sizes it reports are the pickle's declared ones
    (``numel x element size``), equal to the zip records, whatever torch allocated (torch 2.10
    allocates ``numel x itemsize**2`` there)."""
    from ckptgate.enforce.plan_encoder import PlanBudget, PlanEncoder

    path = tmp_path / "m.pt"
    torch.save({"w": torch.ones(51), "b": torch.ones(3, dtype=torch.bfloat16), "u": torch.zeros(5, dtype=torch.uint8)},
               path)
    fd = os.open(path, os.O_RDONLY)
    try:
        obj, record, _keep = wm._load_one(wp.SpecFile(fd=fd, relpath="m.pt", sha256="0" * 64), with_data=False)
    finally:
        os.close(fd)
    tree = PlanEncoder(record, PlanBudget(100, 10)).encode(obj, [])
    with zipfile.ZipFile(path) as z:
        sizes = {n.split("/data/", 1)[1]: z.getinfo(n).file_size for n in z.namelist() if "/data/" in n}
    got = {k: (v["__tensor__"]["storage_key"], v["__tensor__"]["storage_nbytes"]) for k, v in tree.items()}
    assert {k: n for k, (_, n) in got.items()} == {"w": 204, "b": 6, "u": 5}
    assert all(sizes[key] == n for key, n in got.values())


class _StorageId:
    def __init__(self, numel: int) -> None:
        self.numel = numel


class _Rebuilt:
    def __init__(self, ref: _StorageId, n: int) -> None:
        self.ref, self.n = ref, n

    def __reduce__(self) -> Any:
        return (torch._utils._rebuild_tensor_v2, (self.ref, 0, (self.n,), (1,), False, collections.OrderedDict()))


def test_a_storage_key_declared_twice_with_two_sizes_is_refused(tmp_path: Path) -> None:
    """torch builds a key's storage from its first persistent id (here 1000 floats) and returns it
    for every later id of that key; a later id declaring the zip record's size (51 floats) must not
    become the size the plan reports, or the parent's record-size comparison passes for a storage
    torch built four times larger (and which a load with data refuses)."""

    class _Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            return ("storage", torch.FloatStorage, "0", "cpu", o.numel) if isinstance(o, _StorageId) else None

    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump({"a": _Rebuilt(_StorageId(1000), 51), "b": _Rebuilt(_StorageId(51), 51)})
    path = tmp_path / "m.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", bytes(204))
        z.writestr("archive/version", "3\n")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(wp.WorkerError) as ei:
            wm._load_one(wp.SpecFile(fd=fd, relpath="m.pt", sha256="0" * 64), with_data=False)
    finally:
        os.close(fd)
    assert ei.value.code == "runtime.worker.load_failed"
    assert "storage '0' is declared as 4000 bytes, then as 204" in str(ei.value)


def test_a_legacy_format_storage_reports_its_own_size(tmp_path: Path) -> None:
    """A legacy (non-zip) persistent id counts its root storage's elements, which need not be those of
    the view it returns: no declared size is taken from it (and no zip record exists to compare)."""
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(51)}, path, _use_new_zipfile_serialization=False)
    fd = os.open(path, os.O_RDONLY)
    try:
        _obj, record, _keep = wm._load_one(wp.SpecFile(fd=fd, relpath="legacy.pt", sha256="0" * 64), with_data=False)
    finally:
        os.close(fd)
    assert [r.nbytes for r in record.values()] == [None]


def test_select_streams_only_the_requested_tensor_through_a_sink(inputs: _Inputs, profile: ContainmentProfile) -> None:
    big = torch.arange(50_000, dtype=torch.float32)
    torch.save({"a": big, "b": torch.ones(3)}, inputs.root / "m.pt")
    chunks: list[tuple[int, bytes]] = []
    limits = WorkerLimits(setup_timeout_s=90.0, chunk_bytes=64 << 10)
    res = _run(inputs, ["m.pt"], profile, job="torch_load_bytes", limits=limits, select={"m.pt": [["a"]]},
               sink=lambda hdr, off, data: chunks.append((off, data)))
    assert [h.path for h in res.streamed] == [("a",)] and res.tensors == ()
    assert len(chunks) == 4 and all(len(c) <= 64 << 10 for _, c in chunks)
    assert [off for off, _ in chunks] == [0, 65536, 131072, 196608]
    assert b"".join(c for _, c in chunks) == big.numpy().tobytes()


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed")
def test_deepspeed_globals_load_after_preimport(inputs: _Inputs, profile: ContainmentProfile) -> None:
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    state = {"loss_scaler": LossScaler(scale=128.0), "zero_stage": ZeroStageEnum.weights,
             "frag": fragment_address(numel=10, start=4), "fp32": torch.ones(10)}
    torch.save(state, inputs.root / "optim_states.pt")
    res = _run(inputs, ["optim_states.pt"], profile,
               preimports=["deepspeed.runtime.fp16.loss_scaler", "deepspeed.runtime.zero.config",
                           "deepspeed.utils.tensor_fragment"])
    tree = res.plans["optim_states.pt"]
    assert tree["loss_scaler"]["__object__"] == "deepspeed.runtime.fp16.loss_scaler.LossScaler"
    assert tree["loss_scaler"]["state"]["cur_scale"] == 128.0
    assert tree["zero_stage"] == {"__enum__": "deepspeed.runtime.zero.config.ZeroStageEnum",
                                  "name": "weights", "value": 3}
    assert tree["frag"]["__object__"].endswith("fragment_address")
    assert tree["frag"]["state"] == {"numel": 10, "start": 4}
    assert tree["fp32"]["__tensor__"]["shape"] == [10]


# --------------------------------------------------------------------------- malicious
#
# Every scenario is a pickle whose __reduce__ calls something hostile, loaded under a permit that
# *allows* the load.  The scenarios run once per module, two workers at a time, to keep the
# suite fast; each test then checks its own outcome.

_LOOT_CODE = r'''
import os, ctypes
loot = []
def attempt(label, fn):
    try:
        loot.append([label, "OK", repr(fn())])
    except BaseException as e:
        loot.append([label, type(e).__name__, str(e)])
def _openat2(path):
    how = (ctypes.c_uint64 * 3)(0, 0, 0)
    fd = ctypes.CDLL(None, use_errno=True).syscall(437, -100, path.encode(), ctypes.byref(how), 24)
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return os.read(fd, 4096)
attempt("open", lambda: open(SECRET).read())
attempt("os.open", lambda: os.read(os.open(SECRET, os.O_RDONLY), 4096))
attempt("openat2", lambda: _openat2(SECRET))
attempt("environ", lambda: open("/proc/self/environ", "rb").read())
attempt("parent_mem", lambda: open("/proc/%d/mem" % os.getppid(), "rb").read(16))
attempt("create", lambda: open(CANARY, "w").write("x"))
attempt("mkdir", lambda: os.mkdir(CANARY + ".d"))
attempt("symlink", lambda: os.symlink(SECRET, CANARY + ".lnk"))
attempt("kill_parent", lambda: os.kill(os.getppid(), 0))
def _open_fds():
    out = []
    for fd in range(1024):
        try:
            os.fstat(fd)
        except OSError:
            continue
        out.append(fd)
    return out
OPEN_FDS = _open_fds()
'''


_DEEP_CODE = r'''
import os, stat, struct, time
out = None
for f in range(3, 256):  # the output pipe: the one pipe past stderr
    try:
        if stat.S_ISFIFO(os.fstat(f).st_mode):
            out = f
    except OSError:
        pass
payload = b"[" * 200000 + b"]" * 200000
os.write(out, struct.pack(">BQ", ord("J"), len(payload)))
view = memoryview(payload)
while view:
    view = view[os.write(out, view):]
time.sleep(600)
'''


def _write_pickle(root: Path, name: str, obj: Any) -> None:
    (root / name).write_bytes(pickle.dumps(obj, protocol=2))


@dataclass
class _Outcome:
    result: Any = None
    error: BaseException | None = None
    elapsed: float = 0.0


@dataclass
class _Malicious:
    tmp: Path
    before: set[str]
    after: set[str]
    outcomes: dict[str, _Outcome]
    canaries: dict[str, Path]


def _scenarios(tmp: Path, root: Path) -> tuple[dict[str, tuple[Any, dict[str, Any]]], dict[str, Path], Path]:
    """name -> (writer, run_contained keyword overrides)."""
    c = {n: tmp / f"CANARY_{n}" for n in ("system", "open", "exec", "subprocess", "loot")}
    secret = tmp / "secret.txt"
    code = f"SECRET = {str(secret)!r}\nCANARY = {str(c['loot'])!r}\n" + _LOOT_CODE
    scope: dict[str, Any] = {}
    return {
        # torch zip with a payload next to a real tensor
        "system": (lambda: torch.save({"w": torch.ones(2), "evil": _Reduce(os.system, (f"touch {c['system']}",))},
                                      root / "system.pt"), {}),
        "open": (lambda: _write_pickle(root, "open.pt", _Reduce(open, (str(c["open"]), "w"))), {}),
        "socket": (lambda: _write_pickle(root, "socket.pt", _Reduce(socket.socket, (socket.AF_INET, socket.SOCK_STREAM))),
                   {}),
        "exec": (lambda: _write_pickle(root, "exec.pt", _Reduce(os.execv, ("/usr/bin/touch", ["touch", str(c["exec"])]))),
                 {}),
        "subprocess": (lambda: _write_pickle(root, "subprocess.pt",
                                             _Reduce(subprocess.check_call, (["touch", str(c["subprocess"])],))), {}),
        # exec fills the memoised dict, then the tree returns it as data: the loot would be visible.
        "loot": (lambda: torch.save({"run": _Reduce(exec, (code, scope)), "loot": scope}, root / "loot.pt"), {}),
        "bomb": (lambda: _write_pickle(root, "bomb.pt", _Reduce(bytearray, (24 << 30,))),
                 {"limits": WorkerLimits(setup_timeout_s=90.0, address_space_bytes=12 << 30)}),
        "timeout": (lambda: _write_pickle(root, "timeout.pt", _Reduce(time.sleep, (600,))), {"timeout_s": 1.5}),
        # a non-daemon thread left running must not keep the worker alive past its result
        "thread": (lambda: torch.save({"t": _Reduce(exec, ("import threading, time\n"
                                                          "threading.Thread(target=time.sleep, args=(600,)).start()",)),
                                       "w": torch.ones(1)}, root / "thread.pt"), {"timeout_s": 30.0}),
        "changed": (lambda: _write_pickle(root, "changed.pt", _Reduce(open, (str(c["open"]), "w"))),
                    {"sha256": "0" * 64}),
        # a record on the output pipe that json.loads cannot parse without RecursionError, then a wait
        "deep": (lambda: _write_pickle(root, "deep.pt", _Reduce(exec, (_DEEP_CODE,))), {"timeout_s": 30.0}),
    }, c, secret


@pytest.fixture(scope="module")
def malicious(profile: ContainmentProfile, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("malicious")
    root = tmp / "ckpt"
    root.mkdir()
    scenarios, canaries, secret = _scenarios(tmp, root)
    secret.write_text("TOP-SECRET-CANARY-5f1d")
    for writer, _ in scenarios.values():
        writer()
    ins = _Inputs(root)
    before = _listing(tmp)

    def one(name: str) -> _Outcome:
        kw = dict(scenarios[name][1])
        f = ins.open(f"{name}.pt", sha256=kw.pop("sha256", None))
        kw.setdefault("limits", LIMITS)
        kw.setdefault("timeout_s", 60.0)
        t0 = time.monotonic()
        try:
            res = run_contained("torch_load", [f], permit=_permit(), profile=profile, fixture_digest=DIGEST, **kw)
            return _Outcome(result=res, elapsed=time.monotonic() - t0)
        except BaseException as e:  # noqa: BLE001 - each test checks its own outcome
            return _Outcome(error=e, elapsed=time.monotonic() - t0)

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = dict(zip(scenarios, pool.map(one, scenarios)))
    finally:
        ins.close()
    yield _Malicious(tmp=tmp, before=before, after=_listing(tmp), outcomes=outcomes, canaries=canaries)


def _failure(m: _Malicious, name: str) -> RuntimeFailure:
    out = m.outcomes[name]
    assert isinstance(out.error, RuntimeFailure), f"{name}: expected RuntimeFailure, got {out.error or out.result!r}"
    return out.error


def test_a_record_nested_past_the_parsers_limit_is_bad_output_and_ends_the_worker(malicious: _Malicious) -> None:
    """Attack (session 50): a payload wrote a JSON record 200,000 arrays deep on the output pipe.
    json.loads raised RecursionError, which the reader did not catch: its thread died with a
    traceback on stderr, the worker was not killed, and the parent waited for the load's timeout
    to report a generic "exited without a complete result"."""
    out, e = malicious.outcomes["deep"], _failure(malicious, "deep")
    assert e.code == "runtime.worker.bad_output" and "nested deeper" in e.message
    assert out.elapsed < 20  # killed at the violation, not at the 30 s timeout


def test_malicious_loads_write_nothing(malicious: _Malicious) -> None:
    assert malicious.after == malicious.before
    assert not any(p.exists() for p in malicious.canaries.values())


def test_os_system_in_torch_zip_is_killed(malicious: _Malicious) -> None:
    e = _failure(malicious, "system")
    assert e.code == "runtime.worker.crashed" and e.evidence["signal"] == "SIGSYS"


def test_creating_a_file_fails_with_eperm(malicious: _Malicious) -> None:
    e = _failure(malicious, "open")
    assert e.code == "runtime.worker.load_failed" and "PermissionError" in e.evidence["worker_message"]


def test_socket_is_refused(malicious: _Malicious) -> None:
    e = _failure(malicious, "socket")  # not on the allowlist: EPERM, the load fails
    assert e.code == "runtime.worker.load_failed" and "PermissionError" in e.evidence["worker_message"]


def test_exec_is_killed(malicious: _Malicious) -> None:
    e = _failure(malicious, "exec")
    assert e.code == "runtime.worker.crashed" and e.evidence["signal"] == "SIGSYS"


def test_subprocess_cannot_start_a_process(malicious: _Malicious) -> None:
    e = _failure(malicious, "subprocess")
    # Killed on clone/exec, or refused earlier (subprocess not importable under the filter).
    assert e.code in ("runtime.worker.crashed", "runtime.worker.load_failed")


def test_reading_outside_its_fds_fails_and_the_secret_never_reaches_output(malicious: _Malicious) -> None:
    out = malicious.outcomes["loot"]
    assert out.error is None, out.error
    assert "TOP-SECRET-CANARY" not in json.dumps(dict(out.result.plans))
    # exec added "__builtins__" to the scope, so the plan encodes it as a map (dunder keys are escaped).
    scope_out = dict(out.result.plans["loot.pt"]["loot"]["__map__"])
    loot = {row[0]: row[1:] for row in scope_out["loot"]}
    assert set(loot) == {"open", "os.open", "openat2", "environ", "parent_mem", "create", "mkdir", "symlink",
                         "kill_parent"}
    assert all(status == "PermissionError" for status, _ in loot.values()), loot
    # The worker holds stdin, stdout (/dev/null), stderr, its output pipe and its one input: nothing else.
    assert len(scope_out["OPEN_FDS"]) == 5 and scope_out["OPEN_FDS"][:3] == [0, 1, 2], scope_out["OPEN_FDS"]


def test_memory_bomb_is_stopped_by_rlimit_as(malicious: _Malicious) -> None:
    assert _failure(malicious, "bomb").code == "runtime.worker.memory_limit"


def test_timeout_kills_the_process_group_and_leaves_no_orphan(malicious: _Malicious) -> None:
    e = _failure(malicious, "timeout")
    assert e.code == "runtime.worker.timeout" and e.evidence["phase"] == "load"
    assert malicious.outcomes["timeout"].elapsed < 60
    with pytest.raises(ProcessLookupError):
        os.kill(e.evidence["pid"], 0)


def test_a_lingering_thread_does_not_keep_the_worker_alive(malicious: _Malicious) -> None:
    out = malicious.outcomes["thread"]
    assert out.error is None, out.error
    assert out.result.plans["thread.pt"]["w"]["__tensor__"]["shape"] == [1]
    with pytest.raises(ProcessLookupError):
        os.kill(out.result.pid, 0)


def test_changed_input_is_refused_before_load(malicious: _Malicious) -> None:
    assert _failure(malicious, "changed").code == "runtime.worker.input_changed"


# --------------------------------------------------------------------------- other processes and the host's IPC
#
# One test-only payload, under a test-only permit that allows the load, tries every call that could
# reach another process (a victim started here, and this test process: the ckptgate parent), the
# host's System V IPC, or a kernel surface, and records each result in the plan it returns.  The
# interesting calls come first: under a filter that kills, the first killed call ends the payload.

_HOSTILE_CODE = r'''
import ctypes, os, sys
ps = sys.modules["pyseccomp"]  # imported by the worker before its filter
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = []
def call(label, name, *args):
    nr = ps.resolve_syscall(ps.Arch.NATIVE, name)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    results.append([label, int(r), ctypes.get_errno() if r == -1 else 0])
buf = ctypes.create_string_buffer(4096)
mask = (ctypes.c_ulong * 16)(1)                            # CPU 0 only
param = (ctypes.c_int * 1)(0)
attr = (ctypes.c_uint32 * 12)(48, 5)                       # struct sched_attr: size 48, SCHED_IDLE
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 0)      # zero-length: writes nothing even if allowed
for who, pid in (("victim", VICTIM), ("parent", PARENT)):
    call("setpriority(%s)" % who, "setpriority", 0, pid, 19)
    call("sched_setaffinity(%s)" % who, "sched_setaffinity", pid, ctypes.sizeof(mask), mask)
    call("sched_setscheduler(%s)" % who, "sched_setscheduler", pid, 5, param)
    call("sched_setparam(%s)" % who, "sched_setparam", pid, param)
    call("sched_setattr(%s)" % who, "sched_setattr", pid, attr, 0)
    call("ioprio_set(%s)" % who, "ioprio_set", 1, pid, 3 << 13)
call("setpriority(pgrp of victim)", "setpriority", 1, VICTIM, 19)
call("shmget", "shmget", 0, 4096, 0o1666)                  # IPC_PRIVATE, IPC_CREAT | 0666
call("msgget", "msgget", 0, 0o1666)
call("semget", "semget", 0, 1, 0o1666)
call("mq_open", "mq_open", b"ckptgate-f3-probe", os.O_CREAT | os.O_RDWR, 0o666, None)
for who, pid in (("victim", VICTIM), ("parent", PARENT)):
    call("prlimit64(%s)" % who, "prlimit64", pid, 7, None, buf)
    call("kill(%s)" % who, "kill", pid, 0)
    call("pidfd_open(%s)" % who, "pidfd_open", pid, 0)
call("keyctl", "keyctl", 0, -3, 1)                         # KEYCTL_GET_KEYRING_ID, session keyring, create
call("add_key", "add_key", b"user", b"ckptgate-f3", b"x", 1, -3)
call("bpf", "bpf", 0, buf, 72)                             # BPF_MAP_CREATE
call("perf_event_open", "perf_event_open", buf, 0, -1, -1, 0)
call("userfaultfd", "userfaultfd", 0)
call("mount", "mount", b"none", b"/tmp", b"tmpfs", 0, None)
call("unshare", "unshare", 0x00020000 | 0x08000000)        # CLONE_NEWNS | CLONE_NEWIPC
call("setns", "setns", 0, 0)
call("io_uring_setup", "io_uring_setup", 8, buf)
call("socketpair(AF_UNIX)", "socketpair", 1, 1, 0, buf)
for family in range(46):                                   # every address family, AF_UNSPEC to AF_MCTP
    for kind in (1, 2, 3, 5):                              # STREAM, DGRAM, RAW, SEQPACKET
        call("socket(%d,%d)" % (family, kind), "socket", family, kind, 0)
for who, pid in (("victim", VICTIM), ("parent", PARENT)):  # last: the old filter killed these
    call("process_vm_writev(%s)" % who, "process_vm_writev", pid, iov, 1, iov, 1, 0)
    call("process_vm_readv(%s)" % who, "process_vm_readv", pid, iov, 1, iov, 1, 0)
    call("ptrace(%s)" % who, "ptrace", 16, pid, 0, 0)       # PTRACE_ATTACH
PID = os.getpid()
'''

_SOCKET_FAMILIES = {"AF_INET": 2, "AF_INET6": 10, "AF_UNIX": 1, "AF_NETLINK": 16, "AF_PACKET": 17, "AF_VSOCK": 40}


def _ioprio(pid: int) -> int:
    import ctypes  # noqa: PLC0415

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(ctypes.c_long(252), ctypes.c_long(1), ctypes.c_long(pid)))  # ioprio_get, x86_64


def _sched(pid: int) -> tuple[Any, ...]:
    return (os.getpriority(os.PRIO_PROCESS, pid), sorted(os.sched_getaffinity(pid)), os.sched_getscheduler(pid),
            os.sched_getparam(pid).sched_priority, _ioprio(pid) if os.uname().machine == "x86_64" else None)


def _restore_sched(pid: int, snap: tuple[Any, ...]) -> None:
    if _sched(pid) == snap:
        return
    os.setpriority(os.PRIO_PROCESS, pid, snap[0])
    os.sched_setaffinity(pid, snap[1])
    os.sched_setscheduler(pid, snap[2], os.sched_param(snap[3]))
    if snap[4] is not None:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None).syscall(ctypes.c_long(251), ctypes.c_long(1), ctypes.c_long(pid), ctypes.c_long(snap[4]))


def _ipcs() -> str:
    return subprocess.run(["ipcs"], capture_output=True, text=True, check=True, timeout=30).stdout


def _ipc_ids() -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for kind in ("shm", "msg", "sem"):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            out.add((kind, line.split()[1]))
    return out


@pytest.mark.skipif(importlib.util.find_spec("pyseccomp") is None, reason="pyseccomp is not installed")
def test_payload_cannot_reach_other_processes_the_hosts_ipc_or_kernel_surfaces(
        inputs: _Inputs, profile: ContainmentProfile) -> None:
    if shutil.which("ipcs") is None:
        pytest.skip("util-linux ipcs is not installed")
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)  # noqa: S607 - a root process
    me = os.getpid()
    mine, victims, ipcs, ids = _sched(me), _sched(victim.pid), _ipcs(), _ipc_ids()
    scope: dict[str, Any] = {}
    code = f"VICTIM = {victim.pid}\nPARENT = {me}\n" + _HOSTILE_CODE
    torch.save({"run": _Reduce(exec, (code, scope)), "scope": scope}, inputs.root / "hostile.pt")
    try:
        res = _run(inputs, ["hostile.pt"], profile)
        after = {"parent": _sched(me), "victim": _sched(victim.pid), "ipcs": _ipcs()}
    finally:
        victim.kill()
        victim.wait()
        # On a build without these controls the payload changes the host: put it back.
        _restore_sched(me, mine)
        for kind, ident in _ipc_ids() - ids:
            subprocess.run(["ipcrm", {"shm": "-m", "msg": "-q", "sem": "-s"}[kind], ident],  # noqa: S607
                           check=False, timeout=30)
    assert after == {"parent": mine, "victim": victims, "ipcs": ipcs}
    got = dict(res.plans["hostile.pt"]["scope"]["__map__"])
    results = {label: (ret, err) for label, ret, err in got["results"]}
    assert len(results) == 2 * 9 + 15 + 46 * 4 + 2 * 3
    refused = {label for label, (ret, err) in results.items() if (ret, err) == (-1, errno.EPERM)}
    assert set(results) - refused == set(), {k: results[k] for k in set(results) - refused}
    for name, family in _SOCKET_FAMILIES.items():
        assert f"socket({family},1)" in refused or f"socket({family},2)" in refused, name
    # The worker that did this measured its own controls, and they are on its record.
    assert res.controls["seccomp"] and res.controls["ipc_ns"] and res.measured["seccomp"]["mode"] == "allowlist"
    if profile.controls["pid_ns"]:
        assert got["PID"] == 1 and res.controls["pid_ns"]  # PID 1 of its own namespace: no other process in sight


# --------------------------------------------------------------------------- refused before spawn


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("the worker must not be spawned")

    monkeypatch.setattr("ckptgate.enforce.worker.subprocess.Popen", refuse)


def _fake_profile(**overrides: bool) -> ContainmentProfile:
    controls = {c: c != "cgroup_v2" for c in CONTROLS}
    controls.update(overrides)
    return ContainmentProfile(controls=controls, kernel="test")


def _one_input(inputs: _Inputs) -> OpenedInput:
    torch.save({"x": torch.ones(1)}, inputs.root / "m.pt")
    return inputs.open("m.pt")


def test_no_permit_is_refused(inputs: _Inputs, no_spawn: None) -> None:
    with pytest.raises(RuntimeFailure) as ei:
        run_contained("torch_load", [_one_input(inputs)], permit=None, profile=_fake_profile(),  # type: ignore[arg-type]
                      limits=LIMITS, timeout_s=5, fixture_digest=DIGEST)
    assert ei.value.code == "runtime.worker.permit_missing"


def test_permit_for_another_digest_is_refused(inputs: _Inputs, no_spawn: None) -> None:
    with pytest.raises(PolicyDenied) as ei:
        run_contained("torch_load", [_one_input(inputs)], permit=_permit(digest=Digest.parse("sha256:" + "cd" * 32)),
                      profile=_fake_profile(), limits=LIMITS, timeout_s=5, fixture_digest=DIGEST)
    assert ei.value.code == "enforce.permit.wrong_digest"


def test_permit_for_another_loader_is_refused(inputs: _Inputs, no_spawn: None) -> None:
    with pytest.raises(PolicyDenied) as ei:
        run_contained("torch_load", [_one_input(inputs)], permit=_permit(loader="megatron_load"),
                      profile=_fake_profile(), limits=LIMITS, timeout_s=5, fixture_digest=DIGEST)
    assert ei.value.code == "enforce.permit.wrong_loader"


def test_missing_required_control_is_refused_before_spawn(inputs: _Inputs, no_spawn: None) -> None:
    permit = _permit(required=("seccomp", "cgroup_v2"))
    with pytest.raises(PolicyDenied) as ei:
        run_contained("torch_load", [_one_input(inputs)], permit=permit, profile=_fake_profile(cgroup_v2=False),
                      limits=LIMITS, timeout_s=5, fixture_digest=DIGEST)
    assert ei.value.code == "enforce.permit.control_missing" and ei.value.evidence["missing"] == ["cgroup_v2"]


def test_preimport_outside_the_allowed_packages_is_refused(inputs: _Inputs, no_spawn: None) -> None:
    with pytest.raises(RuntimeFailure) as ei:
        run_contained("torch_load", [_one_input(inputs)], permit=_permit(), profile=_fake_profile(),
                      limits=LIMITS, timeout_s=5, fixture_digest=DIGEST, preimports=["antigravity"])
    assert ei.value.code == "runtime.worker.preimport_refused"


def test_unknown_job_and_writable_descriptor_are_refused(inputs: _Inputs, no_spawn: None) -> None:
    f = _one_input(inputs)
    with pytest.raises(RuntimeFailure) as ei:
        run_contained("exec_python", [f], permit=_permit(), profile=_fake_profile(), limits=LIMITS,
                      timeout_s=5, fixture_digest=DIGEST)
    assert ei.value.code == "runtime.worker.bad_job"
    with pytest.raises(RuntimeFailure) as ei:
        run_contained("torch_load_bytes", [f], permit=_permit(), profile=_fake_profile(), limits=LIMITS,
                      timeout_s=5, fixture_digest=DIGEST, select={"other.pt": [["a"]]})
    assert ei.value.code == "runtime.worker.bad_job" and ei.value.evidence["unknown_files"] == ["other.pt"]
    wfd = os.open(inputs.root / "m.pt", os.O_RDWR)
    try:
        rw = OpenedInput(fd=wfd, relpath="m.pt", sha256=f.sha256)
        with pytest.raises(RuntimeFailure, match="read-only") as ei:
            run_contained("torch_load", [rw], permit=_permit(), profile=_fake_profile(), limits=LIMITS,
                          timeout_s=5, fixture_digest=DIGEST)
        assert ei.value.code == "runtime.worker.bad_job"
    finally:
        os.close(wfd)


# --------------------------------------------------------------------------- the worker's own permit check


@pytest.mark.parametrize(("namespaces", "pid_ns", "missing"), [
    (False, False, "user_ns"),  # no namespaces at all
    (True, False, "pid_ns"),    # namespaces, but no PID namespace: recorded as not held, never claimed
])
def test_worker_refuses_when_a_required_control_is_not_active(inputs: _Inputs, namespaces: bool, pid_ns: bool,
                                                              missing: str) -> None:
    """Spawn the worker directly without a control that the permit requires: it must refuse to load."""
    f = _one_input(inputs)
    rfd, wfd = os.pipe()
    spec = {"version": 1, "job": "torch_load",
            "permit": {"fixture_digest": DIGEST.prefixed(), "loader": "torch_load", "required_controls": ["seccomp", missing],
                       "decision_id": "d"},
            "parent_controls": {"openat2": True}, "namespaces": namespaces, "pid_ns": pid_ns,
            "parent_namespaces": namespace_ids(), "rlimits": LIMITS.rlimits(), "cgroup": None,
            "preimports": [], "files": [{"fd": f.fd, "relpath": f.relpath, "sha256": f.sha256}], "select": None,
            "chunk_bytes": 1 << 20, "max_nodes": 1000, "max_depth": 50, "output_fd": wfd}
    proc = subprocess.run([sys.executable, "-I", "-B", "-m", "ckptgate.enforce._worker_main"],
                          input=json.dumps(spec).encode(), pass_fds=(wfd, f.fd), capture_output=True,
                          timeout=90, check=False)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        data = r.read()
    kind, length = wp.HEADER.unpack(data[:wp.HEADER.size])
    doc = json.loads(data[wp.HEADER.size:wp.HEADER.size + length])
    assert proc.returncode == wp.EXIT_ERROR and kind == wp.REC_JSON
    assert doc["event"] == "error" and doc["code"] == "runtime.worker.control_missing", doc
    assert doc["message"].endswith(f": {missing}")
    assert len(data) == wp.HEADER.size + length  # nothing else: no ready, no plan


def _spec(job: str = "torch_load", *, loader: str = "torch_load", required: tuple[str, ...] = ("seccomp",),
          **over: Any) -> wp.WorkerSpec:
    fields: dict[str, Any] = {
        "job": job,
        "permit": wp.PermitTerms(fixture_digest=DIGEST, loader=loader, required_controls=required, decision_id="d"),
        "openat2": True, "namespaces": True, "pid_ns": True,
        "parent_namespaces": {ns: f"{ns}:[1]" for ns in ("user", "net", "ipc", "pid")},
        "rlimits": LIMITS.rlimits(), "cgroup": None, "preimports": (),
        "files": (wp.SpecFile(fd=99, relpath="m.pt", sha256="0" * 64),), "select": None,
        "chunk_bytes": 1 << 20, "max_nodes": 1000, "max_depth": 50}
    fields.update(over)
    return wp.WorkerSpec(**fields)


def test_worker_check_permit_unit() -> None:
    wm._check_permit(_spec(), {"seccomp": True})
    with pytest.raises(wp.WorkerError) as ei:
        wm._check_permit(_spec(), {"seccomp": False})
    assert ei.value.code == "runtime.worker.control_missing"
    with pytest.raises(wp.WorkerError) as ei:  # the job the worker runs is not the permit's loader
        wm._check_permit(_spec("deepspeed"), {"seccomp": True})
    assert ei.value.code == "runtime.worker.permit_mismatch"


# --------------------------------------------------------------------------- output protocol


def _records(*recs: tuple[bytes, bytes]) -> io.BytesIO:
    return io.BytesIO(b"".join(wp.HEADER.pack(k, len(p)) + p for k, p in recs))


def _j(doc: Any) -> tuple[bytes, bytes]:
    return (wp.REC_JSON, json.dumps(doc).encode())


def _measured(**over: Any) -> dict[str, Any]:
    m = {"seccomp": {"mode": "allowlist", "default": "EPERM", "status": 2}, "no_new_privs": 1, "pid": 1,
         "namespaces": {ns: {"worker": f"{ns}:[2]", "parent": f"{ns}:[1]"} for ns in ("user", "net", "ipc", "pid")},
         "rlimits": {}}
    m.update(over)
    return m


READY = _j({"event": "ready", "controls": {c: True for c in CONTROLS}, "measured": _measured(), "pid": 1})


def _parse(stream: io.BytesIO, job: str = "torch_load_bytes") -> _Run:
    f = OpenedInput(fd=99, relpath="m.pt", sha256="0" * 64)
    run = _Run(_spec(job), [f], LIMITS, 1.0, None, use_cgroup=False)
    run._parse(stream)
    return run


@pytest.mark.parametrize(("stream", "why"), [
    (_records((b"P", b"\x80\x04N.")), "unknown record type"),
    (_records(_j({"event": "plan", "file": "m.pt", "tree": {}})), "before the worker was ready"),
    (_records(READY, READY), "repeated ready"),
    (_records(_j({"event": "ready", "controls": {c: True for c in CONTROLS}, "pid": 1})), "malformed or repeated"),
    (_records(_j({"event": "ready", "controls": {c: True for c in CONTROLS}, "pid": 1,
                  "measured": _measured(seccomp={"mode": "denylist", "status": 2})})), "allowlist"),
    (_records(_j({"event": "ready", "controls": {c: True for c in CONTROLS}, "pid": 1,
                  "measured": _measured(no_new_privs=0)})), "NoNewPrivs"),
    (_records(_j({"event": "ready", "controls": {c: True for c in CONTROLS}, "pid": 1,
                  "measured": _measured(namespaces={ns: {"worker": f"{ns}:[1]", "parent": f"{ns}:[1]"}
                                                    for ns in ("user", "net", "ipc", "pid")})})),
     "namespace is the parent's"),
    (_records(_j({"event": "ready", "controls": {c: True for c in CONTROLS}, "pid": 1,
                  "measured": _measured(namespaces={ns: {"worker": f"{ns}:[2]", "parent": f"{ns}:[3]"}
                                                    for ns in ("user", "net", "ipc", "pid")})})),
     "not the one the parent measured"),
    (_records(READY, (wp.REC_JSON, b"{not json")), "not JSON"),
    (_records(READY, (wp.REC_BYTES, b"\0" * 4)), "no tensor record announced"),
    (_records(READY, _j({"event": "plan", "file": "other.pt", "tree": {}})), "plan record"),
    (_records(READY, _j({"event": "plan", "file": "m.pt", "tree": {}}),
              _j({"event": "tensor", "file": "m.pt", "path": ["a"], "dtype": "float32", "shape": [2],
                  "nbytes": 7})), "must agree"),
    (_records(READY, _j({"event": "plan", "file": "m.pt", "tree": {}}),
              _j({"event": "tensor", "file": "m.pt", "path": ["a"], "dtype": "float32", "shape": [2],
                  "nbytes": 8}), (wp.REC_BYTES, b"\0" * 4)), "ended inside a tensor"),
    (_records(READY, _j({"event": "error", "code": "runtime.anything", "message": "x"})), "malformed error"),
    (_records(READY, _j({"event": "done"}), _j({"event": "done"})), "after the end"),
    (io.BytesIO(wp.HEADER.pack(wp.REC_JSON, 10)[:5]), "inside a record header"),
])
def test_malformed_output_is_a_violation(stream: io.BytesIO, why: str) -> None:
    run = _parse(stream)
    assert run.bad is not None and why in run.bad


def test_well_formed_output_parses() -> None:
    run = _parse(_records(READY, _j({"event": "plan", "file": "m.pt", "tree": {"x": 1}}),
                          _j({"event": "tensor", "file": "m.pt", "path": ["a", 0], "dtype": "float32", "shape": [2],
                              "nbytes": 8}), (wp.REC_BYTES, b"\1" * 4), (wp.REC_BYTES, b"\2" * 4),
                          _j({"event": "done"})))
    assert run.bad is None and run.done and run.plans == {"m.pt": {"x": 1}}
    assert run.tensors[0].data == b"\1" * 4 + b"\2" * 4 and run.tensors[0].header.path == ("a", 0)



def test_a_result_without_a_required_control_is_refused() -> None:
    """The parent's check of the worker's result: its controls must include every required one."""
    f = OpenedInput(fd=99, relpath="m.pt", sha256="0" * 64)
    run = _Run(_spec(required=("seccomp", "user_ns")), [f], LIMITS, 1.0, None, use_cgroup=False)
    controls = {c: c != "user_ns" for c in CONTROLS}
    run._parse(_records(_j({"event": "ready", "controls": controls, "measured": _measured(), "pid": 1}),
                        _j({"event": "plan", "file": "m.pt", "tree": {}}), _j({"event": "done"})))
    assert run.bad is None and run.done
    with pytest.raises(RuntimeFailure) as ei:
        run._result(SimpleNamespace(pid=1), 0, 0.0)  # type: ignore[arg-type]
    assert ei.value.code == "runtime.worker.control_missing" and ei.value.evidence["missing"] == ["user_ns"]
