"""The one intake sequence, over a :class:`~ckptgate.group.Group` of ranks: each step once.

    inspect -> digest -> verify + decide -> enforce -> consolidate -> publish

One process is a world of one (:class:`~ckptgate.group.LocalGroup`, :func:`ckptgate.pipeline.intake`);
``--distributed`` is a world of N (:mod:`ckptgate.distributed`).  Inspect and digest are
:func:`~ckptgate.measure.measure`'s.  Rank 0 verifies and decides once (:func:`~ckptgate.judge.judge`,
the group's broadcast); every rank enforces the decision and loads the framework files it owns in
its own contained worker; every rank plans, and the ranks compare the plan's sha256; each writes
its share of the outputs into rank 0's staging directory; rank 0 publishes once.  What differs by
rank is a parameter of the step (who hashes, who loads, who writes, who asks the engine, the chunk
manifest against leases, and at a world of one the output written in the digest's own pass),
never a copy of it.

Any rank's failure in a step fails every rank with the first failure's code (:meth:`Group.agree`).
The launch (rendezvous, secret, signals) is :mod:`ckptgate.distributed`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ckptgate.consolidate import plan_for, shares
from ckptgate.consolidate.chunks import open_sources
from ckptgate.consolidate.hf.plan import check_dtype, write_config_files
from ckptgate.consolidate.hf.source import HfConfig
from ckptgate.consolidate.plan import ConsolidationPlan, cast_plan, check_cast
from ckptgate.consolidate.writer import DEFAULT_CHUNK, WrittenFile, write_index, write_plan
from ckptgate.decide import Decision, PolicyEngine, Request, now_utc, precheck
from ckptgate.decide.decision import decision_from_json
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.enforce.gate import WorkerOptions, enforce
from ckptgate.enforce.load import loaded_json, merge_loaded, worker_record
from ckptgate.errors import Error, RuntimeFailure
from ckptgate.group import Group
from ckptgate.inspect import Inspection, SafeTree
from ckptgate.inspect._threads import usable_cores
from ckptgate.judge import judge
from ckptgate.measure import NO_PROGRESS, Measured, Progress, Staged, measure
from ckptgate.onepass import OnePass
from ckptgate.outcome import Consolidated, Evaluation, IntakeResult, io_failure, published, still_held
from ckptgate.publish import check_destination, open_destination, open_stage, staging
from ckptgate.verify import TrustData
from ckptgate.verify.dsse import Signer
from ckptgate.verify.oms import CertificateChain, OfferedKey, load_verification_material

__all__ = ["EarlyEngine", "grouped_intake", "open_sources", "plan_output", "write_all"]

T = TypeVar("T")


class EarlyEngine:
    """Rank 0's trust data, verification material and policy engine, read before the first step
    (a world of N: before the group forms, so that the embedded OPA launches while torch imports).
    A failure is kept and raised in the first step that asks (the precheck), where every rank
    hears of it; a world of one raises it at once (:meth:`check`), before SRC is opened."""

    def __init__(
        self,
        options: EngineOptions,
        stack: contextlib.ExitStack,
        *,
        signatures: Sequence[Path] = (),
        key: Path | None = None,
        certificate_chain: Sequence[Path] = (),
        start: bool = True,
    ) -> None:
        self.options, self.stack = options, stack
        #: what the verification material was read for: the intake must offer the same
        self.material_for = (tuple(signatures), key, tuple(certificate_chain))
        self.error: Error | None = None
        self.trust: TrustData | None = None
        self.engine: PolicyEngine | None = None
        self.material: tuple[OfferedKey | None, CertificateChain | None] = (None, None)
        self._guard(lambda: self._read(signatures, key, certificate_chain))
        if start:
            self.start()

    def _read(self, signatures: Sequence[Path], key: Path | None, chain: Sequence[Path]) -> None:
        self.trust = load_trust(self.options)
        self.material = load_verification_material(signatures, key, chain, self.options.sigstore_trust_root)

    def _guard(self, run: Callable[[], None]) -> None:
        try:
            run()
        except Error as e:
            self.error = e
        except Exception as e:  # a bug: the other ranks must still hear of it in the decide step
            self.error = Error("internal.unexpected", f"rank 0: {type(e).__name__}: {e}")

    def start(self) -> None:
        """Launch the engine (once)."""
        if self.error is None and self.engine is None:
            assert self.trust is not None
            trust = self.trust
            self._guard(lambda: setattr(self, "engine", self.stack.enter_context(engine_for(self.options, trust))))

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def get(self) -> tuple[TrustData, PolicyEngine]:
        self.start()
        self.check()
        assert self.trust is not None and self.engine is not None
        return self.trust, self.engine


def plan_output(
    inspection: Inspection,
    decision: Decision,
    *,
    max_shard_bytes: int,
    loaded: Any,
    hf: HfConfig | None,
    dtype: str | None,
) -> ConsolidationPlan:
    """The plan from what enforce returned, cast to ``dtype`` if one is named."""
    plan = plan_for(inspection, decision=decision, max_shard_bytes=max_shard_bytes, loaded=loaded, hf=hf)
    plan = cast_plan(plan, dtype, max_shard_bytes=max_shard_bytes)
    if hf is not None:
        check_dtype(plan, hf)
    return plan


def write_all(
    tree: SafeTree,
    plan: ConsolidationPlan,
    out_dir: int | Path,
    *,
    expected: dict[str, str] | None,
    chunk_size: int,
    on_bytes: Callable[[int], None] | None,
    hf: HfConfig | None,
    workers: int | None = None,
    chunks: dict[str, list[str]] | None = None,
) -> tuple[WrittenFile, ...]:
    """The one writer writes every output of ``plan`` (a world of one's plan, or a rank's share of
    it, :func:`~ckptgate.consolidate.shares.share_of`): under the tree's leases, checked after the
    copy; re-hashing every source against ``expected`` (the manifest) in the writer's one pass; or
    checking every chunk read against ``chunks`` (the chunk manifest)."""
    if chunks is None:
        still_held(tree)
    with open_sources(tree, plan) as sources:
        outputs = write_plan(
            plan,
            out_dir,
            sources,
            expected=expected,
            chunks=chunks,
            chunk_size=chunk_size,
            threads=max(1, workers or usable_cores()),
            on_bytes=on_bytes,
        )
    if chunks is None:
        still_held(tree)
    if hf is None:
        return outputs
    if isinstance(out_dir, int):
        return outputs + write_config_files(hf, out_dir)
    fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return outputs + write_config_files(hf, fd)
    finally:
        os.close(fd)


def grouped_intake(
    group: Group,
    stack: contextlib.ExitStack,
    src: Path,
    dst: Path,
    *,
    attestations: Sequence[Path],
    options: EngineOptions,
    engine: EarlyEngine | None,
    max_shard_bytes: int,
    signatures: Sequence[Path],
    key: Path | None,
    certificate_chain: Sequence[Path],
    receipt_signer: Signer | None,
    backend: str | None = "gloo",
    chunk_size: int = DEFAULT_CHUNK,
    now: datetime | None = None,
    dtype: str | None = None,
    select: str | None = None,
    hf: HfConfig | None = None,
    progress: Progress = NO_PROGRESS,
    workers: int | None = None,
) -> IntakeResult | None:
    """Take ``src`` in across ``group``; rank 0 publishes at ``dst`` and returns the result, the
    other ranks return ``None``.  What each step opens is closed by ``stack``.  The receipt records
    the topology unless ``backend`` is None (one process's receipt).  ``workers`` threads hash
    and write (default: the cores this process may run on)."""
    rank, world = group.rank, group.world
    check_cast(dtype)  # a usage error on every rank alike, before anything is opened
    now = now or now_utc()
    state: dict[str, Any] = {}

    def early() -> EarlyEngine:  # rank 0's engine: the caller's, or opened once here
        if "engine" not in state:
            state["engine"] = engine or EarlyEngine(
                options, stack, signatures=signatures, key=key, certificate_chain=certificate_chain
            )
        opened: EarlyEngine = state["engine"]
        if opened.material_for != (tuple(signatures), key, tuple(certificate_chain)):
            # an engine read for other signatures would verify these under no key at all
            raise Error(
                "internal.unexpected",
                "rank 0's verification material was read for other --signature/--key/--certificate-chain "
                "than this intake offers",
            )
        return opened

    def writing(step: Callable[[], T]) -> Callable[[], T]:  # an I/O failure writing is runtime.io, DST named
        def run() -> T:
            try:
                return step()
            except OSError as e:
                raise io_failure(e, dst) from None

        return run

    def open_tree() -> tuple[SafeTree, bool]:
        state["dst"] = check_destination(dst, source=src)
        tree = state["tree"] = stack.enter_context(SafeTree.open(src))
        # DST's parent is resolved once, into a descriptor proved to lie outside the root that is
        # walked; staging, writing, fsync and the final rename are all relative to it.
        state["destination"] = stack.enter_context(open_destination(state["dst"], source_root=tree.root_id))
        if rank == 0:
            early().start()  # the embedded OPA launches while inspection reads
        return tree, tree.hold()  # before anything is read: a read lease on every file, where the kernel gives one

    def one_pass(inspection: Inspection) -> Staged | None:  # a world of one writes in the digest's pass where it can
        one = state["one"] = stack.enter_context(
            OnePass(
                state["destination"],
                max_shard_bytes=max_shard_bytes,
                chunk_size=chunk_size,
                dtype=dtype,
                select=select,
                hf=hf,
                tree=state["tree"],
                workers=workers,
            )
        )
        return one.begin(inspection)

    request = Request(action="intake", now=now, select=select)
    m: Measured = measure(
        group,
        open_tree,
        ask=lambda inspection: precheck(early().get()[1], inspection, request),
        stage=one_pass if world == 1 else None,
        progress=progress,
        workers=workers,
    )
    tree = m.tree

    def decide_once() -> dict[str, Any]:
        trust, policy = early().get()
        offered_key, chain = early().material
        state["evaluation"] = ev = judge(
            m.inspection,
            m.digest,
            attestations=attestations,
            engine=policy,
            trust=trust,
            now=now,
            containment=m.containment,
            sigstore_trust_root=options.sigstore_trust_root,
            signatures=signatures,
            offered_key=offered_key,
            certificate_chain=chain,
            select=select,
            hf=hf,
        )
        return {"decision": ev.decision.to_json()}

    # The decision names the digest rank 0 decided on: enforce refuses it on a rank that formed another.
    decided = group.broadcast("decide", decide_once)
    evaluation: Evaluation | None = state.get("evaluation")
    decision = evaluation.decision if evaluation is not None else decision_from_json(decided["decision"])
    needed = set(m.framework_files)
    owned_needs = [[p for p in m.owners[r] if p in needed] for r in range(world)]

    def load_mine() -> dict[str, Any] | None:
        # Every rank enforces the decision (a deny or an unpermitted loader raises); a rank that owns
        # files needing a framework load loads them in its own contained worker, under its permit.
        enforced = enforce(
            tree,
            m.inspection,
            decision=decision,
            fixture_digest=m.digest,
            framework_files=owned_needs[rank],
            worker=WorkerOptions(profile=evaluation.containment if evaluation is not None else None),
        )
        return loaded_json(enforced.loaded) if enforced.loaded is not None else None

    loads = group.agree("load", load_mine)
    loaded = merge_loaded(loads, owned_needs) if needed else None

    def stage_dir() -> dict[str, Any]:
        one: OnePass | None = state.get("one")
        if one is not None and one.stage is not None:  # written in the digest's pass: keep what the plan names
            assert evaluation is not None
            done = one.finish(tree, evaluation, on_plan=progress.plan, on_bytes=progress.written)
            if done is not None:
                state["stage"], state["done"] = one.stage, done
                return {"plan": "one-pass"}
        plan = state["plan"] = plan_output(
            m.inspection, decision, max_shard_bytes=max_shard_bytes, loaded=loaded, hf=hf, dtype=dtype
        )
        if progress.plan is not None:
            progress.plan(plan.total_size)
        plan_hash = shares.plan_sha256(plan)
        if rank == 0:
            state["stage"] = stack.enter_context(staging(state["destination"]))
            return {"plan": plan_hash, "stage": state["stage"].name}
        return {"plan": plan_hash}

    staged = group.agree("stage", writing(stage_dir))
    if any(s["plan"] != staged[0]["plan"] for s in staged):
        raise RuntimeFailure(
            "runtime.distributed.plan_mismatch",
            "the ranks derived different consolidation plans from the same decision; nothing was published",
            evidence={"plans": [s["plan"] for s in staged]},
        )
    plan: ConsolidationPlan | None = state.get("plan")
    writers = [] if plan is None or world == 1 else shares.assign_by_size(shares.output_sizes(plan), world)

    def write() -> dict[str, Any]:  # the one writer: every output at a world of one (the index included),
        # above it this rank's share (rank 0 writes the index when it publishes; --hf-config is refused there)
        t0 = time.perf_counter()
        if "done" in state:
            outputs = state["done"].outputs
        else:
            assert plan is not None
            stage_fd = state["stage"].fd if rank == 0 else open_stage(state["destination"], staged[0]["stage"])
            try:
                outputs = write_all(
                    tree,
                    plan if world == 1 else shares.share_of(plan, writers[rank]),
                    stage_fd,
                    expected=None if tree.held or m.chunks is not None else m.digest.file_hashes(),
                    chunks=m.chunks,
                    chunk_size=chunk_size,
                    on_bytes=progress.written,
                    hf=hf if world == 1 else None,
                    workers=workers,
                )
            finally:
                if rank != 0:
                    os.close(stage_fd)
            if world == 1:
                state["done"] = Consolidated(outputs=outputs, plan_report=dict(plan.report))
        written = [[o.filename, o.size, o.sha256] for o in outputs]
        return {"written": written, "seconds": round(time.perf_counter() - t0, 3)}

    wrote = group.agree("write", writing(write))
    topology = None if backend is None else _topology(m, wrote, loads, backend)

    def publish_once() -> dict[str, Any]:
        assert evaluation is not None
        stage = state["stage"]
        done: Consolidated | None = state.get("done")
        if done is None:  # the ranks' shares, in the plan's order, and the index
            assert plan is not None
            by_name = {w[0]: WrittenFile(filename=w[0], size=w[1], sha256=w[2]) for r in wrote for w in r["written"]}
            outputs = [by_name[n] for n in [s.filename for s in plan.shards] + [c.filename for c in plan.copies]]
            index = write_index(plan, stage.fd)
            outputs += [index] if index is not None else []
            done = Consolidated(outputs=tuple(outputs), plan_report=dict(plan.report))
        state["result"] = published(
            src, state["dst"], stage, evaluation, done, options=options, signer=receipt_signer, topology=topology
        )
        return {"published": str(state["dst"])}

    try:
        group.broadcast("publish", writing(publish_once))
    except Error:
        if state.get("result") is None:
            raise
        # rank 0 published (the rename is the commit point): a peer lost now cannot undo it
    result: IntakeResult | None = state.get("result")
    return result


def _topology(m: Measured, wrote: list[Any], workers: list[Any], backend: str) -> dict[str, Any]:
    """Who hashed, loaded and wrote what, and how the bytes one rank hashed were bound to the bytes
    another copied (read leases on one kernel, or the chunk manifest)."""
    return {
        "world_size": len(m.owners),
        "backend": backend,
        "copy_check": "leases" if m.leased else "chunk_manifest" if m.chunks is not None else "rehash",
        "ranks": [
            {
                "rank": r,
                "files_hashed": len(m.owners[r]),
                "bytes_hashed": sum(m.sizes[p] for p in m.owners[r]),
                "outputs_written": len(wrote[r]["written"]),
                "bytes_written": sum(w[1] for w in wrote[r]["written"]),
                "hash_seconds": m.hash_seconds[r],
                "write_seconds": wrote[r]["seconds"],
                "worker": worker_record(workers[r]),
            }
            for r in range(len(m.owners))
        ],
    }
