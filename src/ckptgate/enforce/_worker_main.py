"""The code that runs inside the contained worker (``python -I -B -m ckptgate.enforce._worker_main``).

Order, fixed: read the job spec from stdin; enter new user, network and IPC namespaces (while
still single-threaded) and, where the host allows, a PID namespace, forking into it (this process
stays behind as the reaper); set the rlimits; check the cgroup the parent placed us in; pre-import torch and
the modules the pickle names; set ``no_new_privs``; load the seccomp filter *last*; re-check the
permit against the controls that are now actually active, as this process measured them; only
then re-hash the input descriptors and load.  Nothing here writes a file or sends a pickle: the only output is framed
records on the output descriptor, in the framing of :mod:`ckptgate.enforce.protocol`, which also
defines the job spec read here.  The plan is encoded by :mod:`ckptgate.enforce.plan_encoder`.

Everything after the load runs under the assumption that the loaded code may have been hostile:
the parent validates every record it receives.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import resource
import sys
import types
from typing import Any, cast

from ckptgate.enforce import containment as c
from ckptgate.enforce.plan_encoder import PlanBudget, PlanEncoder, StorageRecord, dtype_name
from ckptgate.enforce.protocol import (
    BYTES_JOB,
    EXIT_ERROR,
    EXIT_OK,
    HEADER,
    MAX_SPEC,
    MODULE_NAME,
    REC_BYTES,
    SpecError,
    SpecFile,
    WorkerError,
    WorkerSpec,
    json_frame,
)

_HASH_CHUNK = 8 << 20


class Output:
    """Framed writes on the output descriptor (the framing is :mod:`ckptgate.enforce.protocol`'s)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def json(self, doc: dict[str, Any]) -> None:
        self._write_all(json_frame(doc))

    def raw(self, chunk: memoryview) -> None:
        self._write_all(HEADER.pack(REC_BYTES, len(chunk)))
        self._write_all(chunk)


# --------------------------------------------------------------------------- spec


def _read_spec() -> WorkerSpec:
    try:
        return WorkerSpec.loads(sys.stdin.buffer.read(MAX_SPEC + 1))
    except SpecError as e:
        raise WorkerError("runtime.worker.bad_job", f"the job spec is malformed: {e}") from e


# --------------------------------------------------------------------------- setup


def _setup(spec: WorkerSpec) -> tuple[dict[str, bool], dict[str, Any]]:
    """Set the controls up in the documented order; return which are active and what the worker
    measured in itself (the receipt's record of the controls that were really active)."""
    controls = dict.fromkeys(c.CONTROLS, False)
    parent_ns = spec.parent_namespaces  # every namespace is named: the spec's parser checked it
    # 1. namespaces, while this process has a single thread (unshare(CLONE_NEWUSER) needs it).  A
    #    new PID namespace applies to children only: the worker forks into it, and this process
    #    stays behind as the child's reaper (fork_into_pid_namespace never returns here).
    if spec.namespaces:
        before_pid = c.namespace_ids()["pid"]
        held, _ = c.enter_namespaces(pid=spec.pid_ns)
        if held["pid_ns"]:
            held["pid_ns"], _ = c.fork_into_pid_namespace(before_pid)
        controls.update(held)
    # Every namespace is judged against the parent's own ids, not against what this process saw.
    ns_now = c.namespace_ids()
    for ns in c.NAMESPACES:
        controls[f"{ns}_ns"] = bool(controls[f"{ns}_ns"] and ns_now[ns] is not None and ns_now[ns] != parent_ns[ns])
    # 2. rlimits.
    controls["rlimits"], _ = c.apply_rlimits(dict(spec.rlimits))
    # 3. cgroup v2: the parent moved us into a limited group before sending the spec.
    if spec.cgroup is not None:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            controls["cgroup_v2"] = f"0::{spec.cgroup}" in f.read().splitlines()
    # 4. pre-imports: torch, its lazily imported serialization config, the pickle's modules.
    for name in ("torch", "torch.utils.serialization", *spec.preimports):
        if not MODULE_NAME.match(name):  # the spec's parser checked these; kept next to the import
            raise WorkerError("runtime.worker.bad_job", f"not a module name: {name!r}")
        try:
            __import__(name)
        except Exception as e:  # any import failure is reported, typed
            raise WorkerError(
                "runtime.worker.preimport_failed", f"pre-import of {name} failed: {type(e).__name__}: {e}"
            ) from e
    _warm_torch()
    # pyseccomp raises at import on a host without libseccomp: imported here, that is a typed
    # runtime.worker.setup_failed record, not a worker that dies before it can report.
    from ckptgate.enforce.seccomp import load_filter  # noqa: PLC0415 - libseccomp may be absent

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
    controls["seccomp"] = (
        controls["seccomp"] and status.get("Seccomp") == c.SECCOMP_MODE_FILTER and report.mode == "allowlist"
    )
    # openat2 is the parent's control: it opened every input descriptor with it.
    controls["openat2"] = spec.openat2
    measured = {
        "seccomp": {
            "mode": report.mode,
            "default": report.default,
            "status": status.get("Seccomp"),
            "filters": status.get("Seccomp_filters"),
            "rules_sha256": report.digest(),
            "allowed": len(report.allowed),
            "conditional": len(report.conditional),
            "kill": list(report.kill),
            "detail": seccomp_detail,
        },
        "no_new_privs": status.get("NoNewPrivs"),
        "namespaces": {ns: {"worker": ns_now[ns], "parent": parent_ns[ns]} for ns in c.NAMESPACES},
        "pid": os.getpid(),
        "rlimits": {name: resource.getrlimit(c.RLIMITS[name])[0] for name in sorted(c.RLIMITS)},
    }
    return controls, measured


def _warm_torch() -> None:
    """Touch what torch initialises lazily (cpuinfo, thread pools) before the filter is loaded."""
    # torch, heavy optional; never at the top: it may start threads, and unshare(CLONE_NEWUSER) needs one.
    import torch  # noqa: PLC0415 - imported by step 4's pre-imports, after the namespaces

    x = torch.ones(4, 4)
    (x @ x).sum().item()
    torch.get_num_threads()


def _check_permit(spec: WorkerSpec, controls: dict[str, bool]) -> None:
    """The worker's own check, across the process boundary from the parent's: the job it runs is
    the permit's loader, and every control the permit requires is active as this process measured it."""
    if spec.permit.loader != spec.loader:
        raise WorkerError(
            "runtime.worker.permit_mismatch",
            f"the permit is for loader {spec.permit.loader!r}, not {spec.loader!r} (job {spec.job!r})",
        )
    missing = [name for name in spec.permit.required_controls if not controls.get(name, False)]
    if missing:
        raise WorkerError(
            "runtime.worker.control_missing",
            f"required containment controls are not active in the worker: {', '.join(missing)}",
        )


def _verify_inputs(files: tuple[SpecFile, ...]) -> None:
    for item in files:
        h = hashlib.sha256()
        offset = 0
        while True:
            chunk = os.pread(item.fd, _HASH_CHUNK, offset)
            if not chunk:
                break
            h.update(chunk)
            offset += len(chunk)
        if h.hexdigest() != item.sha256:
            raise WorkerError(
                "runtime.worker.input_changed", f"{item.relpath} no longer has the sha256 the parent measured"
            )


# --------------------------------------------------------------------------- load


def _declared_nbytes(saved_id: tuple[Any, ...], storage: Any) -> int | None:
    """``numel x element size`` from a torch-zip persistent id ``('storage', type, key, location,
    numel)``; None for any other id: the legacy (non-zip) format's ``(..., numel, view_metadata)``
    counts the root storage's elements, not those of the view it may return."""
    numel = saved_id[4] if len(saved_id) == 5 else None
    if type(numel) is not int or numel < 0:
        return None
    size = storage.element_size() if hasattr(storage, "element_size") else 1
    return numel * int(size)


def _recording_pickle(record: dict[int, StorageRecord], keep: list[Any]) -> Any:
    """A ``pickle_module`` whose Unpickler records which storage key each storage came from, and
    the byte size the pickle declares for it (its persistent id's element count times the element
    size).  The declared size, not the size of what torch allocated, is what the plan reports: under
    ``skip_data`` torch 2.10 allocates ``numel x itemsize**2`` bytes, 2.11 and later ``numel x
    itemsize``.  The parent compares it with the zip record it read statically."""
    # typeshed declares persistent_load a method; the C Unpickler's is a getset descriptor.
    base = cast(types.GetSetDescriptorType, pickle.Unpickler.persistent_load)

    class RecordingUnpickler(pickle.Unpickler):
        @property
        def persistent_load(self) -> Any:
            return base.__get__(self)

        @persistent_load.setter
        def persistent_load(self, fn: Any) -> None:
            def wrapped(saved_id: Any) -> Any:
                storage = fn(saved_id)
                untyped = getattr(storage, "_untyped_storage", storage)
                if isinstance(saved_id, tuple) and len(saved_id) >= 3 and hasattr(untyped, "_cdata"):
                    seen = StorageRecord(str(saved_id[2]), _declared_nbytes(saved_id, storage))
                    first = record.setdefault(untyped._cdata, seen)
                    if first != seen:
                        # torch allocates a key's storage from its first id and hands the same
                        # storage to every later id: a later id declaring another size must not
                        # replace the size torch built (torch.save never writes one)
                        raise ValueError(
                            f"storage {first.key!r} is declared as {first.nbytes} bytes, then as {seen.nbytes}"
                        )
                    keep.append(storage)  # keeps _cdata from being reused
                return storage

            base.__set__(self, wrapped)

    mod = types.ModuleType("ckptgate_recording_pickle")
    mod.Unpickler = RecordingUnpickler  # type: ignore[attr-defined]
    mod.load = pickle.load  # type: ignore[attr-defined]
    mod.loads = pickle.loads  # type: ignore[attr-defined]
    return mod


# --------------------------------------------------------------------------- jobs


def _load_one(item: SpecFile, *, with_data: bool) -> tuple[Any, dict[int, StorageRecord], list[Any]]:
    """``torch.load`` one file.  Without ``with_data`` the storages are allocated but never
    filled (``torch.serialization.skip_data``): the plan needs only keys, dtypes, shapes and
    offsets, so the worker's resident memory stays small whatever the checkpoint's size."""
    import torch  # noqa: PLC0415 - torch, heavy optional: pre-imported in step 4

    record: dict[int, StorageRecord] = {}
    keep: list[Any] = []
    try:
        # weights_only=False: the policy allowed a framework load of these exact bytes, under
        # containment.  weights_only=True is not a trust control [R17, R29].
        with contextlib.nullcontext() if with_data else torch.serialization.skip_data():
            obj = torch.load(
                io.FileIO(item.fd, closefd=False),
                weights_only=False,  # nosec B614
                map_location="cpu",
                pickle_module=_recording_pickle(record, keep),
            )
    except MemoryError as e:
        raise WorkerError(
            "runtime.worker.memory_limit", f"loading {item.relpath} ran out of address space (RLIMIT_AS)"
        ) from e
    except BaseException as e:  # the loaded code may raise anything
        raise WorkerError(
            "runtime.worker.load_failed", f"loading {item.relpath} failed: {type(e).__name__}: {_safe_text(e)}"
        ) from e
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
    import torch  # noqa: PLC0415 - torch, heavy optional: pre-imported in step 4

    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    nbytes = int(raw.numel())
    out.json(
        {
            "event": "tensor",
            "file": relpath,
            "path": path,
            "dtype": dtype_name(t.dtype),
            "shape": [int(d) for d in t.shape],
            "nbytes": nbytes,
        }
    )
    view = memoryview(raw.numpy()) if nbytes else memoryview(b"")
    for start in range(0, nbytes, chunk_bytes):
        out.raw(view[start : start + chunk_bytes])


def _run_job(spec: WorkerSpec, out: Output) -> None:
    budget = PlanBudget(spec.max_nodes, spec.max_depth)
    select = spec.select
    for item in spec.files:
        obj, record, keep = _load_one(item, with_data=spec.job == BYTES_JOB)
        enc = PlanEncoder(record, budget)
        tree = enc.encode(obj, [])
        out.json({"event": "plan", "file": item.relpath, "tree": tree})
        if spec.job == BYTES_JOB:
            wanted = select.get(item.relpath) if select is not None else None
            if wanted is None and select is None:
                pairs = enc.tensors
            else:
                pairs = []
                for selected in wanted or ():
                    path = list(selected)
                    try:
                        node = _find(obj, path)
                    except KeyError as e:
                        raise WorkerError(
                            "runtime.worker.select_missing", f"{item.relpath}: no object at {path!r}"
                        ) from e
                    import torch  # noqa: PLC0415 - torch, heavy optional: pre-imported in step 4

                    if not isinstance(node, torch.Tensor):
                        raise WorkerError(
                            "runtime.worker.select_missing", f"{item.relpath}: the object at {path!r} is not a tensor"
                        )
                    pairs.append((path, node))
            for path, t in pairs:
                _stream_tensor(out, item.relpath, path, t, spec.chunk_bytes)
        del obj, enc, tree, record, keep


def _safe_text(e: BaseException, limit: int = 300) -> str:
    """``str(e)``, bounded; an exception whose ``__str__`` fails is named, not re-raised."""
    try:
        text = str(e)
    except BaseException:  # the exception may come from hostile code
        return "<unprintable>"
    return text[:limit]


def main() -> int:
    out: Output | None = None
    loading = False
    try:
        spec = _read_spec()
        out = Output(spec.output_fd)
        controls, measured = _setup(spec)
        _check_permit(spec, controls)
        out.json({"event": "ready", "controls": controls, "measured": measured, "pid": os.getpid()})
        _verify_inputs(spec.files)
        loading = True
        _run_job(spec, out)
        out.json({"event": "done"})
        return EXIT_OK
    except WorkerError as e:
        code, message = e.code, e.message
    except MemoryError:
        code, message = "runtime.worker.memory_limit", "the worker ran out of address space (RLIMIT_AS)"
    except BaseException as e:  # report, typed, without a traceback
        if loading:
            code = "runtime.worker.load_failed"
        elif isinstance(e, (KeyError, TypeError, ValueError)):
            code = "runtime.worker.bad_job"
        else:
            code = "runtime.worker.setup_failed"
        message = f"{type(e).__name__}: {_safe_text(e)}"
    if out is not None:
        try:
            out.json(WorkerError(code, message).record())
        except OSError:
            pass
    return EXIT_ERROR


if __name__ == "__main__":
    # os._exit: no atexit handler, no non-daemon thread the loaded code may have left keeps us alive.
    _status = main()
    sys.stderr.flush()
    os._exit(_status)
