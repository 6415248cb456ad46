"""Strict decision parsing: anything but the exact shape is deny (fail closed)."""

from __future__ import annotations

import json

import pytest

from ckptgate.decide.decision import parse_decision, parse_precheck
from ckptgate.decide.engine import RawDecision

GOOD_ALLOW = {"allow": True, "plane": "pure_data", "permitted_loaders": ["safetensors", "json"],
              "required_controls": [], "reasons": [{"code": "attestation_trusted", "message": "ok", "evidence": {}}],
              "refusal": None}
GOOD_DENY = {"allow": False, "plane": None, "permitted_loaders": [], "required_controls": [],
             "reasons": [{"code": "attestation_missing", "message": "no attestation", "evidence": {"n": 0}}],
             "refusal": "policy"}


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
    (lambda d: {**d, "refusal": "policy"}, "refuses nothing"),
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


@pytest.mark.parametrize(("refusal", "exit_code"), [("input", 4), ("verification", 5), ("policy", 3)])
def test_a_deny_exits_as_its_refusal_class_says(refusal, exit_code):
    assert parse_decision(raw({**GOOD_DENY, "refusal": refusal})).exit_code == exit_code
    assert parse_decision(raw(GOOD_ALLOW)).exit_code == 0


@pytest.mark.parametrize("refusal", [None, "fatal", 5, ["policy"]])
def test_a_deny_without_a_known_refusal_class_is_malformed_and_a_policy_deny(refusal):
    d = parse_decision(raw({**GOOD_DENY, "refusal": refusal}))
    assert [r.code for r in d.reasons] == ["decision_malformed"]
    assert d.refusal == "policy" and d.exit_code == 3


REFUSE = {"refuse": True, "reasons": [{"code": "inspection_not_clean", "message": "m", "evidence": {},
                                      "severity": "deny"}], "refusal": "input"}


def test_a_precheck_refusal_is_parsed_with_its_reasons():
    p = parse_precheck(raw(REFUSE))
    assert p is not None and p.refuse
    assert [r.code for r in p.deny_reasons] == ["inspection_not_clean"]
    assert (p.decision_id, p.policy_revision) == ("d-1", "sha256:r")
    assert p.refusal == "input"
    assert parse_precheck(raw({"refuse": False, "reasons": [], "refusal": None})).refuse is False


@pytest.mark.parametrize("result", [
    None,
    {"refuse": True},
    {**REFUSE, "allow": True},
    {**REFUSE, "refuse": "yes"},
    {**REFUSE, "reasons": []},  # a refusal must say why
    {**REFUSE, "refuse": False},  # a deny reason that refuses nothing
    {**REFUSE, "reasons": [{"code": "x", "message": "m", "severity": "fatal"}]},
    {**REFUSE, "refusal": None},
    {"refuse": False, "reasons": [], "refusal": "input"},
], ids=["none", "no-reasons-key", "extra-key", "refuse-not-bool", "refusal-without-reason",
        "deny-reason-without-refusal", "unknown-severity", "refusal-without-class", "class-without-refusal"])
def test_a_malformed_precheck_refuses_nothing_early(result):
    """Only the decision can allow; a precheck that is not exactly {refuse, reasons} is set aside."""
    assert parse_precheck(raw(result)) is None


class _Engine:
    def __init__(self, result=None, error=None):
        self.result, self.error, self.calls = result, error, []

    def evaluate(self, entrypoint, doc):
        self.calls.append((entrypoint, doc))
        if self.error is not None:
            raise self.error
        return raw(self.result)


class _Facts:
    def to_facts(self):
        return {"format": "safetensors", "clean": False}


def _request():
    from datetime import UTC, datetime

    from ckptgate.decide import Request

    return Request(action="intake", now=datetime(2026, 11, 30, tzinfo=UTC))


def test_the_precheck_sees_only_the_inspection_and_the_request_and_a_refusal_is_audited(tmp_path, monkeypatch):
    from ckptgate.decide import PRECHECK_ENTRYPOINT, precheck

    log = tmp_path / "audit.jsonl"
    engine = _Engine(REFUSE)
    found = precheck(engine, _Facts(), _request(), audit_log=log)
    assert found is not None and found.refuse
    [(entrypoint, doc)] = engine.calls
    assert entrypoint == PRECHECK_ENTRYPOINT and set(doc) == {"inspection", "request"}
    [line] = log.read_text().splitlines()
    assert json.loads(line)["entrypoint"] == PRECHECK_ENTRYPOINT
    assert json.loads(line)["decision"]["refuse"] is True


def test_policies_without_a_precheck_refuse_nothing_early_but_other_engine_failures_raise(tmp_path):
    from ckptgate.decide import precheck
    from ckptgate.errors import EngineUnavailable

    undefined = EngineUnavailable("engine.undefined", "undefined")
    assert precheck(_Engine(error=undefined), _Facts(), _request(), audit_log=tmp_path / "a") is None
    with pytest.raises(EngineUnavailable) as e:
        precheck(_Engine(error=EngineUnavailable("engine.timeout", "late")), _Facts(), _request(),
                 audit_log=tmp_path / "a")
    assert e.value.code == "engine.timeout"
    assert not (tmp_path / "a").exists()


def test_companions_are_optional_plain_names_and_only_on_an_allow():
    assert parse_decision(raw(GOOD_ALLOW)).companions == ()
    d = parse_decision(raw({**GOOD_ALLOW, "companions": ["config.json", "tokenizer.model"]}))
    assert d.allow and d.companions == ("config.json", "tokenizer.model")
    assert d.to_json()["companions"] == ["config.json", "tokenizer.model"]
    for bad in (["../config.json"], ["sub/config.json"], ["a", "a"], "config.json", [1]):
        d = parse_decision(raw({**GOOD_ALLOW, "companions": bad}))
        assert not d.allow and d.reasons[0].code == "decision_malformed", bad
    denied = parse_decision(raw({**GOOD_DENY, "companions": ["config.json"]}))
    assert not denied.allow and denied.reasons[0].code == "decision_malformed"


def test_to_json_with_fields_is_that_projection_in_that_order():
    d = parse_decision(raw({**GOOD_ALLOW, "companions": ["config.json"]}))
    full = d.to_json()
    part = d.to_json("engine", "allow", "reasons")
    assert list(part) == ["engine", "allow", "reasons"]
    assert part == {k: full[k] for k in ("engine", "allow", "reasons")}
    with pytest.raises(KeyError):
        d.to_json("nope")


def test_selection_is_optional_strict_and_only_on_an_allow():
    sel = {"prefix": "model", "layout": "torchtitan", "source": "policy", "excluded": ["optimizer"]}
    assert parse_decision(raw(GOOD_ALLOW)).selection is None
    assert parse_decision(raw({**GOOD_ALLOW, "selection": None})).selection is None
    assert "selection" not in parse_decision(raw(GOOD_ALLOW)).to_json()
    d = parse_decision(raw({**GOOD_ALLOW, "selection": sel}))
    assert d.allow and d.selection is not None and d.selection.prefix == "model"
    assert d.to_json()["selection"] == sel
    for bad in ({**sel, "prefix": "model."}, {**sel, "prefix": ".model"}, {**sel, "prefix": 1},
                {**sel, "source": "guess"}, {**sel, "excluded": "optimizer"}, {**sel, "extra": 1},
                {k: v for k, v in sel.items() if k != "layout"}, "model"):
        d = parse_decision(raw({**GOOD_ALLOW, "selection": bad}))
        assert not d.allow and d.reasons[0].code == "decision_malformed", bad
    denied = parse_decision(raw({**GOOD_DENY, "selection": sel}))
    assert not denied.allow and denied.reasons[0].code == "decision_malformed"


def _input(digest):
    from ckptgate.decide import PolicyInput

    return PolicyInput(request=_request(), fixture={"digest": digest, "algorithm": "sha256", "file_count": 1,
                                                    "total_bytes": 1},
                       inspection={"format": "safetensors"}, attestations=(), rejected_attestations=(),
                       containment=None)


@pytest.mark.parametrize("answer", [GOOD_ALLOW, GOOD_DENY, {**GOOD_ALLOW, "fixture_digest": "sha256:" + "cd" * 32}])
def test_a_decision_names_the_digest_of_its_input_and_the_policy_cannot_set_it(answer, tmp_path):
    """Found by an attacker: a decision did not say which bytes it was for, so enforce permitted
    checkpoint B under an allow made for checkpoint A.  decide() sets it from the input document;
    a policy answer that names one is not the decision shape (a malformed deny, for the same input)."""
    from ckptgate.decide import decide
    from ckptgate.digest import Digest

    digest = "sha256:" + "ab" * 32
    d = decide(_Engine(answer), _input(digest), audit_log=tmp_path / "a")
    assert d.fixture_digest == Digest.parse(digest) and d.to_json()["fixture_digest"] == digest
    assert d.allow is (answer is GOOD_ALLOW)
    assert (d.reasons[0].code == "decision_malformed") == ("fixture_digest" in answer)
    assert json.loads((tmp_path / "a").read_text())["decision"]["fixture_digest"] == digest


def test_a_decision_crosses_json_with_its_digest():
    """Ranks receive rank 0's decision as JSON: the digest it was made for comes with it, and a
    digest that is not sha256:<64 hex> is a typed error, not a decision for no bytes."""
    import dataclasses

    from ckptgate.decide.decision import decision_from_json
    from ckptgate.digest import Digest
    from ckptgate.errors import VerificationError

    d = dataclasses.replace(parse_decision(raw(GOOD_ALLOW)), fixture_digest=Digest.parse("sha256:" + "ab" * 32))
    back = decision_from_json(json.loads(json.dumps(d.to_json())))
    assert back == d and back.fixture_digest == d.fixture_digest
    assert decision_from_json(parse_decision(raw(GOOD_ALLOW)).to_json()).fixture_digest is None
    with pytest.raises(VerificationError) as e:
        decision_from_json({**d.to_json(), "fixture_digest": "ab" * 32})
    assert e.value.code == "verify.digest.malformed"
