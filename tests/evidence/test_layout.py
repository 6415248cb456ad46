"""A consumer repository that names its own evidence locations: ``qualify``, ``matrix build`` and
``check`` use them (never ckptgate's own ``attestations/``, ``matrix/``, ``tests/fixtures/data``), a
policy-data overlay sets the freshness window signed into the statement, and a location outside the
configuration's directory is refused with a typed ``usage.config.*`` error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode
from ckptgate.evidence.layout import RepoLayout, as_layout
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, generate_keypair, trust_entry
from ckptgate.verify.store import statement_of
from evidence_helpers import FIXTURE, REPO, commit_all, git

CONFIG = """\
trust = "trust.json"
policy_data = "ckptgate-data.json"
docs = ["README.md"]
attestations = "evidence/att"
matrix = "site/matrix"
fixtures = "data/fx"
"""
FAST = ("--skip", "policy_tests", "--skip", "opa_fmt", "--skip", "regal_lint")


def ckptgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "ckptgate", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600, check=False)


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(repository, signing key, code commit): no policies/ of its own, evidence at configured paths."""
    root = tmp_path_factory.mktemp("consumer")
    repo = root / "repo"
    shutil.copytree(REPO / "tests" / "fixtures" / "data" / FIXTURE, repo / "data" / "fx" / FIXTURE)
    private, public = generate_keypair("ed25519")
    key = root / "qualify.pem"
    key.write_bytes(private)
    key.chmod(0o600)
    entry = trust_entry(public, signer_id="ci-qualification", predicate_types=[QUALIFICATION_PREDICATE_TYPE])
    (repo / "trust.json").write_text(json.dumps({"signers": [entry]}, indent=2) + "\n")
    (repo / "ckptgate-data.json").write_text(json.dumps({"freshness": {"max_age_seconds": 86400}}) + "\n")
    (repo / "ckptgate.toml").write_text(CONFIG)
    (repo / "README.md").write_text("# A training repository\n\nIt gates its checkpoints.\n")
    git(repo, "init", "-q", "-b", "main")
    return repo, key, commit_all(repo, "code")


def test_a_plain_path_is_ckptgates_own_layout(tmp_path: Path) -> None:
    layout = as_layout(tmp_path)
    root = tmp_path.resolve()
    assert layout == RepoLayout.default(tmp_path)
    assert (layout.attestations, layout.matrix, layout.fixtures) == (
        root / "attestations", root / "matrix", root / "tests" / "fixtures" / "data")
    assert layout.evidence_paths == ("attestations", "matrix") and layout.policies is None
    assert as_layout(layout) is layout


def test_qualify_matrix_and_check_use_the_configured_locations(consumer: tuple[Path, Path, str]) -> None:
    repo, key, code = consumer
    q = ckptgate(repo, "qualify", "--adapter", "hf-safetensors", "--fixture", FIXTURE, "--key", str(key), "--json")
    assert q.returncode == 0, q.stdout + q.stderr
    result = json.loads(q.stdout)
    att, log = Path(result["attestation"]), Path(result["log"])
    assert att.resolve().is_relative_to(repo.resolve() / "evidence" / "att")
    assert log.resolve().is_relative_to(repo.resolve() / "evidence" / "att" / "evidence")
    assert result["candidate_commit"] == code
    statement = statement_of(att.read_bytes())[1]
    assert statement["predicate"]["result"]["evidence"]["location"].startswith("evidence/att/evidence/")
    validity = statement["predicate"]["validity"]
    issued, expires = (datetime.fromisoformat(validity[k].replace("Z", "+00:00")) for k in ("issued_at", "expires_at"))
    assert (expires - issued).total_seconds() == 86400  # the overlay's freshness, not the bundled 180 days
    commit_all(repo, "evidence: qualification")

    built = ckptgate(repo, "matrix", "build", "--json")
    assert built.returncode == 0, built.stdout + built.stderr
    assert sorted(Path(p).name for p in json.loads(built.stdout)["written"]) == ["SUPPORT.md", "index.html",
                                                                              "support.json"]
    support = json.loads((repo / "site" / "matrix" / "support.json").read_text())
    [row] = [r for r in support["rows"] if r.get("adapter") == "hf-safetensors"]
    assert row["status"] == "supported" and row["source"].startswith("evidence/att/")
    assert not (repo / "matrix").exists() and not (repo / "attestations").exists()
    # An evidence commit (evidence/att only) does not move the candidate: the matrix names the code commit.
    assert support["generated"]["candidate_commit"] == code
    commit_all(repo, "evidence: matrix")

    passed = ckptgate(repo, "check", *FAST, "--json")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    results = {r["name"]: r for r in json.loads(passed.stdout)["checks"]}
    assert set(results) == {"matrix_drift", "evidence", "claims"}
    assert json.loads(passed.stdout)["candidate_commit"] == code
    assert results["matrix_drift"]["summary"] == "site/matrix/ matches a fresh build"

    att.unlink()
    failed = ckptgate(repo, "check", *FAST, "--json")
    assert failed.returncode == 3, failed.stdout + failed.stderr
    results = {r["name"]: r for r in json.loads(failed.stdout)["checks"]}
    assert not results["matrix_drift"]["passed"] and not results["evidence"]["passed"]
    assert {f["file"] for f in results["matrix_drift"]["findings"]} <= {
        "site/matrix/SUPPORT.md", "site/matrix/support.json", "site/matrix/index.html"}
    missing = [f for f in results["evidence"]["findings"] if f["code"] == "check.evidence.attestation_missing"]
    assert missing and missing[0]["file"] == att.resolve().relative_to(repo.resolve()).as_posix()
    git(repo, "checkout", "--", ".")


@pytest.mark.parametrize("line", ['attestations = "../att"', 'matrix = "/srv/matrix"\nfixtures = "data/fx"',
                                  'fixtures = "data/../../fx"'])
def test_a_location_outside_the_configuration_directory_is_refused(tmp_path: Path, line: str) -> None:
    repo = tmp_path / "repo"
    (repo / "data" / "fx").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "ckptgate.toml").write_text(line + "\n")
    for args in (("matrix", "build", "--json"), ("qualify", "--all", "--json")):
        out = ckptgate(repo, *args)
        assert out.returncode == ExitCode.USAGE, out.stdout + out.stderr
        assert json.loads(out.stdout)["error"]["code"] == "usage.config.path"
