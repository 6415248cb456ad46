"""ckptgate installed like any tool: the built wheel, in a fresh venv with no path back to this
clone, takes a real safetensors checkpoint in with the core install only.

Offline by construction: the wheel is built without build isolation (hatchling, from the
environment running the tests), installed with ``pip --no-deps --no-index``, and its
dependencies come from the installed environment through a ``.pth`` link.  torch, numpy and the
producers are blocked inside the venv, so the intake below proves the core never imports them.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest

from ckptgate.decide.bundle import find_opa
from ckptgate.errors import EngineUnavailable, ExitCode
from tests.wheel_helpers import EXTRAS_ONLY, build_wheel, dependency_dirs, fresh_venv

pytestmark = pytest.mark.package

REPO = Path(__file__).resolve().parent.parent
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"
CORE_BUDGET_BYTES = 80 * 1000 * 1000

MAKE_STATEMENT = '''\
import json, platform, sys
from datetime import timedelta
from pathlib import Path

from ckptgate.decide import now_utc
from ckptgate.digest import fixture_digest
from ckptgate.inspect import SafeTree
from ckptgate.verify.statement import qualification_statement

src, out = Path(sys.argv[1]), Path(sys.argv[2])
with SafeTree.open(src) as tree:
    digest = fixture_digest(tree).digest
statement = qualification_statement(
    subject_name="package-test", fixture_digest=digest, manifest="hf_sharded",
    producer={"name": "huggingface_hub", "version": "2.4.0"}, adapter={"name": "hf-safetensors", "version": "1"},
    candidate_commit="0" * 40,
    environment={"python": platform.python_version(), "torch": None, "os": "linux", "arch": platform.machine(),
                 "accelerator": "cpu"},
    topology={"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1},
    status="passed", checks_run=["package-test"], evidence_digest=str(digest), evidence_location="package-test",
    issued_at=now_utc(), valid_for=timedelta(hours=1))
out.write_text(json.dumps(statement))
print(digest)
'''


def core_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def closure_size(requirements: list[str]) -> dict[str, int]:
    """Bytes installed per distribution, for the requirements and everything they need (no extras)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    sizes: dict[str, int] = {}
    todo = [Requirement(r).name for r in requirements]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in sizes:
            continue
        dist = md.distribution(name)
        sizes[name] = sum(f.size or 0 for f in dist.files or [])
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sizes


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv holding ckptgate from the wheel alone; returns (venv, wheel, scratch, env)."""
    root = tmp_path_factory.mktemp("package")
    assert not root.resolve().is_relative_to(REPO)
    wheel = build_wheel(root / "dist")
    env_dir = root / "venv"
    py = fresh_venv(env_dir, core_only=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CKPTGATE_", "PYTHON")) and k not in ("VIRTUAL_ENV",)}
    scratch = root / "scratch"
    scratch.mkdir()
    env.update(PATH=f"{env_dir / 'bin'}:/usr/bin:/bin", CKPTGATE_AUDIT_LOG=str(scratch / "decisions.jsonl"),
               HOME=str(scratch))
    proc = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
                           "--no-input", str(wheel)], cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return env_dir, wheel, scratch, env


def run(installed, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env_dir, _, scratch, env = installed
    return subprocess.run([*args], cwd=scratch, env={**env, **(extra_env or {})}, capture_output=True, text=True,
                          timeout=300, check=False)


def ckptgate(installed, *args: str, **kw) -> subprocess.CompletedProcess[str]:
    return run(installed, str(installed[0] / "bin" / "ckptgate"), *args, **kw)


def test_the_wheel_carries_the_policies_their_data_and_schemas(installed):
    names = set(zipfile.ZipFile(installed[1]).namelist())
    for rel in ("ckptgate/_policies/ckptgate/intake/intake.rego",
                "ckptgate/_policies/ckptgate/config/trust/data.json",
                "ckptgate/_policies/schemas/intake/schema.json",
                "ckptgate/_policies/ckptgate/config/qualified/data.json",
                "ckptgate/_policies/schemas/qualified/schema.json",
                "ckptgate/verify/schemas/qualification-v1.schema.json"):
        assert rel in names
    shipped = {n.removeprefix("ckptgate/_policies/") for n in names if n.startswith("ckptgate/_policies/")}
    source = {str(p.relative_to(REPO / "policies")) for p in (REPO / "policies").rglob("*") if p.is_file()}
    assert shipped == source


def test_ckptgate_comes_from_the_venv_not_the_clone(installed):
    env_dir = installed[0]
    proc = run(installed, str(env_dir / "bin" / "python"), "-c",
               "import json, sys, ckptgate, ckptgate._resources as r; "
               "print(json.dumps([ckptgate.__file__, str(r.policies_dir()), str(r.source_root()), sys.path]))")
    assert proc.returncode == 0, proc.stderr
    module, policies, source_root, path = json.loads(proc.stdout)
    assert Path(module).resolve().is_relative_to(env_dir.resolve())
    assert Path(policies).resolve().is_relative_to(env_dir.resolve())
    assert source_root == "None"
    assert not any(p and Path(p).resolve().is_relative_to(REPO) for p in path)


def test_the_core_install_never_imports_torch_or_numpy(installed):
    proc = run(installed, str(installed[0] / "bin" / "python"), "-c", "import numpy")
    assert proc.returncode != 0 and "No module named 'numpy'" in proc.stderr  # the core view is in force


def test_a_real_checkpoint_is_taken_in_with_the_core_install_only(installed):
    try:
        opa = find_opa()
    except EngineUnavailable:
        pytest.skip("no OPA binary here")
    env_dir, _, scratch, _ = installed
    src = scratch / "ckpt"
    shutil.copytree(HF, src)
    keygen = ckptgate(installed, "attest", "keygen", "--out", "key", "--trust-out", "trust.json", "--json")
    assert keygen.returncode == 0, keygen.stderr
    (scratch / "make_statement.py").write_text(MAKE_STATEMENT)
    made = run(installed, str(env_dir / "bin" / "python"), "make_statement.py", str(src), "statement.json")
    assert made.returncode == 0, made.stderr
    signed = ckptgate(installed, "attest", "sign", "--key", "key.pem", "--statement", "statement.json",
                      "--out", "ckpt.intoto.dsse.json", "--json")
    assert signed.returncode == 0, signed.stderr

    # OPA from $CKPTGATE_OPA: the venv knows no clone, so there is no .tools/bin to fall back on.
    with_opa = {"CKPTGATE_OPA": opa}
    no_opa = ckptgate(installed, "intake", "ckpt", "--out", "published", "--attestation", "ckpt.intoto.dsse.json",
                      "--trust", "trust.json", "--json")
    assert no_opa.returncode == ExitCode.ENGINE_UNAVAILABLE
    error = json.loads(no_opa.stdout)["error"]
    assert error["code"] == "engine.opa.not_installed"
    assert all(way in error["advice"] for way in ("--opa-binary", "CKPTGATE_OPA", "PATH", "--opa-url"))
    assert not (scratch / "published").exists()

    cast = ckptgate(installed, "intake", "ckpt", "--out", "published", "--attestation", "ckpt.intoto.dsse.json",
                    "--trust", "trust.json", "--dtype", "BF16", "--json", extra_env=with_opa)
    assert cast.returncode == ExitCode.USAGE
    assert json.loads(cast.stdout)["error"]["code"] == "usage.dtype.numpy_missing"
    assert not (scratch / "published").exists()

    took = ckptgate(installed, "intake", "ckpt", "--out", "published", "--attestation", "ckpt.intoto.dsse.json",
                    "--trust", "trust.json", "--json", extra_env=with_opa)
    assert took.returncode == 0, took.stdout + took.stderr
    receipt = json.loads((scratch / "published" / "ckptgate-receipt.json").read_text())
    assert receipt["decision"]["allow"] is True
    assert receipt["input"]["digest"] == "sha256:" + made.stdout.strip().removeprefix("sha256:")
    for out in receipt["outputs"]:
        assert (scratch / "published" / out["file"]).is_file()


def test_the_core_dependency_set_is_under_80_mb_without_torch(installed):
    requirements = core_requirements(installed[1])
    assert requirements and not any(r.split(">")[0].split("=")[0].strip().replace("-", "_") in EXTRAS_ONLY
                                    for r in requirements)
    sizes = closure_size(requirements)
    assert not set(sizes) & {n.replace("_", "-") for n in EXTRAS_ONLY}
    total = sum(sizes.values())
    print(textwrap.dedent(f"""
        core install: {len(sizes)} distributions, {total / 1e6:.1f} MB
        (largest: {', '.join(f'{n} {s / 1e6:.1f} MB' for n, s in sorted(sizes.items(), key=lambda x: -x[1])[:4])})"""))
    assert total < CORE_BUDGET_BYTES


def _git(repo: Path, env: dict[str, str], *args: str) -> None:
    ident = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
             "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    proc = subprocess.run(["git", "-C", str(repo), *args], env={**env, **ident}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_a_consumer_repository_is_configured_takes_a_checkpoint_in_and_is_checked(installed):
    """In a scratch git repository: `ckptgate init`; the configuration's trust data takes a signed
    safetensors checkpoint in (no --trust); `ckptgate check` runs only the claims lint, passes, then
    fails on an over-claim added to a doc; the hook runs through `pre-commit try-repo` when it can."""
    try:
        opa = find_opa()
    except EngineUnavailable:
        pytest.skip("no OPA binary here")
    env_dir, _, scratch, env = installed
    env = {**env, "CKPTGATE_OPA": opa}
    repo = scratch / "consumer"
    (repo / "docs").mkdir(parents=True)
    sub = repo / "docs"
    (sub / "x.md").write_text("# Models\n\nWe take checkpoints in with ckptgate after checking their signatures.\n")
    _git(repo, env, "init", "-q", "-b", "main")

    def cg(*args: str, cwd: Path = repo) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(env_dir / "bin" / "ckptgate"), *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300, check=False)

    made = cg("init", "--json", cwd=sub)  # from a subdirectory: written at the top of the work tree
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["config"] == str(repo / "ckptgate.toml")
    assert cg("init", "--json").returncode == ExitCode.USAGE  # never overwrites

    # Trust from the configuration: keygen writes trust.json, the configuration names it.
    assert cg("attest", "keygen", "--out", "key", "--trust-out", "trust.json", "--json").returncode == 0
    config = (repo / "ckptgate.toml").read_text().replace('# trust = "trust.json"', 'trust = "trust.json"')
    assert 'trust = "trust.json"\n' in config
    (repo / "ckptgate.toml").write_text(config)
    src = scratch / "consumer-ckpt"
    shutil.copytree(HF, src)
    (scratch / "make_statement.py").write_text(MAKE_STATEMENT)
    statement = subprocess.run([str(env_dir / "bin" / "python"), str(scratch / "make_statement.py"), str(src),
                                str(repo / "statement.json")], cwd=repo, env=env, capture_output=True, text=True,
                               timeout=300, check=False)
    assert statement.returncode == 0, statement.stderr
    assert cg("attest", "sign", "--key", "key.pem", "--statement", "statement.json", "--out", "ckpt.dsse.json",
              "--json").returncode == 0
    # Found in the work tree, the configuration may only restrict: its trust file adds a signer.
    widens = cg("intake", str(src), "--out", str(scratch / "consumer-out"), "--attestation",
                str(repo / "ckpt.dsse.json"), "--json", cwd=sub)
    assert widens.returncode == ExitCode.USAGE, widens.stdout + widens.stderr
    assert json.loads(widens.stdout)["error"]["code"] == "usage.config.widens"
    assert not (scratch / "consumer-out").exists()
    # Committed, and read from git's objects with --base: the reviewed revision may widen.
    (repo / "key.pem").unlink()
    _git(repo, env, "add", "-A")
    _git(repo, env, "commit", "-q", "-m", "adopt ckptgate")
    took = cg("intake", str(src), "--out", str(scratch / "consumer-out"), "--attestation", str(repo / "ckpt.dsse.json"), "--json",
              "--base", "HEAD", cwd=sub)
    assert took.returncode == 0, took.stdout + took.stderr
    receipt = json.loads((scratch / "consumer-out" / "ckptgate-receipt.json").read_text())
    assert receipt["decision"]["allow"] is True
    assert {i["role"]: i["path"] for i in receipt["inputs"]}["trust"] == "HEAD:trust.json"
    # The same intake outside the repository has no configuration, so the bundled trust: the signer is unknown.
    outside = cg("intake", str(src), "--out", str(scratch / "consumer-out2"), "--attestation",
                 str(repo / "ckpt.dsse.json"), "--json", cwd=scratch)
    assert outside.returncode != 0 and not (scratch / "consumer-out2").exists()
    passed = cg("check", "--json", "--sarif", str(scratch / "check.sarif"))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    report = json.loads(passed.stdout)
    assert [c["name"] for c in report["checks"]] == ["claims"] and report["passed"] is True
    assert set(report["skip_reasons"]) == {"policy_tests", "opa_fmt", "regal_lint", "matrix_drift", "gate_drift",
                                              "evidence"}
    assert all(report["skip_reasons"].values())
    notes = json.loads((scratch / "check.sarif").read_text())["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert len(notes) == 6 and all("configuration" in n["message"]["text"] for n in notes)

    with (sub / "x.md").open("a") as f:
        f.write("\nckptgate makes loading any pickle checkpoint safe.\n")
    failed = cg("check", "--json")
    assert failed.returncode == ExitCode.DENIED, failed.stdout + failed.stderr
    codes = {f["code"] for c in json.loads(failed.stdout)["checks"] for f in c["findings"]}
    assert "check.claims.claims_containment_as_proof" in codes
    text = cg("check")
    assert text.returncode == ExitCode.DENIED and "docs/x.md" in text.stdout and "SKIP matrix_drift" in text.stdout


def pre_commit() -> str | None:
    """The pinned pre-commit that bootstrap installs into ``.tools/lint``, else one on PATH."""
    pinned = REPO / ".tools" / "lint" / "bin" / "pre-commit"
    return str(pinned) if pinned.is_file() else shutil.which("pre-commit")


def test_the_pre_commit_hook_runs_check_in_a_consumer_repository(installed):
    """`.pre-commit-hooks.yaml` through `pre-commit try-repo` in a scratch repository: pre-commit
    makes its own environment for the hook (language: python) and installs ckptgate from this
    clone into it with pip, and the hook fails on an over-claim in the repository's docs.

    Offline, as the rest of this module: pip runs with no index, no build isolation and no
    dependencies (``--no-deps``), and the hook environment sees the installed dependencies (and
    hatchling, the build backend) through PYTHONPATH, so the install builds and installs only
    ckptgate itself (about 3 s; resolving the dependencies against that path took pip about 20 s).  A real consumer's pre-commit installs
    the core dependencies from the package index instead (tens of MB with sigstore's, once per
    pre-commit cache); nothing may be downloaded here, so this test does not do that."""
    tool = pre_commit()
    if tool is None:
        pytest.skip("pre-commit is not installed (`python3 scripts/bootstrap.py setup` puts the pinned one in "
                    ".tools/lint), and nothing may be downloaded here: `pre-commit try-repo` not run")
    try:
        opa = find_opa()
    except EngineUnavailable:
        pytest.skip("no OPA binary here")
    _, _, scratch, env = installed
    env = {**env, "CKPTGATE_OPA": opa, "PATH": "/usr/bin:/bin", "PRE_COMMIT_HOME": str(scratch / "pre-commit-home"),
           "PYTHONPATH": os.pathsep.join(dependency_dirs()), "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
           "PIP_NO_DEPS": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    repo = scratch / "hooked"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "x.md").write_text("ckptgate makes loading any pickle checkpoint safe.\n")
    (repo / "ckptgate.toml").write_text('docs = ["docs/*.md"]\n')
    _git(repo, env, "init", "-q", "-b", "main")
    _git(repo, env, "add", "-A")
    _git(repo, env, "commit", "-q", "-m", "x")

    assert shutil.which("ckptgate", path=env["PATH"]) is None  # only the hook's environment has it
    hook = subprocess.run([tool, "try-repo", str(REPO), "ckptgate-check", "--all-files"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert hook.returncode == 1, hook.stdout + hook.stderr
    assert "ckptgate check" in hook.stdout and "Failed" in hook.stdout
    assert "claims_containment_as_proof" in hook.stdout and "docs/x.md" in hook.stdout



def test_the_user_guides_local_pre_commit_hook_runs_the_installed_ckptgate(installed):
    """The user guide's `.pre-commit-config.yaml`, extracted from it: a `repo: local` hook that runs
    the wheel-installed ckptgate with `--base origin/main`; it fails on an over-claim in the docs."""
    tool = pre_commit()
    assert tool is not None, "pre-commit is not installed: run `python3 scripts/bootstrap.py setup`"
    guide = (REPO / "docs" / "user-guide.md").read_text(encoding="utf-8")
    block = re.search(r"test_package.py runs `pre-commit run`[^\n]*\n```yaml\n(.*?)```", guide, re.S)
    assert block is not None, "the user guide's pre-commit configuration block is gone"
    env_dir, _, scratch, env = installed
    env = {**env, "CKPTGATE_OPA": find_opa(), "PRE_COMMIT_HOME": str(scratch / "pre-commit-home-local")}
    repo = scratch / "hooked-local"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "x.md").write_text("# Models\n")
    (repo / "ckptgate.toml").write_text('docs = ["docs/*.md"]\n')
    (repo / ".pre-commit-config.yaml").write_text(block.group(1))
    _git(repo, env, "init", "-q", "-b", "main")
    _git(repo, env, "add", "-A")
    _git(repo, env, "commit", "-q", "-m", "x")
    _git(repo, env, "update-ref", "refs/remotes/origin/main", "HEAD")
    (repo / "docs" / "x.md").write_text("ckptgate makes loading any pickle checkpoint safe.\n")
    hook = subprocess.run([tool, "run", "--all-files"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert hook.returncode == 1, hook.stdout + hook.stderr
    assert "ckptgate check" in hook.stdout and "Failed" in hook.stdout
    assert "claims_containment_as_proof" in hook.stdout and "docs/x.md" in hook.stdout
    (repo / "docs" / "x.md").write_text("# Models\n")
    assert subprocess.run([tool, "run", "--all-files"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300, check=False).returncode == 0

WORKER_LOAD = '''\
import hashlib, json, os, sys
from pathlib import Path

import torch

import ckptgate
from ckptgate.decide.decision import Decision
from ckptgate.digest import Digest
from ckptgate.enforce.containment import openat2, preflight
from ckptgate.enforce.permit import issue_permit
from ckptgate.enforce.worker import OpenedInput, WorkerLimits, run_contained

CONTROLS = ("no_new_privs", "seccomp", "rlimits", "user_ns", "net_ns", "ipc_ns", "openat2")
profile = preflight()
missing = [c for c in CONTROLS if not profile.controls[c]]
if missing:
    print(json.dumps({"missing_controls": missing}))
    sys.exit(0)
root = Path(sys.argv[1])
root.mkdir()
state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 7}
torch.save(state, root / "model.pt")
digest = Digest.parse("sha256:" + "ab" * 32)
# The test-only decision the worker tests use: the framework plane, torch_load permitted.
decision = Decision(allow=True, plane="framework", permitted_loaders=("torch_load",), required_controls=CONTROLS,
                    reasons=(), decision_id="package-test", policy_revision="test", engine="test",
                    fixture_digest=digest)
permit = issue_permit(decision, fixture_digest=digest, loader="torch_load")
dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
opened = OpenedInput(fd=openat2(dirfd, "model.pt"), relpath="model.pt",
                     sha256=hashlib.sha256((root / "model.pt").read_bytes()).hexdigest())
res = run_contained("torch_load_bytes", [opened], permit=permit, profile=profile,
                    limits=WorkerLimits(setup_timeout_s=90.0), timeout_s=120.0, fixture_digest=digest)
tree = res.plans["model.pt"]
data = {tuple(t.header.path): t.data for t in res.tensors}
print(json.dumps({"ckptgate": ckptgate.__file__, "step": tree["step"], "shape": tree["w"]["__tensor__"]["shape"],
                  "bytes_equal": data[("w",)] == state["w"].numpy().tobytes(), "seccomp": res.measured["seccomp"]["mode"],
                  "controls": sorted(c for c, on in res.controls.items() if on)}))
'''


@pytest.fixture(scope="module")
def installed_torch(installed, tmp_path_factory):
    """A second fresh venv: the same wheel with the ``[torch]`` extra, resolved by pip with no index
    against the installed environment (linked by ``.pth``, never downloaded: torch is the shared
    environment's); returns (venv, env)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed, and nothing may be downloaded here")
    _, wheel, scratch, env = installed
    env_dir = tmp_path_factory.mktemp("package-torch") / "venv"
    py = fresh_venv(env_dir)
    proc = subprocess.run([str(py), "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "--no-input",
                           "--find-links", str(wheel.parent), "ckptgate[torch]"], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # every [torch] requirement is already installed
    return env_dir, env


def test_the_torch_extra_loads_a_checkpoint_in_the_contained_worker(installed_torch):
    env_dir, env = installed_torch
    scratch = env_dir.parent
    (scratch / "worker_load.py").write_text(WORKER_LOAD)
    proc = subprocess.run([str(env_dir / "bin" / "python"), "worker_load.py", "ckpt"], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "missing_controls" in got:
        pytest.skip(f"this host lacks containment controls {got['missing_controls']}")
    assert Path(got["ckptgate"]).resolve().is_relative_to(env_dir.resolve())  # the installed package's worker
    assert (got["step"], got["shape"], got["bytes_equal"], got["seccomp"]) == (7, [2, 3], True, "allowlist")
    assert {"no_new_privs", "seccomp", "user_ns", "net_ns", "ipc_ns", "openat2"} <= set(got["controls"])
