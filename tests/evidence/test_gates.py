"""What the gates data names for a fixture (``ckptgate.evidence.gates``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from ckptgate.evidence import gates
from ckptgate.evidence.fixtures import find_fixture

REPO = Path(__file__).resolve().parents[2]


def test_a_format_the_gates_data_lists_is_taken_from_meta_json() -> None:
    fixture = find_fixture(REPO, "peft_lora")
    assert gates.fixture_format(REPO, fixture) == "peft-lora"
    assert gates.fixture_adapter(REPO, fixture) == "peft"


def _repo(tmp_path: Path) -> Path:
    """A repository whose gates data does not list the fixture's recorded format."""
    gates_file = tmp_path / gates.GATES_DATA
    gates_file.parent.mkdir(parents=True)
    gates_file.write_text(json.dumps({"formats": {"inspected-format": {"adapter": "inspected-adapter"}}}))
    root = tmp_path / "tests" / "fixtures" / "data" / "f"
    (root / "checkpoint").mkdir(parents=True)
    (root / "checkpoint" / "x.bin").write_bytes(b"\0" * 8)
    (root / "expected.safetensors").write_bytes(b"")
    (root / "meta.json").write_text(json.dumps({"format": "recorded-format", "producer": "p.save",
                                                "versions": {"p": "1"}, "topology": {}}))
    return tmp_path


def test_an_inspection_already_made_is_used_and_the_tree_not_read_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repo(tmp_path)
    fixture = find_fixture(repo, "f")

    def no_second_read(*_a: object, **_k: object) -> None:
        raise AssertionError("the fixture was inspected again")

    monkeypatch.setattr(gates, "inspect_open_tree", no_second_read)  # the name gates calls
    assert gates.fixture_format(repo, fixture, SimpleNamespace(format="inspected-format")) == "inspected-format"


def test_without_an_inspection_the_tree_is_inspected(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    fixture = find_fixture(repo, "f")
    assert gates.fixture_format(repo, fixture) == "unknown"  # what inspection calls one opaque file
    assert gates.fixture_adapter(repo, fixture) is None


def test_the_freshness_window_and_gates_come_from_the_layouts_policies_with_the_overlay(tmp_path: Path) -> None:
    from datetime import timedelta

    from ckptgate import policydata
    from ckptgate.evidence.layout import RepoLayout

    overlay = tmp_path / "ckptgate-data.json"
    overlay.write_text(json.dumps({"freshness": {"max_age_seconds": 3600},
                                   "gates": {"dcp": {"versions": {"any": True, "exact": [], "ranges": []}}}}))
    own = RepoLayout.default(REPO)
    assert own.policies == REPO / "policies"
    assert gates.validity(own) == gates.validity(REPO) == timedelta(days=180)
    layout = RepoLayout(root=tmp_path, attestations=tmp_path / "a", matrix=tmp_path / "m", fixtures=tmp_path / "f",
                        policies=REPO / "policies", policy_data=policydata.load(overlay))
    assert gates.validity(layout) == timedelta(hours=1)
    assert gates.gates_data(layout)["adapters"]["dcp"]["versions"]["any"] is True  # type: ignore[index]
    assert gates.gate_producer(layout, "dcp") == "torch"  # the overlay changes versions, not the producer
    assert "versions" not in gates.gates_data(own)["adapters"]["dcp"]  # type: ignore[index]  # no restriction
