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


@pytest.mark.parametrize("predicate_type", [[QUALIFICATION_PREDICATE_TYPE], {"a": 1}, 7, None])
def test_a_predicate_type_that_is_not_a_string_is_a_shape_error(predicate_type) -> None:
    """Found by fuzzing signed statements: a list here was a TypeError (a traceback), not a typed error."""
    s = json.loads(json.dumps(STATEMENT))
    s["predicateType"] = predicate_type
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


# --------------------------------------------------------------------------------------------- fixture provenance
def _provenance(**predicate_changes) -> dict:
    from ckptgate.verify.statement import PROVENANCE_PREDICATE_TYPE

    s = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "deepspeed_zero2", "digest": {"sha256": "ab" * 32}}],
        "predicateType": PROVENANCE_PREDICATE_TYPE,
        "predicate": {
            "basis": "repository-review",
            "fixture": {"digest": "sha256:" + "ab" * 32, "digest_algorithm": "sha256",
                        "location": "tests/fixtures/data/deepspeed_zero2/checkpoint",
                        "manifest": "tests/fixtures/data/deepspeed_zero2/meta.json", "git_tree": "12" * 20},
            "producer": {"name": "deepspeed", "version": "0.19.8", "call": "deepspeed.DeepSpeedEngine.save_checkpoint"},
            "producers": {"deepspeed": "0.19.8", "torch": "2.13.0", "megatron-core": "0.16.1"},
            "generator": {"script": "tests/fixtures/generate.py",
                          "command": "python tests/fixtures/generate.py --only deepspeed_zero2"},
            "topology": {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "etp": 1, "world_size": 2, "zero_stage": 2},
            "candidate_commit": "0123456789abcdef0123456789abcdef01234567",
            "validity": {"issued_at": "2026-11-01T00:00:00Z", "expires_at": "2027-02-01T00:00:00Z"},
        },
    }
    s["predicate"].update(predicate_changes)
    return s


def test_provenance_schema_is_valid_and_registered() -> None:
    import jsonschema

    from ckptgate.verify.statement import PREDICATE_SCHEMAS, PROVENANCE_PREDICATE_TYPE

    schema = json.loads(schema_text(PROVENANCE_PREDICATE_TYPE))
    jsonschema.validators.validator_for(schema).check_schema(schema)
    assert schema["properties"]["predicateType"]["const"] == PROVENANCE_PREDICATE_TYPE
    assert PREDICATE_SCHEMAS[PROVENANCE_PREDICATE_TYPE] == "fixture-provenance-v1.schema.json"
    assert check_statement(_provenance()) == _provenance()


@pytest.mark.parametrize("change", [
    {"basis": "regenerated"},
    {"candidate_commit": "abc"},
    {"producer": {"name": "deepspeed", "version": "0.19.8"}},
    {"producers": {}},
    {"producers": {"deepspeed": ""}},
    {"generator": {"script": "tests/fixtures/generate.py"}},
    {"generator": {"script": "../outside.py", "command": "x"}},
    {"fixture": {"digest": "sha256:" + "ab" * 32, "digest_algorithm": "sha256", "location": "/abs/checkpoint",
                 "manifest": "m.json", "git_tree": "12" * 20}},
    {"fixture": {"digest": "sha256:" + "ab" * 32, "digest_algorithm": "sha256", "location": "a/../b",
                 "manifest": "m.json", "git_tree": "12" * 20}},
    {"fixture": {"digest": "sha256:" + "ab" * 32, "digest_algorithm": "sha256", "location": "a",
                 "manifest": "m.json", "git_tree": "123"}},
    {"fixture": {"digest": "sha256:" + "ab" * 32, "digest_algorithm": "sha256", "location": "a"}},
    {"topology": {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1}},
    {"validity": {"issued_at": "2026-11-01", "expires_at": "2027-02-01T00:00:00Z"}},
    {"adapter": {"name": "deepspeed-zero", "version": "1"}},
])
def test_provenance_predicate_violations(change) -> None:
    assert _code(_provenance(**change)) == "verify.statement.predicate_invalid"


def test_provenance_subject_binding() -> None:
    s = _provenance()
    s["subject"].append({"name": "other", "digest": {"sha256": "cd" * 32}})
    assert _code(s) == "verify.statement.predicate_invalid"  # exactly one subject: the fixture
    s = _provenance()
    s["subject"][0]["digest"]["sha256"] = "cd" * 32
    assert _code(s) == "verify.statement.fixture_inconsistent"


def test_provenance_validity_window_is_enforced() -> None:
    from datetime import datetime, timedelta, timezone

    from ckptgate.verify.statement import check_validity

    s = _provenance()
    v = check_validity(s, datetime(2026, 12, 1, tzinfo=timezone.utc), max_clock_skew=timedelta(minutes=5))
    assert v is not None and v.expires_at == datetime(2027, 2, 1, tzinfo=timezone.utc)
    with pytest.raises(VerificationError) as e:
        check_validity(s, datetime(2027, 3, 1, tzinfo=timezone.utc), max_clock_skew=timedelta(minutes=5))
    assert e.value.code == "verify.statement.expired"


def test_provenance_fast_and_reference_validators_agree() -> None:
    import fastjsonschema

    from ckptgate.verify import statement as st

    cases = [_provenance(), _provenance(basis="x"), _provenance(producers={"a b": "1"}),
             _provenance(generator={"script": "./g.py", "command": "c"}),
             _provenance(topology={"tp": 1.0, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1})]
    name = "fixture-provenance-v1.schema.json"
    ref = [st._validator(name).is_valid(c) for c in cases]
    assert ref == [True, False, False, False, True]
    got = []
    for c in cases:
        try:
            st._fast(name)(c)
            got.append(True)
        except fastjsonschema.JsonSchemaException:
            got.append(False)
    assert got == ref


@pytest.mark.parametrize(("field", "when"), [
    ("issued_at", "0001-01-01T00:00:00+14:00"),  # before year 1 once in UTC: astimezone overflowed (internal.unexpected)
    ("expires_at", "9999-12-31T23:59:59-14:00"),  # after year 9999 once in UTC
    ("issued_at", "1600-01-01T00:00:00Z"),  # before what policy reads as nanoseconds since the epoch
    ("expires_at", "3000-01-01T00:00:00Z"),  # after it
])
def test_validity_outside_the_years_policy_compares_is_a_typed_refusal(field: str, when: str) -> None:
    from datetime import datetime, timedelta, timezone

    from ckptgate.verify.statement import check_validity

    s = statement(validity={"issued_at": "2026-01-01T00:00:00Z", "expires_at": "2027-01-01T00:00:00Z", field: when})
    check_statement(s)  # the schema's pattern admits it: the window check refuses it
    with pytest.raises(VerificationError) as e:
        check_validity(s, datetime(2026, 12, 1, tzinfo=timezone.utc), max_clock_skew=timedelta(minutes=5))
    assert e.value.code == "verify.statement.validity_window"


def test_validity_is_read_in_utc() -> None:
    from datetime import datetime, timedelta, timezone

    from ckptgate.verify.statement import check_validity

    s = statement(validity={"issued_at": "2026-01-01T09:00:00+09:00", "expires_at": "2027-01-01T00:00:00-05:00"})
    v = check_validity(s, datetime(2026, 12, 1, tzinfo=timezone.utc), max_clock_skew=timedelta(minutes=5))
    assert v is not None
    assert v.issued_at == datetime(2026, 1, 1, tzinfo=timezone.utc) and v.issued_at.utcoffset() == timedelta(0)
    assert v.expires_at == datetime(2027, 1, 1, 5, tzinfo=timezone.utc)
