"""``ckptgate engine install``: the pinned OPA (and Regal) through ``go install``, tested with a fake
``go`` that records its arguments and writes an executable; no real ``go install`` runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ckptgate._resources import GO_TOOLS
from ckptgate.errors import ExitCode

FAKE_GO = r"""#!/bin/sh
# records its arguments, GOBIN and the throwaway module, then "builds" a binary reporting the
# version -ldflags stamps (or $FAKE_GO_VERSION)
{ printf 'ARG %s\n' "$@"; echo "GOBIN $GOBIN"; echo "GOFLAGS $GOFLAGS"; cat go.mod; echo END; } >> "$FAKE_GO_LOG"
for a in "$@"; do mod="$a"; done
ver="${FAKE_GO_VERSION:-${2##*Version=}}"
name=$(basename "$mod")
printf '#!/bin/sh\necho "Version: %s"\n' "$ver" > "$GOBIN/$name"
chmod +x "$GOBIN/$name"
"""


def _fake_go(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "gobin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    return bin_dir


def _cli(args: list[str], path: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "XDG_DATA_HOME"}
    full.update(PATH=path, FAKE_GO_LOG=str(tmp_path / "go.log"), HOME=str(tmp_path / "home"), **env)
    return subprocess.run(
        [sys.executable, "-m", "ckptgate", "engine", "install", *args, "--json"],
        capture_output=True, text=True, timeout=120, env=full,
    )


def test_install_builds_exactly_the_pinned_versions_and_says_how_to_use_them(tmp_path: Path) -> None:
    path = f"{_fake_go(tmp_path)}:/usr/bin:/bin"
    target = tmp_path / "engine"
    res = _cli(["--dir", str(target), "--regal"], path, tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["dir"] == str(target)
    assert doc["env"] == {"CKPTGATE_OPA": str(target / "opa"), "CKPTGATE_REGAL": str(target / "regal")}
    assert [(t["name"], t["spec"], t["built"]) for t in doc["installed"]] == [
        ("opa", GO_TOOLS["opa"].spec, True), ("regal", GO_TOOLS["regal"].spec, True)]
    log = (tmp_path / "go.log").read_text().split("END\n")[:-1]
    assert len(log) == 2
    for entry, name in zip(log, ("opa", "regal"), strict=True):
        tool = GO_TOOLS[name]
        args = [line[4:] for line in entry.splitlines() if line.startswith("ARG ")]
        assert args == ["install", f"-ldflags=-X {tool.version_package}.Version={tool.version_text}", tool.module]
        assert f"GOBIN {target}" in entry and "GOFLAGS -mod=mod" in entry
        assert f"require {tool.module} v{tool.version_text}" in entry  # exactly the pin, never @latest
    out = subprocess.run([str(target / "opa"), "version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"Version: {GO_TOOLS['opa'].version_text}"

    again = _cli(["--dir", str(target)], path, tmp_path)  # already at the pin: nothing is built
    assert again.returncode == 0, again.stderr
    assert [t["built"] for t in json.loads(again.stdout)["installed"]] == [False]
    assert len((tmp_path / "go.log").read_text().split("END\n")[:-1]) == 2


def test_default_directory_is_the_per_user_data_directory(tmp_path: Path) -> None:
    path = f"{_fake_go(tmp_path)}:/usr/bin:/bin"
    res = _cli([], path, tmp_path, XDG_DATA_HOME=str(tmp_path / "data"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["env"] == {"CKPTGATE_OPA": str(tmp_path / "data" / "ckptgate" / "bin" / "opa")}


def test_no_go_is_a_usage_error_naming_every_other_way(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    res = _cli(["--dir", str(tmp_path / "engine")], str(empty), tmp_path)
    assert res.returncode == ExitCode.USAGE, res.stderr
    assert "Traceback" not in res.stderr
    err = json.loads(res.stdout)["error"]
    assert err["code"] == "usage.engine.no_go"
    for way in ("--opa-binary", "CKPTGATE_OPA", "PATH", "--opa-url", "Install Go"):
        assert way in err["advice"], way
    assert not (tmp_path / "engine").exists()


def test_a_build_that_reports_another_version_fails(tmp_path: Path) -> None:
    path = f"{_fake_go(tmp_path)}:/usr/bin:/bin"
    res = _cli(["--dir", str(tmp_path / "engine")], path, tmp_path, FAKE_GO_VERSION="1.23.0")
    assert res.returncode == ExitCode.ENGINE_UNAVAILABLE, res.stderr
    err = json.loads(res.stdout)["error"]
    assert err["code"] == "engine.install.failed"
    assert "1.23.0" in err["message"] and GO_TOOLS["opa"].version_text in err["message"]
