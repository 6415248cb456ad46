"""Labelled progress bars (issue 19, item 3): one bar per long phase, only on a terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from ckptgate._cli._progress import phase_bars
from tests.pipeline_helpers import demo_attested

HF = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "hf_sharded" / "checkpoint"


def test_each_phase_has_its_labelled_byte_bar_with_rate_and_eta() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with phase_bars(True, "hashing", "consolidating", console=console) as bars:
        bars["hashing"].plan(2 << 20)
        bars["hashing"].advance(1 << 20)
        console.file.flush()
        bars["consolidating"].plan(4 << 20)
        bars["consolidating"].advance(1 << 20)
        time.sleep(0.2)
        bars["consolidating"].advance(1 << 20)  # two samples apart in time: a rate and a time left
    text = out.getvalue()
    hashing = [line for line in text.splitlines() if "hashing" in line]
    assert hashing and any("1.0/2.1 MB" in line for line in hashing), text
    last = [line for line in text.splitlines() if "consolidating" in line][-1]
    assert re.search(r"2\.1/4\.2 MB [\d.]+ [kMG]?B/s ETA \d+:\d\d:\d\d", last), last


def test_disabled_bars_draw_nothing_and_give_no_callbacks() -> None:
    with phase_bars(False, "hashing") as bars:
        assert bars["hashing"].plan is None and bars["hashing"].advance is None


def _on_a_terminal(*args: object) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; (exit status, everything it drew)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "ckptgate", *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            proc.kill()
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def _attested(tmp_path: Path) -> tuple[Path, Path, Path]:
    src = tmp_path / "ckpt"
    shutil.copytree(HF, src)
    attested = demo_attested(src, tmp_path)
    return src, attested.trust, attested.attestation


def test_intake_on_a_terminal_shows_hashing_then_consolidating(tmp_path: Path) -> None:
    src, trust, att = _attested(tmp_path)
    rc, drawn = _on_a_terminal("intake", src, "--out", tmp_path / "out", "--attestation", att, "--trust", trust)
    assert rc == 0, drawn
    assert "hashing" in drawn and "consolidating" in drawn
    assert drawn.index("hashing") < drawn.index("consolidating")
    rc, drawn = _on_a_terminal("intake", src, "--out", tmp_path / "out2", "--attestation", att, "--trust", trust,
                               "--quiet")
    assert rc == 0 and "hashing" not in drawn and "consolidating" not in drawn and "published" in drawn


def test_verify_bars_only_on_a_terminal_and_not_with_quiet(tmp_path: Path) -> None:
    src, trust, att = _attested(tmp_path)
    rc, drawn = _on_a_terminal("verify", src, "--attestation", att, "--trust", trust)
    assert rc == 0 and "hashing" in drawn, drawn
    rc, drawn = _on_a_terminal("verify", src, "--attestation", att, "--trust", trust, "--quiet")
    assert rc == 0 and "hashing" not in drawn and "decision" in drawn
    piped = subprocess.run([sys.executable, "-m", "ckptgate", "verify", str(src), "--attestation", str(att),
                            "--trust", str(trust)], capture_output=True, text=True, timeout=180)
    assert piped.returncode == 0 and "hashing" not in piped.stderr and "decision" in piped.stdout
