"""The reviewer report's HTML in headless Chromium (Debian's ``chromium``): every section is there,
nothing overflows sideways at a desktop width or at Chromium's narrowest window (500 px), and long values are complete and escaped."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckptgate.evidence.report import build_report, render_html
from ckptgate.decide.options import EngineOptions
from chromium_helpers import chromium, layout, needs_chromium
from evidence_helpers import FIXTURE, REPO, EvidenceRepo

SECTIONS = ("verdict", "inspected", "attestations", "attestation-1", "decision", "about", "json")
#: A4 at 96 px/in less the report's 15 mm page margins: the width a printout lays the page out at.
PRINT_WIDTH = 680
LONG = "x" * 700  # one unbroken token, far wider than any screen
HOSTILE = '<img src=x onerror="document.title=1">'


def _layout_s(page: str, tmp_path: Path, width: int) -> dict[str, Any]:
    return layout(page, tmp_path, width, SECTIONS)


def _checkpoint(repo: Path) -> Path:
    return repo / "tests/fixtures/data" / FIXTURE / "checkpoint"


def _hostile_attestation(qualified_repo: EvidenceRepo, tmp_path: Path) -> Path:
    """A trusted key's statement whose predicate holds markup and a 700-character token."""
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree
    from ckptgate.verify import KeySigner
    from ckptgate.verify.dsse import canonical_payload, sign_payload

    with SafeTree.open(_checkpoint(qualified_repo.path)) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    statement = {"_type": "https://in-toto.io/Statement/v1",
                 "subject": [{"name": FIXTURE, "digest": {"sha256": digest.removeprefix("sha256:")}}],
                 "predicateType": "https://example.com/other/v1",
                 "predicate": {"note": HOSTILE, "token": LONG, "nested": {"list": [1, {"deep": LONG}]}}}
    att = tmp_path / "other.dsse.json"
    att.write_bytes(sign_payload(canonical_payload(statement), [KeySigner.from_pem(qualified_repo.key)]))
    return att


def _report(qualified_repo: EvidenceRepo, attestations: list[Path]) -> dict[str, Any]:
    repo = qualified_repo.path
    return build_report(_checkpoint(repo), attestations, options=EngineOptions(policy_dir=repo / "policies"))


def test_the_document_is_complete_and_escaped(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    [att] = list((qualified_repo.path / "attestations").glob("sha256-*/*.dsse.json"))
    doc = _report(qualified_repo, [att, _hostile_attestation(qualified_repo, tmp_path)])
    g = doc["generated"]
    assert g["ckptgate_version"] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", g["at"])
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", g["trust_data"]["sha256"])
    assert g["policy_revision"] == doc["decision"]["policy_revision"]
    good, other = doc["attestations"]
    assert "signature" in good["checks"] and good["binding"] == "subject"
    assert len(good["signers"][0]["spki_sha256"]) == 64
    assert other["predicate"]["nested"]["list"][1]["deep"] == LONG
    page = render_html(doc)
    assert HOSTILE not in page and html_escaped(HOSTILE) in page
    assert page.count(LONG) >= 4  # two predicate rows and the JSON appendix: none cut
    assert good["signers"][0]["spki_sha256"] in page and doc["checkpoint"]["digest"] in page
    assert g["trust_data"]["sha256"] in page and g["at"] in page
    assert "<table class=\"predicate\">" in page and "nested.list[1].deep" in page
    assert "@media print" in page and "http://" not in page and "https://example" in page


def html_escaped(text: str) -> str:
    from markupsafe import escape  # the escaping the templates' autoescape applies

    return str(escape(text))


@needs_chromium
@pytest.mark.parametrize("width", [1280, PRINT_WIDTH, 500])
def test_no_horizontal_overflow_no_word_broken_and_every_section_present(qualified_repo: EvidenceRepo,
                                                                          tmp_path: Path, width: int) -> None:
    [att] = list((qualified_repo.path / "attestations").glob("sha256-*/*.dsse.json"))
    doc = _report(qualified_repo, [att, _hostile_attestation(qualified_repo, tmp_path)])
    out = _layout_s(render_html(doc), tmp_path, width)
    assert out["sections"] == {s: True for s in SECTIONS}
    assert out["scroll"] <= out["width"], out
    assert out["wide"] == []
    assert out["hostile"] == 0  # the predicate's markup stayed text
    assert out["broken"] == []  # no header, code or term breaks mid-word ("Severit/y", "trus/ted")
    assert 0 < out["json_height"] < 60  # the raw JSON is folded to its summary line: not in a printout


@needs_chromium
def test_the_word_probe_sees_a_broken_word(tmp_path: Path) -> None:
    """The probe fails a header squeezed until it breaks, so the assertion above can fail."""
    page = ('<html><body><table style="width:10px"><tr><th style="overflow-wrap:anywhere;white-space:normal">'
            "Severity</th></tr></table></body></html>")
    assert _layout_s(page, tmp_path, 500)["broken"] == ["Severity"]


def test_a_filed_record_names_files_by_sha256_the_absolute_path_the_opa_version_and_its_references(
        qualified_repo: EvidenceRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = qualified_repo.path
    monkeypatch.chdir(repo)
    relative = _checkpoint(repo).relative_to(repo)
    doc = build_report(relative, [], options=EngineOptions(policy_dir=repo / "policies"))
    page = render_html(doc)
    c = doc["checkpoint"]
    assert c["path"] == str(repo / relative) and c["path_as_given"] == str(relative)
    assert c["files"] and all(re.fullmatch(r"[0-9a-f]{64}", f["sha256"]) for f in c["files"])
    assert all(f["sha256"] in page for f in c["files"])
    assert str(repo / relative) in page
    assert "pid" not in page.split('id="h-json"')[0]  # the engine is named by version, not by process
    assert f"OPA {doc['generated']['engine']['opa_version']}" in page
    assert doc["generated"]["engine"]["opa_version"]
    for rid in ("R28", "R30"):  # cited by the containment note, explained on the page
        assert f'<dt id="{rid}">{rid}</dt>' in page
    assert 'id="revision-note"' in page and "trust data" in page.split('id="revision-note"')[1].split("</p>")[0]
    assert "<details>" in page and "<details open" not in page


def test_the_register_titles_are_the_docs_references_table() -> None:
    """``evidence/register.json`` (in the wheel, which has no docs/) is the references table's IDs and
    titles, exactly."""
    table = dict(re.findall(r"^\| (R\d\d) \| ([^|]+?) \|", (REPO / "docs" / "references.md").read_text(), re.M))
    shipped = json.loads((REPO / "src" / "ckptgate" / "evidence" / "register.json").read_text())
    assert shipped == table and len(table) >= 30


@needs_chromium
def test_layout_probe_sees_overflow(tmp_path: Path) -> None:
    """The probe itself fails a page that is too wide, so the assertions above can fail."""
    out = _layout_s(f"<html><body><pre style=\"white-space:pre\">{LONG}</pre></body></html>", tmp_path, 500)
    assert out["scroll"] > out["width"] and out["wide"]


@needs_chromium
def test_screenshot(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    """Screenshots the allowed report; with ``CKPTGATE_UPDATE_SCREENSHOT=1`` the user guide's copy
    (docs/img/reviewer-report.png) is replaced."""
    [att] = list((qualified_repo.path / "attestations").glob("sha256-*/*.dsse.json"))
    page = tmp_path / "report.html"
    page.write_text(render_html(_report(qualified_repo, [att])), encoding="utf-8")
    shot = tmp_path / "report.png"
    chromium(tmp_path, "--window-size=1100,2600", f"--screenshot={shot}", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("CKPTGATE_UPDATE_SCREENSHOT") == "1":
        dest = REPO / "docs" / "img" / "reviewer-report.png"
        dest.parent.mkdir(exist_ok=True)
        shutil.copy(shot, dest)
