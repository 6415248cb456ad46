"""The reviewer report for the qualified fixture with its attestation."""

from __future__ import annotations

from ckptgate.evidence.report import build_report, render_html, render_text
from ckptgate.pipeline import EngineOptions
from evidence_helpers import FIXTURE, EvidenceRepo


def test_report_says_what_who_which_policy_and_controls(qualified_repo: EvidenceRepo) -> None:
    repo = qualified_repo.path
    [att] = list((repo / "attestations").glob("sha256-*/*.dsse.json"))
    doc = build_report(repo / "tests/fixtures/data" / FIXTURE / "checkpoint", [att],
                       options=EngineOptions(policy_dir=repo / "policies"))
    assert doc["checkpoint"]["format"] == "hf-sharded-safetensors"
    assert doc["checkpoint"]["digest"] == "sha256:" + att.parent.name.removeprefix("sha256-")
    assert doc["digest_matches_any_attestation"] is True
    [a] = doc["attestations"]
    assert a["signers"][0]["signer_id"] == "ci-qualification" and a["issued_at"]
    assert doc["decision"]["policy_revision"].startswith("sha256:")
    assert doc["decision"]["allow"] is True
    assert [r["code"] for r in doc["decision"]["reasons"]] == ["attestation_trusted", "plane_selected"]
    assert doc["load_requires"]["plane"] == "pure_data"
    text = "\n".join(render_text(doc))
    assert "digest MATCHES" in text and "policy revision" in text
    assert 'id="verdict"' in render_html(doc)


def test_report_without_attestation_lists_none(qualified_repo: EvidenceRepo) -> None:
    repo = qualified_repo.path
    doc = build_report(repo / "tests/fixtures/data" / FIXTURE / "checkpoint", [],
                       options=EngineOptions(policy_dir=repo / "policies"))
    assert doc["attestations"] == [] and doc["digest_matches_any_attestation"] is False
    assert "none offered" in "\n".join(render_text(doc))
