"""The worker protocol: everything that crosses the process boundary, defined once for both sides.

The parent (:mod:`ckptgate.enforce.worker`) writes a :class:`WorkerSpec` on the worker's stdin
and reads framed records from one pipe; the worker (:mod:`ckptgate.enforce._worker_main`) reads
the spec and writes the records.  Both sides take from here:

* the framing: a :data:`HEADER` (one kind byte, a big-endian u64 length), then the payload;
  :data:`REC_JSON` payloads are one JSON object, :data:`REC_BYTES` payloads are raw tensor bytes
  (never a pickle);
* the record kinds (:data:`RECORD_FIELDS`): ``ready``, ``plan``, ``tensor``, ``done`` and
  ``error``, each with its exact set of fields, and the error codes a worker may report;
* the job spec, a frozen record with a strict parser: an unknown, missing or ill-typed field is
  refused, on either side.

This module holds no policy: the parent decides what to ask for and validates what it gets
back; the worker sets up its controls and loads.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ckptgate.digestvalue import Digest, MalformedDigest
from ckptgate.dtypes import TORCH_ITEMSIZE
from ckptgate.enforce.containment import NAMESPACES, RLIMITS

__all__ = [
    "BYTES_JOB",
    "EXIT_ERROR",
    "EXIT_OK",
    "HEADER",
    "JOBS",
    "MAX_SPEC",
    "MODULE_NAME",
    "RECORD_FIELDS",
    "REC_BYTES",
    "REC_JSON",
    "SPEC_VERSION",
    "TORCH_ITEMSIZE",
    "WORKER_ERROR_CODES",
    "PermitTerms",
    "SpecError",
    "SpecFile",
    "WorkerError",
    "WorkerSpec",
    "json_frame",
    "tensor_nbytes",
]

# --------------------------------------------------------------------------- framing

#: Record header: one kind byte and a big-endian u64 payload length.
HEADER = struct.Struct(">cQ")
REC_JSON = b"J"
REC_BYTES = b"B"


def json_frame(doc: Mapping[str, Any]) -> bytes:
    """One framed JSON record (compact, no NaN or infinity)."""
    payload = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    return HEADER.pack(REC_JSON, len(payload)) + payload


# --------------------------------------------------------------------------- records

#: Each record kind (its ``event``) and the exact fields it carries.
RECORD_FIELDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "ready": frozenset({"event", "controls", "measured", "pid"}),
        "plan": frozenset({"event", "file", "tree"}),
        "tensor": frozenset({"event", "file", "path", "dtype", "shape", "nbytes"}),
        "done": frozenset({"event"}),
        "error": frozenset({"event", "code", "message"}),
    }
)
#: The fields of a ``ready`` record's ``measured`` object.
MEASURED_FIELDS: frozenset[str] = frozenset({"seccomp", "no_new_privs", "namespaces", "pid", "rlimits"})

#: Exit statuses of the worker.
EXIT_OK = 0
EXIT_ERROR = 3

#: Error codes the worker may report (the parent accepts no other).
WORKER_ERROR_CODES = frozenset(
    {
        "runtime.worker.bad_job",
        "runtime.worker.setup_failed",
        "runtime.worker.preimport_failed",
        "runtime.worker.control_missing",
        "runtime.worker.permit_mismatch",
        "runtime.worker.input_changed",
        "runtime.worker.load_failed",
        "runtime.worker.memory_limit",
        "runtime.worker.plan_too_large",
        "runtime.worker.select_missing",
        "runtime.worker.unencodable",
    }
)


class WorkerError(Exception):
    """A failure the worker reports as an ``error`` record with a stable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        assert code in WORKER_ERROR_CODES
        self.code = code
        self.message = message

    def record(self) -> dict[str, str]:
        return {"event": "error", "code": self.code, "message": self.message}


def tensor_nbytes(dtype: Any, shape: Any) -> int | None:
    """The byte count a ``tensor`` record with ``dtype`` and ``shape`` must announce; ``None``
    when either is not one this protocol carries (a torch dtype name, a list of ints >= 0)."""
    if (
        not isinstance(dtype, str)
        or dtype not in TORCH_ITEMSIZE
        or not isinstance(shape, list)
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        return None
    n = TORCH_ITEMSIZE[dtype]
    for d in shape:
        n *= d
    return n


# --------------------------------------------------------------------------- the job spec

SPEC_VERSION = 1
#: Largest spec the worker reads.
MAX_SPEC = 16 << 20
#: A dotted module name (pre-imports).
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

#: Job name -> the loader name a permit must allow.
JOBS: Mapping[str, str] = MappingProxyType(
    {
        "torch_load": "torch_load",  # plan only: tensor bytes are never read into the worker
        "deepspeed": "deepspeed",  # the same plan job, permitted as the DeepSpeed loader
        "torch_load_bytes": "torch_load",  # plan plus the selected tensors' bytes, streamed back
    }
)
#: The one job that streams tensor bytes back.
BYTES_JOB = "torch_load_bytes"


class SpecError(ValueError):
    """A job spec that does not have the protocol's shape."""


def _int(v: Any, what: str, *, minimum: int = 0) -> int:
    if type(v) is not int or v < minimum:
        raise SpecError(f"{what} must be an int >= {minimum}")
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str) or not v or "\0" in v:
        raise SpecError(f"{what} must be a non-empty string")
    return v


def _obj(doc: Any, keys: frozenset[str], what: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or set(doc) != keys:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"{what} must be an object with exactly the fields {sorted(keys)}, not {got}")
    return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecFile:
    """An input descriptor the worker inherits, and the sha256 the parent measured of it."""

    fd: int
    relpath: str
    sha256: str

    _FIELDS = frozenset({"fd", "relpath", "sha256"})

    def __post_init__(self) -> None:
        _int(self.fd, "files[].fd", minimum=3)
        _str(self.relpath, "files[].relpath")
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise SpecError("files[].sha256 must be 64 lower-case hex digits")

    def to_json(self) -> dict[str, Any]:
        return {"fd": self.fd, "relpath": self.relpath, "sha256": self.sha256}

    @classmethod
    def from_json(cls, doc: Any) -> SpecFile:
        d = _obj(doc, cls._FIELDS, "a files[] entry")
        return cls(fd=d["fd"], relpath=d["relpath"], sha256=d["sha256"])


@dataclass(frozen=True, slots=True, kw_only=True)
class PermitTerms:
    """What the worker needs of the permit the parent checked: the fixture digest (carried only
    here), the loader, the controls the policy required, and the decision behind it."""

    fixture_digest: Digest
    loader: str
    required_controls: tuple[str, ...]
    decision_id: str

    _FIELDS = frozenset({"fixture_digest", "loader", "required_controls", "decision_id"})

    def __post_init__(self) -> None:
        if not isinstance(self.fixture_digest, Digest):
            raise SpecError("permit.fixture_digest must be a Digest")
        _str(self.loader, "permit.loader")
        if not isinstance(self.required_controls, tuple) or not all(isinstance(c, str) for c in self.required_controls):
            raise SpecError("permit.required_controls must be a tuple of strings")
        if not isinstance(self.decision_id, str):
            raise SpecError("permit.decision_id must be a string")

    def to_json(self) -> dict[str, Any]:
        return {
            "fixture_digest": self.fixture_digest.prefixed(),
            "loader": self.loader,
            "required_controls": list(self.required_controls),
            "decision_id": self.decision_id,
        }

    @classmethod
    def from_json(cls, doc: Any) -> PermitTerms:
        d = _obj(doc, cls._FIELDS, "permit")
        rc = d["required_controls"]
        if not isinstance(rc, list):
            raise SpecError("permit.required_controls must be a list")
        try:
            digest = Digest.parse(d["fixture_digest"])
        except MalformedDigest:
            raise SpecError("permit.fixture_digest must be sha256:<64 hex>") from None
        return cls(
            fixture_digest=digest,
            loader=d["loader"],
            required_controls=tuple(rc),
            decision_id=d["decision_id"],
        )


Select = Mapping[str, tuple[tuple[str | int, ...], ...]]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """One worker job, as the parent sends it on the worker's stdin (JSON, version 1)."""

    job: str
    permit: PermitTerms
    #: The parent's own control: it opened every input descriptor with openat2.
    openat2: bool
    #: Enter new user, network and IPC namespaces; ``pid_ns``: a PID namespace too.
    namespaces: bool
    pid_ns: bool
    #: The parent's namespace ids, against which the worker's are judged.
    parent_namespaces: Mapping[str, str | None]
    rlimits: Mapping[str, int]
    #: The cgroup v2 path the parent moved the worker into, or ``None``.
    cgroup: str | None
    preimports: tuple[str, ...]
    files: tuple[SpecFile, ...]
    #: For the bytes job: ``{relpath: (path, ...)}``, or ``None`` for every tensor.
    select: Select | None
    chunk_bytes: int
    max_nodes: int
    max_depth: int
    #: The worker's end of the output pipe (set just before spawn; -1 until then).
    output_fd: int = -1

    _FIELDS = frozenset(
        {
            "version",
            "job",
            "permit",
            "parent_controls",
            "namespaces",
            "pid_ns",
            "parent_namespaces",
            "rlimits",
            "cgroup",
            "preimports",
            "files",
            "select",
            "chunk_bytes",
            "max_nodes",
            "max_depth",
            "output_fd",
        }
    )

    def __post_init__(self) -> None:
        if self.job not in JOBS:
            raise SpecError(f"unknown job {self.job!r}")
        if not isinstance(self.permit, PermitTerms):
            raise SpecError("permit must be PermitTerms")
        for name in ("openat2", "namespaces", "pid_ns"):
            if type(getattr(self, name)) is not bool:
                raise SpecError(f"{name} must be a bool")
        pns = self.parent_namespaces
        if (
            not isinstance(pns, Mapping)
            or set(pns) != set(NAMESPACES)
            or not all(v is None or isinstance(v, str) for v in pns.values())
        ):
            raise SpecError("parent_namespaces must name every namespace")
        if not isinstance(self.rlimits, Mapping) or set(self.rlimits) != set(RLIMITS):
            raise SpecError(f"rlimits must set exactly {sorted(RLIMITS)}")
        for k, v in self.rlimits.items():
            _int(v, f"rlimits.{k}")
        if self.cgroup is not None:
            _str(self.cgroup, "cgroup")
        if not isinstance(self.preimports, tuple) or not all(
            isinstance(m, str) and MODULE_NAME.match(m) for m in self.preimports
        ):
            raise SpecError("preimports must be a tuple of module names")
        if not isinstance(self.files, tuple) or not self.files or not all(isinstance(f, SpecFile) for f in self.files):
            raise SpecError("files must be a non-empty tuple of SpecFile")
        names = [f.relpath for f in self.files]
        if len(set(names)) != len(names):
            raise SpecError("an input is given twice")
        if self.select is not None:
            if self.job != BYTES_JOB or not isinstance(self.select, Mapping) or not set(self.select) <= set(names):
                raise SpecError("select applies to the bytes job and names input files")
            for paths in self.select.values():
                if not isinstance(paths, tuple) or not all(
                    isinstance(p, tuple) and all(type(s) in (str, int) for s in p) for p in paths
                ):
                    raise SpecError("select holds tuples of paths of str/int segments")
        _int(self.chunk_bytes, "chunk_bytes", minimum=1)
        _int(self.max_nodes, "max_nodes", minimum=1)
        _int(self.max_depth, "max_depth", minimum=1)
        _int(self.output_fd, "output_fd", minimum=-1)

    @property
    def loader(self) -> str:
        """The loader this job runs (what the permit must allow)."""
        return JOBS[self.job]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION,
            "job": self.job,
            "permit": self.permit.to_json(),
            "parent_controls": {"openat2": self.openat2},
            "namespaces": self.namespaces,
            "pid_ns": self.pid_ns,
            "parent_namespaces": dict(self.parent_namespaces),
            "rlimits": dict(self.rlimits),
            "cgroup": self.cgroup,
            "preimports": list(self.preimports),
            "files": [f.to_json() for f in self.files],
            "select": None if self.select is None else {k: [list(p) for p in v] for k, v in self.select.items()},
            "chunk_bytes": self.chunk_bytes,
            "max_nodes": self.max_nodes,
            "max_depth": self.max_depth,
            "output_fd": self.output_fd,
        }

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, doc: Any) -> WorkerSpec:
        """Parse a spec strictly; raises :class:`SpecError`."""
        if isinstance(doc, dict) and doc.get("version") != SPEC_VERSION:
            raise SpecError("the job spec is not a version-1 object")
        d = _obj(doc, cls._FIELDS, "the job spec")
        pc = _obj(d["parent_controls"], frozenset({"openat2"}), "parent_controls")
        for name in ("preimports", "files"):
            if not isinstance(d[name], list):
                raise SpecError(f"{name} must be a list")
        select = d["select"]
        if select is not None:
            if not isinstance(select, dict) or not all(
                isinstance(v, list) and all(isinstance(p, list) for p in v) for v in select.values()
            ):
                raise SpecError("select must map relpaths to lists of paths")
            select = MappingProxyType({k: tuple(tuple(p) for p in v) for k, v in select.items()})
        for name in ("parent_namespaces", "rlimits"):
            if not isinstance(d[name], dict):
                raise SpecError(f"{name} must be an object")
        return cls(
            job=d["job"],
            permit=PermitTerms.from_json(d["permit"]),
            openat2=pc["openat2"],
            namespaces=d["namespaces"],
            pid_ns=d["pid_ns"],
            parent_namespaces=MappingProxyType(dict(d["parent_namespaces"])),
            rlimits=MappingProxyType(dict(d["rlimits"])),
            cgroup=d["cgroup"],
            preimports=tuple(d["preimports"]),
            files=tuple(SpecFile.from_json(f) for f in d["files"]),
            select=select,
            chunk_bytes=d["chunk_bytes"],
            max_nodes=d["max_nodes"],
            max_depth=d["max_depth"],
            output_fd=d["output_fd"],
        )

    @classmethod
    def loads(cls, data: bytes) -> WorkerSpec:
        """Parse a spec from its bytes; raises :class:`SpecError`."""
        if len(data) > MAX_SPEC:
            raise SpecError("the job spec is too large")
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise SpecError(f"the job spec is not JSON: {e}") from e
        return cls.from_json(doc)
