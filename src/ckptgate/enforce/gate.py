"""The enforce step: the one gate between a decision and anything that loads or publishes.

:func:`enforce` takes the decision and the files that need a framework load, and checks each
thing once, here: that the decision is *allow* (a deny raises the refusal it stands for), that
it was decided for the fixture digest it is given (a decision for other bytes, or for none,
permits nothing), that it permits every loader the inspection says the checkpoint needs, and,
when some files need a framework load, it mints the one :class:`~ckptgate.enforce.permit.Permit`,
runs the containment preflight (unless the decision's profile is given) and runs the contained
worker.  It returns an :class:`Enforcement`: what consolidation may build its plan from, and what
the receipt records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ckptgate.decide.decision import Decision, Reason
from ckptgate.enforce import permit as permits
from ckptgate.enforce.advice import REASON_ADVICE
from ckptgate.enforce.load import LoadedTrees, WorkerOptions, load_trees
from ckptgate.errors import Error, InputRejected, PolicyDenied, VerificationError

if TYPE_CHECKING:
    from ckptgate.digest import FixtureDigest
    from ckptgate.inspect import Inspection, SafeTree

#: Framework loaders that may run in the worker, in order of preference.
WORKER_LOADERS = ("deepspeed", "torch_load")


@dataclass(frozen=True, slots=True, kw_only=True)
class Enforcement:
    """What the enforce step allowed and ran for one allow decision."""

    #: The permit for the framework load; ``None`` when no file needed one.
    permit: permits.Permit | None = None
    #: What the contained worker loaded; ``None`` when no worker ran.
    loaded: LoadedTrees | None = None
    #: The controls that were active inside the worker (empty when no worker ran).
    controls: Mapping[str, bool] = field(default_factory=dict)


def enforce(
    tree: SafeTree,
    inspection: Inspection,
    *,
    decision: Decision,
    fixture_digest: FixtureDigest,
    framework_files: Sequence[str] = (),
    worker: WorkerOptions | None = None,
) -> Enforcement:
    """Gate ``decision``; when ``framework_files`` is not empty, load them in the contained worker.

    :param fixture_digest: the measured :class:`~ckptgate.digest.FixtureDigest`; a framework load
        checks each file against its manifest.
    :param framework_files: the files consolidation cannot plan without a framework load
        (:func:`ckptgate.consolidate.framework_files`).
    :param worker: timeout, limits and containment profile for the framework load.
    :raises PolicyDenied: a deny decision (or :class:`InputRejected`/:class:`VerificationError`, as
        its refusal class says: :func:`refuse`), a decision made for another fixture digest or for
        none (``enforce.decision_digest_mismatch``), a loader the decision does not permit, or no
        framework loader the worker can run.
    :raises RuntimeFailure: the contained worker failed.
    """
    refuse(decision)
    if decision.fixture_digest != fixture_digest.digest:
        decided = decision.fixture_digest.prefixed() if decision.fixture_digest is not None else None
        raise PolicyDenied(
            "enforce.decision_digest_mismatch",
            f"the decision {decision.decision_id or '-'} was made for fixture digest {decided or 'none'}, "
            f"not for these bytes ({fixture_digest.digest})",
            evidence={
                "decision_id": decision.decision_id,
                "decided": decided,
                "actual": fixture_digest.digest.prefixed(),
            },
            advice=f"Nothing was loaded or published. Decide on {fixture_digest.digest} itself (`ckptgate intake` "
            "decides on the bytes it hashed) and enforce that decision; a decision never carries over to other bytes.",
        )
    unpermitted = sorted(set(inspection.loaders) - set(decision.permitted_loaders))
    if unpermitted:
        raise PolicyDenied(
            "enforce.loader_not_permitted",
            f"the decision does not permit the loaders this checkpoint needs: {', '.join(unpermitted)}",
            evidence={"needed": list(inspection.loaders), "permitted": list(decision.permitted_loaders)},
        )
    if not framework_files:
        return Enforcement()
    loader = next((name for name in WORKER_LOADERS if name in decision.permitted_loaders), None)
    if loader is None:
        raise PolicyDenied(
            "enforce.permit.loader_not_permitted",
            "the decision permits no framework loader for this checkpoint",
            evidence={"permitted_loaders": list(decision.permitted_loaders)},
        )
    permit = permits.issue_permit(decision, fixture_digest=fixture_digest.digest, loader=loader)
    loaded = load_trees(
        tree, inspection, framework_files, permit=permit, digest=fixture_digest, options=worker or WorkerOptions()
    )
    return Enforcement(permit=permit, loaded=loaded, controls=dict(loaded.controls))


def refuse(decision: Decision) -> None:
    """Raise the error that a deny decision stands for: the policy's refusal class sets it (4 for
    the checkpoint's own content, 5 when only failed or untrusted signatures explain the deny,
    else 3)."""
    if not decision.allow:
        raise refusal(
            decision.deny_reasons,
            decision.decision_id,
            decision.policy_revision,
            decision.refusal or "policy",
            remote=decision.remote,
        )


def refusal(
    deny_reasons: Sequence[Reason],
    decision_id: str,
    policy_revision: str,
    refusal_class: str,
    *,
    before_digest: bool = False,
    remote: bool = False,
) -> Error:
    """The error for a refusal of class ``refusal_class`` (``input``, ``verification`` or ``policy``),
    from a decision or, with ``before_digest``, from the policy's precheck."""
    ordered = sorted(deny_reasons, key=lambda r: r.code not in _FIRST.get(refusal_class, ()))  # what decided it first
    reasons = [r.to_json() for r in ordered]
    summary = "; ".join(r.message for r in ordered) or "deny"
    if before_digest:
        summary += " (refused before the checkpoint was hashed)"
    evidence = {
        "decision_id": decision_id,
        "policy_revision": policy_revision,
        "before_digest": before_digest,
        "refusal": refusal_class,
    }
    first = ordered[0].code if ordered else "deny"
    advice = REASON_ADVICE.get(first)
    if refusal_class == "input":
        return InputRejected(
            "input.refused_by_policy",
            f"the checkpoint was refused: {summary}",
            reasons=reasons,
            evidence=evidence,
            advice=f"Nothing in it was loaded or run. {advice}" if advice else None,
        )
    if refusal_class == "verification":
        return VerificationError(
            f"verify.{first}",
            f"no attestation verified for this checkpoint: {summary}",
            reasons=reasons,
            evidence=evidence,
            advice=_VERIFY_ADVICE_REMOTE if remote else _VERIFY_ADVICE,
        )
    return PolicyDenied(
        f"policy.{first}" if deny_reasons else "policy.deny",
        f"the policy denied the intake: {summary}",
        reasons=reasons,
        evidence=evidence,
        advice=f"{advice} `ckptgate explain` with the same arguments shows the evidence behind each reason."
        if advice
        else None,
    )


# Within a refusal, the reasons of its own class come first (the code names the first one).
_FIRST = {
    "input": ("inspection_not_clean", "pickle_outside_allowlist", "pickle_global_not_allowlisted"),
    "verification": ("attestation_rejected", "attestation_untrusted_signer", "attestation_digest_mismatch"),
    # the producer-release gate: the statement was trusted, the release or topology is what is missing
    "policy": ("producer_release_unqualified", "topology_unqualified", "producer_release_missing"),
}
_VERIFY_ADVICE = (
    "Do not trust this evidence as it stands. An untrusted signer is trusted only through the trust "
    "data: pass a trust file naming its key or identity with --trust FILE (`ckptgate attest keygen "
    "--trust-out FILE` writes one for a new key). A failed signature or another digest means the "
    "attestation was not made for exactly these bytes."
)
# With --opa-url the server's bundle holds the trust data, and --trust is refused.
_VERIFY_ADVICE_REMOTE = (
    "Do not trust this evidence as it stands. The OPA server named by --opa-url decided with the trust data "
    "of its own bundle (--trust cannot widen it): ask whoever runs that server to add the signer's key or "
    "identity to the bundle's ckptgate/config/trust/data.json, or drop --opa-url and pass --trust FILE to "
    "decide locally. A failed signature or another digest means the attestation was not made for exactly "
    "these bytes."
)


__all__ = ["WORKER_LOADERS", "Enforcement", "LoadedTrees", "WorkerOptions", "enforce", "refusal", "refuse"]
