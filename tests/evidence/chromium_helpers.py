"""Headless Chromium (Debian's ``chromium``) laying out a page at a window width: the probe measures
sideways overflow, words broken mid-word, the given sections' presence and the folded JSON."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="Debian's chromium is not installed (apt-get install -y chromium)")

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
  // A word (between spaces and identifier separators) laid out on more than one line: broken mid-word.
  out.broken = [];
  for (const el of document.body.querySelectorAll("th, code.word, dt")) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const re = /[^\\s_.\\/:\\-]+/g;
      for (let m = re.exec(node.data); m; m = re.exec(node.data)) {
        const r = document.createRange(); r.setStart(node, m.index); r.setEnd(node, m.index + m[0].length);
        const lines = new Set(Array.from(r.getClientRects()).map((b) => Math.round(b.top)));
        if (lines.size > 1) out.broken.push(m[0]);
      }
    }
  }
  const details = document.querySelector("#json details");
  out.json_height = details === null ? -1 : details.getBoundingClientRect().height;
  const p = document.createElement("output"); p.id = "probe"; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
})();
</script>"""


def chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM is not None
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def layout(page: str, tmp_path: Path, width: int, sections: tuple[str, ...] = ()) -> dict[str, Any]:
    probe = tmp_path / f"probe-{width}.html"
    probe.write_text(page.replace("</body>", _PROBE % json.dumps(list(sections)) + "</body>"), encoding="utf-8")
    dom = chromium(tmp_path, f"--window-size={width},900", "--virtual-time-budget=2000", "--dump-dom",
                    probe.as_uri())
    m = re.search(r'<output id="probe">(.*?)</output>', dom)
    assert m, dom[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
