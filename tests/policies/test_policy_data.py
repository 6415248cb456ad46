"""Policy data under policies/ckptgate/config/ against the JSON Schemas in policies/schemas/.

The same check runs in Rego (policies/ckptgate/config/config_test.rego, via json.match_schema);
this one uses the jsonschema library, so a schema that OPA's validator tolerates but the
standard Draft 7 validator rejects is caught too.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
NAMES = ("loaders", "gates", "intake", "trust")


def _load(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", NAMES)
def test_schema_is_a_valid_draft7_schema(name: str) -> None:
    jsonschema.Draft7Validator.check_schema(_load(POLICIES / "schemas" / name / "schema.json"))


@pytest.mark.parametrize("name", NAMES)
def test_policy_data_matches_its_schema(name: str) -> None:
    schema = _load(POLICIES / "schemas" / name / "schema.json")
    data = _load(POLICIES / "ckptgate" / "config" / name / "data.json")
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(data), key=lambda e: list(e.path))
    assert errors == [], [f"{list(e.path)}: {e.message}" for e in errors]


def test_loaders_schema_rejects_an_unknown_risk_class() -> None:
    schema = _load(POLICIES / "schemas" / "loaders" / "schema.json")
    data = _load(POLICIES / "ckptgate" / "config" / "loaders" / "data.json")
    data["loaders"]["torch_load"]["class"] = "pure_data_please"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema, cls=jsonschema.Draft7Validator)


def test_intake_schema_rejects_a_missing_freshness_limit() -> None:
    schema = _load(POLICIES / "schemas" / "intake" / "schema.json")
    data = _load(POLICIES / "ckptgate" / "config" / "intake" / "data.json")
    del data["freshness"]["max_age_seconds"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema, cls=jsonschema.Draft7Validator)


def test_no_exceptable_code_bears_code():
    """A policy-data overlay may except only exceptable_codes; none of them may be a finding that
    names code a loader would run (issue #30)."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[2] / "policies/ckptgate/config/intake/data.json").read_text())
    exceptable = set(data["exceptable_codes"])
    bearing = set(data["code_bearing_findings"]["codes"]) | {"classify.code", "pickle.global_not_allowed",
                                                             "pickle.call_not_allowed", "classify.raw_pickle"}
    assert exceptable and not exceptable & bearing
