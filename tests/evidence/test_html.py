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
