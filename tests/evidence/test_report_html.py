"""The reviewer report's HTML in headless Chromium (Debian's ``chromium``): every section is there,
nothing overflows sideways at a desktop width or at Chromium's narrowest window (500 px), and long values are complete and escaped."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ckptgate.evidence.report import build_report, render_html
from ckptgate.decide.options import EngineOptions
from evidence_helpers import FIXTURE, REPO, EvidenceRepo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="Debian's chromium is not installed (apt-get install -y chromium)")
SECTIONS = ("verdict", "inspected", "attestations", "attestation-1", "decision", "about", "json")
LONG = "x" * 700  # one unbroken token, far wider than any screen
HOSTILE = '<img src=x onerror="document.title=1">'

# Appended by the test only: measures the laid-out page and writes the result into the DOM.
_PROBE = """<script>
(function () {
  const de = document.documentElement, width = de.clientWidth, out = {scroll: de.scrollWidth, width: width,
    sections: {}, wide: [], hostile: document.querySelectorAll("img").length};
  for (const id of %s) {
    const el = document.getElementById(id);
    out.sections[id] = el !== null && el.getBoundingClientRect().height > 0;
  }
  for (const el of document.body.querySelectorAll("*")) {
    // An element past the viewport's right edge, or one whose content spills out of its own box.
    if (el.getBoundingClientRect().right > width + 0.5 || (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1))
      out.wide.push(el.tagName + "#" + el.id + "." + el.className);
  }
  const p = document.createElement("output"); p.id = "probe"; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
})();
</script>"""


def _chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM is not None
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _layout(page: str, tmp_path: Path, width: int) -> dict[str, Any]:
    probe = tmp_path / f"probe-{width}.html"
    probe.write_text(page.replace("</body>", _PROBE % json.dumps(SECTIONS) + "</body>"), encoding="utf-8")
    dom = _chromium(tmp_path, f"--window-size={width},900", "--virtual-time-budget=2000", "--dump-dom",
                    probe.as_uri())
    m = re.search(r'<output id="probe">(.*?)</output>', dom)
    assert m, dom[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


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
    import html

    return html.escape(text)


@needs_chromium
@pytest.mark.parametrize("width", [1280, 500])
def test_no_horizontal_overflow_and_every_section_present(qualified_repo: EvidenceRepo, tmp_path: Path,
                                                           width: int) -> None:
    [att] = list((qualified_repo.path / "attestations").glob("sha256-*/*.dsse.json"))
    doc = _report(qualified_repo, [att, _hostile_attestation(qualified_repo, tmp_path)])
    out = _layout(render_html(doc), tmp_path, width)
    assert out["sections"] == {s: True for s in SECTIONS}
    assert out["scroll"] <= out["width"], out
    assert out["wide"] == []
    assert out["hostile"] == 0  # the predicate's markup stayed text


@needs_chromium
def test_layout_probe_sees_overflow(tmp_path: Path) -> None:
    """The probe itself fails a page that is too wide, so the assertions above can fail."""
    out = _layout(f"<html><body><pre style=\"white-space:pre\">{LONG}</pre></body></html>", tmp_path, 500)
    assert out["scroll"] > out["width"] and out["wide"]


@needs_chromium
def test_screenshot(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    """Screenshots the allowed report; with ``CKPTGATE_UPDATE_SCREENSHOT=1`` the user guide's copy
    (docs/img/reviewer-report.png) is replaced."""
    [att] = list((qualified_repo.path / "attestations").glob("sha256-*/*.dsse.json"))
    page = tmp_path / "report.html"
    page.write_text(render_html(_report(qualified_repo, [att])), encoding="utf-8")
    shot = tmp_path / "report.png"
    _chromium(tmp_path, "--window-size=1100,2600", f"--screenshot={shot}", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("CKPTGATE_UPDATE_SCREENSHOT") == "1":
        dest = REPO / "docs" / "img" / "reviewer-report.png"
        dest.parent.mkdir(exist_ok=True)
        shutil.copy(shot, dest)
