"""The reviewer report for the qualified fixture with its attestation."""

from __future__ import annotations

from ckptgate.evidence.report import build_report, render_html, render_text
from ckptgate.decide.options import EngineOptions
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


def test_report_of_a_trusted_statement_of_an_unknown_predicate_type(qualified_repo: EvidenceRepo, tmp_path) -> None:
    """ckptgate has no schema for such a predicate, so a trusted key may have signed any shape in
    it: the report lists it and the policy denies, where a string for ``validity`` used to stop
    the report with an AttributeError."""
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import canonical_payload, sign_payload

    repo = qualified_repo.path
    checkpoint = repo / "tests/fixtures/data" / FIXTURE / "checkpoint"
    with SafeTree.open(checkpoint) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    statement = {"_type": "https://in-toto.io/Statement/v1",
                 "subject": [{"name": FIXTURE, "digest": {"sha256": digest.removeprefix("sha256:")}}],
                 "predicateType": "https://example.com/other/v1",
                 "predicate": {"validity": "soon", "adapter": "y", "producer": 3}}
    att = tmp_path / "other.dsse.json"
    att.write_bytes(sign_payload(canonical_payload(statement), [KeySigner.from_pem(qualified_repo.key)]))
    doc = build_report(checkpoint, [att], options=EngineOptions(policy_dir=repo / "policies"))
    [a] = doc["attestations"]
    assert a["predicate_type"] == "https://example.com/other/v1" and a["issued_at"] is None
    assert a["claims"] == {"adapter": "y", "producer": 3}
    assert doc["decision"]["allow"] is False
    assert "DENY" in "\n".join(render_text(doc)) and 'id="verdict"' in render_html(doc)
