"""A small, real repository for evidence tests: the project's policies, register and README, the
``hf_sharded`` fixture, and trust data naming a throwaway key; qualified and with a built matrix and
generated gate."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, generate_keypair, trust_entry

REPO = Path(__file__).resolve().parents[2]
FIXTURE = "hf_sharded"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.invalid", "-c", "user.name=t",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@dataclass(frozen=True, slots=True, kw_only=True)
class EvidenceRepo:
    path: Path
    key: Path
    code_commit: str


def _make_base(root: Path) -> EvidenceRepo:
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(REPO / "policies", repo / "policies", ignore=shutil.ignore_patterns(".opa*", "__pycache__"))
    shutil.copytree(REPO / "tests" / "fixtures" / "data" / FIXTURE, repo / "tests" / "fixtures" / "data" / FIXTURE)
    # Only the register: the project's other docs claim the formats the project's matrix backs,
    # and the claims lint judges them against this repository's own, one-row matrix.
    if (REPO / "docs" / "references.md").is_file():
        (repo / "docs").mkdir()
        shutil.copy(REPO / "docs" / "references.md", repo / "docs" / "references.md")
    if (REPO / "README.md").is_file():
        shutil.copy(REPO / "README.md", repo / "README.md")
    private, public = generate_keypair("ed25519")
    key = root / "qualify.pem"
    key.write_bytes(private)
    key.chmod(0o600)
    entry = trust_entry(public, signer_id="ci-qualification", predicate_types=[QUALIFICATION_PREDICATE_TYPE])
    trust = repo / "policies" / "ckptgate" / "config" / "trust" / "data.json"
    trust.write_text(json.dumps({"signers": [entry]}, indent=2) + "\n")
    git(repo, "init", "-q", "-b", "main")
    code = commit_all(repo, "code")
    return EvidenceRepo(path=repo, key=key, code_commit=code)


@pytest.fixture(scope="session")
def qualified_repo(tmp_path_factory: pytest.TempPathFactory) -> EvidenceRepo:
    """Qualified at the code commit, matrix built, evidence committed (never modify: clone it)."""
    from ckptgate.evidence import matrix
    from ckptgate.evidence.fixtures import find_fixture
    from ckptgate.evidence.qualify import qualify
    from ckptgate.decide.options import EngineOptions, engine_for, load_trust

    base = _make_base(tmp_path_factory.mktemp("evidence"))
    options = EngineOptions(policy_dir=base.path / "policies")
    qualify(base.path, find_fixture(base.path, FIXTURE), "hf-safetensors", key=base.key, options=options)
    trust = load_trust(options)
    with engine_for(options, trust) as engine:
        built = matrix.build(base.path, engine, trust)
    # the generated gate first, as `ckptgate matrix build` does; the matrix names its policy revision
    matrix.write_gate(built, base.path / "policies" / "ckptgate" / "config" / "qualified" / "data.json")
    with engine_for(options, trust) as engine:
        matrix.write(matrix.build(base.path, engine, trust, doc=built.input), base.path / "matrix")
    commit_all(base.path, "evidence: qualification, gate and matrix")
    return base


@pytest.fixture()
def clone(qualified_repo: EvidenceRepo, tmp_path: Path) -> Path:
    """A private clone of the qualified repository that a test may change."""
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(qualified_repo.path), str(dest)], check=True)
    return dest
