"""One gated intake across the ranks of a torch.distributed job (``ckptgate intake --distributed``).

This module is a consumer, like :mod:`ckptgate.pipeline`: it composes the same steps, and no step
imports it.  Under ``torchrun`` (or any launcher that sets torch.distributed's ``env://``
variables), every rank runs :func:`distributed_intake` on the same SRC and DST, on one shared
file system:

1. **Inspect.**  Every rank walks and inspects SRC itself (headers and metadata only), and the
   ranks exchange what inspection read: each file's read ledger (:mod:`ckptgate.inspect.hashed`).
2. **Hash, split by bytes.**  The files are assigned to ranks, largest first to the rank with the
   fewest bytes.  Each rank hashes its own files with the digest's per-file code
   (:func:`ckptgate.digest.hash_files`), which checks every chunk that *any* rank's inspection
   read, and records the sha256 of every :data:`COPY_CHUNK`-aligned chunk (the chunk manifest).
3. **Decide once.**  Rank 0 forms the fixture digest from the gathered manifest entries (the same
   digest a single process computes), verifies the attestations and asks the policy engine once.
   The decision is sent to every rank, each of which enforces it and derives the consolidation
   plan; the ranks compare the plan's sha256 and stop on any difference.
4. **Write in parallel, publish once.**  Rank 0 makes the staging directory beside DST; the output
   files are assigned to ranks, balanced by bytes; each rank writes and hashes its own into that
   directory, reading its sources in whole chunks checked against the chunk manifest (so bytes
   another rank hashed are checked before they are written).  Rank 0 gathers the hashes, writes
   the index and the receipt (with a ``topology`` record) and publishes with one atomic rename.

Messages between ranks are data: JSON in ``uint8`` tensors (``all_gather``), never
pickle-based object collectives, each authenticated with an HMAC-SHA256 keyed by the per-job
secret in :data:`SECRET_ENV` and bound to the phase, the sequence number, the sender's rank, the
world size, the job's nonce (the first exchange: rank 0 picks a random one, and every rank adds its
own) and, once the ranks have formed it, the fixture digest: a message recorded in one job is
refused in another that shares the secret.  Every phase ends in one exchange where each rank
reports success or its error: any rank's error, a deny, a wrong HMAC, or a rank that dies or stops
answering (the collectives' timeout) makes every rank raise, the staging directory is removed, and nothing is published.
Every rank then exits with the exit code of the first failure (the lowest failing rank's).
gloo is unencrypted: the rendezvous and the ranks must stay on the job's private network [R28].

Every plane is taken in this way.  When the plan needs a framework load (the files
:func:`~ckptgate.consolidate.framework_files` names), each rank runs the enforce step on the files
it owns: the same permit for the same fixture digest, minted on every rank from the broadcast
decision, and its own contained worker (:func:`~ckptgate.enforce.gate.enforce`); the workers' JSON
trees (never a pickle) are gathered, so every rank plans from the same trees.  A control counts as
held only when it held in every worker, and each rank's worker record is in the topology.
``--dtype`` and ``--select`` are refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import heapq
import hmac
import json
import os
import secrets
import signal
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ckptgate import interrupts
from ckptgate._fs import LOCAL_FILE_SYSTEMS
from ckptgate.consolidate import framework_files, plan_for
from ckptgate.consolidate.plan import ConsolidationPlan, Placement, ShardTask
from ckptgate.consolidate.writer import WrittenFile, header_bytes, write_index
from ckptgate.decide import PolicyEngine
from ckptgate.decide.decision import Decision, Reason
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.digest import FixtureDigest, ManifestEntry, hash_files
from ckptgate.enforce.gate import WorkerOptions, enforce
from ckptgate.enforce.load import LoadedTrees
from ckptgate.errors import Error, RuntimeFailure, UsageError
from ckptgate.group import Group, Relayed, canonical
from ckptgate.inspect import DeferredCrcs, Finding, Inspection, SafeTree, Severity, inspect_open_tree
from ckptgate.pipeline import (
    Consolidated,
    Evaluation,
    IntakeResult,
    judge,
    local_opa_version,
    receipt_for,
    still_held,
)
from ckptgate.publish import Destination, Stage, check_destination, open_destination, publish, staging
from ckptgate.verify import TrustData
from ckptgate.verify.dsse import Signer
from ckptgate.verify.oms import load_verification_material

__all__ = [
    "COPY_CHUNK",
    "SECRET_ENV",
    "DistributedOptions",
    "Relayed",
    "TorchGroup",
    "assign_by_size",
    "distributed_intake",
    "plan_sha256",
]

#: The environment variable that carries the per-job secret every message is authenticated with.
SECRET_ENV = "CKPTGATE_DIST_SECRET"
MIN_SECRET_BYTES = 16
#: Each rank's share of the job's nonce (rank 0's first among them), from :func:`secrets.token_hex`.
NONCE_BYTES = 32
#: The chunk manifest's granularity: 4 MiB, so a terabyte's manifest is about 8 MB of digests.
COPY_CHUNK = 4 << 20
#: No message between ranks may be larger (a peer that claims more is refused before allocation).
MAX_MESSAGE = 1 << 30
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedOptions:
    """How long any one exchange may wait for every rank (the collectives' timeout)."""

    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not (0 < self.timeout_s <= 86400):
            raise UsageError(
                "usage.distributed.timeout",
                f"the distributed deadline must be between 0 and 86400 seconds, not {self.timeout_s!r}",
            )


def _peer_lost(what: str, e: BaseException) -> RuntimeFailure:
    return RuntimeFailure(
        "runtime.distributed.peer_lost",
        f"a rank did not answer in the {what} exchange (it died, or passed the deadline): "
        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; nothing was published",
        evidence={"phase": what},
        advice="Check every rank's output and the launcher's; take the checkpoint in again.",
    )


def _secret() -> bytes:
    raw = os.environ.get(SECRET_ENV, "")
    if len(raw.encode()) < MIN_SECRET_BYTES:
        raise UsageError(
            "usage.distributed.secret",
            f"--distributed needs a per-job secret of at least "
            f"{MIN_SECRET_BYTES} bytes in ${SECRET_ENV}, the same on every rank, to authenticate "
            "the messages between ranks" + ("" if raw else "; none was set"),
            advice=f"Generate one per job (e.g. `openssl rand -hex 32`) and pass it to every rank "
            f"in ${SECRET_ENV}; see docs/scale-out.md.",
        )
    return raw.encode()


def _launcher_env() -> None:
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise UsageError(
            "usage.distributed.no_launcher",
            f"--distributed runs under torchrun or a launcher that "
            f"sets torch.distributed's environment; {', '.join(missing)} is not set",
            advice="Run `torchrun --nproc-per-node N -m ckptgate intake ... --distributed`.",
        )


class TorchGroup(Group):
    """The ranks of a torch.distributed job: authenticated exchanges of JSON, over ``all_gather`` of bytes."""

    def __init__(self, dist: Any, torch: Any, secret: bytes) -> None:
        self.dist, self.torch, self.secret = dist, torch, secret
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.seq = 0
        self.nonce = ""  # this job's, from the first exchange (:meth:`start`)
        self.fixture = ""  # the fixture digest, once the ranks have formed it (:meth:`bind_fixture`)

    def _mac(self, phase: str, sender: int, body: bytes) -> bytes:
        head = [phase, self.seq, sender, self.world, self.nonce, self.fixture]
        return hmac.new(
            self.secret, json.dumps(head, separators=(",", ":")).encode() + b"\0" + body, hashlib.sha256
        ).digest()

    def start(self) -> None:
        """The first exchange: rank 0 picks a random nonce (every other rank adds one of its own), and
        this job's nonce, the sha256 of them all in rank order, is bound into every later message's
        HMAC.  A message recorded in another job that shares the secret carries another job's nonce:
        it is refused (``runtime.distributed.unauthenticated``), from the second exchange on."""
        hellos = self.exchange("nonce", {"nonce": secrets.token_hex(NONCE_BYTES)})
        nonces = [h.get("nonce") if isinstance(h, dict) else None for h in hellos]
        if not all(isinstance(n, str) and len(n) == 2 * NONCE_BYTES for n in nonces):
            raise RuntimeFailure(
                "runtime.distributed.message",
                "a rank's first message carries no nonce of the expected size; refused",
                evidence={"phase": "nonce"},
            )
        self.nonce = hashlib.sha256("".join(str(n) for n in nonces).encode()).hexdigest()

    def bind_fixture(self, digest: str) -> None:
        """From now on every message's HMAC also covers the fixture digest the ranks formed."""
        self.fixture = digest

    def exchange(self, phase: str, data: Any) -> list[Any]:
        """Every rank's ``data`` (JSON, keys in their order), in rank order, each message's HMAC checked."""
        torch, dist = self.torch, self.dist
        self.seq += 1
        body = canonical(data)  # the HMAC covers the bytes
        payload = self._mac(phase, self.rank, body) + body
        try:
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
            dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64))
            lengths = [int(s.item()) for s in sizes]
            if not all(32 <= n <= MAX_MESSAGE for n in lengths):
                raise RuntimeFailure(
                    "runtime.distributed.message",
                    f"a rank announced a message of {max(lengths)} bytes in the {phase} exchange; refused",
                    evidence={"phase": phase, "sizes": lengths},
                )
            width = max(lengths)
            mine = torch.zeros(width, dtype=torch.uint8)
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            bufs = [torch.empty(width, dtype=torch.uint8) for _ in range(self.world)]
            dist.all_gather(bufs, mine)
        except Error:
            raise
        except Exception as e:  # gloo: connection closed, timeout
            raise _peer_lost(phase, e) from None
        out = []
        for sender, (buf, n) in enumerate(zip(bufs, lengths, strict=True)):
            raw = buf[:n].numpy().tobytes()
            if not hmac.compare_digest(raw[:32], self._mac(phase, sender, raw[32:])):
                raise RuntimeFailure(
                    "runtime.distributed.unauthenticated",
                    f"the {phase} message from rank {sender} does not carry a valid HMAC under "
                    f"this rank's ${SECRET_ENV}; nothing was published",
                    evidence={"phase": phase, "rank": sender},
                    advice=f"Give every rank the same ${SECRET_ENV}, and keep the job's network "
                    "private (docs/scale-out.md).",
                )
            out.append(json.loads(raw[32:]))
        return out


def assign_by_size(items: Sequence[tuple[str, int]], world: int, *, first: Collection[str] = ()) -> list[list[str]]:
    """Items to ranks, largest first to the rank with the fewest bytes so far (ties: by name, then
    the lowest rank): deterministic on every rank.  The items named in ``first`` (the files that
    need a framework load) are spread before all others, so that every rank loads a share."""
    loads = [0] * world
    out: list[list[str]] = [[] for _ in range(world)]
    early = set(first)
    for name, size in sorted(items, key=lambda x: (x[0] not in early, -x[1], x[0])):
        r = min(range(world), key=lambda k: (loads[k], k))
        out[r].append(name)
        loads[r] += size
    return out


def plan_sha256(plan: ConsolidationPlan) -> str:
    """The sha256 of everything the plan makes the ranks write (headers, placements, copies, index)."""
    doc = {
        "shards": [
            {
                "file": s.filename,
                "header": hashlib.sha256(header_bytes(s)).hexdigest(),
                "placements": [
                    [
                        t.source_dtype,
                        [
                            [p.src, p.src_offset, p.dst_offset, p.length, p.count, p.src_stride, p.dst_stride]
                            for p in t.placements
                        ],
                    ]
                    for t in s.tensors
                ],
            }
            for s in plan.shards
        ],
        "copies": [[c.src, c.filename, c.size] for c in plan.copies],
        "index": [plan.write_index, dict(plan.index_metadata), plan.total_size],
        "report": dict(plan.report),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


class _ChunkRecorder:
    """Records the sha256 of every :data:`COPY_CHUNK`-aligned chunk of one file as the digest streams it."""

    def __init__(self) -> None:
        self.hashes: list[str] = []
        self._h = hashlib.sha256()
        self._fill = 0

    def __call__(self, offset: int, view: memoryview) -> None:
        while view:
            n = min(len(view), COPY_CHUNK - self._fill)
            self._h.update(view[:n])
            self._fill += n
            view = view[n:]
            if self._fill == COPY_CHUNK:
                self.done()

    def done(self) -> None:
        if self._fill:
            self.hashes.append(self._h.hexdigest())
            self._h, self._fill = hashlib.sha256(), 0


class _Source:
    """A source a rank copies from: with ``chunks`` (the chunk manifest), read in whole chunks, each
    checked against its hash before use; without, read directly under this rank's read lease, which
    the caller checks after the copy (``SafeTree.intact``)."""

    def __init__(self, path: str, fd: int, size: int, chunks: Sequence[str] | None) -> None:
        self.path, self.fd, self.size, self.chunks = path, fd, size, chunks
        self._index, self._data = -1, b""

    def _chunk(self, i: int, chunks: Sequence[str]) -> bytes:
        if i != self._index:
            lo = i * COPY_CHUNK
            want = min(COPY_CHUNK, self.size - lo)
            data = os.pread(self.fd, want, lo)
            if len(data) != want or i >= len(chunks) or hashlib.sha256(data).hexdigest() != chunks[i]:
                raise RuntimeFailure(
                    "runtime.copy.source_changed",
                    f"{self.path}: chunk {i} no longer has the sha256 the digest pass recorded; nothing was published",
                    evidence={"source": self.path, "chunk": i},
                    advice="The checkpoint changed while it was being taken in. Take it in "
                    "again from a copy that nothing else writes to.",
                )
            self._index, self._data = i, data
        return self._data

    def _direct(self, offset: int, length: int) -> bytes:
        data = os.pread(self.fd, min(length, COPY_CHUNK), offset)
        if not data:
            raise RuntimeFailure(
                "runtime.copy.short_read",
                f"{self.path}: the source ended early at byte {offset}",
                evidence={"source": self.path, "offset": offset},
            )
        return data

    def read(self, offset: int, length: int) -> Iterator[bytes]:
        if offset < 0 or offset + length > self.size:
            raise RuntimeFailure(
                "runtime.copy.short_read",
                f"{self.path}: the plan reads past the end of the file",
                evidence={"source": self.path, "size": self.size},
            )
        while length:
            if self.chunks is None:
                piece = self._direct(offset, length)
            else:
                i, at = divmod(offset, COPY_CHUNK)
                piece = self._chunk(i, self.chunks)[at : at + length]
            yield piece
            offset, length = offset + len(piece), length - len(piece)


def _write_output(
    stage_fd: int,
    name: str,
    head: bytes,
    pieces: Iterable[tuple[str, int, int]],
    sources: Mapping[str, _Source],
) -> WrittenFile:
    """Write output ``name`` front to back (``head``, then each ``(src, offset, length)``), hashing it."""
    fd = os.open(name, _CREATE, 0o644, dir_fd=stage_fd)
    h = hashlib.sha256()
    pos = 0
    try:

        def put(data: bytes) -> None:
            nonlocal pos
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
            h.update(data)

        put(head)
        for src, off, length in pieces:
            for data in sources[src].read(off, length):
                put(data)
    finally:
        os.close(fd)
    return WrittenFile(filename=name, size=pos, sha256=h.hexdigest())


def _shard_pieces(task: ShardTask) -> Iterator[tuple[str, int, int]]:
    """``(src, offset, length)`` for every run of ``task``, in output order; a strided placement is
    expanded one run at a time.  A gap or an overlap raises when it is reached (before its bytes)."""
    plain: list[tuple[int, str, int, int]] = []
    strided: list[Iterator[tuple[int, str, int, int]]] = []
    base = 0
    for t in task.tensors:
        for p in t.placements:
            if p.count == 1:
                plain.append((base + p.dst_offset, p.src, p.src_offset, p.length))
            else:
                strided.append(_runs(base, p))
        base += t.nbytes
    plain.sort()
    pos = 0
    for out_off, src, off, length in heapq.merge(plain, *strided):
        if out_off != pos:
            raise RuntimeFailure(
                "runtime.copy.not_tiled",
                f"{task.filename}: the plan leaves a gap or an overlap at byte {min(pos, out_off)}",
                evidence={"output": task.filename},
            )
        yield src, off, length
        pos += length
    if pos != task.nbytes:
        raise RuntimeFailure(
            "runtime.copy.not_tiled",
            f"{task.filename}: the plan covers {pos} of {task.nbytes} bytes",
            evidence={"output": task.filename},
        )


def _runs(base: int, p: Placement) -> Iterator[tuple[int, str, int, int]]:
    for k in range(p.count):
        yield base + p.dst_offset + k * p.dst_stride, p.src, p.src_offset + k * p.src_stride, p.length


def _loaded_json(loaded: LoadedTrees) -> dict[str, Any]:
    """What one rank's contained worker loaded, as the JSON the ranks exchange."""
    return {
        "trees": dict(loaded.trees),
        "job": loaded.job,
        "controls": dict(loaded.controls),
        "measured": dict(loaded.measured),
        "wall_s": loaded.wall_s,
        "pid": loaded.worker_pid,
    }


def _merge_loaded(workers: Sequence[dict[str, Any] | None], owned: Sequence[Sequence[str]]) -> LoadedTrees:
    """Every rank's worker trees as one :class:`LoadedTrees`.  Each rank must have loaded exactly
    the files it owns (``owned``, per rank) in one job; a control counts as held only if it held in
    every worker that ran; the measurement recorded is the lowest such rank's (each rank's own is
    in the topology)."""
    got = [sorted(w["trees"]) if w is not None else [] for w in workers]
    ran = [w for w in workers if w is not None]
    if got != [sorted(o) for o in owned] or not ran or len({w["job"] for w in ran}) != 1:
        raise RuntimeFailure(
            "runtime.distributed.load_mismatch",
            "the ranks' contained workers did not each load exactly the files their rank owns, in one "
            "job; nothing was published",
            evidence={"loaded": got, "owned": [list(o) for o in owned]},
        )
    trees = {rel: value for w in ran for rel, value in w["trees"].items()}
    names = sorted({c for w in ran for c in w["controls"]})
    return LoadedTrees(
        trees=trees,
        controls={c: all(w["controls"].get(c) is True for w in ran) for c in names},
        measured=ran[0]["measured"],
        job=ran[0]["job"],
        wall_s=max(float(w["wall_s"]) for w in ran),
        worker_pid=int(ran[0]["pid"]),
    )


def _worker_record(worker: dict[str, Any] | None) -> dict[str, Any] | None:
    if worker is None:
        return None
    return {
        "job": worker["job"],
        "files": sorted(worker["trees"]),
        "controls": worker["controls"],
        "measured": worker["measured"],
        "wall_s": round(float(worker["wall_s"]), 3),
    }


def leases_bind(seen: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the ranks' read leases bind what one rank copies to what another hashed: every rank
    holds every file, on a local file system, on one kernel, and opened the very same inodes."""
    kernels = {s.get("kernel") for s in seen}
    return (
        bool(seen)
        and all(
            s.get("held") is True and s.get("local_fs") is True and s.get("inodes") == seen[0].get("inodes")
            for s in seen
        )
        and len(kernels) == 1
        and None not in kernels
    )


def _boot_id() -> str | None:
    """This kernel's boot id: ranks that report the same one share the kernel, and so its leases."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _finding(doc: dict[str, Any]) -> Finding:
    """A finding another rank sent as its ``to_json()``."""
    return Finding(
        code=doc["code"],
        severity=Severity(doc["severity"]),
        path=doc["path"],
        message=doc["message"],
        evidence=dict(doc.get("evidence") or {}),
    )


def _decision_from(doc: dict[str, Any]) -> Decision:
    """The :class:`Decision` rank 0 sent as its ``to_json()``: every field it carries, lists as tuples."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Decision):
        if f.name not in doc:
            continue
        v = doc[f.name]
        if f.name == "reasons":
            v = tuple(
                Reason(
                    code=r["code"],
                    message=r["message"],
                    evidence=r.get("evidence") or {},
                    severity=r.get("severity", "deny"),
                )
                for r in v
            )
        elif isinstance(v, list):
            v = tuple(v)
        values[f.name] = v
    return Decision(**values)


_UNWINDING = threading.Event()  # set once this rank has begun to fail: a later SIGTERM no longer interrupts


class _Terminated(BaseException):
    """SIGTERM (the launcher stopping this rank because another one failed): unwind, cleaning up."""


@contextlib.contextmanager
def _process_group(timeout_s: float) -> Iterator[tuple[Any, Any]]:
    try:
        import torch  # noqa: PLC0415 - the [torch] extra, only for --distributed
        import torch.distributed as dist  # noqa: PLC0415
    except ImportError:
        raise UsageError(
            "usage.distributed.torch_missing",
            "--distributed needs torch (the [torch] extra)",
            advice="pip install 'ckptgate[torch]'",
        ) from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise UsageError("usage.distributed.no_gloo", "this torch build has no torch.distributed gloo backend")
    try:
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    except Exception as e:
        raise _peer_lost("rendezvous", e) from None

    def on_term(signum: int, frame: object) -> None:
        if not _UNWINDING.is_set() and not interrupts.past_commit():  # after the rename: published
            _UNWINDING.set()
            raise _Terminated

    _UNWINDING.clear()
    previous = signal.signal(signal.SIGTERM, on_term)
    failed = True
    try:
        yield torch, dist
        failed = False
    except _Terminated:
        raise RuntimeFailure(
            "runtime.distributed.terminated",
            "this rank was stopped (SIGTERM), most likely by "
            "the launcher after another rank failed; nothing was published",
        ) from None
    finally:
        # After a failure the launcher may SIGTERM this rank while it exits: keep its exit code.
        signal.signal(signal.SIGTERM, signal.SIG_IGN if failed else previous)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def distributed_intake(
    src: Path,
    dst: Path,
    *,
    attestations: Sequence[Path],
    options: EngineOptions | None = None,
    max_shard_bytes: int = 2 << 30,
    dtype: str | None = None,
    signatures: Sequence[Path] = (),
    key: Path | None = None,
    certificate_chain: Sequence[Path] = (),
    # a Signer or None; Any while _cli/intake_cmd.py passes it as `object` (issue #21)
    receipt_signer: Any = None,
    dist_options: DistributedOptions | None = None,
    select: str | None = None,
) -> IntakeResult | None:
    """Take ``src`` in across the ranks of this torch.distributed job; publish at ``dst`` once.

    Returns the :class:`ckptgate.pipeline.IntakeResult` on rank 0 and ``None`` on the others;
    raises on every rank when any rank fails (see the module's docstring).
    """
    options = options or EngineOptions()
    dist_options = dist_options or DistributedOptions()
    if select is not None:
        raise UsageError(
            "usage.distributed.select",
            "--select is not supported with --distributed yet",
            advice="Drop --select (the policy's default selection still applies), or take the "
            "checkpoint in on one process.",
        )
    if dtype is not None:
        raise UsageError(
            "usage.distributed.dtype",
            "--dtype is not supported with --distributed yet: the ranks copy bytes verbatim",
            advice="Drop --dtype, or take the checkpoint in on one process.",
        )
    secret = _secret()
    _launcher_env()
    with contextlib.ExitStack() as early:
        engine = _EarlyEngine(options, early) if os.environ.get("RANK") == "0" else None
        with _process_group(dist_options.timeout_s) as (torch, dist):
            comm = TorchGroup(dist, torch, secret)
            comm.start()
            return _run(
                comm,
                src,
                dst,
                attestations=attestations,
                options=options,
                engine=engine,
                max_shard_bytes=max_shard_bytes,
                signatures=signatures,
                key=key,
                certificate_chain=certificate_chain,
                receipt_signer=receipt_signer,
            )


class _EarlyEngine:
    """Rank 0's trust data and policy engine, opened before the process group, so that the embedded
    OPA launches (on its keeper thread) while torch imports.  A failure to open them (a bad trust
    file, say) is kept and raised in the decide phase, where every rank hears of it."""

    def __init__(self, options: EngineOptions, stack: contextlib.ExitStack) -> None:
        self.error: Error | None = None
        self.trust: TrustData | None = None
        self.engine: PolicyEngine | None = None
        try:
            self.trust = load_trust(options)
            self.engine = stack.enter_context(engine_for(options, self.trust))
        except Error as e:
            self.error = e
        except Exception as e:  # a bug: the other ranks must still hear of it in the decide phase
            self.error = Error("internal.unexpected", f"rank 0: {type(e).__name__}: {e}")

    def get(self) -> tuple[TrustData, PolicyEngine]:
        if self.error is not None:
            raise self.error
        assert self.trust is not None and self.engine is not None
        return self.trust, self.engine


def _run(comm: TorchGroup, src: Path, dst: Path, **kw: Any) -> IntakeResult | None:
    """The phases, then the clean-up of what they opened (the staging directory above all); a
    SIGTERM that arrives once the clean-up has begun is ignored, so it cannot cut it short."""
    with contextlib.ExitStack() as stack:
        try:
            return _phases(comm, stack, src, dst, **kw)
        except BaseException:
            _UNWINDING.set()
            raise


def _phases(
    comm: TorchGroup,
    stack: contextlib.ExitStack,
    src: Path,
    dst: Path,
    *,
    attestations: Sequence[Path],
    options: EngineOptions,
    engine: _EarlyEngine | None,
    max_shard_bytes: int,
    signatures: Sequence[Path],
    key: Path | None,
    certificate_chain: Sequence[Path],
    receipt_signer: Signer | None,
) -> IntakeResult | None:
    rank, world = comm.rank, comm.world
    state: dict[str, Any] = {}

    def inspect() -> dict[str, Any]:
        state["dst"] = check_destination(dst, source=src)
        tree = state["tree"] = stack.enter_context(SafeTree.open(src))
        held = tree.hold()  # before anything is read: a read lease on every file, where the kernel gives one
        crcs = state["crcs"] = DeferredCrcs()
        state["inspection"] = inspect_open_tree(tree, verify_crc=crcs)
        ledgers = {
            e.path: {str(i): d.hex() for i, d in sorted(tree.ledger(e.path).recorded().items())} for e in tree.entries
        }
        return {
            "ledgers": ledgers,
            "files": sorted([e.path, e.size] for e in tree.entries),
            "framework_files": list(framework_files(state["inspection"])),
            "held": held,
            "kernel": _boot_id(),
            # what a lease is on: the inodes this rank opened, and the file system they are on
            "inodes": [list(tree.root_id), *([e.path, e.dev, e.ino] for e in tree.entries)],
            "local_fs": tree.root_fs_magic in LOCAL_FILE_SYSTEMS,
        }

    seen = comm.agree("inspect", inspect)
    if any(s["files"] != seen[0]["files"] or s["framework_files"] != seen[0]["framework_files"] for s in seen):
        raise RuntimeFailure(
            "runtime.distributed.tree_mismatch",
            "the ranks do not see the same files in SRC (is it on one shared file system?); nothing was published",
            evidence={"source": str(src)},
        )
    tree: SafeTree = state["tree"]
    # Leases are the kernel's: they bind the bytes across ranks only when every rank runs on one
    # kernel, opened the very same inodes (a lease is on this rank's inode, not on a path), on a
    # local file system (a write from another host could not break it), and holds every file.
    # Then each rank copies the placed bytes under its own lease, taken before any rank hashed,
    # and checks it still holds after its copy, as one process does; otherwise the digest pass
    # records the chunk manifest and every copied chunk is checked against it.
    leased = leases_bind(seen)
    needed: list[str] = seen[0]["framework_files"]
    owners = assign_by_size([(p, s) for p, s in seen[0]["files"]], world, first=needed)
    needs = set(needed)
    owned_needs = [[p for p in owners[r] if p in needs] for r in range(world)]

    def digest_pass() -> dict[str, Any]:
        mine = owners[rank]
        for other in seen:  # what every rank's inspection read of my files: checked in my one pass
            for path in mine:
                for i, d in other["ledgers"].get(path, {}).items():
                    tree.ledger(path).record(int(i), bytes.fromhex(d))
        recorders = {} if leased else {p: _ChunkRecorder() for p in mine}
        crcs: DeferredCrcs = state["crcs"]

        def also(path: str) -> Callable[[int, memoryview], None] | None:
            rec, crc = recorders.get(path), crcs.reader(path)
            if crc is None or rec is None:
                return crc or rec

            def both(offset: int, view: memoryview) -> None:
                rec(offset, view)
                crc(offset, view)

            return both

        t0 = time.perf_counter()
        entries = hash_files(tree, mine, also=also)
        for r in recorders.values():
            r.done()
        own = set(mine)
        return {
            "entries": [e.to_json() for e in entries],
            "seconds": round(time.perf_counter() - t0, 3),
            "chunks": {p: r.hashes for p, r in recorders.items()},
            # the CRC-32 checks of the zip entries this rank streamed (a bad or unchecked CRC is an
            # error finding, as in one process); another rank's files are that rank's to report
            "crc_findings": [f.to_json() for f in crcs.findings() if f.path in own],
        }

    hashed = comm.agree("digest", digest_pass)
    state["inspection"] = state["inspection"].with_findings([_finding(f) for h in hashed for f in h["crc_findings"]])
    chunks: dict[str, list[str]] = {p: c for h in hashed for p, c in h["chunks"].items()}
    digest = FixtureDigest.from_manifest(
        [ManifestEntry(path=e["path"], size=e["size"], sha256=e["sha256"]) for h in hashed for e in h["entries"]]
    )
    comm.bind_fixture(str(digest.digest))

    def decide_once() -> dict[str, Any] | None:
        if rank != 0:
            return None
        state["evaluation"] = ev = _judge(
            state["inspection"],
            digest,
            attestations=attestations,
            options=options,
            early=engine if engine is not None else _EarlyEngine(options, stack),
            signatures=signatures,
            key=key,
            certificate_chain=certificate_chain,
        )
        return {"decision": ev.decision.to_json(), "digest": str(digest.digest)}

    decided = comm.agree("decide", decide_once)[0]
    if decided["digest"] != str(digest.digest):
        raise RuntimeFailure(
            "runtime.distributed.digest_mismatch",
            "rank 0 decided on another digest than this rank formed; nothing was published",
        )
    decision = _decision_from(decided["decision"])

    def load_mine() -> dict[str, Any] | None:
        # Every rank enforces the decision (a deny or an unpermitted loader raises); a rank that owns
        # files needing a framework load loads them in its own contained worker, under its permit.
        evaluation: Evaluation | None = state.get("evaluation")
        profile = evaluation.containment if evaluation is not None else None
        enforced = enforce(
            tree,
            state["inspection"],
            decision=decision,
            fixture_digest=digest,
            framework_files=owned_needs[rank],
            worker=WorkerOptions(profile=profile),
        )
        return _loaded_json(enforced.loaded) if enforced.loaded is not None else None

    workers = comm.agree("load", load_mine)
    loaded = _merge_loaded(workers, owned_needs) if needed else None

    def stage_dir() -> dict[str, Any]:
        state["plan"] = plan = plan_for(
            state["inspection"], decision=decision, max_shard_bytes=max_shard_bytes, loaded=loaded
        )
        plan_hash = plan_sha256(plan)
        state["destination"] = destination = stack.enter_context(
            open_destination(state["dst"], source_root=tree.root_id)
        )
        if rank == 0:
            state["stage"] = stack.enter_context(staging(destination))
            return {"plan": plan_hash, "stage": state["stage"].name}
        return {"plan": plan_hash}

    staged = comm.agree("stage", stage_dir)
    plan: ConsolidationPlan = state["plan"]
    destination = state["destination"]
    if any(s["plan"] != staged[0]["plan"] for s in staged):
        raise RuntimeFailure(
            "runtime.distributed.plan_mismatch",
            "the ranks derived different consolidation plans from the same decision; nothing was published",
            evidence={"plans": [s["plan"] for s in staged]},
        )
    outputs = [(s.filename, len(header_bytes(s)) + s.nbytes) for s in plan.shards] + [
        (c.filename, c.size) for c in plan.copies
    ]
    writers = assign_by_size(outputs, world)

    def write() -> dict[str, Any]:
        t0 = time.perf_counter()
        stage_fd = state["stage"].fd if rank == 0 else _open_stage(destination, staged[0]["stage"])
        sources: dict[str, _Source] = {}
        manifest = None if leased else chunks
        try:
            mine = set(writers[rank])
            written = []
            for s in plan.shards:
                if s.filename in mine:
                    _open_sources(tree, sources, {p.src for t in s.tensors for p in t.placements}, manifest)
                    written.append(_write_output(stage_fd, s.filename, header_bytes(s), _shard_pieces(s), sources))
            for c in plan.copies:
                if c.filename in mine:
                    _open_sources(tree, sources, {c.src}, manifest)
                    written.append(
                        _write_output(stage_fd, c.filename, b"", [(c.src, 0, c.size)] if c.size else [], sources)
                    )
            if leased:
                still_held(tree)
        finally:
            for source in sources.values():
                os.close(source.fd)
            if rank != 0:
                os.close(stage_fd)
        return {
            "written": [[w.filename, w.size, w.sha256] for w in written],
            "seconds": round(time.perf_counter() - t0, 3),
        }

    wrote = comm.agree("write", write)
    files_per_rank = [list(owners[r]) for r in range(world)]
    sizes = dict(seen[0]["files"])
    topology = {
        "world_size": world,
        "backend": "gloo",
        # how the bytes one rank hashed were bound to the bytes another copied: read leases on one
        # kernel, or the chunk manifest
        "copy_check": "leases" if leased else "chunk_manifest",
        "ranks": [
            {
                "rank": r,
                "files_hashed": len(files_per_rank[r]),
                "bytes_hashed": sum(sizes[p] for p in files_per_rank[r]),
                "outputs_written": len(wrote[r]["written"]),
                "bytes_written": sum(w[1] for w in wrote[r]["written"]),
                "hash_seconds": hashed[r]["seconds"],
                "write_seconds": wrote[r]["seconds"],
                "worker": _worker_record(workers[r]),
            }
            for r in range(world)
        ],
    }

    def publish_once() -> dict[str, Any] | None:
        if rank != 0:
            return None
        state["result"] = _publish(
            src,
            state["dst"],
            state["stage"],
            plan,
            state["evaluation"],
            wrote,
            topology,
            options=options,
            receipt_signer=receipt_signer,
        )
        return {"published": str(state["dst"])}

    try:
        comm.agree("publish", publish_once)
    except Error:
        if state.get("result") is None:
            raise
        # rank 0 published (the rename is the commit point): a peer lost now cannot undo it
    result: IntakeResult | None = state.get("result")
    return result


def _open_stage(destination: Destination, name: str) -> int:
    """The staging directory rank 0 made beside DST, opened by name relative to DST's parent."""
    if not isinstance(name, str) or "/" in name or not name.startswith(f".{destination.name}.ckptgate-staging-"):
        raise RuntimeFailure("runtime.distributed.stage", f"rank 0 named no staging directory of this DST: {name!r}")
    try:
        fd = os.open(name, _DIR, dir_fd=destination.parent_fd)
    except FileNotFoundError:
        raise RuntimeFailure(
            "runtime.distributed.not_shared",
            f"rank 0 made its staging directory beside {destination.path}, and this rank does not see it: "
            "DST's parent is not one file system shared by every rank; nothing was published",
            evidence={"destination": str(destination.path), "staging": name},
            advice="Give every rank the same DST on one shared file system (docs/scale-out.md#file-systems).",
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise RuntimeFailure("runtime.distributed.stage", f"the staging directory {name!r} is not this user's")
    return fd


def _open_sources(
    tree: SafeTree,
    sources: dict[str, _Source],
    paths: set[str],
    chunks: dict[str, list[str]] | None,
) -> None:
    """Open each source in ``paths`` once: under the lease (``chunks`` is None), or checked against
    its chunk manifest."""
    for p in sorted(paths - set(sources)):
        entry = tree.entry(p)
        if entry is None or (chunks is not None and p not in chunks):
            raise RuntimeFailure(
                "runtime.copy.source_missing", f"no measured source for {p!r}", evidence={"missing": [p]}
            )
        fd = tree.open_file(p)
        sources[p] = _Source(p, fd, entry.size, None if chunks is None else chunks[p])


def _judge(
    inspection: Inspection,
    digest: FixtureDigest,
    *,
    attestations: Sequence[Path],
    options: EngineOptions,
    early: _EarlyEngine,
    signatures: Sequence[Path],
    key: Path | None,
    certificate_chain: Sequence[Path],
) -> Evaluation:
    trust, engine = early.get()
    offered_key, chain = load_verification_material(signatures, key, certificate_chain, options.sigstore_trust_root)
    return judge(
        inspection,
        digest,
        attestations=attestations,
        engine=engine,
        trust=trust,
        sigstore_trust_root=options.sigstore_trust_root,
        signatures=signatures,
        offered_key=offered_key,
        certificate_chain=chain,
    )


def _publish(
    src: Path,
    dst: Path,
    stage: Stage,
    plan: ConsolidationPlan,
    evaluation: Evaluation,
    wrote: list[dict[str, Any]],
    topology: dict[str, Any],
    *,
    options: EngineOptions,
    receipt_signer: Signer | None,
) -> IntakeResult:
    by_name = {w[0]: WrittenFile(filename=w[0], size=w[1], sha256=w[2]) for r in wrote for w in r["written"]}
    order = [s.filename for s in plan.shards] + [c.filename for c in plan.copies]
    outputs = [by_name[n] for n in order]
    index = write_index(plan, stage.fd)
    if index is not None:
        outputs.append(index)
    done = Consolidated(outputs=tuple(outputs), plan_report=dict(plan.report))
    receipt = receipt_for(src, evaluation, done, opa_version=None if options.opa_url else local_opa_version())
    receipt["topology"] = topology
    try:
        publish(stage, receipt, signer=receipt_signer)
    except OSError as e:
        raise RuntimeFailure(
            "runtime.io",
            f"writing the output failed: {e.strerror or e}",
            evidence={"errno": e.errno, "destination": str(dst)},
        ) from None
    return IntakeResult(evaluation=evaluation, destination=dst, outputs=tuple(outputs), receipt=receipt)
