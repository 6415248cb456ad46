"""The intake pipeline's public face: one pass through every step, in order, fail closed.

    walk + inspect -> digest -> verify -> decide -> enforce -> consolidate -> publish

The steps are written once, in :func:`ckptgate.grouped.grouped_intake`; one process is a world of
one (:class:`~ckptgate.group.LocalGroup`: no torch, no process group), ``--distributed`` a world
of N.  Enforce (:func:`ckptgate.enforce.gate.enforce`) gates every loader and the publication:
nothing is loaded beyond pure data but under its permit in the contained worker, and nothing is
published unless the decision is allow, and then only atomically (:mod:`ckptgate.publish`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from ckptgate.consolidate import framework_files
from ckptgate.consolidate.hf.source import HfConfig, read_hf_config
from ckptgate.consolidate.plan import check_cast
from ckptgate.consolidate.writer import DEFAULT_CHUNK
from ckptgate.decide import PolicyEngine, Request, now_utc, precheck
from ckptgate.decide.options import EngineOptions
from ckptgate.enforce.containment import ContainmentProfile
from ckptgate.enforce.gate import WorkerOptions, enforce
from ckptgate.errors import UsageError
from ckptgate.group import LocalGroup
from ckptgate.grouped import EarlyEngine, grouped_intake, open_sources, plan_output, write_all
from ckptgate.inspect import SafeTree
from ckptgate.judge import judge, refuse_if
from ckptgate.measure import Progress, combine_also, measure
from ckptgate.onepass import OnePass
from ckptgate.outcome import (
    Consolidated,
    Evaluation,
    IntakeResult,
    local_opa_version,
    published,
    receipt_for,
    still_held,
)
from ckptgate.publish import check_destination
from ckptgate.verify import TrustData
from ckptgate.verify.dsse import Signer
from ckptgate.verify.oms import CertificateChain, OfferedKey

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
    hf: HfConfig | None = None,
) -> Evaluation:
    """Inspect, digest, verify and decide (the sequence's first steps, at a world of one).  Never
    loads anything from the checkpoint.

    The CRC-32 of torch-zip entries is computed from the bytes the digest reads (one read of the
    input, not two).  While the digest hashes, when the loaders need a containment profile, the
    preflight's child runs.  With ``refuse_early``, the
    policy's precheck is asked beside the digest, from the inspection alone; when it refuses, the
    digest stops where it is and the refusal is raised (:func:`ckptgate.measure.measure`).
    ``on_hash_plan`` is told the bytes the digest will hash; ``on_hash_bytes`` then receives byte
    counts as they are hashed (from the hashing threads).
    """
    now = now or now_utc()
    request = Request(action=action, now=now, select=select, candidate_commit=candidate_commit)
    m = measure(
        LocalGroup(),
        lambda: (tree, tree.held),
        ask=(lambda inspection: precheck(engine, inspection, request)) if refuse_early else None,
        containment=containment,
        progress=Progress(hash_plan=on_hash_plan, hash_bytes=on_hash_bytes),
    )
    return judge(
        m.inspection,
        m.digest,
        attestations=attestations,
        engine=engine,
        trust=trust,
        action=action,
        now=now,
        candidate_commit=candidate_commit,
        containment=m.containment,
        sigstore_trust_root=sigstore_trust_root,
        signatures=signatures,
        offered_key=offered_key,
        certificate_chain=certificate_chain,
        select=select,
        hf=hf,
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
    worker: bool = False,
) -> Consolidated:
    """Enforce an evaluated decision and write the consolidated output into ``out_dir`` (a
    directory descriptor, or a path the writer opens once as one): the sequence's enforce, plan
    and write steps at a world of one.

    A deny raises the refusal it stands for, a loader the decision does not permit is refused, and
    files that need a framework load are loaded in the contained worker under a permit and the
    profile the policy decided on (:func:`~ckptgate.enforce.gate.enforce`).  When ``tree`` holds
    its files, only the placed bytes are read, and the leases must still hold after the write;
    otherwise every source is re-hashed in the writer's single pass and must match the manifest.
    Dtypes are preserved unless ``dtype`` names one to cast every floating-point tensor to.
    ``worker``: the contained worker takes the adapter's whole ``worker_files`` set, static reader or
    not (a runtime qualification, about the worker's torch).
    """
    check_cast(dtype)
    enforced = enforce(
        tree,
        evaluation.inspection,
        decision=evaluation.decision,
        fixture_digest=evaluation.digest,
        framework_files=framework_files(evaluation.inspection, worker=worker),
        worker=WorkerOptions(profile=evaluation.containment),
    )
    plan = plan_output(
        evaluation.inspection,
        evaluation.decision,
        max_shard_bytes=max_shard_bytes,
        loaded=enforced.loaded,
        hf=hf,
        dtype=dtype,
    )
    if on_plan:
        on_plan(plan.total_size)
    expected = None if tree.held else evaluation.digest.file_hashes()
    outputs = write_all(tree, plan, out_dir, expected=expected, chunk_size=chunk_size, on_bytes=on_bytes, hf=hf)
    return Consolidated(outputs=outputs, plan_report=dict(plan.report))  # adapters build it from plain JSON


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
    workers: int | None = None,
) -> IntakeResult:
    """Take ``src`` in through the gate and publish HF sharded safetensors at ``dst`` (every
    floating-point tensor cast to ``dtype`` if one is named; dtypes are otherwise preserved).
    With ``receipt_signer`` (a :class:`ckptgate.verify.dsse.Signer`) the receipt is also signed
    as a DSSE envelope published beside it.  ``on_hash_plan``/``on_hash_bytes`` report the digest's
    progress (total, then byte counts); ``on_plan``/``on_bytes`` the consolidation's.  ``select``
    (``--select PREFIX``) names the subtree of a training-state tree to write; by default the
    policy picks the model subtree of a layout its data describes.  ``hf_config`` (``--hf-config``)
    maps a Megatron checkpoint to the Hugging Face model that config declares
    (:mod:`ckptgate.consolidate.hf`) and publishes the config's files beside it.  ``workers``
    (``--workers``) is the number of threads that hash and write (default: the cores this process
    may run on); the published bytes are the same for every value."""
    if workers is not None and workers < 1:
        raise UsageError(
            "usage.workers",
            f"--workers must be at least 1, not {workers}",
            advice="Give --workers a positive number of threads, or leave it out to use every core.",
        )
    options = options or EngineOptions()
    if hf_config is not None and select is not None:
        raise UsageError(
            "usage.hf_config.select",
            "--select does not combine with --hf-config",
            advice=f"Leave --select {select} out: a mapped intake (--hf-config {hf_config}) takes the whole model.",
        )
    hf = read_hf_config(hf_config) if hf_config is not None else None  # read once, before any work
    if select is not None:
        Request(action="intake", now=now_utc(), select=select)  # a bad prefix is a usage error before any work
    check_cast(dtype)  # before the digest, not after it
    check_destination(dst, source=src)  # the early answer, by path, before any work
    with contextlib.ExitStack() as stack:
        engine = EarlyEngine(
            options, stack, signatures=signatures, key=key, certificate_chain=certificate_chain, start=False
        )
        engine.check()  # the trust data and the verification material, before SRC is opened
        result = grouped_intake(
            LocalGroup(),
            stack,
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
            backend=None,  # one process's receipt records no topology
            chunk_size=chunk_size,
            now=now,
            dtype=dtype,
            select=select,
            hf=hf,
            progress=Progress(hash_plan=on_hash_plan, hash_bytes=on_hash_bytes, plan=on_plan, written=on_bytes),
            workers=workers,
        )
    assert result is not None  # a world of one is rank 0
    return result
