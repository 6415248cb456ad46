"""The generated matrix: deterministic, headed with the policy revision, supported at the candidate."""

from __future__ import annotations

import json
from pathlib import Path

from ckptgate.evidence import matrix
from ckptgate.pipeline import EngineOptions, engine_for, load_trust
from evidence_helpers import EvidenceRepo


def _build(repo: Path) -> matrix.Matrix:
    options = EngineOptions(policy_dir=repo / "policies")
    with engine_for(options) as engine:
        return matrix.build(repo, engine, load_trust(options))


def test_rebuild_is_byte_identical_to_the_committed_matrix(qualified_repo: EvidenceRepo) -> None:
    repo = qualified_repo.path
    m = _build(repo)
    assert matrix.diff(m, repo / "matrix") == []
    for name, data in m.files().items():
        assert (repo / "matrix" / name).read_bytes() == data


def test_rows_and_headers(qualified_repo: EvidenceRepo) -> None:
    repo = qualified_repo.path
    doc = json.loads((repo / "matrix" / "support.json").read_text())
    revision = doc["generated"]["policy_revision"]
    assert revision.startswith("sha256:")
    assert doc["generated"]["candidate_commit"] == qualified_repo.code_commit
    supported = [r for r in doc["rows"] if r["status"] == "supported"]
    assert [r["adapter"] for r in supported] == ["hf-safetensors"]
    assert supported[0]["candidate_commit"] == qualified_repo.code_commit
    assert supported[0]["evidence"]["location"].startswith("attestations/evidence/")
    assert any(r["status"] == "unqualified" for r in doc["rows"])
    md = (repo / "matrix" / "SUPPORT.md").read_text()
    html = (repo / "matrix" / "index.html").read_text()
    for text in (md, html):
        assert "generated file, do not edit" in text and revision in text
    assert "http://" not in html and "https://" not in html  # works from file:// without network
    assert f'href="../{supported[0]["evidence"]["location"]}"' in html


def test_deleted_attestation_changes_the_matrix(clone: Path) -> None:
    for p in (clone / "attestations").glob("sha256-*/*.dsse.json"):
        p.unlink()
    diffs = matrix.diff(_build(clone), clone / "matrix")
    assert diffs and any("supported" in d for d in diffs)
