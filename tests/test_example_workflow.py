"""examples/ci/github-workflow.yml runs on GitHub as written: actionlint passes, every action is pinned
by a full commit SHA, the SARIF upload is skipped for pull requests from forks, and its ``run:``
steps, in order, build and install ckptgate from a copy of this clone, build OPA with ``go install``
and run ``ckptgate check --base`` in a consumer repository's pull request.

What GitHub provides is stood in for, offline: the ``uses:`` steps (the consumer checkout is the
scratch repository; ckptgate's checkout is a copy of this clone; setup-python and setup-go are this
machine's Python and Go), ``sudo`` and ``apt-get`` (recorded, not run), the package index
(``tests/wheel_helpers.OFFLINE_SHIMS``), and the Go module proxy and build cache (this machine's,
which ``scripts/bootstrap.py`` filled when it built OPA). YAML is read with PyYAML, which the
shared environment has through huggingface-hub.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.wheel_helpers import OFFLINE_SHIMS, REPO, copy_clone, fresh_venv, user_env

WORKFLOW = REPO / "examples" / "ci" / "github-workflow.yml"
SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def steps() -> list[dict[str, Any]]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["check"]["steps"]


def tool(name: str) -> str:
    found = os.environ.get(f"CKPTGATE_{name.upper()}") or shutil.which(name) or str(REPO / ".tools" / "bin" / name)
    assert Path(found).is_file(), f"{name} is not installed: run `python3 scripts/bootstrap.py setup`"
    return found


def test_actionlint_passes() -> None:
    res = subprocess.run([tool("actionlint"), "-no-color", str(WORKFLOW)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_action_is_pinned_by_a_full_commit_sha_with_its_release_beside_it() -> None:
    used = [s["uses"] for s in steps() if "uses" in s]
    assert len(used) >= 5
    assert all(SHA_PIN.match(u) for u in used), used
    for line in WORKFLOW.read_text().splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40}\s+#\s+v\d+\.\d+\.\d+$", line), line


class _Context:
    """A GitHub expression context: attribute access into nested dicts, '' where a key is absent."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def __getattr__(self, name: str) -> Any:
        got = self._value.get(name, "") if isinstance(self._value, dict) else ""
        return _Context(got) if isinstance(got, dict) else got


def evaluate(condition: str, github: dict[str, Any]) -> bool:
    """The few operators the workflow's ``if:`` conditions use, translated to Python."""
    expr = " ".join(condition.split()).replace("always()", "True").replace("&&", " and ").replace("||", " or ")
    assert re.fullmatch(r"[\w.()'!=/ \-]+", expr), expr
    return bool(eval(expr, {"__builtins__": {}, "True": True, "github": _Context(github)}))


def test_the_sarif_upload_is_skipped_for_pull_requests_from_forks() -> None:
    (upload,) = [s for s in steps() if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif@")]
    same = {"event_name": "pull_request", "repository": "acme/models",
            "event": {"pull_request": {"head": {"repo": {"full_name": "acme/models"}}}}}
    fork = {**same, "event": {"pull_request": {"head": {"repo": {"full_name": "someone/models"}}}}}
    push = {"event_name": "push", "repository": "acme/models", "event": {}}
    assert evaluate(upload["if"], same) and evaluate(upload["if"], push)
    assert not evaluate(upload["if"], fork)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=repo, check=True,
                   capture_output=True)


def consumer_pull_request(root: Path) -> Path:
    """A repository that adopted ckptgate (``ckptgate init``, a doc), pushed to ``origin``, with a
    pull-request branch that edits the doc."""
    repo = root / "consumer"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "models.md").write_text("# Models\n\nWe take checkpoints in with ckptgate.\n")
    _git(repo, "init", "-q", "-b", "main")
    made = subprocess.run([sys.executable, "-c", "from ckptgate._cli import main; main()", "init"], cwd=repo,
                          env={k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")},
                          capture_output=True, text=True, check=False)
    assert made.returncode == 0, made.stderr
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "adopt ckptgate")
    _git(root, "clone", "-q", "--bare", str(repo), str(root / "origin.git"))
    _git(repo, "remote", "add", "origin", str(root / "origin.git"))
    _git(repo, "fetch", "-q", "origin")
    _git(repo, "switch", "-q", "-c", "change")
    (repo / "docs" / "models.md").write_text("# Models\n\nWe take checkpoints in with ckptgate, signed.\n")
    _git(repo, "commit", "-q", "-am", "say more")
    return repo


def expand(value: str, github: dict[str, Any]) -> str:
    """``${{ env.X }}`` and ``${{ github.X }}`` as GitHub substitutes them; any other expression fails."""
    def one(m: re.Match[str]) -> str:
        scope, _, name = m.group(1).partition(".")
        assert scope == "github" and name in github, m.group(0)
        return str(github[name])
    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", one, value)


@pytest.mark.package
def test_the_run_steps_run_in_order_against_a_locally_built_wheel(tmp_path: Path) -> None:
    repo = consumer_pull_request(tmp_path)
    env_dir = tmp_path / "venv"
    fresh_venv(env_dir, core_only=True)  # the workflow asserts that its install has no torch
    home = tmp_path / "home"
    home.mkdir()
    shims = tmp_path / "runner-bin"
    shims.mkdir()
    (shims / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (shims / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "apt.log"}\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    github_env = tmp_path / "github-env"
    github_env.touch()
    env = user_env(env_dir, home)
    del env["CKPTGATE_OPA"]  # the workflow builds and names its own
    go = subprocess.run(["go", "env", "GOMODCACHE", "GOCACHE"], capture_output=True, text=True, check=True)
    modcache, gocache = go.stdout.split()
    env.update(PATH=f"{shims}:{env['PATH']}", RUNNER_TEMP=str(runner_temp), GITHUB_ENV=str(github_env),
               GITHUB_WORKSPACE=str(repo), GOMODCACHE=modcache, GOCACHE=gocache, GOFLAGS="-mod=mod")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    github = {"base_ref": "main", "event_name": "pull_request"}
    env.update({k: expand(str(v), github) for k, v in workflow["env"].items()})

    ran = []
    for step in workflow["jobs"]["check"]["steps"]:
        uses = str(step.get("uses", ""))
        if uses.startswith("actions/checkout@") and "repository" in step.get("with", {}):
            copy_clone(repo / step["with"]["path"])
            continue
        if "run" not in step:
            continue  # the consumer checkout is the scratch repository; setup-*, uploads: GitHub's
        step_env = {k: expand(str(v), github) for k, v in step.get("env", {}).items()}
        script = f"{OFFLINE_SHIMS}\n{expand(step['run'], github)}"
        res = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=repo,
                             env={**env, **step_env}, capture_output=True, text=True, timeout=600, check=False)
        assert res.returncode == 0, f"{step.get('name')}\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
        for line in github_env.read_text().splitlines():
            key, _, value = line.partition("=")
            env[key] = value
        ran.append((step.get("name"), res))

    assert [name for name, _ in ran] == ["Install libseccomp", "Build and install ckptgate (core only, no torch)",
                                         "Build OPA", "ckptgate check"]
    assert (tmp_path / "apt.log").read_text().splitlines() == ["update", "install -y libseccomp2"]
    assert not (repo / ".ckptgate-src").exists()  # the source tree is gone before check runs
    assert Path(env["CKPTGATE_OPA"]) == runner_temp / "bin" / "opa"
    version = subprocess.run([env["CKPTGATE_OPA"], "version"], capture_output=True, text=True, check=True).stdout
    assert "Version: " + workflow["env"]["OPA_MODULE"].rsplit("@v", 1)[1] in version
    where = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import ckptgate; print(ckptgate.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(env_dir), where
    sarif = json.loads((repo / "ckptgate.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"]
    assert (repo / "ckptgate-junit.xml").read_text().startswith("<?xml")
