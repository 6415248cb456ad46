"""Inspection facts follow the documented JSON Schema, for every real fixture and a malicious tree."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import jsonschema
import pytest

from ckptgate.inspect import inspect_tree
from ckptgate.inspect.schema import validate_facts

from ckpt_inspect_helpers import write

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_fixture_facts_follow_the_schema(name: str) -> None:
    facts = inspect_tree(FIXTURES / name / "checkpoint").to_facts()
    validate_facts(json.loads(json.dumps(facts)))


def test_malicious_facts_follow_the_schema_and_schema_is_strict(tmp_path: Path) -> None:
    write(tmp_path, "x.bin", pickle.dumps(print))
    facts = json.loads(json.dumps(inspect_tree(tmp_path).to_facts()))
    validate_facts(facts)
    assert facts["clean"] is False
    facts["clean"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        validate_facts(facts)
