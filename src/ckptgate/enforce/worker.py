"""The contained worker: framework deserializers run only here, under a permit [R27, R28, R34].

:func:`run_contained` spawns ``python -I -B -m ckptgate.enforce._worker_main`` (a fresh
interpreter, never a fork of this process's state) with a minimal environment, in its own
process group, and hands it only the input descriptors the parent opened (with ``openat2``) and
hashed, plus one output pipe.  The worker sets up namespaces, rlimits, pre-imports,
``no_new_privs`` and seccomp, in that order, re-checks the permit against the controls that are
then active, and only then reads its inputs (see :mod:`ckptgate.enforce._worker_main`).

Channels: in, the descriptors and a :class:`~ckptgate.enforce.protocol.WorkerSpec` on stdin;
out, framed records on one pipe: JSON documents (``ready``, ``plan``, ``tensor``, ``done``,
``error``) and raw tensor bytes, never a pickle.  The spec, the framing and the record kinds are
:mod:`ckptgate.enforce.protocol`'s, shared with the worker; this module is the parent's half.  It
checks the permit once, where the permit meets the job, before spawn; it validates every record;
a crash, a timeout, a non-zero exit or a malformed record raises
:class:`~ckptgate.errors.RuntimeFailure` with a stable code.

Containment narrows what hostile code in a loader can reach; it is not proof that the load is
safe, and the controls hold only as measured on this host [R30-R35, claim rules 5 and 7].
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ckptgate.digest import Digest
from ckptgate.enforce import protocol as wp
from ckptgate.enforce.containment import NAMESPACES, ContainmentProfile, cgroup_v2_slot, namespace_ids
from ckptgate.enforce.protocol import JOBS, PermitTerms, SpecError, SpecFile, WorkerSpec
from ckptgate.enforce.worker_records import RecordReader
from ckptgate.enforce.worker_terms import (
    PREIMPORT_ROOTS,
    ChunkSink,
    OpenedInput,
    TensorBytes,
    TensorHeader,
    WorkerLimits,
    WorkerResult,
)
from ckptgate.errors import RuntimeFailure

if TYPE_CHECKING:
    from ckptgate.enforce.permit import Permit

__all__ = [
    "JOBS",
    "PREIMPORT_ROOTS",
    "ChunkSink",
    "OpenedInput",
    "TensorBytes",
    "TensorHeader",
    "WorkerLimits",
    "WorkerResult",
    "run_contained",
]

#: Seconds to wait, after the worker's process group is reaped, for its output to be parsed.
_READER_JOIN_S = 120.0


def run_contained(
    job: str,
    files: Sequence[OpenedInput],
    *,
    permit: Permit,
    profile: ContainmentProfile,
    limits: WorkerLimits,
    timeout_s: float,
    fixture_digest: Digest,
    preimports: Sequence[str] = (),
    select: Mapping[str, Sequence[Sequence[str | int]]] | None = None,
    sink: ChunkSink | None = None,
) -> WorkerResult:
    """Run ``job`` on ``files`` in a contained worker; raises on anything but a clean result.

    :param job: one of :data:`JOBS`: ``torch_load`` or ``deepspeed`` (JSON placement plan), or
        ``torch_load_bytes`` (plan plus raw bytes of the tensors in ``select``,
        ``{relpath: [path, ...]}``, or of every tensor if ``None``).
    :param permit: checked here, once (seal, digest, loader, the profile's controls), before
        spawn; the worker checks its terms again against the controls that are actually active,
        before it reads anything, and a result whose controls lack a required one is refused.
    :param fixture_digest: the digest of the fixture these files belong to.
    :param preimports: modules the pickle's globals live in (from the static reader); each must be
        under :data:`PREIMPORT_ROOTS`.
    :param timeout_s: seconds for the load after setup; ``limits.setup_timeout_s`` covers setup.
    :raises PolicyDenied: the permit does not allow this run (``enforce.permit.*``).
    :raises RuntimeFailure: ``runtime.worker.*``.
    """
    loader = JOBS.get(job)
    if loader is None:
        raise RuntimeFailure("runtime.worker.bad_job", f"unknown worker job {job!r}", evidence={"jobs": sorted(JOBS)})
    if not isinstance(profile, ContainmentProfile):
        raise RuntimeFailure("runtime.worker.control_missing", "no containment preflight profile was given")
    if not isinstance(limits, WorkerLimits):
        raise RuntimeFailure("runtime.worker.bad_job", "limits must be a WorkerLimits")
    if not timeout_s > 0:
        raise RuntimeFailure("runtime.worker.bad_job", "timeout_s must be positive")
    _check_files(files)
    mods = _check_preimports(preimports)
    if select is not None:
        unknown_files = sorted(set(select) - {f.relpath for f in files})
        bad_paths = [p for paths in select.values() for p in paths if not all(type(seg) in (str, int) for seg in p)]
        if job != wp.BYTES_JOB or unknown_files or bad_paths:
            raise RuntimeFailure(
                "runtime.worker.bad_job",
                "select applies to torch_load_bytes, names input files, and holds paths of str/int segments",
                evidence={"unknown_files": unknown_files},
            )
    # The permit is the authority: digest, loader and the controls this host has [PolicyDenied].
    if permit is None or not callable(getattr(permit, "check", None)):
        raise RuntimeFailure("runtime.worker.permit_missing", "a framework load needs a permit")
    # The one check in this process: a control the profile does not have (unknown ones included)
    # is enforce.permit.control_missing here.
    permit.check(fixture_digest=fixture_digest, loader=loader, controls=profile.controls)
    try:
        spec = WorkerSpec(
            job=job,
            permit=PermitTerms(
                fixture_digest=permit.fixture_digest,
                loader=permit.loader,
                required_controls=tuple(permit.required_controls),
                decision_id=permit.decision_id,
            ),
            openat2=bool(profile.controls["openat2"]),
            namespaces=any(profile.controls[f"{ns}_ns"] for ns in NAMESPACES),
            pid_ns=bool(profile.controls["pid_ns"]),  # where the preflight found the host allows it
            parent_namespaces=MappingProxyType(namespace_ids()),
            rlimits=MappingProxyType(limits.rlimits()),
            cgroup=None,
            preimports=tuple(mods),
            files=tuple(SpecFile(fd=f.fd, relpath=f.relpath, sha256=f.sha256) for f in files),
            select=None
            if select is None
            else MappingProxyType({k: tuple(tuple(p) for p in v) for k, v in select.items()}),
            chunk_bytes=limits.chunk_bytes,
            max_nodes=limits.max_nodes,
            max_depth=limits.max_depth,
        )
    except SpecError as e:
        raise RuntimeFailure("runtime.worker.bad_job", f"the worker job cannot be specified: {e}") from e
    return _Run(spec, files, limits, timeout_s, sink, use_cgroup=profile.controls["cgroup_v2"]).run()


def _check_files(files: Sequence[OpenedInput]) -> None:
    if not files:
        raise RuntimeFailure("runtime.worker.bad_job", "the worker needs at least one input")
    seen: set[str] = set()
    for f in files:
        if not isinstance(f, OpenedInput):
            raise RuntimeFailure("runtime.worker.bad_job", "inputs must be OpenedInput records")
        if f.relpath in seen:
            raise RuntimeFailure("runtime.worker.bad_job", f"input {f.relpath!r} is given twice")
        seen.add(f.relpath)
        try:
            st = os.fstat(f.fd)
            flags = fcntl.fcntl(f.fd, fcntl.F_GETFL)
        except OSError as e:
            raise RuntimeFailure("runtime.worker.bad_job", f"input descriptor of {f.relpath!r} is not open: {e}") from e
        if not stat.S_ISREG(st.st_mode):
            raise RuntimeFailure("runtime.worker.bad_job", f"input {f.relpath!r} is not a regular file")
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise RuntimeFailure("runtime.worker.bad_job", f"input {f.relpath!r} must be opened read-only")


def _check_preimports(preimports: Sequence[str]) -> list[str]:
    mods: list[str] = []
    for m in preimports:
        if not isinstance(m, str) or not wp.MODULE_NAME.match(m):
            raise RuntimeFailure("runtime.worker.preimport_refused", f"not a module name: {m!r}")
        if m.split(".", 1)[0] not in PREIMPORT_ROOTS:
            raise RuntimeFailure(
                "runtime.worker.preimport_refused",
                f"module {m!r} is not under an allowed package; it would be imported, "
                f"running its top-level code, before the seccomp filter is loaded",
                evidence={"module": m, "allowed_roots": sorted(PREIMPORT_ROOTS)},
            )
        if m not in mods:
            mods.append(m)
    return mods


class _Run(RecordReader):
    """One worker process, its reader threads and its clocks."""

    def __init__(
        self,
        spec: WorkerSpec,
        files: Sequence[OpenedInput],
        limits: WorkerLimits,
        timeout_s: float,
        sink: ChunkSink | None,
        *,
        use_cgroup: bool,
    ) -> None:
        self.spec = spec
        self.files = files
        self.required = spec.permit.required_controls
        self.limits = limits
        self.timeout_s = timeout_s
        self.sink = sink
        self.use_cgroup = use_cgroup
        self.ready = threading.Event()
        self.plans: dict[str, Any] = {}
        self.tensors: list[TensorBytes] = []
        self.streamed: list[TensorHeader] = []
        self.controls: dict[str, bool] | None = None
        self.measured: dict[str, Any] = {}
        self.bad: str | None = None  # first protocol violation
        self.error: dict[str, Any] | None = None
        self.done = False
        self.stderr = bytearray()
        self.sink_error: BaseException | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    # ---- process

    def run(self) -> WorkerResult:
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": str(max(1, min(8, os.cpu_count() or 1))),
        }
        self.spec = replace(self.spec, output_fd=wfd)
        slot = None
        if self.use_cgroup:
            slot, why = cgroup_v2_slot(memory_max=self.limits.cgroup_memory_bytes, pids_max=self.limits.cgroup_pids)
            if slot is None:
                os.close(rfd)
                os.close(wfd)
                raise RuntimeFailure(
                    "runtime.worker.control_missing", f"cgroup v2 was preflighted but a group cannot be made now: {why}"
                )
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(  # fixed argv, no shell
                [sys.executable, "-I", "-B", "-m", "ckptgate.enforce._worker_main"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(wfd, *(f.fd for f in self.files)),
                close_fds=True,
                env=env,
                cwd="/",
                start_new_session=True,
            )
        except OSError as e:
            os.close(rfd)
            os.close(wfd)
            if slot is not None:
                slot.remove()
            raise RuntimeFailure("runtime.worker.spawn_failed", f"cannot start the worker: {e}") from e
        os.close(wfd)
        self.proc = proc
        readers = [
            threading.Thread(target=self._read_output, args=(rfd,), daemon=True),
            threading.Thread(target=self._read_stderr, args=(proc.stderr,), daemon=True),
        ]
        try:
            for t in readers:
                t.start()
            if slot is not None:
                slot.add(proc.pid)
                self.spec = replace(self.spec, cgroup=slot.relpath)
            self._send_spec(proc)
            status = self._wait(proc, t0)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            # The group is reaped, so the pipes reach EOF; parsing a large plan may still take a while.
            for t in readers:
                t.join(timeout=_READER_JOIN_S)
            if slot is not None:
                slot.remove()
        if any(t.is_alive() for t in readers):
            raise RuntimeFailure(
                "runtime.worker.bad_output",
                f"the worker's output was still being read {_READER_JOIN_S:g} s after it exited",
            )
        return self._result(proc, status, time.monotonic() - t0)

    def _send_spec(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(self.spec.dumps())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # the worker died; its exit status tells why

    def _wait(self, proc: subprocess.Popen[bytes], t0: float) -> int:
        deadline = t0 + self.limits.setup_timeout_s
        while not self.ready.is_set():
            if proc.poll() is not None:
                return proc.returncode
            if time.monotonic() > deadline:
                _kill_group(proc)
                raise RuntimeFailure(
                    "runtime.worker.timeout",
                    f"the worker did not finish its setup in {self.limits.setup_timeout_s:g} s; it was killed",
                    evidence={"pid": proc.pid, "phase": "setup"},
                )
            self.ready.wait(0.05)
        try:
            return proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise RuntimeFailure(
                "runtime.worker.timeout",
                f"the contained load did not finish in {self.timeout_s:g} s; the worker's "
                "process group was killed and nothing was published",
                evidence={"pid": proc.pid, "phase": "load"},
            ) from None

    # ---- outcome

    def _result(self, proc: subprocess.Popen[bytes], status: int, wall: float) -> WorkerResult:
        tail = self.stderr.decode("utf-8", "replace")[-4000:]
        evidence: dict[str, Any] = {"pid": proc.pid, "exit_status": status}
        if self.sink_error is not None:
            raise self.sink_error
        if self.bad is not None:
            raise RuntimeFailure(
                "runtime.worker.bad_output", f"the worker's output was malformed: {self.bad}", evidence=evidence
            )
        if status < 0:
            sig = -status
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            whys: dict[int, str] = {
                signal.SIGSYS: "a forbidden system call (seccomp)",
                signal.SIGXCPU: "the CPU-time limit (RLIMIT_CPU)",
                signal.SIGKILL: "SIGKILL (a limit, or the out-of-memory killer)",
            }
            why = whys.get(sig, f"signal {name}")
            raise RuntimeFailure(
                "runtime.worker.crashed",
                f"the contained worker was killed by {why}; nothing was published",
                evidence={**evidence, "signal": name, "stderr_tail": tail[-1000:]},
            )
        if self.error is not None:
            raise RuntimeFailure(
                self.error["code"],
                f"the contained worker failed: {self.error['message'][:500]}",
                evidence={**evidence, "worker_message": self.error["message"][:2000]},
            )
        if status != 0:
            raise RuntimeFailure(
                "runtime.worker.crashed",
                f"the contained worker exited with status {status} without a result",
                evidence={**evidence, "stderr_tail": tail[-1000:]},
            )
        if not self.done or self.controls is None or set(self.plans) != {f.relpath for f in self.files}:
            raise RuntimeFailure(
                "runtime.worker.bad_output", "the worker exited without a complete result", evidence=evidence
            )
        missing = [c for c in self.required if not self.controls.get(c, False)]
        if missing:  # the worker checks this too; a result that claims otherwise is refused
            raise RuntimeFailure(
                "runtime.worker.control_missing",
                f"required controls were not active in the worker: {', '.join(missing)}",
                evidence={**evidence, "missing": missing},
            )
        return WorkerResult(
            job=self.spec.job,
            plans=MappingProxyType(self.plans),
            controls=MappingProxyType(self.controls),
            measured=MappingProxyType(self.measured),
            tensors=tuple(self.tensors),
            streamed=tuple(self.streamed),
            wall_s=wall,
            pid=proc.pid,
            stderr_tail=tail,
        )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's whole process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
        pass
