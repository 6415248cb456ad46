"""The parent's reading of a contained worker's output: framed records, validated one by one.

JSON documents (``ready``, ``plan``, ``tensor``, ``done``, ``error``) and raw tensor bytes, never a
pickle (:mod:`ckptgate.enforce.protocol`).  The first violation ends the worker, and nothing it
wrote is used.  :class:`RecordReader` is the reading half of one run
(:class:`ckptgate.enforce.worker._Run`, which owns the process).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ckptgate.enforce import protocol as wp
from ckptgate.enforce.containment import CONTROLS, NAMESPACES
from ckptgate.enforce.protocol import MEASURED_FIELDS, RECORD_FIELDS, WorkerSpec
from ckptgate.enforce.worker_terms import ChunkSink, OpenedInput, TensorBytes, TensorHeader, WorkerLimits

__all__ = ["RecordReader"]

_STDERR_TAIL = 64 << 10


class RecordReader:
    """What a run has read from its worker so far, and the readers of its two streams."""

    spec: WorkerSpec
    files: Sequence[OpenedInput]
    limits: WorkerLimits
    sink: ChunkSink | None
    ready: threading.Event
    plans: dict[str, Any]
    tensors: list[TensorBytes]
    streamed: list[TensorHeader]
    controls: dict[str, bool] | None
    measured: dict[str, Any]
    bad: str | None  # first protocol violation
    error: dict[str, Any] | None
    done: bool
    stderr: bytearray
    sink_error: BaseException | None
    proc: subprocess.Popen[bytes] | None

    def _read_stderr(self, stream: Any) -> None:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                return
            self.stderr += chunk
            if len(self.stderr) > _STDERR_TAIL:
                del self.stderr[:-_STDERR_TAIL]

    def _read_output(self, rfd: int) -> None:
        try:
            with os.fdopen(rfd, "rb", buffering=1 << 20) as f:
                self._parse(f)
        except Exception as e:  # the worker's output is hostile: whatever it makes the reading raise is its fault
            self._violation(f"output that could not be read ({type(e).__name__})")
        finally:
            self.ready.set()  # wake the waiter; it checks the exit status

    def _violation(self, why: str) -> None:
        """Record the first protocol violation and kill the worker: its output is not trusted."""
        if self.bad is None:
            self.bad = why
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _parse(self, f: Any) -> None:
        current: TensorHeader | None = None
        received = 0
        buf: bytearray | None = None
        collected = 0
        while True:
            head = f.read(wp.HEADER.size)
            if not head:
                if current is not None:
                    self._violation("the output ended inside a tensor")
                return
            if len(head) < wp.HEADER.size:
                return self._violation("the output ended inside a record header")
            kind, length = wp.HEADER.unpack(head)
            if kind == wp.REC_BYTES:
                if current is None or received + length > current.nbytes:
                    return self._violation("tensor bytes that no tensor record announced")
                if length > self.limits.chunk_bytes:
                    return self._violation("a tensor chunk larger than the chunk limit")
                data = f.read(length)
                if len(data) != length:
                    return self._violation("the output ended inside a tensor chunk")
                if self.sink is not None:
                    try:
                        self.sink(current, received, data)
                    except BaseException as e:  # re-raised by the caller's thread
                        self.sink_error = e
                        return self._violation("the sink refused a chunk")
                else:
                    assert buf is not None
                    buf += data
                received += length
                if received == current.nbytes:
                    self._finish_tensor(current, buf)
                    current, buf = None, None
                continue
            if kind != wp.REC_JSON:
                return self._violation(f"unknown record type {kind!r}")
            if current is not None:
                return self._violation("a JSON record inside a tensor")
            if length > self.limits.max_json_bytes:
                return self._violation(f"a JSON record of {length} bytes, over the limit")
            payload = f.read(length)
            if len(payload) != length:
                return self._violation("the output ended inside a JSON record")
            try:
                doc = json.loads(payload)
            except ValueError:
                return self._violation("a JSON record that is not JSON")
            except RecursionError:
                return self._violation("a JSON record nested deeper than the parser's limit")
            hdr = self._event(doc)
            if self.bad is not None:
                return
            if hdr is not None:
                collected += hdr.nbytes
                if self.sink is None and collected > self.limits.max_collected_bytes:
                    return self._violation("more tensor bytes than max_collected_bytes")
                current, received = hdr, 0
                buf = bytearray() if self.sink is None else None
                if hdr.nbytes == 0:
                    self._finish_tensor(hdr, buf)
                    current, buf = None, None

    def _finish_tensor(self, hdr: TensorHeader, buf: bytearray | None) -> None:
        self.streamed.append(hdr)
        if buf is not None:
            self.tensors.append(TensorBytes(header=hdr, data=bytes(buf)))

    def _event(self, doc: Any) -> TensorHeader | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("event"), str):
            self._violation("a JSON record that is not an event object")
            return None
        ev = doc["event"]
        if self.done or self.error is not None:
            self._violation(f"a {ev!r} record after the end")
            return None
        if ev == "ready":
            if (
                self.controls is not None
                or set(doc) != RECORD_FIELDS["ready"]
                or not isinstance(doc["controls"], dict)
                or set(doc["controls"]) != set(CONTROLS)
                or not all(isinstance(v, bool) for v in doc["controls"].values())
            ):
                self._violation("a malformed or repeated ready record")
                return None
            why = _measured_mismatch(doc["controls"], doc["measured"], self.spec.parent_namespaces)
            if why:
                self._violation(f"a ready record whose measurements do not support its controls: {why}")
                return None
            self.controls = dict(doc["controls"])
            self.measured = doc["measured"]
            self.ready.set()
            return None
        if ev == "error":
            if (
                set(doc) != RECORD_FIELDS["error"]
                or doc["code"] not in wp.WORKER_ERROR_CODES
                or not isinstance(doc["message"], str)
            ):
                self._violation("a malformed error record")
                return None
            self.error = doc
            return None
        if self.controls is None:
            self._violation(f"a {ev!r} record before the worker was ready")
            return None
        if ev == "plan":
            if (
                set(doc) != RECORD_FIELDS["plan"]
                or doc["file"] not in {f.relpath for f in self.files}
                or doc["file"] in self.plans
            ):
                self._violation("a malformed or repeated plan record")
                return None
            self.plans[doc["file"]] = doc["tree"]
            return None
        if ev == "tensor":
            return self._tensor_header(doc)
        if ev == "done":
            if set(doc) != RECORD_FIELDS["done"]:
                self._violation("a malformed done record")
                return None
            self.done = True
            return None
        self._violation(f"an unknown event {ev!r}")
        return None

    def _tensor_header(self, doc: dict[str, Any]) -> TensorHeader | None:
        if self.spec.job != wp.BYTES_JOB or set(doc) != RECORD_FIELDS["tensor"]:
            self._violation("a tensor record that this job does not produce")
            return None
        shape, nbytes, path = doc["shape"], doc["nbytes"], doc["path"]
        ok = (
            doc["file"] in self.plans
            and isinstance(path, list)
            and all(type(p) in (str, int) for p in path)
            and type(nbytes) is int
            and nbytes >= 0
            and wp.tensor_nbytes(doc["dtype"], shape) == nbytes
        )
        if not ok:
            self._violation("a malformed tensor record (shape, dtype and byte count must agree)")
            return None
        return TensorHeader(file=doc["file"], path=tuple(path), dtype=doc["dtype"], shape=tuple(shape), nbytes=nbytes)


def _measured_mismatch(controls: Mapping[str, bool], measured: Any, parent_ns: Any) -> str:
    """Why the worker's measurements do not back the controls it claims ("" when they do).

    The ``ready`` record is written by ckptgate's own code before any input byte is read; this is
    a consistency check of that record, so that a control reaches the receipt only with the
    measurement behind it: seccomp in filter mode with the allowlist, ``NoNewPrivs: 1``, and each
    namespace id different from the parent's (the ids the parent measured in itself).
    """
    if not isinstance(measured, dict) or set(measured) != MEASURED_FIELDS:
        return "the measured object has the wrong fields"
    sec, ns = measured["seccomp"], measured["namespaces"]
    if (
        not isinstance(sec, dict)
        or not isinstance(ns, dict)
        or set(ns) != set(NAMESPACES)
        or not all(isinstance(v, dict) and set(v) == {"worker", "parent"} for v in ns.values())
    ):
        return "malformed seccomp or namespace measurements"
    if controls.get("seccomp") and (sec.get("status") != 2 or sec.get("mode") != "allowlist"):
        return "seccomp is claimed without Seccomp: 2 and the allowlist"
    if controls.get("no_new_privs") and measured["no_new_privs"] != 1:
        return "no_new_privs is claimed without NoNewPrivs: 1"
    for name, ids in ns.items():
        if isinstance(parent_ns, Mapping) and ids["parent"] != parent_ns.get(name):
            return f"the {name} namespace id of the parent is not the one the parent measured"
        if controls.get(f"{name}_ns") and (not isinstance(ids["worker"], str) or ids["worker"] == ids["parent"]):
            return f"{name}_ns is claimed but the worker's {name} namespace is the parent's"
    return ""
