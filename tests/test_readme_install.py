"""README "Installing ckptgate as a tool": its commands, extracted from the README and run as written
in a fresh venv from a copy of this clone, build the wheel, install it and take a checkpoint in.

Offline: ``tests/wheel_helpers.OFFLINE_SHIMS`` stands in for the package index (local files only,
the dependencies linked from the installed environment; hatchling for ``build``).  Every other
command runs unchanged, and ``ckptgate`` is the one the venv got from the built wheel.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from tests.wheel_helpers import OFFLINE_SHIMS, REPO, copy_clone, fresh_venv, user_env

SECTION = "## Installing ckptgate as a tool"
CHECKPOINT = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"


def section_commands() -> list[str]:
    """Every ``$ `` line of every console block in the section, in order, trailing comments kept
    (bash ignores them)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```console\n(.*?)```", body, re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def test_the_section_names_the_wheel_that_the_build_writes() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    wheels = {m for c in section_commands() for m in re.findall(r"dist/(ckptgate-[^\s'\[]+\.whl)", c)}
    assert wheels == {f"ckptgate-{version}-py3-none-any.whl"}


def test_the_install_section_runs_as_written(tmp_path: Path) -> None:
    commands = section_commands()
    assert commands[:2] == ["python -m pip install build", "python -m build --wheel"]
    clone = copy_clone(tmp_path / "ckptgate")
    env_dir = tmp_path / "venv"
    fresh_venv(env_dir)
    env = user_env(env_dir, tmp_path / "home")
    (tmp_path / "home").mkdir()
    shutil.copytree(CHECKPOINT, clone / "checkpoint")
    script = "\n".join([OFFLINE_SHIMS, "set -euo pipefail", *(f"echo '+ {c}' >&2; {c}" for c in commands)])
    res = subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
    # The ckptgate that ran is the wheel's, in the venv: not this clone's source tree.
    assert (env_dir / "bin" / "ckptgate").is_file()
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import ckptgate; print(ckptgate.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(env_dir), where
    assert "ckptgate, version" in res.stdout
    receipt = json.loads((clone / "published" / "ckptgate-receipt.json").read_text())
    assert receipt["decision"]["allow"] is True
    assert receipt["decision"]["plane"] == "pure_data"
    published = {o["file"] for o in receipt["outputs"]}
    index = json.loads((clone / "published" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) | {"model.safetensors.index.json"} == published
