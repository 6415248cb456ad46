"""``ckptgate inspect``: JSON facts, exit 0 when clean, 4 on any error finding."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import safetensors.numpy

from ckpt_inspect_helpers import write


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from ckptgate._cli import main; main()", "inspect", *args],
                          capture_output=True, text=True, timeout=120)


def test_clean_tree_exits_0_with_facts(tmp_path: Path) -> None:
    safetensors.numpy.save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "model.safetensors"))
    r = _run(str(tmp_path), "--json", "--digest")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["inspection"]["format"] == "safetensors" and doc["inspection"]["clean"] is True
    assert doc["fixture"]["digest"].startswith("sha256:") and doc["fixture"]["file_count"] == 1
    assert set(doc["inspection"]) >= {"format", "clean", "loaders", "findings", "files", "layout"}


def test_malicious_tree_exits_4_without_traceback(tmp_path: Path) -> None:
    write(tmp_path, "model.bin", pickle.dumps(print, protocol=2))
    r = _run(str(tmp_path), "--json")
    assert r.returncode == 4
    doc = json.loads(r.stdout)
    assert "pickle.global_not_allowed" in {f["code"] for f in doc["inspection"]["findings"]}
    assert "Traceback" not in r.stderr
    h = _run(str(tmp_path))
    assert h.returncode == 4 and "Traceback" not in h.stderr + h.stdout
    assert "global_not_allowed" in h.stdout


def test_missing_root_is_a_usage_error_like_every_other_command(tmp_path: Path) -> None:
    r = _run(str(tmp_path / "nope"), "--json")
    assert r.returncode == 2
    error = json.loads(r.stdout)["error"]
    assert error["code"] == "usage.invalid" and "nope" in error["message"]


def test_empty_directory_is_not_clean(tmp_path: Path) -> None:
    r = _run(str(tmp_path), "--json")
    assert r.returncode == 4, r.stderr
    doc = json.loads(r.stdout)["inspection"]
    assert doc["clean"] is False and doc["files"] == []
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["walk.empty"]
