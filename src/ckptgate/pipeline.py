"""The intake pipeline: one pass through every step, in order, fail closed.

    walk + inspect -> digest -> verify -> decide -> enforce -> consolidate -> publish

This module composes the steps, in that order; none of them imports it.  Enforce
(:func:`ckptgate.enforce.gate.enforce`) gates every loader and the publication: nothing is
loaded beyond pure data but under its permit in the contained worker, and nothing is published
unless the decision is allow, and then only atomically (:mod:`ckptgate.publish`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ckptgate import __version__, interrupts
from ckptgate.consolidate import adapter_plan, framework_files, plan_for, with_companions
from ckptgate.consolidate.hf.plan import check_dtype, layout_tp, write_config_files
from ckptgate.consolidate.hf.source import HfConfig, read_hf_config
from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile, cast_plan, check_cast
from ckptgate.consolidate.streamed import StreamedPlan
from ckptgate.consolidate.writer import DEFAULT_CHUNK, WrittenFile, write_index, write_plan
from ckptgate.decide import (
    Decision,
    PolicyEngine,
    PolicyInput,
    PolicyInputBuilder,
    Precheck,
    Request,
    decide,
    now_utc,
    precheck,
)
from ckptgate.decide.bundle import opa_version
from ckptgate.decide.inputs import DecisionInput
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.digest import DigestCancelled, FixtureDigest, fixture_digest
from ckptgate.enforce.containment import ContainmentProfile, preflight
from ckptgate.enforce.gate import WorkerOptions, enforce, refusal
from ckptgate.errors import Error, RuntimeFailure, UsageError, VerificationError
from ckptgate.inspect import DeferredCrcs, Inspection, SafeTree, inspect_open_tree
from ckptgate.publish import Destination, Stage, check_destination, open_destination, publish, staging
from ckptgate.userfiles import io_advice, read_regular_file
from ckptgate.verify import TrustData, prepare_statement_checks, verify_attestation
from ckptgate.verify.dsse import MAX_ENVELOPE_BYTES, Signer
from ckptgate.verify.oms import (
    CertificateChain,
    OfferedKey,
    check_signature_flags,
    load_verification_material,
    verify_oms_bundle,
)

PURE_DATA_LOADERS = frozenset({"safetensors", "json"})
#: The loaders of the planes that run no loader (pure data, static pickle): the output may be
#: staged in the digest's pass (:class:`OnePass`).  A checkpoint that names any other loader
#: (the framework plane) takes two passes, even when its plan comes from the static reader.
ONE_PASS_LOADERS = PURE_DATA_LOADERS | {"static_pickle"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """Everything the gate knew and decided about one checkpoint (no output yet)."""

    policy_input: PolicyInput
    decision: Decision
    inspection: Inspection
    digest: FixtureDigest
    containment: ContainmentProfile | None = None  # the profile the decision saw (None for pure data)


@dataclass(frozen=True, slots=True, kw_only=True)
class Consolidated:
    """What :func:`consolidate_into` wrote, and what the plan's adapter reported (JSON)."""

    outputs: tuple[WrittenFile, ...]
    plan_report: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class IntakeResult:
    evaluation: Evaluation
    destination: Path
    outputs: tuple[WrittenFile, ...]
    receipt: dict[str, Any]


def _read_attestation(path: Path) -> bytes:
    try:
        raw = read_regular_file(path, limit=MAX_ENVELOPE_BYTES)  # one byte more, so verification sees it is too large
    except OSError as e:
        raise UsageError("usage.attestation_unreadable", f"cannot read attestation {path}: {e.strerror}") from None
    return raw


def evaluate(
    tree: SafeTree,
    *,
    attestations: Sequence[Path],
    engine: PolicyEngine,
    trust: TrustData,
    action: str = "intake",
    now: datetime | None = None,
    candidate_commit: str | None = None,
    containment: ContainmentProfile | None = None,
    sigstore_trust_root: Path | str | None = None,
    refuse_early: bool = False,
    signatures: Sequence[Path] = (),
    offered_key: OfferedKey | None = None,
    on_hash_plan: Callable[[int], None] | None = None,
    on_hash_bytes: Callable[[int], None] | None = None,
    certificate_chain: CertificateChain | None = None,
    select: str | None = None,
    stage: Callable[[Inspection], Callable[[str], Callable[[int, memoryview], None] | None] | None] | None = None,
    hf: HfConfig | None = None,
) -> Evaluation:
    """Inspect, digest, verify and decide.  Never loads anything from the checkpoint.

    The CRC-32 of torch-zip entries is computed from the bytes the digest reads (one read of the
    input, not two).  While the digest hashes, the statement schemas are compiled and, when the
    loaders need a containment profile, the preflight's child runs.

    With ``refuse_early``, the policy's precheck is asked beside the digest, from the inspection
    alone; when it refuses, the digest stops where it is and the refusal is raised, so a
    checkpoint whose structure is already refused is never hashed in full (a sparse terabyte
    behind a broken header costs a header read, not the hours of a full hash).

    ``on_hash_plan`` is told the bytes the digest will hash before it starts; ``on_hash_bytes``
    then receives byte counts as they are hashed (from the hashing threads).

    ``stage``, when given, is called with the inspection before the digest starts; what it returns
    (``path -> callable or None``) is handed every chunk the digest hashes, from the digest's own
    buffer (:class:`OnePass`, which writes the output in the same read).
    """
    now = now or now_utc()
    crcs = DeferredCrcs()
    inspection = inspect_open_tree(tree, verify_crc=crcs)
    stop = threading.Event()  # set by a refusing precheck, or by a signal that aborts the run
    with (
        interrupts.cancelling(stop),
        ThreadPoolExecutor(max_workers=3, thread_name_prefix="ckptgate-beside-digest") as pool,
    ):
        pool.submit(prepare_statement_checks)
        profile = pool.submit(_preflight) if containment is None and _needs_profile(inspection) else None
        early = (
            pool.submit(
                _precheck,
                engine,
                inspection,
                Request(action=action, now=now, select=select, candidate_commit=candidate_commit),
                stop,
            )
            if refuse_early
            else None
        )
        if on_hash_plan is not None:
            on_hash_plan(tree.total_bytes)
        also = combine_also(crcs.reader, stage(inspection) if stage is not None else None)
        try:
            digest = fixture_digest(tree, also=also, cancel=stop, progress=on_hash_bytes)
        except DigestCancelled:
            digest = None
        refuse_if(early.result() if early is not None else None)  # raises what the precheck raised
        assert digest is not None  # only a refusal or a failed precheck cancels it
        if profile is not None:
            containment = profile.result()
    inspection = inspection.with_findings(crcs.findings())
    return judge(
        inspection,
        digest,
        attestations=attestations,
        engine=engine,
        trust=trust,
        action=action,
        now=now,
        candidate_commit=candidate_commit,
        containment=containment,
        sigstore_trust_root=sigstore_trust_root,
        signatures=signatures,
        offered_key=offered_key,
        certificate_chain=certificate_chain,
        select=select,
        hf=hf,
    )


def combine_also(
    *readers: Callable[[str], Callable[[int, memoryview], None] | None] | None,
) -> Callable[[str], Callable[[int, memoryview], None] | None]:
    """One ``also`` for the digest from several: each file's chunks go to each reader that wants them."""
    given = [r for r in readers if r is not None]

    def also(path: str) -> Callable[[int, memoryview], None] | None:
        taken = [f for f in (r(path) for r in given) if f is not None]
        if len(taken) <= 1:
            return taken[0] if taken else None

        def each(offset: int, view: memoryview) -> None:
            for f in taken:
                f(offset, view)

        return each

    return also


def refuse_if(found: Precheck | None) -> None:
    """Raise the refusal of a precheck that refuses (the structure is refused before the digest)."""
    if found is not None and found.refuse:
        raise refusal(
            found.deny_reasons, found.decision_id, found.policy_revision, found.refusal or "policy", before_digest=True
        )


def _precheck(engine: PolicyEngine, inspection: Inspection, request: Request, stop: threading.Event) -> Precheck | None:
    """The policy's precheck; a refusal, or a failure to ask, stops the digest (the failure is
    raised to the caller, as the decision's would be)."""
    try:
        found = precheck(engine, inspection, request)
    except BaseException:
        stop.set()
        raise
    if found is not None and found.refuse:
        stop.set()
    return found


def _needs_profile(inspection: Inspection) -> bool:
    """Only loads beyond pure data can need containment; the policy decides which controls."""
    return not set(inspection.loaders) <= PURE_DATA_LOADERS


def _preflight() -> ContainmentProfile:
    """Only when a framework load may follow (tests replace it)."""
    return preflight()


def judge(
    inspection: Inspection,
    digest: FixtureDigest,
    *,
    attestations: Sequence[Path],
    engine: PolicyEngine,
    trust: TrustData,
    action: str = "intake",
    now: datetime | None = None,
    candidate_commit: str | None = None,
    containment: ContainmentProfile | None = None,
    sigstore_trust_root: Path | str | None = None,
    signatures: Sequence[Path] = (),
    offered_key: OfferedKey | None = None,
    certificate_chain: CertificateChain | None = None,
    select: str | None = None,
    hf: HfConfig | None = None,
) -> Evaluation:
    """Verify ``attestations`` against what was measured and decide; :func:`evaluate` measures first.

    ``signatures`` are OpenSSF Model Signing bundles, verified under ``offered_key`` (``--key``) or
    against ``certificate_chain`` (``--certificate-chain``), as each bundle's method says, and
    bound file by file to the measured manifest (:mod:`ckptgate.verify.oms`).  An in-toto statement in
    ``attestations`` whose subjects list the checkpoint's files (SLSA provenance, say) binds to the same
    manifest (:func:`ckptgate.verify.statement.bind_manifest`).
    For a second decision on the same measurement (more evidence, same bytes), without inspecting
    and hashing again.
    """
    check_signature_flags(signatures, offered_key, certificate_chain is not None or sigstore_trust_root is not None)
    now = now or now_utc()
    builder = (
        PolicyInputBuilder(Request(action=action, now=now, candidate_commit=candidate_commit, select=select))
        .fixture(digest)
        .inspection(inspection)
    )
    manifest = digest.file_hashes()
    for path in attestations:
        raw = _read_attestation(path)
        try:
            verified = verify_attestation(
                raw,
                source=str(path),
                trust=trust,
                measured_digest=digest.digest,
                now=now,
                sigstore_trust_root=sigstore_trust_root,
                manifest=manifest,
            )
        except VerificationError as e:
            builder.rejected_attestation(str(path), e)
        else:
            builder.attestation(verified)
    if offered_key is not None:
        builder.offered_key(offered_key)
    if offered_key is not None or certificate_chain is not None or sigstore_trust_root is not None:
        for path in signatures:
            raw = _read_attestation(path)
            try:
                verified = verify_oms_bundle(
                    raw,
                    source=str(path),
                    key=offered_key,
                    manifest=manifest,
                    measured_digest=digest.digest,
                    now=now,
                    certificate_chain=certificate_chain,
                    sigstore_trust_root=sigstore_trust_root,
                    trust=trust,
                )
            except VerificationError as e:
                builder.rejected_attestation(str(path), e)
            else:
                builder.attestation(verified)
    if containment is None and _needs_profile(inspection):
        containment = _preflight()
    builder.containment(containment)
    if hf is not None:
        dcp_layout = inspection.layout.get("dcp") if isinstance(inspection.layout, dict) else None
        builder.hf_mapping(hf.facts(layout_tp(dcp_layout) if isinstance(dcp_layout, dict) else None))
    policy_input = builder.build()
    decision = decide(engine, policy_input)
    if hf is not None:  # the config decides too: named in the decision, as every other input
        config_input = DecisionInput(role="hf_config", path=hf.source, origin="explicit", sha256="sha256:" + hf.digest)
        decision = dataclasses.replace(decision, inputs=(*decision.inputs, config_input))
    return Evaluation(
        policy_input=policy_input, decision=decision, inspection=inspection, digest=digest, containment=containment
    )


def consolidate_into(
    tree: SafeTree,
    evaluation: Evaluation,
    out_dir: int | Path,
    *,
    max_shard_bytes: int,
    chunk_size: int = DEFAULT_CHUNK,
    on_bytes: Callable[[int], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    dtype: str | None = None,
    hf: HfConfig | None = None,
) -> Consolidated:
    """Enforce an evaluated decision and write the consolidated output into ``out_dir`` (a
    directory descriptor, or a path the writer opens once as one).

    The enforce step gates it: a deny raises the refusal it stands for, a loader the decision
    does not permit is refused, and files that need a framework load are loaded in the contained
    worker under a permit and the profile the policy decided on
    (:func:`~ckptgate.enforce.gate.enforce`).  Consolidation then plans from what enforce
    returned, and the writer writes.  When ``tree`` holds its files
    (:meth:`~ckptgate.inspect.SafeTree.hold`), only the placed bytes are read, and the leases must
    still hold after the write; otherwise every source is re-hashed in the writer's single pass
    and must match the manifest.  Either way the bytes written are the bytes that were measured.
    Dtypes are preserved unless ``dtype`` names one to cast every floating-point tensor to
    (:func:`~ckptgate.consolidate.plan.cast_plan`).
    """
    check_cast(dtype)
    enforced = enforce(
        tree,
        evaluation.inspection,
        decision=evaluation.decision,
        fixture_digest=evaluation.digest,
        framework_files=framework_files(evaluation.inspection),
        worker=WorkerOptions(profile=evaluation.containment) if evaluation.containment else None,
    )
    plan = plan_for(
        evaluation.inspection,
        decision=evaluation.decision,
        max_shard_bytes=max_shard_bytes,
        loaded=enforced.loaded,
        hf=hf,
    )
    plan = cast_plan(plan, dtype, max_shard_bytes=max_shard_bytes)
    if hf is not None:
        check_dtype(plan, hf)
    if on_plan:
        on_plan(plan.total_size)
    still_held(tree)
    with open_sources(tree, plan) as sources:
        outputs = write_plan(
            plan,
            out_dir,
            sources,
            expected=None if tree.held else evaluation.digest.file_hashes(),
            chunk_size=chunk_size,
            on_bytes=on_bytes,
        )
    still_held(tree)
    if hf is not None:
        outputs += _config_files(hf, out_dir)
    return Consolidated(outputs=outputs, plan_report=dict(plan.report))  # adapters build it from plain JSON


def _config_files(hf: HfConfig, out_dir: int | Path) -> tuple[WrittenFile, ...]:
    if isinstance(out_dir, int):
        return write_config_files(hf, out_dir)
    fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return write_config_files(hf, fd)
    finally:
        os.close(fd)


def still_held(tree: SafeTree) -> None:
    """A held tree whose lease broke was opened for writing during the intake: fail closed."""
    if tree.held and not tree.intact():
        raise RuntimeFailure(
            "runtime.copy.source_changed",
            "a checkpoint file was opened for writing while it was being taken in; nothing was published",
            evidence={"source": str(tree.root)},
            advice="Take the checkpoint in again from a copy that nothing else writes to.",
        )


def intake(
    src: Path,
    dst: Path,
    *,
    attestations: Sequence[Path],
    options: EngineOptions | None = None,
    max_shard_bytes: int = 2 << 30,
    chunk_size: int = DEFAULT_CHUNK,
    now: datetime | None = None,
    on_bytes: Callable[[int], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    dtype: str | None = None,
    signatures: Sequence[Path] = (),
    key: Path | None = None,
    certificate_chain: Sequence[Path] = (),
    receipt_signer: Signer | None = None,
    on_hash_plan: Callable[[int], None] | None = None,
    on_hash_bytes: Callable[[int], None] | None = None,
    select: str | None = None,
    hf_config: Path | None = None,
) -> IntakeResult:
    """Take ``src`` in through the gate and publish HF sharded safetensors at ``dst`` (every
    floating-point tensor cast to ``dtype`` if one is named; dtypes are otherwise preserved).
    With ``receipt_signer`` (a :class:`ckptgate.verify.dsse.Signer`) the receipt is also signed
    as a DSSE envelope published beside it.  ``on_hash_plan``/``on_hash_bytes`` report the digest's
    progress (total, then byte counts); ``on_plan``/``on_bytes`` the consolidation's.  ``select``
    (``--select PREFIX``) names the subtree of a training-state tree to write; by default the
    policy picks the model subtree of a layout its data describes.  ``hf_config`` (``--hf-config``)
    maps a Megatron checkpoint to the Hugging Face model that config declares
    (:mod:`ckptgate.consolidate.hf`) and publishes the config's files beside it."""
    options = options or EngineOptions()
    if hf_config is not None and select is not None:
        raise UsageError("usage.hf_config.select", "--select does not combine with --hf-config")
    hf = read_hf_config(hf_config) if hf_config is not None else None  # read once, before any work
    if select is not None:
        Request(action="intake", now=now_utc(), select=select)  # a bad prefix is a usage error before any work
    check_cast(dtype)  # before the digest, not after it
    dst = check_destination(dst, source=src)  # the early answer, by path, before any work
    trust = load_trust(options)
    offered_key, chain = load_verification_material(signatures, key, certificate_chain, options.sigstore_trust_root)
    # DST's parent is resolved once, here, into a descriptor proved to lie outside the root that
    # is walked; staging, writing, fsync and the final rename are all relative to it.
    with (
        SafeTree.open(src) as tree,
        open_destination(dst, source_root=tree.root_id) as destination,
        engine_for(options, trust) as engine,
    ):
        # Leases let the copy read only the placed bytes; without them it hashes every source in its
        # one read.  Inspection is bound to the digest by the tree's read ledger either way.
        tree.hold()
        with OnePass(
            destination, max_shard_bytes=max_shard_bytes, chunk_size=chunk_size, dtype=dtype, select=select, hf=hf
        ) as one:
            evaluation = evaluate(
                tree,
                attestations=attestations,
                engine=engine,
                trust=trust,
                now=now,
                sigstore_trust_root=options.sigstore_trust_root,
                refuse_early=True,
                signatures=signatures,
                offered_key=offered_key,
                on_hash_plan=on_hash_plan,
                on_hash_bytes=on_hash_bytes,
                certificate_chain=chain,
                select=select,
                stage=one.begin,
                hf=hf,
            )
            try:
                with contextlib.ExitStack() as later:
                    done = None
                    if one.stage is not None:  # written in the digest's pass: enforce, then keep what was staged
                        stage = one.stage
                        done = one.finish(tree, evaluation, on_plan=on_plan, on_bytes=on_bytes)
                    if done is None:  # two passes: nothing is read for the output before enforce
                        stage = later.enter_context(staging(destination))
                        done = consolidate_into(
                            tree,
                            evaluation,
                            stage.fd,
                            max_shard_bytes=max_shard_bytes,
                            chunk_size=chunk_size,
                            on_bytes=on_bytes,
                            on_plan=on_plan,
                            dtype=dtype,
                            hf=hf,
                        )
                    return published(src, dst, stage, evaluation, done, options=options, signer=receipt_signer)
            except OSError as e:  # ENOSPC, EFBIG, EIO...: an I/O failure, not a bug; nothing was published
                raise _io_failure(e, dst) from None


def published(
    src: Path,
    dst: Path,
    stage: Stage,
    evaluation: Evaluation,
    done: Consolidated,
    *,
    options: EngineOptions,
    signer: Signer | None,
    topology: dict[str, Any] | None = None,
) -> IntakeResult:
    """Write the receipt (with ``topology`` when a group of ranks took the input in) and publish."""
    receipt = receipt_for(src, evaluation, done, opa_version=None if options.opa_url else local_opa_version())
    if topology is not None:
        receipt["topology"] = topology
    try:
        publish(stage, receipt, signer=signer)
    except OSError as e:  # ENOSPC, EFBIG, EIO...: an I/O failure, not a bug; nothing was published
        raise _io_failure(e, dst) from None
    return IntakeResult(evaluation=evaluation, destination=dst, outputs=done.outputs, receipt=receipt)


def _io_failure(e: OSError, dst: Path) -> RuntimeFailure:
    return RuntimeFailure(
        "runtime.io",
        f"writing the output failed: {e.strerror or e}",
        evidence={"errno": e.errno, "destination": str(dst)},
        advice=io_advice(e, dst),  # a full disk is not the worker's resource limit
    )


class OnePass:
    """Intake's single read of the input, for the planes that run no loader.

    When a checkpoint's loaders are all of the planes that run no loader
    (:data:`ONE_PASS_LOADERS`: pure data, or the static reader's facts) and no cast was asked
    for, :meth:`begin` (called by :func:`evaluate` with the inspection, before the digest) plans
    from the inspection, opens a private staging directory beside DST
    (:func:`ckptgate.publish.staging`) and returns the digest's ``also``: every chunk the digest
    hashes is written, from the digest's own buffer, into the staged outputs
    (:class:`~ckptgate.consolidate.streamed.StreamedPlan`), so the input is read once and the bytes
    written are the bytes hashed.  Every companion inspection checked is staged too; the decision
    names which stay.  Nothing is published before :meth:`finish` has had the decision enforced
    (:func:`~ckptgate.enforce.gate.enforce`: a deny raises its refusal) and :func:`publish` runs;
    leaving the ``with`` block any other way removes the staging directory (a ``kill -9`` leaves it
    to the next run's sweep, :mod:`ckptgate.workdirs`).

    Everything else takes two passes (:func:`consolidate_into` after the decision): the framework
    plane (nothing is loaded, or staged, before the permit; DeepSpeed ZeRO included), casts
    (``--dtype``: the plan's output sizes depend on it, and the streaming writer does not
    convert), and layouts whose plan fails before the digest (so the decision's refusal still
    comes first, as it does today).
    """

    def __init__(
        self,
        destination: Destination,
        *,
        max_shard_bytes: int,
        chunk_size: int = DEFAULT_CHUNK,
        dtype: str | None = None,
        select: str | None = None,
        hf: HfConfig | None = None,
    ) -> None:
        self._destination, self._max, self._chunk, self._dtype = destination, max_shard_bytes, chunk_size, dtype
        self._select, self._hf = select, hf
        self._stack = contextlib.ExitStack()
        self.stage: Stage | None = None  # once the output is being written in the digest's pass
        self._plan: ConsolidationPlan | None = None
        self._writer: StreamedPlan | None = None

    def __enter__(self) -> OnePass:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()  # closes the outputs, then removes the staging directory unless published

    def begin(self, inspection: Inspection) -> Callable[[str], Callable[[int, memoryview], None] | None] | None:
        """Plan and stage for the one pass, or ``None`` for two passes."""
        if (
            self._dtype is not None
            or self._select is not None  # a subtree the decision will select: nothing staged before it
            or not inspection.consolidatable
            or framework_files(inspection)
            or not set(inspection.loaders) <= ONE_PASS_LOADERS
        ):
            return None
        try:
            plan = adapter_plan(inspection, max_shard_bytes=self._max, hf=self._hf)
            if self._hf is not None:
                check_dtype(plan, self._hf)
            taken = {c.filename for c in plan.copies} | {s.filename for s in plan.shards}
            maybe = tuple(
                CopiedFile(src=f.path, filename=f.path, size=f.size)
                for f in inspection.files
                if f.role == "companion" and f.path not in taken and self._hf is None
            )
        except Error:
            return None  # raised again, in its place after the decision, by the two-pass path
        staged = dataclasses.replace(plan, copies=plan.copies + maybe)
        try:
            self.stage = self._stack.enter_context(staging(self._destination))
            self._writer = self._stack.enter_context(StreamedPlan(staged, self.stage.fd, chunk_size=self._chunk))
        except OSError as e:
            raise _io_failure(e, self._destination.path) from None
        self._plan = plan
        writer, dst = self._writer, self._destination.path

        def also(path: str) -> Callable[[int, memoryview], None] | None:
            feed = writer.feeder(path)
            if feed is None:
                return None

            def write(offset: int, view: memoryview) -> None:
                try:
                    feed(offset, view)
                except OSError as e:
                    raise _io_failure(e, dst) from None

            return write

        return also

    def finish(
        self,
        tree: SafeTree,
        evaluation: Evaluation,
        *,
        on_plan: Callable[[int], None] | None = None,
        on_bytes: Callable[[int], None] | None = None,
    ) -> Consolidated | None:
        """Enforce the decision, then keep the staged outputs the final plan names (the others, the
        companions the decision did not name, are removed) and write the index.  ``None`` when the
        decision selects a subtree (the staged plan is the whole tree's): the staging directory is
        removed and the caller takes the two-pass path with the decision's plan."""
        assert self.stage is not None and self._writer is not None and self._plan is not None
        enforce(tree, evaluation.inspection, decision=evaluation.decision, fixture_digest=evaluation.digest)
        if evaluation.decision.selection is not None:
            self._stack.close()
            self.stage = self._writer = None
            return None
        plan = self._plan if self._hf else with_companions(self._plan, evaluation.inspection, evaluation.decision)
        if on_plan:
            on_plan(plan.total_size)
        if on_bytes:  # every placed byte was written in the digest's pass
            on_bytes(plan.total_size)
        still_held(tree)  # the leases held from the walk to the last byte written, as in two passes
        written = self._writer.finish()
        names = [s.filename for s in plan.shards] + [c.filename for c in plan.copies]
        for name in set(written) - set(names):
            os.unlink(name, dir_fd=self.stage.fd)
        unstaged = sorted(set(names) - set(written))
        if unstaged:
            raise RuntimeFailure(
                "runtime.copy.not_staged",
                "the decision's plan names outputs the one pass did not stage",
                evidence={"outputs": unstaged},
            )
        outputs = [written[n] for n in names]
        index = write_index(plan, self.stage.fd)
        if index is not None:
            outputs.append(index)
        if self._hf is not None:
            outputs += write_config_files(self._hf, self.stage.fd)
        return Consolidated(outputs=tuple(outputs), plan_report=dict(plan.report))


@contextlib.contextmanager
def open_sources(tree: SafeTree, plan: ConsolidationPlan) -> Iterator[dict[str, int]]:
    fds: dict[str, int] = {}
    try:
        for src in plan.source_paths:
            fds[src] = tree.open_file(src)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def _containment_record(evaluation: Evaluation, done: Consolidated) -> dict[str, Any]:
    """The containment part of the receipt.

    ``worker``: the controls that were active inside the contained worker, as the worker measured
    them in itself before it read an input (seccomp mode and filter, ``NoNewPrivs``, namespace ids
    beside the parent's); ``null`` when no worker ran.  ``preflight``: the host profile the
    decision was taken on, which is a prediction, not a record of the load.
    """
    worker = done.plan_report.get("worker")
    record = None
    if isinstance(worker, dict):
        record = {"job": worker.get("job"), "controls": worker.get("controls"), "measured": worker.get("measured")}
    return {"worker": record, "preflight": evaluation.policy_input.containment}


def local_opa_version() -> str | None:
    """The version the local OPA binary reports (``opa version``), or None when it cannot say: the
    one its check reported when the embedded engine launched it, not a second run at the end."""
    return opa_version()


def _resume_state(evaluation: Evaluation) -> list[dict[str, Any]]:
    """The resume-state files the intake left out, each with its digest and full pickle inventory."""
    hashes = evaluation.digest.file_hashes()
    pickles = {p.path: p for p in evaluation.inspection.pickles}
    return [
        {
            "path": f.path,
            "size": f.size,
            "sha256": hashes.get(f.path),
            "pickle": pickles[f.path].to_json() if f.path in pickles else None,
        }
        for f in evaluation.inspection.files
        if f.role == "resume_state"
    ]


def receipt_for(
    src: Path, evaluation: Evaluation, done: Consolidated, *, opa_version: str | None = None
) -> dict[str, Any]:
    """The receipt of one intake: what was decided about which bytes, and what was written."""
    d = evaluation.decision
    return {
        "receipt_version": 1,
        "ckptgate_version": __version__,
        "opa_version": opa_version,
        "source": str(src),
        "source_absolute": os.path.abspath(src),
        "input": {
            "digest": evaluation.digest.digest.prefixed(),
            "algorithm": evaluation.digest.algorithm,
            "format": evaluation.inspection.format,
        },
        "decision": {
            "id": d.decision_id,
            **d.to_json("allow", "plane", "permitted_loaders", "required_controls", "reasons", "engine"),
        },
        "policy_revision": d.policy_revision,
        "inputs": [i.to_json() for i in d.inputs],
        "containment": _containment_record(evaluation, done),
        "attestations": [
            {"source": a.get("source"), "signers": a.get("signers")} for a in evaluation.policy_input.attestations
        ],
        "plan": done.plan_report,
        "outputs": [o.to_json() for o in done.outputs],
        "companions": [
            o.to_json() for o in done.outputs if o.filename in set(done.plan_report.get("companions") or ())
        ],
        "resume_state": _resume_state(evaluation),
        "published_at": now_utc().strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


__all__ = [
    "Consolidated",
    "Evaluation",
    "IntakeResult",
    "OnePass",
    "combine_also",
    "consolidate_into",
    "evaluate",
    "intake",
    "judge",
    "local_opa_version",
    "open_sources",
    "published",
    "receipt_for",
    "refuse_if",
    "still_held",
]
