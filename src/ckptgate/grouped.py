"""The intake over a :class:`~ckptgate.group.Group` of ranks: each step once, each rank its share.

    inspect -> digest -> verify + decide -> enforce -> consolidate -> publish

Every rank inspects SRC itself and the ranks exchange what inspection read (the read ledgers).
The files are split by bytes (:func:`~ckptgate.consolidate.shares.assign_by_size`): each rank
hashes its own, checking every chunk any rank's inspection read, and records the chunk manifest
unless read leases bind the ranks (:func:`~ckptgate.inspect.leases.leases_bind`).  Rank 0 forms
the fixture digest from the gathered entries, verifies and decides once (the group's broadcast);
every rank enforces the decision and loads the framework files it owns in its own contained
worker; every rank plans, and the ranks compare the plan's sha256; each writes its share of the
outputs into rank 0's staging directory; rank 0 publishes once.  What differs by rank is a
parameter of the step (who hashes, who loads, who writes, who asks the engine), never a copy of it.

Any rank's failure in a step fails every rank with the first failure's code (:meth:`Group.agree`).
The launch (rendezvous, secret, signals) is :mod:`ckptgate.distributed`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckptgate.consolidate import framework_files, plan_for, shares
from ckptgate.consolidate.writer import WrittenFile, write_index
from ckptgate.decide import PolicyEngine, Request, now_utc, precheck
from ckptgate.decide.decision import decision_from_json
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.digest import FixtureDigest, ManifestEntry, hash_files
from ckptgate.enforce.gate import WorkerOptions, enforce
from ckptgate.enforce.load import loaded_json, merge_loaded, worker_record
from ckptgate.errors import Error, RuntimeFailure
from ckptgate.group import Group
from ckptgate.inspect import DeferredCrcs, Inspection, SafeTree, inspect_open_tree
from ckptgate.inspect.findings import finding_from_json
from ckptgate.inspect.leases import lease_facts, leases_bind
from ckptgate.pipeline import (
    Consolidated,
    Evaluation,
    IntakeResult,
    combine_also,
    judge,
    published,
    refuse_if,
    still_held,
)
from ckptgate.publish import check_destination, open_destination, open_stage, staging
from ckptgate.verify import TrustData
from ckptgate.verify.dsse import Signer
from ckptgate.verify.oms import load_verification_material

__all__ = ["EarlyEngine", "grouped_intake"]


class EarlyEngine:
    """Rank 0's trust data and policy engine, opened before the group forms, so that the embedded
    OPA launches (on its keeper thread) while torch imports.  A failure to open them (a bad trust
    file, say) is kept and raised in the first step that asks it (the precheck), where every rank hears of it."""

    def __init__(self, options: EngineOptions, stack: contextlib.ExitStack) -> None:
        self.error: Error | None = None
        self.trust: TrustData | None = None
        self.engine: PolicyEngine | None = None
        try:
            self.trust = load_trust(options)
            self.engine = stack.enter_context(engine_for(options, self.trust))
        except Error as e:
            self.error = e
        except Exception as e:  # a bug: the other ranks must still hear of it in the decide step
            self.error = Error("internal.unexpected", f"rank 0: {type(e).__name__}: {e}")

    def get(self) -> tuple[TrustData, PolicyEngine]:
        if self.error is not None:
            raise self.error
        assert self.trust is not None and self.engine is not None
        return self.trust, self.engine


def _refuse_early(early: EarlyEngine, inspection: Inspection) -> None:
    """The policy's precheck, as the single process asks it beside its digest."""
    refuse_if(precheck(early.get()[1], inspection, Request(action="intake", now=now_utc())))


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
    backend: str = "gloo",
) -> IntakeResult | None:
    """Take ``src`` in across ``group``; rank 0 publishes at ``dst`` and returns the result, the
    other ranks return ``None``.  What each step opens is closed by ``stack``."""
    rank, world = group.rank, group.world
    state: dict[str, Any] = {}

    def early() -> EarlyEngine:  # rank 0's engine: the caller's, or opened once here
        if "engine" not in state:
            state["engine"] = engine if engine is not None else EarlyEngine(options, stack)
        opened: EarlyEngine = state["engine"]
        return opened

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
            **lease_facts(tree, held),
        }

    seen = group.agree("inspect", inspect)
    if any(s["files"] != seen[0]["files"] or s["framework_files"] != seen[0]["framework_files"] for s in seen):
        raise RuntimeFailure(
            "runtime.distributed.tree_mismatch",
            "the ranks do not see the same files in SRC (is it on one shared file system?); nothing was published",
            evidence={"source": str(src)},
        )
    tree: SafeTree = state["tree"]
    # With leases that bind every rank, each rank copies the placed bytes under its own lease,
    # taken before any rank hashed, and checks it still holds after its copy, as one process does;
    # otherwise the digest pass records the chunk manifest and every copied chunk is checked against it.
    leased = leases_bind(seen)
    needed: list[str] = seen[0]["framework_files"]
    owners = shares.assign_by_size([(p, s) for p, s in seen[0]["files"]], world, first=needed)
    owned_needs = [[p for p in owners[r] if p in set(needed)] for r in range(world)]

    def digest_pass() -> dict[str, Any]:
        if rank == 0:  # the policy's precheck, from the inspection alone, before rank 0 hashes
            _refuse_early(early(), state["inspection"])
        mine = owners[rank]
        for other in seen:  # what every rank's inspection read of my files: checked in my one pass
            for path in mine:
                for i, d in other["ledgers"].get(path, {}).items():
                    tree.ledger(path).record(int(i), bytes.fromhex(d))
        recorders = {} if leased else {p: shares.ChunkRecorder() for p in mine}
        crcs: DeferredCrcs = state["crcs"]
        t0 = time.perf_counter()
        entries = hash_files(tree, mine, also=combine_also(recorders.get, crcs.reader))
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

    hashed = group.agree("digest", digest_pass)
    found = [finding_from_json(f) for h in hashed for f in h["crc_findings"]]
    state["inspection"] = state["inspection"].with_findings(found)
    chunks: dict[str, list[str]] = {p: c for h in hashed for p, c in h["chunks"].items()}
    digest = FixtureDigest.from_manifest(
        [ManifestEntry(path=e["path"], size=e["size"], sha256=e["sha256"]) for h in hashed for e in h["entries"]]
    )
    group.bind_fixture(str(digest.digest))

    def decide_once() -> dict[str, Any]:
        trust, policy = early().get()
        offered_key, chain = load_verification_material(signatures, key, certificate_chain, options.sigstore_trust_root)
        state["evaluation"] = ev = judge(
            state["inspection"],
            digest,
            attestations=attestations,
            engine=policy,
            trust=trust,
            sigstore_trust_root=options.sigstore_trust_root,
            signatures=signatures,
            offered_key=offered_key,
            certificate_chain=chain,
        )
        return {"decision": ev.decision.to_json(), "digest": str(digest.digest)}

    decided = group.broadcast("decide", decide_once)
    if decided["digest"] != str(digest.digest):
        raise RuntimeFailure(
            "runtime.distributed.digest_mismatch",
            "rank 0 decided on another digest than this rank formed; nothing was published",
        )
    decision = decision_from_json(decided["decision"])

    def load_mine() -> dict[str, Any] | None:
        # Every rank enforces the decision (a deny or an unpermitted loader raises); a rank that owns
        # files needing a framework load loads them in its own contained worker, under its permit.
        evaluation: Evaluation | None = state.get("evaluation")
        enforced = enforce(
            tree,
            state["inspection"],
            decision=decision,
            fixture_digest=digest,
            framework_files=owned_needs[rank],
            worker=WorkerOptions(profile=evaluation.containment if evaluation is not None else None),
        )
        return loaded_json(enforced.loaded) if enforced.loaded is not None else None

    workers = group.agree("load", load_mine)
    loaded = merge_loaded(workers, owned_needs) if needed else None

    def stage_dir() -> dict[str, Any]:
        state["plan"] = plan = plan_for(
            state["inspection"], decision=decision, max_shard_bytes=max_shard_bytes, loaded=loaded
        )
        plan_hash = shares.plan_sha256(plan)
        state["destination"] = destination = stack.enter_context(
            open_destination(state["dst"], source_root=tree.root_id)
        )
        if rank == 0:
            state["stage"] = stack.enter_context(staging(destination))
            return {"plan": plan_hash, "stage": state["stage"].name}
        return {"plan": plan_hash}

    staged = group.agree("stage", stage_dir)
    plan = state["plan"]
    if any(s["plan"] != staged[0]["plan"] for s in staged):
        raise RuntimeFailure(
            "runtime.distributed.plan_mismatch",
            "the ranks derived different consolidation plans from the same decision; nothing was published",
            evidence={"plans": [s["plan"] for s in staged]},
        )
    writers = shares.assign_by_size(shares.output_sizes(plan), world)

    def write() -> dict[str, Any]:
        stage_fd = state["stage"].fd if rank == 0 else open_stage(state["destination"], staged[0]["stage"])
        try:
            done = shares.write_share(tree, stage_fd, plan, set(writers[rank]), None if leased else chunks)
            if leased:
                still_held(tree)
        finally:
            if rank != 0:
                os.close(stage_fd)
        return done

    wrote = group.agree("write", write)
    sizes = dict(seen[0]["files"])
    topology = {
        "world_size": world,
        "backend": backend,
        # how the bytes one rank hashed were bound to the bytes another copied: read leases on one
        # kernel, or the chunk manifest
        "copy_check": "leases" if leased else "chunk_manifest",
        "ranks": [
            {
                "rank": r,
                "files_hashed": len(owners[r]),
                "bytes_hashed": sum(sizes[p] for p in owners[r]),
                "outputs_written": len(wrote[r]["written"]),
                "bytes_written": sum(w[1] for w in wrote[r]["written"]),
                "hash_seconds": hashed[r]["seconds"],
                "write_seconds": wrote[r]["seconds"],
                "worker": worker_record(workers[r]),
            }
            for r in range(world)
        ],
    }

    def publish_once() -> dict[str, Any]:
        stage = state["stage"]
        by_name = {w[0]: WrittenFile(filename=w[0], size=w[1], sha256=w[2]) for r in wrote for w in r["written"]}
        outputs = [by_name[n] for n in [s.filename for s in plan.shards] + [c.filename for c in plan.copies]]
        index = write_index(plan, stage.fd)
        if index is not None:
            outputs.append(index)
        done = Consolidated(outputs=tuple(outputs), plan_report=dict(plan.report))
        state["result"] = published(
            src,
            state["dst"],
            stage,
            state["evaluation"],
            done,
            options=options,
            signer=receipt_signer,
            topology=topology,
        )
        return {"published": str(state["dst"])}

    try:
        group.broadcast("publish", publish_once)
    except Error:
        if state.get("result") is None:
            raise
        # rank 0 published (the rename is the commit point): a peer lost now cannot undo it
    result: IntakeResult | None = state.get("result")
    return result
