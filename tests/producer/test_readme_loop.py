"""README "From training job to published model": the commands of its console block, run as written
(in a scratch directory with the clone's ``examples/``), each exits 0 and the model is published."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## From training job to published model", 1)[1]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    assert block is not None
    return [line[2:] for line in block.group(1).splitlines() if line.startswith("$ ")]


def test_the_readme_loop_runs_as_written(tmp_path: Path) -> None:
    commands = readme_commands()
    assert len(commands) == 5 and commands[1].startswith("CKPTGATE_SIGNING_KEY=")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    outputs = []
    for command in commands:
        res = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        outputs.append(res.stdout)
    assert "builder     https://ci.example/trainer" in outputs[2]
    assert "allowed plane=pure_data" in outputs[3]
    assert int(outputs[4].strip().splitlines()[-1]) > 0
    assert (tmp_path / "published" / "model.safetensors.index.json").is_file()
