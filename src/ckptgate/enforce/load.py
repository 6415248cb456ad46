"""Framework loads: only in the contained worker, only under a permit [R28, R34].

The enforce step (:func:`ckptgate.enforce.gate.enforce`) mints the permit and calls
:func:`load_trees`, which reads each input with the :class:`~ckptgate.inspect.SafeTree` (openat2)
into a sealed in-memory copy, hashing it on the way against the ``FixtureDigest`` manifest, so
the bytes the worker loads are the bytes that were verified and decided on; then it runs the
worker job that the permit's loader names.  The worker returns JSON object trees (tensors as
storage keys and offsets, never data, never a pickle), kept in a :class:`LoadedTrees`; the
consolidation adapters map storage keys to byte ranges with the torch-zip layout that
inspection read statically, and the writer moves the raw bytes.

This module is also where the records live that consolidation may read (:class:`LoadedTrees`):
it imports the worker, the containment preflight and the permit only inside the functions that
run them.

Containment limits what a hostile loader can reach; it is not proof that the load is safe
[R30, claim rule 5].
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptgate.errors import RuntimeFailure

if TYPE_CHECKING:
    from ckptgate.digest import FixtureDigest
    from ckptgate.enforce.containment import ContainmentProfile
    from ckptgate.enforce.permit import Permit
    from ckptgate.enforce.worker import WorkerLimits
    from ckptgate.inspect import Inspection, SafeTree


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """How the enforce step runs framework loaders: timeout, limits and the host's preflight
    profile (measured on first use when ``None``)."""

    timeout_s: float = 600.0
    limits: WorkerLimits | None = None
    profile: ContainmentProfile | None = None

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError("timeout_s must be positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedTrees:
    """What the worker said about each file: its JSON object tree, keyed by relpath."""

    trees: Mapping[str, Any]
    controls: Mapping[str, bool]
    #: What the worker measured in itself before it read an input (seccomp mode, NoNewPrivs,
    #: namespace ids beside the parent's): the receipt's record of the active controls.
    measured: Mapping[str, Any]
    job: str
    wall_s: float
    worker_pid: int = field(default=0)


def job_for(loader: str) -> str:
    """The worker job that runs ``loader`` and returns placement trees only."""
    from ckptgate.enforce.worker import JOBS  # noqa: PLC0415 - worker stack: 110 ms import

    for job, name in JOBS.items():
        if name == loader and not job.endswith("_bytes"):
            return job
    raise RuntimeFailure(
        "runtime.worker.no_job",
        f"the contained worker has no job for loader {loader!r}",
        evidence={"loader": loader, "jobs": dict(JOBS)},
        advice=f"Loader {loader!r} cannot run in the contained worker yet; nothing was loaded. This is a bug in "
        "ckptgate: report it with the --json output.",
    )


def preimports_for(inspection: Inspection, relpaths: Sequence[str]) -> list[str]:
    """Modules the pickles' globals live in (from the static reader), under the allowed roots."""
    from ckptgate.enforce.worker import PREIMPORT_ROOTS  # noqa: PLC0415 - worker stack: 110 ms import

    by_path = {f.path: f for f in inspection.files}
    mods: list[str] = []
    for rel in relpaths:
        rep = by_path[rel].pickle if rel in by_path else None
        for g in rep.globals if rep is not None else ():
            mod = g.rsplit(".", 1)[0]
            if mod.split(".", 1)[0] in PREIMPORT_ROOTS and mod not in mods:
                mods.append(mod)
    return mods


def open_verified(tree: SafeTree, relpaths: Sequence[str], digest: FixtureDigest) -> list[Any]:
    """A sealed in-memory copy of each manifest file, made and hashed in one read (caller closes).

    Each file is read once through the tree (``SafeTree.open_file`` refuses another inode or size)
    into a ``memfd``, hashing every byte on the way; the copy is used only if its sha256 is the
    manifest's, and it is then sealed against every write, shrink and grow and handed over
    read-only.  So the worker's loader reads exactly the bytes that were measured and decided on,
    whether or not the tree holds leases, and nothing that later writes to the checkpoint can
    reach it (the worker hashes its descriptor once more, as a check of this one).
    """
    from ckptgate.enforce.worker import OpenedInput  # noqa: PLC0415 - worker stack: 110 ms import

    manifest = {e.path: e for e in digest.manifest}
    opened: list[OpenedInput] = []
    try:
        for rel in relpaths:
            entry = manifest.get(rel)
            if entry is None:
                raise RuntimeFailure(
                    "runtime.input.not_in_manifest",
                    f"{rel} is not in the fixture digest manifest",
                    evidence={"path": rel, "digest": digest.digest.prefixed()},
                )
            opened.append(OpenedInput(fd=_sealed_copy(tree, rel, entry.sha256), relpath=rel, sha256=entry.sha256))
    except BaseException:
        for o in opened:
            os.close(o.fd)
        raise
    return opened


_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_COPY_CHUNK = 4 << 20


def _sealed_copy(tree: SafeTree, rel: str, sha256: str) -> int:
    """A read-only descriptor of a sealed memfd holding ``rel``'s bytes, which hash to ``sha256``."""
    src = tree.open_file(rel)
    mem = os.memfd_create(f"ckptgate-input-{len(rel)}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        h = hashlib.sha256()
        buf = memoryview(bytearray(_COPY_CHUNK))
        pos = 0
        while (n := os.preadv(src, [buf], pos)) > 0:
            h.update(buf[:n])
            view = buf[:n]
            while view:
                view = view[os.write(mem, view) :]
            pos += n
        if h.hexdigest() != sha256:
            raise RuntimeFailure(
                "runtime.worker.input_changed",
                f"{rel} no longer has the sha256 that was measured and decided on; nothing was loaded",
                evidence={"source": rel, "expected": sha256, "actual": h.hexdigest()},
                advice=f"{rel} changed while it was being taken in: copy the checkpoint to a directory that "
                "nothing else writes to (`cp -a SRC COPY`), and take that copy in.",
            )
        fcntl.fcntl(mem, fcntl.F_ADD_SEALS, _SEALS)
        return os.open(f"/proc/self/fd/{mem}", os.O_RDONLY | os.O_CLOEXEC)  # a read-only description
    finally:
        os.close(mem)
        os.close(src)


def load_trees(
    tree: SafeTree,
    inspection: Inspection,
    relpaths: Sequence[str],
    *,
    permit: Permit | None,
    digest: FixtureDigest,
    options: WorkerOptions,
) -> LoadedTrees:
    """Run the permit's loader on ``relpaths`` in the contained worker; return the JSON trees.

    :raises RuntimeFailure: no permit (``runtime.worker.permit_missing``), a file that differs from
        the manifest, or any worker failure (timeout, crash, protocol violation).
    :raises PolicyDenied: the permit does not allow this load (``enforce.permit.*``).
    """
    from ckptgate.enforce.containment import preflight  # noqa: PLC0415 - worker stack: 110 ms import
    from ckptgate.enforce.worker import WorkerLimits, run_contained  # noqa: PLC0415 - worker stack: 110 ms import

    if permit is None:
        raise RuntimeFailure("runtime.worker.permit_missing", "a framework load needs a permit; none was given")
    job = job_for(permit.loader)
    profile = options.profile or preflight()
    # The permit is checked once in this process, by run_contained where it meets the job, and once
    # in the worker.
    files = open_verified(tree, relpaths, digest)
    try:
        res = run_contained(
            job,
            files,
            permit=permit,
            profile=profile,
            limits=options.limits or WorkerLimits(),
            timeout_s=options.timeout_s,
            fixture_digest=digest.digest,
            preimports=preimports_for(inspection, relpaths),
        )
    finally:
        for f in files:
            os.close(f.fd)
    missing = [r for r in relpaths if r not in res.plans]
    if missing:
        raise RuntimeFailure(
            "runtime.worker.plan_missing", f"the worker returned no plan for {missing}", evidence={"missing": missing}
        )
    return LoadedTrees(
        trees=dict(res.plans),
        controls=dict(res.controls),
        measured=dict(res.measured),
        job=job,
        wall_s=res.wall_s,
        worker_pid=res.pid,
    )


def loaded_json(loaded: LoadedTrees) -> dict[str, Any]:
    """What one rank's contained worker loaded, as the JSON the ranks exchange."""
    return {
        "trees": dict(loaded.trees),
        "job": loaded.job,
        "controls": dict(loaded.controls),
        "measured": dict(loaded.measured),
        "wall_s": loaded.wall_s,
        "pid": loaded.worker_pid,
    }


def merge_loaded(workers: Sequence[dict[str, Any] | None], owned: Sequence[Sequence[str]]) -> LoadedTrees:
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


def worker_record(worker: dict[str, Any] | None) -> dict[str, Any] | None:
    if worker is None:
        return None
    return {
        "job": worker["job"],
        "files": sorted(worker["trees"]),
        "controls": worker["controls"],
        "measured": worker["measured"],
        "wall_s": round(float(worker["wall_s"]), 3),
    }
