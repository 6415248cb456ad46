"""Decide: build the OPA input document, evaluate it, and parse the answer strictly.

Rego decides what the facts mean; this package only transports them and refuses any answer
that is not exactly a decision (fail closed).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ckptgate.decide import audit
from ckptgate.decide.decision import Decision, Precheck, Reason, deny, parse_decision, parse_precheck
from ckptgate.decide.engine import EmbeddedOpa, PolicyEngine, RawDecision, RemoteOpa, open_engine
from ckptgate.decide.input import HasFacts, PolicyInput, PolicyInputBuilder, Request, now_utc
from ckptgate.digestvalue import Digest
from ckptgate.errors import EngineUnavailable

INTAKE_ENTRYPOINT = "ckptgate/intake/decision"
PRECHECK_ENTRYPOINT = "ckptgate/intake/precheck"

__all__ = [
    "INTAKE_ENTRYPOINT",
    "PRECHECK_ENTRYPOINT",
    "Decision",
    "EmbeddedOpa",
    "PolicyEngine",
    "PolicyInput",
    "PolicyInputBuilder",
    "Precheck",
    "RawDecision",
    "Reason",
    "RemoteOpa",
    "Request",
    "decide",
    "deny",
    "now_utc",
    "open_engine",
    "parse_decision",
    "precheck",
]


def decide(
    engine: PolicyEngine,
    policy_input: PolicyInput,
    *,
    entrypoint: str = INTAKE_ENTRYPOINT,
    audit_log: Path | None = None,
) -> Decision:
    """Evaluate ``policy_input``; a malformed answer is a deny.  Engine failures raise
    :class:`~ckptgate.errors.EngineUnavailable` (the caller must treat that as deny).

    The decision names the fixture digest of ``policy_input`` (the policy cannot set it): enforce
    permits nothing for other bytes."""
    doc = policy_input.to_json()
    raw = engine.evaluate(entrypoint, doc)
    decision = dataclasses.replace(parse_decision(raw), fixture_digest=Digest.parse(doc["fixture"]["digest"]))
    audit.append(
        {
            "entrypoint": entrypoint,
            "fixture_digest": doc["fixture"]["digest"],
            "action": doc["request"]["action"],
            "decision": decision.to_json(),
        },
        audit_log,
    )
    return decision


def precheck(
    engine: PolicyEngine, inspection: HasFacts, request: Request, *, audit_log: Path | None = None
) -> Precheck | None:
    """Ask the policy, from the inspection and the request alone, whether the checkpoint is refused
    already, so nothing more needs measuring.  A refusal is audited like a decision; a malformed
    answer, or policies without a precheck, give None, which refuses nothing early.  Other engine
    failures raise, as for :func:`decide`."""
    doc = {"inspection": inspection.to_facts(), "request": request.to_json()}
    try:
        raw = engine.evaluate(PRECHECK_ENTRYPOINT, doc)
    except EngineUnavailable as e:
        if e.code == "engine.undefined":  # policies from before the precheck: the decision alone decides
            return None
        raise
    found = parse_precheck(raw)
    if found is not None and found.refuse:
        audit.append(
            {
                "entrypoint": PRECHECK_ENTRYPOINT,
                "fixture_digest": None,
                "action": doc["request"]["action"],
                "decision": found.to_json(),
            },
            audit_log,
        )
    return found
