"""docs/attestations.md: the complete example of each predicate (marked ``<!-- example: NAME -->``) satisfies
its JSON Schema, and the training example is what ``TrainingFacts`` reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ckptgate.verify.statement import TRAINING_SCHEMA, check_statement, schema_errors, statement_schema
from ckptgate.verify.training import TrainingFacts

DOC = Path(__file__).resolve().parents[2] / "docs" / "attestations.md"


def examples() -> dict[str, dict]:
    text = DOC.read_text(encoding="utf-8")
    found = re.finditer(r"<!-- example: (\w+) -->\n```json\n(.*?)```", text, re.S)
    return {m.group(1): json.loads(m.group(2)) for m in found}


def test_both_predicates_have_an_example() -> None:
    assert set(examples()) == {"qualification", "training"}


@pytest.mark.parametrize("name", ["qualification", "training"])
def test_each_example_satisfies_its_schema(name: str) -> None:
    doc = examples()[name]
    assert statement_schema(doc) is not None
    assert schema_errors(doc) == []
    check_statement(doc)


def test_the_training_example_is_training_provenance() -> None:
    doc = examples()["training"]
    assert statement_schema(doc) == TRAINING_SCHEMA
    facts = TrainingFacts.from_statement(doc)
    assert facts.code is not None and len(facts.code.commit) == 40
    assert {p.name for p in facts.producers} == {"deepspeed", "torch"}
    broken = json.loads(json.dumps(doc))
    del broken["predicate"]["runDetails"]["builder"]
    assert [e["path"] for e in schema_errors(broken)] == ["/predicate/runDetails"]
