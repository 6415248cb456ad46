"""Verify and decide: the evidence offered for one measured checkpoint, and the policy's answer.

:func:`judge` is the verify and decide steps of the one sequence (:mod:`ckptgate.grouped`): rank 0
runs it once, on the inspection and the fixture digest every rank formed (:mod:`ckptgate.measure`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ckptgate.consolidate.hf.plan import mapping_facts
from ckptgate.consolidate.hf.source import HfConfig
from ckptgate.decide import PolicyEngine, PolicyInputBuilder, Precheck, Request, decide, now_utc
from ckptgate.decide.inputs import DecisionInput
from ckptgate.digest import FixtureDigest
from ckptgate.enforce.containment import ContainmentProfile, preflight
from ckptgate.enforce.gate import refusal
from ckptgate.errors import UsageError, VerificationError
from ckptgate.inspect import Inspection
from ckptgate.outcome import Evaluation
from ckptgate.userfiles import read_regular_file
from ckptgate.verify import TrustData, VerifiedAttestation, verify_attestation
from ckptgate.verify.dsse import MAX_ENVELOPE_BYTES
from ckptgate.verify.oms import CertificateChain, OfferedKey, check_signature_flags, verify_oms_bundle

__all__ = ["PURE_DATA_LOADERS", "judge", "needs_profile", "read_attestation", "refuse_if", "run_preflight"]

PURE_DATA_LOADERS = frozenset({"safetensors", "json"})


def read_attestation(path: Path) -> bytes:
    try:
        raw = read_regular_file(path, limit=MAX_ENVELOPE_BYTES)  # one byte more, so verification sees it is too large
    except OSError as e:
        raise UsageError(
            "usage.attestation_unreadable",
            f"cannot read attestation {path}: {e.strerror}",
            advice=f"Check that {path} is a regular file this user can read, or drop that --attestation/--signature.",
        ) from None
    return raw


def refuse_if(found: Precheck | None) -> None:
    """Raise the refusal of a precheck that refuses (the structure is refused before the digest)."""
    if found is not None and found.refuse:
        raise refusal(
            found.deny_reasons, found.decision_id, found.policy_revision, found.refusal or "policy", before_digest=True
        )


def needs_profile(inspection: Inspection) -> bool:
    """Only loads beyond pure data can need containment; the policy decides which controls."""
    return not set(inspection.loaders) <= PURE_DATA_LOADERS


def run_preflight() -> ContainmentProfile:
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
    """Verify ``attestations`` against what was measured and decide; :func:`ckptgate.measure.measure` measures first.

    ``signatures`` are OpenSSF Model Signing bundles, verified under ``offered_key`` (``--key``) or
    against ``certificate_chain`` (``--certificate-chain``), as each bundle's method says, and
    bound file by file to the measured manifest (:mod:`ckptgate.verify.oms`).  An in-toto statement in
    ``attestations`` whose subjects list the checkpoint's files (SLSA provenance, say) binds to the same
    manifest (:func:`ckptgate.verify.binding.bind_manifest`); one in a Sigstore bundle signed under an
    X.509 certificate with no log entry is verified against ``certificate_chain`` too
    (:mod:`ckptgate.verify.x509bundle`).
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
    bound = {"measured_digest": digest.digest, "now": now, "manifest": digest.file_hashes()}

    def take(paths: Sequence[Path], verify: Callable[..., VerifiedAttestation], **kw: Any) -> None:
        """Verify each file of ``paths`` with ``verify``: a verified attestation or a rejection."""
        for path in paths:
            raw = read_attestation(path)
            try:
                verified = verify(raw, source=str(path), **bound, **kw)
            except VerificationError as e:
                builder.rejected_attestation(str(path), e)
            else:
                builder.attestation(verified)

    take(
        attestations,
        verify_attestation,
        trust=trust,
        sigstore_trust_root=sigstore_trust_root,
        certificate_chain=certificate_chain,
    )
    if offered_key is not None:
        builder.offered_key(offered_key)
    if offered_key is not None or certificate_chain is not None or sigstore_trust_root is not None:
        take(
            signatures,
            verify_oms_bundle,
            key=offered_key,
            certificate_chain=certificate_chain,
            sigstore_trust_root=sigstore_trust_root,
            trust=trust,
        )
    if containment is None and needs_profile(inspection):
        containment = run_preflight()
    builder.containment(containment)
    if hf is not None:
        builder.hf_mapping(mapping_facts(inspection.layout if isinstance(inspection.layout, dict) else {}, hf))
    policy_input = builder.build()
    decision = decide(engine, policy_input)
    # What the caller offered beside the engine's inputs decides too: named in the decision (and
    # so the receipt), as every other input, by path and the sha256 of the bytes that were used.
    offered: list[DecisionInput] = []
    if offered_key is not None:
        offered.append(
            DecisionInput(
                role="verification_key", path=offered_key.source, origin="explicit", sha256=offered_key.file_sha256
            )
        )
    if certificate_chain is not None:
        offered += [
            DecisionInput(role="certificate_chain", path=path, origin="explicit", sha256=sha)
            for path, sha in zip(certificate_chain.sources, certificate_chain.digests, strict=True)
        ]
    if hf is not None:
        offered.append(DecisionInput(role="hf_config", path=hf.source, origin="explicit", sha256="sha256:" + hf.digest))
    if offered:
        decision = dataclasses.replace(decision, inputs=(*decision.inputs, *offered))
    return Evaluation(
        policy_input=policy_input, decision=decision, inspection=inspection, digest=digest, containment=containment
    )
