"""The code that runs inside the contained worker (``python -I -B -m ckptgate.enforce._worker_main``).

Order, fixed: read the job spec from stdin; enter new user, network and IPC namespaces (while
still single-threaded) and, where the host allows, a PID namespace, forking into it (this process
stays behind as the reaper); set the rlimits; check the cgroup the parent placed us in; pre-import torch and
the modules the pickle names; set ``no_new_privs``; load the seccomp filter *last*; re-check the
permit against the controls that are now actually active, as this process measured them; only
then re-hash the input descriptors and load.  Nothing here writes a file or sends a pickle: the only output is framed
records on the output descriptor (see :data:`REC_JSON`, :data:`REC_BYTES`).

Everything after the load runs under the assumption that the loaded code may have been hostile:
the parent validates every record it receives.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
import math
import os
import re
import struct
import sys
import types
from typing import Any

#: Record header: one type byte and a big-endian u64 payload length.
HEADER = struct.Struct(">cQ")
REC_JSON = b"J"
REC_BYTES = b"B"

#: Exit statuses of the worker.
EXIT_OK = 0
EXIT_ERROR = 3

#: Error codes the worker may report (the parent accepts no other).
WORKER_ERROR_CODES = frozenset({
    "runtime.worker.bad_job", "runtime.worker.setup_failed", "runtime.worker.preimport_failed",
    "runtime.worker.control_missing", "runtime.worker.permit_mismatch", "runtime.worker.input_changed",
    "runtime.worker.load_failed", "runtime.worker.memory_limit", "runtime.worker.plan_too_large",
    "runtime.worker.select_missing",
})

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_MAX_SPEC = 16 << 20
_HASH_CHUNK = 8 << 20


class WorkerError(Exception):
    """A failure the worker reports as an ``error`` record with a stable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        assert code in WORKER_ERROR_CODES
        self.code = code
        self.message = message


class Output:
    """Framed writes on the output descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def json(self, doc: dict[str, Any]) -> None:
        payload = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
        self._write_all(HEADER.pack(REC_JSON, len(payload)) + payload)

    def raw(self, chunk: memoryview) -> None:
        self._write_all(HEADER.pack(REC_BYTES, len(chunk)))
        self._write_all(chunk)


# --------------------------------------------------------------------------- spec


def _read_spec() -> dict[str, Any]:
    data = sys.stdin.buffer.read(_MAX_SPEC + 1)
    if len(data) > _MAX_SPEC:
        raise WorkerError("runtime.worker.bad_job", "the job spec is too large")
    try:
        spec = json.loads(data)
    except ValueError as e:
        raise WorkerError("runtime.worker.bad_job", f"the job spec is not JSON: {e}") from e
    if not isinstance(spec, dict) or spec.get("version") != 1:
        raise WorkerError("runtime.worker.bad_job", "the job spec is not a version-1 object")
    return spec


# --------------------------------------------------------------------------- setup


def _setup(spec: dict[str, Any]) -> tuple[dict[str, bool], dict[str, Any]]:
    """Set the controls up in the documented order; return which are active and what the worker
    measured in itself (the receipt's record of the controls that were really active)."""
    from ckptgate.enforce import containment as c  # noqa: PLC0415

    controls = {name: False for name in c.CONTROLS}
    parent_ns = spec["parent_namespaces"]
    if not isinstance(parent_ns, dict) or set(parent_ns) != set(c.NAMESPACES):
        raise WorkerError("runtime.worker.bad_job", "the job spec has no parent namespace ids")
    # 1. namespaces, while this process has a single thread (unshare(CLONE_NEWUSER) needs it).  A
    #    new PID namespace applies to children only: the worker forks into it, and this process
    #    stays behind as the child's reaper (fork_into_pid_namespace never returns here).
    if spec["namespaces"]:
        before_pid = c.namespace_ids()["pid"]
        held, _ = c.enter_namespaces(pid=bool(spec["pid_ns"]))
        if held["pid_ns"]:
            held["pid_ns"], _ = c.fork_into_pid_namespace(before_pid)
        controls.update(held)
    # Every namespace is judged against the parent's own ids, not against what this process saw.
    ns_now = c.namespace_ids()
    for ns in c.NAMESPACES:
        controls[f"{ns}_ns"] = bool(controls[f"{ns}_ns"] and ns_now[ns] is not None and ns_now[ns] != parent_ns[ns])
    # 2. rlimits.
    controls["rlimits"], _ = c.apply_rlimits({k: int(v) for k, v in spec["rlimits"].items()})
    # 3. cgroup v2: the parent moved us into a limited group before sending the spec.
    if spec["cgroup"] is not None:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            controls["cgroup_v2"] = f"0::{spec['cgroup']}" in f.read().splitlines()
    # 4. pre-imports: torch, its lazily imported serialization config, the pickle's modules.
    for name in ("torch", "torch.utils.serialization", *spec["preimports"]):
        if not isinstance(name, str) or not _MODULE_NAME.match(name):
            raise WorkerError("runtime.worker.bad_job", f"not a module name: {name!r}")
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001 - any import failure is reported, typed
            raise WorkerError("runtime.worker.preimport_failed",
                              f"pre-import of {name} failed: {type(e).__name__}: {e}") from e
    _warm_torch()
    from ckptgate.enforce.seccomp import load_filter  # noqa: PLC0415

    # /proc/self/status is opened now and read after the filter is loaded (opening is refused
    # then); it is closed before any input byte is read.
    status_fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        # 5. no_new_privs, then 6. seccomp, last.
        controls["no_new_privs"], _ = c.set_no_new_privs()
        report = load_filter()
        controls["seccomp"], seccomp_detail = c.seccomp_active()
        status = c.read_status(status_fd)
    finally:
        os.close(status_fd)
    controls["no_new_privs"] = controls["no_new_privs"] and status.get("NoNewPrivs") == 1
    controls["seccomp"] = controls["seccomp"] and status.get("Seccomp") == c.SECCOMP_MODE_FILTER \
        and report.mode == "allowlist"
    # openat2 is the parent's control: it opened every input descriptor with it.
    controls["openat2"] = bool(spec["parent_controls"].get("openat2", False))
    import resource  # noqa: PLC0415 - already imported by the containment module

    measured = {
        "seccomp": {"mode": report.mode, "default": report.default, "status": status.get("Seccomp"),
                    "filters": status.get("Seccomp_filters"), "rules_sha256": report.digest(),
                    "allowed": len(report.allowed), "conditional": len(report.conditional),
                    "kill": list(report.kill), "detail": seccomp_detail},
        "no_new_privs": status.get("NoNewPrivs"),
        "namespaces": {ns: {"worker": ns_now[ns], "parent": parent_ns[ns]} for ns in c.NAMESPACES},
        "pid": os.getpid(),
        "rlimits": {name: resource.getrlimit(c.RLIMITS[name])[0] for name in sorted(c.RLIMITS)},
    }
    return controls, measured


def _warm_torch() -> None:
    """Touch what torch initialises lazily (cpuinfo, thread pools) before the filter is loaded."""
    import torch  # noqa: PLC0415

    x = torch.ones(4, 4)
    (x @ x).sum().item()
    torch.get_num_threads()


def _check_permit(spec: dict[str, Any], controls: dict[str, bool]) -> None:
    permit = spec["permit"]
    if permit["fixture_digest"] != spec["fixture_digest"]:
        raise WorkerError("runtime.worker.permit_mismatch", "the permit is for another fixture digest")
    if permit["loader"] != spec["loader"]:
        raise WorkerError("runtime.worker.permit_mismatch", "the permit is for another loader")
    missing = [name for name in permit["required_controls"] if not controls.get(name, False)]
    if missing:
        raise WorkerError("runtime.worker.control_missing",
                          f"required containment controls are not active in the worker: {', '.join(missing)}")


def _verify_inputs(files: list[dict[str, Any]]) -> None:
    for item in files:
        h = hashlib.sha256()
        offset = 0
        while True:
            chunk = os.pread(item["fd"], _HASH_CHUNK, offset)
            if not chunk:
                break
            h.update(chunk)
            offset += len(chunk)
        if h.hexdigest() != item["sha256"]:
            raise WorkerError("runtime.worker.input_changed",
                              f"{item['relpath']} no longer has the sha256 the parent measured")


# --------------------------------------------------------------------------- plan


class _Budget:
    def __init__(self, max_nodes: int, max_depth: int) -> None:
        self.nodes = 0
        self.max_nodes = max_nodes
        self.max_depth = max_depth

    def tick(self, depth: int) -> None:
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise WorkerError("runtime.worker.plan_too_large", f"the object tree has more than {self.max_nodes} nodes")
        if depth > self.max_depth:
            raise WorkerError("runtime.worker.plan_too_large", f"the object tree is deeper than {self.max_depth}")


def _qualname(obj: Any) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{getattr(t, '__module__', '?')}.{getattr(t, '__qualname__', t.__name__)}"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class PlanEncoder:
    """Turns an unpickled object tree into JSON; tensors become ``__tensor__`` records."""

    def __init__(self, storage_keys: dict[int, str], budget: _Budget) -> None:
        import torch  # noqa: PLC0415

        self.torch = torch
        self.keys = storage_keys
        self.budget = budget
        self.tensors: list[tuple[list[Any], Any]] = []  # (path, tensor), in tree order
        self._stack: set[int] = set()

    def encode(self, obj: Any, path: list[Any], depth: int = 0) -> Any:
        self.budget.tick(depth)
        torch = self.torch
        if obj is None or type(obj) is bool:
            return obj
        if isinstance(obj, str):
            return str.__str__(obj)
        if isinstance(obj, enum.Enum):
            return {"__enum__": _qualname(obj), "name": obj.name,
                    "value": self.encode(obj.value, path, depth + 1)}
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            f = float(obj)
            return f if math.isfinite(f) else {"__float__": repr(f)}
        if isinstance(obj, complex):
            return {"__complex__": [self.encode(obj.real, path, depth + 1), self.encode(obj.imag, path, depth + 1)]}
        if isinstance(obj, (bytes, bytearray)):
            data = bytes(obj)
            return {"__bytes__": base64.b64encode(data).decode() if len(data) <= 1 << 20 else None,
                    "len": len(data)}
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, path)
        if isinstance(obj, torch.dtype):
            return {"__dtype__": _dtype_name(obj)}
        if isinstance(obj, torch.device):
            return {"__device__": str(obj)}
        if isinstance(obj, torch.Size):
            return [int(d) for d in obj]
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.ndarray):
            raw = obj.tobytes() if obj.nbytes <= 1 << 16 else None
            return {"__ndarray__": {"dtype": str(obj.dtype), "shape": list(obj.shape),
                                    "data": base64.b64encode(raw).decode() if raw is not None else None}}
        if np is not None and isinstance(obj, np.generic):
            return self.encode(obj.item(), path, depth + 1)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
            if isinstance(obj, types.ModuleType):
                return {"__global__": obj.__name__}
            return {"__global__": f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"}
        key = id(obj)
        if key in self._stack:
            return {"__cycle__": True}
        self._stack.add(key)
        try:
            return self._container(obj, path, depth)
        finally:
            self._stack.discard(key)

    def _container(self, obj: Any, path: list[Any], depth: int) -> Any:
        if isinstance(obj, dict):
            items = list(obj.items())
            if all(type(k) is str and not (k.startswith("__") and k.endswith("__")) for k, _ in items):
                return {k: self.encode(v, [*path, k], depth + 1) for k, v in items}
            return {"__map__": [[self.encode(k, path, depth + 1), self.encode(v, [*path, _path_key(k)], depth + 1)]
                                for k, v in items]}
        if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):
            return {"__object__": _qualname(obj),
                    "state": {str(f): self.encode(v, [*path, i], depth + 1)
                              for i, (f, v) in enumerate(zip(type(obj)._fields, obj))}}
        if isinstance(obj, (list, tuple)):
            return [self.encode(v, [*path, i], depth + 1) for i, v in enumerate(obj)]
        if isinstance(obj, (set, frozenset)):
            return {"__set__": [self.encode(v, path, depth + 1) for v in obj]}
        state: dict[str, Any] = {}
        try:
            d = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            d = None
        if isinstance(d, dict):
            state.update(d)
        for cls in type(obj).__mro__:
            for slot in cls.__dict__.get("__slots__", ()) if isinstance(cls.__dict__.get("__slots__", ()), (tuple, list)) else ():
                if isinstance(slot, str) and slot not in ("__dict__", "__weakref__") and slot not in state:
                    try:
                        state[slot] = object.__getattribute__(obj, slot)
                    except AttributeError:
                        pass
        return {"__object__": _qualname(obj), "state": self._container(state, path, depth) if state else {}}

    def _tensor(self, t: Any, path: list[Any]) -> Any:
        torch = self.torch
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_quantized:
            return {"__object__": _qualname(t), "tensor": True, "supported": False, "layout": str(t.layout)}
        storage = t.untyped_storage()
        self.tensors.append((list(path), t))
        return {"__tensor__": {
            "storage_key": self.keys.get(storage._cdata),
            "dtype": _dtype_name(t.dtype),
            "shape": [int(d) for d in t.shape],
            "stride": [int(s) for s in t.stride()],
            "storage_offset": int(t.storage_offset()),
            "storage_nbytes": int(storage.nbytes()),
            "parameter": type(t) is torch.nn.Parameter,
        }}


def _path_key(k: Any) -> Any:
    return k if type(k) in (str, int) else repr(k)


def _recording_pickle(record: dict[int, str], keep: list[Any]) -> Any:
    """A ``pickle_module`` whose Unpickler records which storage key each storage came from."""
    import pickle  # noqa: PLC0415

    base = pickle.Unpickler.persistent_load

    class RecordingUnpickler(pickle.Unpickler):
        @property  # type: ignore[override]
        def persistent_load(self) -> Any:
            return base.__get__(self)

        @persistent_load.setter
        def persistent_load(self, fn: Any) -> None:
            def wrapped(saved_id: Any) -> Any:
                storage = fn(saved_id)
                untyped = getattr(storage, "_untyped_storage", storage)
                if isinstance(saved_id, tuple) and len(saved_id) >= 3 and hasattr(untyped, "_cdata"):
                    record[untyped._cdata] = str(saved_id[2])
                    keep.append(storage)  # keeps _cdata from being reused
                return storage

            base.__set__(self, wrapped)

    mod = types.ModuleType("ckptgate_recording_pickle")
    mod.Unpickler = RecordingUnpickler  # type: ignore[attr-defined]
    mod.load = pickle.load  # type: ignore[attr-defined]
    mod.loads = pickle.loads  # type: ignore[attr-defined]
    return mod


# --------------------------------------------------------------------------- jobs


def _load_one(item: dict[str, Any], *, with_data: bool) -> tuple[Any, dict[int, str], list[Any]]:
    """``torch.load`` one file.  Without ``with_data`` the storages are allocated but never
    filled (``torch.serialization.skip_data``): the plan needs only keys, dtypes, shapes and
    offsets, so the worker's resident memory stays small whatever the checkpoint's size."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415

    import torch  # noqa: PLC0415

    record: dict[int, str] = {}
    keep: list[Any] = []
    try:
        # weights_only=False: the policy allowed a framework load of these exact bytes, under
        # containment.  weights_only=True is not a trust control [R17, R29].
        with contextlib.nullcontext() if with_data else torch.serialization.skip_data():
            obj = torch.load(io.FileIO(item["fd"], closefd=False), weights_only=False,  # nosec B614
                             map_location="cpu", pickle_module=_recording_pickle(record, keep))
    except MemoryError as e:
        raise WorkerError("runtime.worker.memory_limit",
                          f"loading {item['relpath']} ran out of address space (RLIMIT_AS)") from e
    except BaseException as e:  # noqa: BLE001 - the loaded code may raise anything
        raise WorkerError("runtime.worker.load_failed",
                          f"loading {item['relpath']} failed: {type(e).__name__}: {_safe_text(e)}") from e
    return obj, record, keep


def _find(tree: Any, path: list[Any]) -> Any:
    node = tree
    for seg in path:
        if isinstance(node, dict):
            if seg in node:
                node = node[seg]
                continue
            raise KeyError(seg)
        if isinstance(node, (list, tuple)) and isinstance(seg, int) and 0 <= seg < len(node):
            node = node[seg]
            continue
        raise KeyError(seg)
    return node


def _stream_tensor(out: Output, relpath: str, path: list[Any], t: Any, chunk_bytes: int) -> None:
    import torch  # noqa: PLC0415

    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    nbytes = int(raw.numel())
    out.json({"event": "tensor", "file": relpath, "path": path, "dtype": _dtype_name(t.dtype),
              "shape": [int(d) for d in t.shape], "nbytes": nbytes})
    view = memoryview(raw.numpy()) if nbytes else memoryview(b"")
    for start in range(0, nbytes, chunk_bytes):
        out.raw(view[start:start + chunk_bytes])


def _run_job(spec: dict[str, Any], out: Output) -> None:
    budget = _Budget(int(spec["max_nodes"]), int(spec["max_depth"]))
    select = spec["select"]
    for item in spec["files"]:
        obj, record, keep = _load_one(item, with_data=spec["job"] == "torch_load_bytes")
        enc = PlanEncoder(record, budget)
        tree = enc.encode(obj, [])
        out.json({"event": "plan", "file": item["relpath"], "tree": tree})
        if spec["job"] == "torch_load_bytes":
            wanted = select.get(item["relpath"]) if select is not None else None
            if wanted is None and select is None:
                pairs = enc.tensors
            else:
                pairs = []
                for path in wanted or []:
                    try:
                        node = _find(obj, path)
                    except KeyError as e:
                        raise WorkerError("runtime.worker.select_missing",
                                          f"{item['relpath']}: no object at {path!r}") from e
                    import torch  # noqa: PLC0415

                    if not isinstance(node, torch.Tensor):
                        raise WorkerError("runtime.worker.select_missing",
                                          f"{item['relpath']}: the object at {path!r} is not a tensor")
                    pairs.append((path, node))
            for path, t in pairs:
                _stream_tensor(out, item["relpath"], path, t, int(spec["chunk_bytes"]))
        del obj, enc, tree, record, keep


def _safe_text(e: BaseException, limit: int = 300) -> str:
    """``str(e)``, bounded; an exception whose ``__str__`` fails is named, not re-raised."""
    try:
        text = str(e)
    except BaseException:  # noqa: BLE001 - the exception may come from hostile code
        return "<unprintable>"
    return text[:limit]


def main() -> int:
    out: Output | None = None
    loading = False
    try:
        spec = _read_spec()
        out = Output(int(spec["output_fd"]))
        controls, measured = _setup(spec)
        _check_permit(spec, controls)
        out.json({"event": "ready", "controls": controls, "measured": measured, "pid": os.getpid()})
        _verify_inputs(spec["files"])
        loading = True
        _run_job(spec, out)
        out.json({"event": "done"})
        return EXIT_OK
    except WorkerError as e:
        code, message = e.code, e.message
    except MemoryError:
        code, message = "runtime.worker.memory_limit", "the worker ran out of address space (RLIMIT_AS)"
    except BaseException as e:  # noqa: BLE001 - report, typed, without a traceback
        if loading:
            code = "runtime.worker.load_failed"
        elif isinstance(e, (KeyError, TypeError, ValueError)):
            code = "runtime.worker.bad_job"
        else:
            code = "runtime.worker.setup_failed"
        message = f"{type(e).__name__}: {_safe_text(e)}"
    if out is not None:
        try:
            out.json({"event": "error", "code": code, "message": message})
        except OSError:
            pass
    return EXIT_ERROR


if __name__ == "__main__":
    # os._exit: no atexit handler, no non-daemon thread the loaded code may have left keeps us alive.
    _status = main()
    sys.stderr.flush()
    os._exit(_status)
