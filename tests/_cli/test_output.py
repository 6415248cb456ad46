"""Human output through pipes: nothing cut, wrapped or padded (issue 19, item 2)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HF = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "hf_sharded" / "checkpoint"


def _run(*args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          timeout=180, env=env)


def test_inspect_through_a_pipe_keeps_every_code_path_and_digest_whole(tmp_path):
    src = tmp_path / "ckpt"
    shutil.copytree(HF, src)
    long_name = "a-very-long-file-name-" + "x" * 150 + ".bin"
    (src / long_name).write_bytes(b"\x00\x01 not anything known")
    human, machine = _run("inspect", src, "--digest"), _run("inspect", src, "--digest", "--json")
    assert human.returncode == machine.returncode
    doc = json.loads(machine.stdout)
    lines = human.stdout.splitlines()
    for f in doc["inspection"]["findings"]:
        assert any(f["code"] in line and f["path"] in line and f["message"] in line for line in lines), f
    assert any(long_name in line for line in lines)
    assert doc["fixture"]["digest"] in human.stdout
    assert not [line for line in lines if line != line.rstrip()]  # no padding
    assert "…" not in human.stdout and "..." not in human.stdout


def test_errors_on_stderr_are_never_wrapped(tmp_path):
    dst = tmp_path / ("d" * 200)
    dst.mkdir()
    res = _run("intake", HF, "--out", dst)
    assert res.returncode == 2
    # the error is one line; the line before it, if any, announces the configuration used
    [first, *_] = [line for line in res.stderr.splitlines() if not line.startswith("ckptgate: using configuration")]
    assert "[usage.dst_exists]" in first and str(dst) in first


def test_decide_prints_plain_json_through_a_pipe():
    res = _run("decide", HF)
    assert res.returncode == 3
    text = res.stdout
    start = text.index("{", text.index("decision"))
    assert json.loads(text[start:])["refusal"] == "policy"
    assert not re.search(r"\x1b\[", text)  # no terminal escapes in a log
