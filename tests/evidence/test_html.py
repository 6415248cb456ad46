"""The matrix HTML in headless Chromium (Debian's ``chromium``): filtering by status works from file://."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from evidence_helpers import EvidenceRepo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _dom(url: str, tmp_path: Path) -> str:
    assert CHROMIUM is not None
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_status_filter_hides_other_rows(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    page = (qualified_repo.path / "matrix" / "index.html").resolve()
    dom = _dom(page.as_uri() + "?status=supported", tmp_path)
    rows = [(m.group("status"), "hidden" in m.group(0))
            for m in re.finditer(r"<tr[^>]*data-status=\"(?P<status>\w+)\"[^>]*>", dom)]
    assert ("supported", False) in rows
    assert any(s == "unqualified" for s, _ in rows)
    assert all(hidden for s, hidden in rows if s != "supported")
    assert re.search(r'<span id="shown">1</span>', dom)
    assert 'class="status-supported"' in dom


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_unfiltered_shows_every_row(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    page = (qualified_repo.path / "matrix" / "index.html").resolve()
    dom = _dom(page.as_uri(), tmp_path)
    rows = re.findall(r"<tr[^>]*data-status=\"\w+\"[^>]*>", dom)
    assert rows and not any("hidden" in r for r in rows)


_STYLE_PROBE = """<script>
(function () {
  const out = [];
  for (const a of document.querySelectorAll("table.matrix td.c-evidence a")) {
    const s = getComputedStyle(a), cell = getComputedStyle(a.closest("td"));
    out.push({cls: a.className, href: a.getAttribute("href"), underline: s.textDecorationLine.includes("underline"),
              distinct: s.color !== cell.color, visible: a.getBoundingClientRect().width > 0});
  }
  const p = document.createElement("output"); p.id = "probe"; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
})();
</script>"""


def _supported_row(dom: str) -> str:
    m = re.search(r'<tr[^>]*data-status="supported"[^>]*>.*?</tr>', dom, re.S)
    assert m, dom[-2000:]
    return m.group(0)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_each_row_shows_its_signer_and_links_its_evidence(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    import html
    import json

    matrix_dir = qualified_repo.path / "matrix"
    page = matrix_dir / "index.html"
    probe = tmp_path / "matrix" / "index.html"  # beside a copy of the repository layout: hrefs are ../
    probe.parent.mkdir()
    probe.write_text(page.read_text().replace("</body>", _STYLE_PROBE + "</body>"))
    dom = _dom(probe.as_uri(), tmp_path)
    row = _supported_row(dom)
    assert re.search(r'<td class="c-signers"[^>]*>ci-qualification</td>', row)
    hrefs = dict(re.findall(r'<a class="(attestation|log)" href="([^"]+)"', row))
    assert set(hrefs) == {"attestation", "log"}
    for href in hrefs.values():  # relative to matrix/, and each names a file the repository holds
        assert href.startswith("../") and (matrix_dir / html.unescape(href)).resolve().is_file(), href
    assert hrefs["log"].endswith(".log.json") and hrefs["attestation"].endswith(".dsse.json")
    styles = json.loads(html.unescape(re.search(r'<output id="probe">(.*?)</output>', dom).group(1)))
    assert styles and all(s["underline"] and s["distinct"] and s["visible"] for s in styles), styles


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_text_filter_matches_the_signer(qualified_repo: EvidenceRepo, tmp_path: Path) -> None:
    page = (qualified_repo.path / "matrix" / "index.html").resolve()
    dom = _dom(page.as_uri() + "?q=ci-qualification", tmp_path)
    rows = [(m.group("status"), "hidden" in m.group(0))
            for m in re.finditer(r"<tr[^>]*data-status=\"(?P<status>\w+)\"[^>]*>", dom)]
    assert ("supported", False) in rows and any(hidden for _, hidden in rows)
