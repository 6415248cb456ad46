"""What one intake found, decided and wrote, and the receipt it publishes: the same at any world size."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate import __version__
from ckptgate.consolidate.writer import WrittenFile
from ckptgate.decide import Decision, PolicyInput, now_utc
from ckptgate.decide.bundle import opa_version
from ckptgate.decide.options import EngineOptions
from ckptgate.digest import FixtureDigest
from ckptgate.enforce.containment import ContainmentProfile
from ckptgate.errors import RuntimeFailure
from ckptgate.inspect import Inspection, SafeTree
from ckptgate.publish import Stage, publish
from ckptgate.userfiles import io_advice
from ckptgate.verify.dsse import Signer

__all__ = [
    "Consolidated",
    "Evaluation",
    "IntakeResult",
    "io_failure",
    "local_opa_version",
    "published",
    "receipt_for",
    "still_held",
]


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
    """What the consolidation wrote, and what the plan's adapter reported (JSON)."""

    outputs: tuple[WrittenFile, ...]
    plan_report: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class IntakeResult:
    evaluation: Evaluation
    destination: Path
    outputs: tuple[WrittenFile, ...]
    receipt: dict[str, Any]


def io_failure(e: OSError, dst: Path) -> RuntimeFailure:
    """An I/O failure while writing the output (ENOSPC, EFBIG, EIO...): not a bug; nothing was published."""
    return RuntimeFailure(
        "runtime.io",
        f"writing the output failed: {e.strerror or e}",
        evidence={"errno": e.errno, "destination": str(dst)},
        advice=io_advice(e, dst),  # a full disk is not the worker's resource limit
    )


def still_held(tree: SafeTree) -> None:
    """A held tree whose lease broke was opened for writing during the intake: fail closed."""
    if tree.held and not tree.intact():
        raise RuntimeFailure(
            "runtime.copy.source_changed",
            "a checkpoint file was opened for writing while it was being taken in; nothing was published",
            evidence={"source": str(tree.root)},
            advice=f"Take {tree.root} in again with `ckptgate intake`, from a copy that nothing else writes to.",
        )


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
    remote = evaluation.decision.remote or options.opa_url is not None
    receipt = receipt_for(src, evaluation, done, opa_version=None if remote else local_opa_version())
    if topology is not None:
        receipt["topology"] = topology
    try:
        publish(stage, receipt, signer=signer)
    except OSError as e:
        raise io_failure(e, dst) from None
    return IntakeResult(evaluation=evaluation, destination=dst, outputs=done.outputs, receipt=receipt)


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
            **d.to_json(
                "allow", "plane", "permitted_loaders", "required_controls", "reasons", "engine", "fixture_digest"
            ),
        },
        "policy_revision": d.policy_revision,
        # which engine decided: a remote OPA by its URL and reported revision, never mistaken for ours
        "engine": d.engine_json(opa_version),
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
