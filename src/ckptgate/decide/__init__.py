"""Decide: build the OPA input document, evaluate it, and parse the answer strictly.

Rego decides what the facts mean; this package only transports them and refuses any answer
that is not exactly a decision (fail closed).
"""

from __future__ import annotations

from pathlib import Path

from ckptgate.decide import audit
from ckptgate.decide.decision import Decision, Reason, deny, parse_decision
from ckptgate.decide.engine import EmbeddedOpa, PolicyEngine, RawDecision, RemoteOpa, open_engine
from ckptgate.decide.input import PolicyInput, PolicyInputBuilder, Request, now_utc

INTAKE_ENTRYPOINT = "ckptgate/intake/decision"

__all__ = [
    "INTAKE_ENTRYPOINT", "Decision", "EmbeddedOpa", "PolicyEngine", "PolicyInput", "PolicyInputBuilder",
    "RawDecision", "Reason", "RemoteOpa", "Request", "decide", "deny", "now_utc", "open_engine",
    "parse_decision",
]


def decide(engine: PolicyEngine, policy_input: PolicyInput, *, entrypoint: str = INTAKE_ENTRYPOINT,
           audit_log: Path | None = None) -> Decision:
    """Evaluate ``policy_input``; a malformed answer is a deny.  Engine failures raise
    :class:`~ckptgate.errors.EngineUnavailable` (the caller must treat that as deny)."""
    doc = policy_input.to_json()
    raw = engine.evaluate(entrypoint, doc)
    decision = parse_decision(raw)
    audit.append({
        "entrypoint": entrypoint,
        "fixture_digest": doc["fixture"]["digest"],
        "action": doc["request"]["action"],
        "decision": decision.to_json(),
    }, audit_log)
    return decision
