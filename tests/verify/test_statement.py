from __future__ import annotations

import json

import pytest
from verify_helpers import STATEMENT, statement

from ckptgate.errors import VerificationError
from ckptgate.verify.statement import QUALIFICATION_PREDICATE_TYPE, check_statement, schema_text


def _code(doc) -> str:
    with pytest.raises(VerificationError) as ei:
        check_statement(doc)
    return ei.value.code


def test_schema_is_valid_and_versioned() -> None:
    import jsonschema

    schema = json.loads(schema_text())
    jsonschema.validators.validator_for(schema).check_schema(schema)
    assert schema["properties"]["predicateType"]["const"] == QUALIFICATION_PREDICATE_TYPE
    assert QUALIFICATION_PREDICATE_TYPE.endswith("/v1")


def test_valid_statement_passes() -> None:
    assert check_statement(json.loads(json.dumps(STATEMENT))) == STATEMENT


@pytest.mark.parametrize("change", [
    {"candidate_commit": "abc"},
    {"candidate_commit": "G" * 40},
    {"producer": {"name": "x"}},
    {"topology": {"tp": 0, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1}},
    {"topology": {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1, "zero_stage": 4}},
    {"result": {"status": "ok", "checks_run": ["a"], "evidence": {"digest": "sha256:" + "0" * 64, "location": "l"}}},
    {"result": {"status": "passed", "checks_run": [], "evidence": {"digest": "sha256:" + "0" * 64, "location": "l"}}},
    {"validity": {"issued_at": "yesterday", "expires_at": "2027-01-01T00:00:00Z"}},
    {"environment": {"python": "3.11"}},
    {"extra": 1},
])
def test_predicate_schema_violations(change) -> None:
    assert _code(statement(**change)) == "verify.statement.predicate_invalid"


def test_subject_and_type_checks() -> None:
    s = json.loads(json.dumps(STATEMENT))
    s["subject"][0]["digest"] = {"sha256": "AB" * 32}
    assert _code(s) == "verify.statement.predicate_invalid"  # our schema wants lower-case hex
    s = json.loads(json.dumps(STATEMENT))
    s["_type"] = "https://in-toto.io/Statement/v0.1"
    assert _code(s) == "verify.statement.type"
    s = json.loads(json.dumps(STATEMENT))
    s["subject"] = [{"name": "x"}]
    assert _code(s) == "verify.statement.shape"


def test_fast_and_reference_validators_agree(monkeypatch) -> None:
    """The fastjsonschema hot path and jsonschema give the same verdicts."""
    from ckptgate.verify import statement as st

    cases = [STATEMENT, statement(candidate_commit="abc"), statement(extra=1),
             statement(topology={"tp": True, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1}),
             statement(topology={"tp": 1.0, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1}),
             statement(result={"status": "passed", "checks_run": ["a", "a"],
                               "evidence": {"digest": "sha256:" + "0" * 64, "location": "l"}})]
    ref = [st._validator("qualification-v1.schema.json").is_valid(c) for c in cases]
    assert ref == [True, False, False, False, True, False]  # 1.0 is an integer in JSON Schema
    fast = st._fast("qualification-v1.schema.json")
    import fastjsonschema

    got = []
    for c in cases:
        try:
            fast(c)
            got.append(True)
        except fastjsonschema.JsonSchemaException:
            got.append(False)
    assert got == ref
