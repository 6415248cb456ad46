"""Companions join a plan only as the decision names them, and only if inspection checked them."""

from __future__ import annotations

import json

import pytest

from ckptgate.consolidate import with_companions
from ckptgate.consolidate.plan import ConsolidationPlan
from ckptgate.decide.decision import Decision
from ckptgate.errors import PolicyDenied
from ckptgate.inspect import inspect_tree


def _allow(companions):
    return Decision(allow=True, plane="pure_data", permitted_loaders=("json", "safetensors"), required_controls=(),
                    reasons=(), decision_id="d", policy_revision="r", engine="test", companions=tuple(companions))


def test_named_companions_become_whole_file_copies(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "notes.json").write_text(json.dumps({"a": 1}))
    insp = inspect_tree(tmp_path)
    plan = with_companions(ConsolidationPlan(shards=()), insp, _allow(["config.json"]))
    assert [(c.src, c.filename, c.size) for c in plan.copies] == [
        ("config.json", "config.json", (tmp_path / "config.json").stat().st_size)]
    assert plan.report["companions"] == ["config.json"]
    assert "config.json" in plan.source_paths  # bound to the digest like every other source
    assert with_companions(ConsolidationPlan(shards=()), insp, _allow([])).copies == ()


@pytest.mark.parametrize("name", ["notes.json", "absent.json"])
def test_a_name_inspection_did_not_check_as_a_companion_is_refused(tmp_path, name):
    """Capability: companion files (only names inspection checked as companions travel)."""
    (tmp_path / "notes.json").write_text(json.dumps({"a": 1}))
    with pytest.raises(PolicyDenied) as e:
        with_companions(ConsolidationPlan(shards=()), inspect_tree(tmp_path), _allow([name]))
    assert e.value.code == "enforce.companion_not_checked"
