"""Strict decision parsing: anything but the exact shape is deny (fail closed)."""

from __future__ import annotations

import pytest

from ckptgate.decide.decision import parse_decision
from ckptgate.decide.engine import RawDecision

GOOD_ALLOW = {"allow": True, "plane": "pure_data", "permitted_loaders": ["safetensors", "json"],
              "required_controls": [], "reasons": [{"code": "attestation_trusted", "message": "ok", "evidence": {}}]}
GOOD_DENY = {"allow": False, "plane": None, "permitted_loaders": [], "required_controls": [],
             "reasons": [{"code": "attestation_missing", "message": "no attestation", "evidence": {"n": 0}}]}


def raw(result):
    return RawDecision(result=result, decision_id="d-1", policy_revision="sha256:r", engine="test")


def test_allow_is_parsed_with_provenance():
    d = parse_decision(raw(GOOD_ALLOW))
    assert d.allow and d.plane == "pure_data"
    assert d.permitted_loaders == ("safetensors", "json")
    assert d.reasons[0].severity == "info"
    assert (d.decision_id, d.policy_revision) == ("d-1", "sha256:r")


def test_deny_keeps_its_reasons():
    d = parse_decision(raw(GOOD_DENY))
    assert not d.allow
    assert [r.code for r in d.deny_reasons] == ["attestation_missing"]
    assert d.deny_reasons[0].evidence == {"n": 0}


@pytest.mark.parametrize("mutate, why", [
    (lambda d: None, "expected an object"),
    (lambda d: {**d, "extra": 1}, "unexpected keys"),
    (lambda d: {k: v for k, v in d.items() if k != "reasons"}, "missing keys"),
    (lambda d: {**d, "allow": "true"}, "not a boolean"),
    (lambda d: {**d, "plane": "root"}, "unknown plane"),
    (lambda d: {**d, "plane": None}, "without a plane"),
    (lambda d: {**d, "permitted_loaders": "safetensors"}, "not a list of names"),
    (lambda d: {**d, "permitted_loaders": []}, "permits no loader"),
    (lambda d: {**d, "permitted_loaders": ["json", "json"]}, "repeats"),
    (lambda d: {**d, "required_controls": [1]}, "not a list of names"),
    (lambda d: {**d, "reasons": {}}, "not a list"),
    (lambda d: {**d, "reasons": ["bare string"]}, "not {code, message"),
    (lambda d: {**d, "reasons": [{"code": "x", "message": "m", "evidence": []}]}, "non-object evidence"),
    (lambda d: {**d, "reasons": [{"code": "x", "message": "m", "severity": "deny"}]}, "deny reason is present"),
    (lambda d: {**d, "reasons": [{"code": "x", "message": "m", "severity": "fatal"}]}, "unknown severity"),
])
def test_malformed_allow_becomes_deny(mutate, why):
    d = parse_decision(raw(mutate(dict(GOOD_ALLOW))))
    assert not d.allow
    assert d.plane is None and d.permitted_loaders == ()
    assert [r.code for r in d.reasons] == ["decision_malformed"]
    assert why in d.reasons[0].message


def test_deny_without_a_reason_is_malformed():
    d = parse_decision(raw({**GOOD_DENY, "reasons": []}))
    assert [r.code for r in d.reasons] == ["decision_malformed"]
