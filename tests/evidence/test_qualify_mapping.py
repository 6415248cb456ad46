"""A mapping qualification (issue #39): a fixture whose expected output is Megatron's own logits is
qualified through intake --hf-config; the signed statement's checks_run names the logits check, and
``matrix build`` generates the (family, release, topology) row of the mapping from it, never a row
of the name-preserving gate.  A qualification whose logits do not match is signed as failed and
generates no row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from evidence_helpers import REPO, commit_all, git

from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.evidence import matrix
from ckptgate.evidence.errors import QualificationFailed
from ckptgate.evidence.fixtures import find_fixture
from ckptgate.evidence.logits import LOGITS_CHECK
from ckptgate.evidence.qualify import qualify
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, AttestationStore, generate_keypair, trust_entry
from ckptgate.verify.store import statement_of

FIXTURE = "megatron_hf_mixtral_ep2"
#: fixture -> (family, release, tp, pp, ep) of the row its passing qualification generates: 0.16.1 at ep2,
#: and 0.19.2 (common state in the .distcp files) at pp2 with Qwen3's embeddings tied across stages
PASSING = {FIXTURE: ("mixtral", "0.16.1", 1, 1, 2), "megatron_hf_qwen3_pp2_mc0192": ("qwen3", "0.19.2", 1, 2, 1)}


def _repo(root: Path, *, perturb: bool = False, fixture: str = FIXTURE) -> tuple[Path, Path]:
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(REPO / "policies", repo / "policies", ignore=shutil.ignore_patterns(".opa*", "__pycache__"))
    fx = repo / "tests" / "fixtures" / "data" / fixture
    shutil.copytree(REPO / "tests" / "fixtures" / "data" / fixture, fx)
    if perturb:  # logits 1e-3 off: the fixture's record is consistent, the check must fail
        import hashlib

        from safetensors.torch import load_file, save_file

        want = load_file(str(fx / "expected.safetensors"))
        want["logits"] = want["logits"] + 1e-3
        save_file(want, str(fx / "expected.safetensors"), metadata={"ckptgate_fixture": "megatron-logits"})
        meta = json.loads((fx / "meta.json").read_text())
        meta["expected"]["sha256"] = hashlib.sha256((fx / "expected.safetensors").read_bytes()).hexdigest()
        (fx / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    private, public = generate_keypair("ed25519")
    key = root / "qualify.pem"
    key.write_bytes(private)
    key.chmod(0o600)
    entry = trust_entry(public, signer_id="ci-qualification", predicate_types=[QUALIFICATION_PREDICATE_TYPE])
    (repo / "policies" / "ckptgate" / "config" / "trust" / "data.json").write_text(
        json.dumps({"signers": [entry]}, indent=2) + "\n")
    git(repo, "init", "-q", "-b", "main")
    commit_all(repo, "code")
    return repo, key


def _gate(repo: Path) -> dict:
    options = EngineOptions(policy_dir=repo / "policies")
    trust = load_trust(options)
    with engine_for(options, trust) as engine:
        return matrix.build(repo, engine, trust).qualified


@pytest.mark.parametrize("fixture", sorted(PASSING))
def test_a_passing_mapping_qualification_generates_its_mapping_row(fixture: str, tmp_path: Path) -> None:
    family, release, tp, pp, ep = PASSING[fixture]
    repo, key = _repo(tmp_path, fixture=fixture)
    options = EngineOptions(policy_dir=repo / "policies")
    result = qualify(repo, find_fixture(repo, fixture), "megatron-torch-dist", key=key, options=options)
    assert result.status == "passed"
    _, statement, _ = statement_of(result.attestation.read_bytes())
    pred = statement["predicate"]
    assert LOGITS_CHECK in pred["result"]["checks_run"] and "hf_parameters" in pred["result"]["checks_run"]
    assert (pred["producer"], pred["topology"]["tp"], pred["topology"]["pp"], pred["topology"]["ep"]) == (
        {"name": "megatron-core", "version": release}, tp, pp, ep)
    log = json.loads(result.log.read_text())
    assert log["mapping"]["family"] == family
    assert log["mapping"]["logits"]["max_abs_delta"] <= 1e-4 and log["mapping"]["logits"]["passed"]
    gate = _gate(repo)
    [row] = gate["hf_mapping"]["qualified"]
    assert {k: row[k] for k in ("family", "release", "tp", "pp", "ep")} == {
        "family": family, "release": release, "tp": tp, "pp": pp, "ep": ep}
    assert row["max_abs_delta"] == log["mapping"]["logits"]["max_abs_delta"]
    assert gate["adapters"]["megatron-torch-dist"]["rows"] == []  # not a name-preserving row


def test_a_mapping_whose_logits_differ_is_signed_failed_and_generates_no_row(tmp_path: Path) -> None:
    repo, key = _repo(tmp_path, perturb=True)
    options = EngineOptions(policy_dir=repo / "policies")
    with pytest.raises(QualificationFailed) as e:
        qualify(repo, find_fixture(repo, FIXTURE), "megatron-torch-dist", key=key, options=options)
    assert LOGITS_CHECK in e.value.message
    [stored] = AttestationStore(repo / "attestations").iter()
    _, statement, _ = statement_of(stored.read_bytes())
    assert statement["predicate"]["result"]["status"] == "failed"
    assert _gate(repo)["hf_mapping"]["qualified"] == []
