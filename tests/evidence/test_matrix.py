"""The generated matrix: deterministic, headed with the policy revision, supported at the candidate."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from ckptgate.evidence import matrix
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from chromium_helpers import layout, needs_chromium
from evidence_helpers import FIXTURE, EvidenceRepo


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


def _forge(clone: Path, name: str, change) -> Path:
    """A copy of the stored attestation with its statement changed and its signature kept: no
    trusted key signed what it now says."""
    [genuine] = (clone / "attestations").glob("sha256-*/*.dsse.json")
    env = json.loads(genuine.read_text())
    statement = json.loads(base64.b64decode(env["payload"]))
    change(statement)
    env["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = genuine.parent / name
    forged.write_text(json.dumps(env))
    return forged


def test_an_unsigned_future_issue_time_does_not_move_the_evaluation_time(clone: Path) -> None:
    """The as-of time comes from the commit and the newest issue time a trusted key signed; a
    forged file claiming 2099 used to make it 2099 and every genuine attestation look expired."""
    before = _build(clone)

    def future(statement):
        statement["predicate"]["validity"] = {"issued_at": "2099-01-01T00:00:00Z",
                                              "expires_at": "2099-06-01T00:00:00Z"}

    forged = _forge(clone, "ckptgate.dev-attestation-qualification-v1-ffffffffffffffff.dsse.json", future)
    after = _build(clone)
    assert after.as_of == before.as_of
    assert [r["status"] for r in after.rows if r["status"] == "supported"] == ["supported"]
    assert any(r["status"] == "refused" and forged.name in json.dumps(r) for r in after.rows)


def test_a_stored_statement_of_any_shape_is_a_row_not_a_crash(clone: Path) -> None:
    def odd(statement):
        statement["predicateType"] = "https://example.com/other/v1"
        statement["predicate"] = {"validity": "soon"}

    forged = _forge(clone, "example.com-other-v1-eeeeeeeeeeeeeeee.dsse.json", odd)
    rows = _build(clone).rows
    assert any(r["status"] == "refused" and forged.name in json.dumps(r) for r in rows)
    assert [r["status"] for r in rows if r["status"] == "supported"] == ["supported"]


def test_a_retained_result_that_changed_is_refused_by_the_policy(clone: Path) -> None:
    """The support policy sees the sha256 of the retained result log (Python reads it): a log that
    no longer matches the signed evidence digest refuses the row in the matrix itself, not only
    in `ckptgate check`."""
    [log] = (clone / "attestations" / "evidence").glob("sha256-*/*.log.json")
    log.write_text(log.read_text() + " ")
    [row] = [r for r in _build(clone).rows if (r.get("source") or "").endswith(".dsse.json")]
    assert row["status"] == "refused"
    [reason] = [r for r in row["reasons"] if r["code"] == "result_not_retained"]
    assert reason["evidence"]["location"] == log.relative_to(clone).as_posix()
    log.unlink()
    [row] = [r for r in _build(clone).rows if (r.get("source") or "").endswith(".dsse.json")]
    assert row["status"] == "refused" and "result_not_retained" in [r["code"] for r in row["reasons"]]


def test_rows_name_their_fixture_and_are_grouped_by_adapter(qualified_repo: EvidenceRepo) -> None:
    """SUPPORT.md and index.html show each row's fixture by name beside its digest, under a heading for
    its adapter; the name is the committed fixture whose measured digest the row names."""
    repo = qualified_repo.path
    doc = json.loads((repo / "matrix" / "support.json").read_text())
    [supported] = [r for r in doc["rows"] if r["status"] == "supported"]
    assert supported["fixture"] == {"name": FIXTURE, "synthetic_device": None}
    md = (repo / "matrix" / "SUPPORT.md").read_text()
    html = (repo / "matrix" / "index.html").read_text()
    adapters = sorted({r["adapter"] for r in doc["rows"]})
    assert len(adapters) > 1
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == adapters
    assert f"| {FIXTURE} (sha256:" in md
    for adapter in adapters:
        assert f'<section class="adapter" id="adapter-{adapter}">' in html
    assert f"{FIXTURE} (sha256:" in html.replace("<wbr>", "")


@needs_chromium
def test_the_matrix_page_is_not_cut_off_at_a_narrow_window(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    page = (qualified_repo.path / "matrix" / "index.html").read_text()
    for width in (1280, 500):
        out = layout(page, tmp_path, width)
        assert out["scroll"] <= out["width"] and out["wide"] == [], (width, out)
        assert out["broken"] == [], (width, out["broken"])
