"""What one contained worker run is given and gives back: its inputs, its limits, its results.

The values :func:`ckptgate.enforce.worker.run_contained` takes and returns, apart from the process
that runs it (:mod:`ckptgate.enforce.worker`) and the reading of its records
(:mod:`ckptgate.enforce.worker_records`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ckptgate.enforce.containment import RLIMITS

__all__ = [
    "PREIMPORT_ROOTS",
    "ChunkSink",
    "OpenedInput",
    "TensorBytes",
    "TensorHeader",
    "WorkerLimits",
    "WorkerResult",
]

#: Top-level packages the worker may pre-import before the filter is loaded.  A module outside
#: these is refused before spawn: importing it would run its top-level code unfiltered.
PREIMPORT_ROOTS: frozenset[str] = frozenset(
    {
        "torch",
        "numpy",
        "collections",
        "deepspeed",
        "megatron",
        "peft",
        "transformers",
        "argparse",
        "enum",
        "datetime",
        "decimal",
        "fractions",
        "pathlib",
        "typing",
        "dataclasses",
        "functools",
        "_codecs",
        "codecs",
        "copyreg",
        "builtins",
        "types",
    }
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenedInput:
    """An input the parent opened read-only and hashed (consolidation hands over a sealed in-memory
    copy read through the tree); the worker inherits ``fd``, and re-hashes it against ``sha256``."""

    fd: int
    relpath: str
    sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.fd, int) or self.fd < 3:
            raise ValueError("fd must be an int >= 3")
        if not isinstance(self.relpath, str) or not self.relpath or "\0" in self.relpath:
            raise ValueError("relpath must be a non-empty string")
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise ValueError("sha256 must be 64 lower-case hex digits")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLimits:
    """Resource limits of one worker run."""

    #: RLIMIT_AS; torch alone maps about 4.5 GB of address space.
    address_space_bytes: int = 32 << 30
    #: RLIMIT_CPU (all threads together).
    cpu_seconds: int = 3600
    #: RLIMIT_FSIZE: the worker writes no file, so 0.
    file_size_bytes: int = 0
    #: RLIMIT_NOFILE.
    open_files: int = 256
    #: RLIMIT_NPROC (threads count too).
    processes: int = 256
    #: cgroup v2 ``memory.max`` and ``pids.max``, where the host has them.
    cgroup_memory_bytes: int = 32 << 30
    cgroup_pids: int = 256
    #: Seconds for interpreter start, pre-imports and setup, before the ``ready`` record.
    setup_timeout_s: float = 120.0
    #: Largest JSON record accepted from the worker.
    max_json_bytes: int = 256 << 20
    #: Tensor bytes are sent in chunks of at most this size.
    chunk_bytes: int = 8 << 20
    #: Largest total of tensor bytes collected in memory when no sink is given.
    max_collected_bytes: int = 1 << 30
    #: Object-tree limits of the placement plan.
    max_nodes: int = 2_000_000
    max_depth: int = 200

    def __post_init__(self) -> None:
        for name in (
            "address_space_bytes",
            "cpu_seconds",
            "open_files",
            "processes",
            "cgroup_memory_bytes",
            "cgroup_pids",
            "max_json_bytes",
            "chunk_bytes",
            "max_collected_bytes",
            "max_nodes",
            "max_depth",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int")
        if not isinstance(self.file_size_bytes, int) or self.file_size_bytes < 0:
            raise ValueError("file_size_bytes must be an int >= 0")
        if not self.setup_timeout_s > 0:
            raise ValueError("setup_timeout_s must be positive")

    def rlimits(self) -> dict[str, int]:
        out = {
            "AS": self.address_space_bytes,
            "CPU": self.cpu_seconds,
            "FSIZE": self.file_size_bytes,
            "NOFILE": self.open_files,
            "NPROC": self.processes,
        }
        assert set(out) == set(RLIMITS)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorHeader:
    """A tensor the worker streams as raw bytes (C-contiguous, native little-endian)."""

    file: str
    path: tuple[str | int, ...]
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorBytes:
    """A streamed tensor collected in memory (when no sink was given)."""

    header: TensorHeader
    data: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerResult:
    """What a worker run produced: per-file placement plans and, for bytes jobs, tensors."""

    job: str
    plans: Mapping[str, Any]
    controls: Mapping[str, bool]
    #: What the worker measured in itself once its filter was loaded, before it read an input:
    #: seccomp mode and filter, ``NoNewPrivs``, its namespace ids beside the parent's, rlimits.
    measured: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    tensors: tuple[TensorBytes, ...] = ()
    streamed: tuple[TensorHeader, ...] = ()
    wall_s: float = 0.0
    pid: int = 0
    stderr_tail: str = field(default="", repr=False)


#: A sink receives each chunk of a streamed tensor: (header, offset, bytes).
ChunkSink = Callable[[TensorHeader, int, bytes], None]
