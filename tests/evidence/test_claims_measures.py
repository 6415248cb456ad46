"""The claims lint's three measures (docs/claims.md): the labelled corpus (in test_claims_model), the
held-out split (``data/claims_heldout.jsonl``, committed before the closed-world rules and never tuned
on) and the template-generated set (``claims_templates``); each is computed here, never hard-coded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from claims_templates import sentences as template_sentences
from test_claims_model import DATA, _judge


def _measure(items: list[dict[str, Any]]) -> tuple[float, float, list[str], list[str]]:
    rows = json.loads((DATA / "claims_matrix.json").read_text())["rows"]
    got = _judge([c["text"] for c in items], rows)
    tp = sum(1 for i, c in enumerate(items) if c["expect"] and got.get(i + 1))
    fp = [c["text"] for i, c in enumerate(items) if not c["expect"] and got.get(i + 1)]
    fn = [c["text"] for i, c in enumerate(items) if c["expect"] and not got.get(i + 1)]
    over = sum(1 for c in items if c["expect"])
    return (tp / (tp + len(fp)) if tp + len(fp) else 1.0), tp / over, fp, fn


def test_held_out_split_meets_its_targets() -> None:
    items = [json.loads(x) for x in (DATA / "claims_heldout.jsonl").read_text().splitlines() if x.strip()]
    assert len(items) >= 40 and sum(1 for c in items if c["expect"]) >= 20
    precision, recall, fp, fn = _measure(items)
    print(f"held-out: {len(items)} sentences; precision {precision:.3f}, recall {recall:.3f}")
    assert precision == 1.0, fp
    assert recall >= 0.95, fn


def test_template_set_meets_its_targets() -> None:
    items = template_sentences()
    assert len(items) >= 1000
    assert len({c["text"] for c in items}) == len(items)
    precision, recall, fp, fn = _measure(items)
    print(f"templates: {len(items)} sentences; precision {precision:.3f}, recall {recall:.3f}")
    assert precision >= 0.99, fp[:20]
    assert recall >= 0.98, fn[:20]


def test_templates_label_every_class_of_the_issue() -> None:
    codes = {c["expect"] for c in template_sentences()}
    assert codes == {None, "claims_support_not_in_matrix", "claims_containment_as_proof", "claims_unlisted_capability"}


def test_data_files_are_where_the_docs_say() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "claims.md").read_text()
    assert "claims_heldout.jsonl" in doc and "claims_templates.py" in doc
