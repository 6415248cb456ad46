"""The generated gate (``policies/ckptgate/config/qualified/data.json``): its rows come from passing
qualifications with retained evidence only, never from rows marked supported; ``ckptgate check``
fails when the file and the retained qualifications disagree; the file never moves the candidate
commit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from evidence_helpers import EvidenceRepo, commit_all

from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.evidence import matrix
from ckptgate.evidence.candidate import candidate_commit
from ckptgate.evidence.check import run_check
from ckptgate.evidence.layout import RepoLayout
from ckptgate.verify import AttestationStore, KeySigner
from ckptgate.verify.dsse import sign_statement
from ckptgate.verify.store import statement_of

GATE = Path("policies") / "ckptgate" / "config" / "qualified" / "data.json"
FAST = ("policy_tests", "opa_fmt", "regal_lint")


def _options(repo: Path) -> EngineOptions:
    return EngineOptions(policy_dir=repo / "policies")


def _generated(repo: Path) -> dict[str, Any]:
    options = _options(repo)
    trust = load_trust(options)
    with engine_for(options, trust) as engine:
        return matrix.build(repo, engine, trust).qualified


def _hf(gate: dict[str, Any]) -> list[dict[str, Any]]:
    return list(gate["adapters"]["hf-safetensors"]["rows"])


def _resign(repo: Path, key: Path, change: Any) -> Path:
    """Replace the stored qualification with one whose predicate ``change`` edited, signed by the
    trusted qualification key (the signature verifies: only what it says differs)."""
    [stored] = (repo / "attestations").glob("sha256-*/*qualification*.dsse.json")
    _, statement, _ = statement_of(stored.read_bytes())
    change(statement["predicate"])
    stored.unlink()
    return AttestationStore(repo / "attestations").add(sign_statement(statement, KeySigner.from_pem(key)))


def test_the_committed_gate_is_what_the_qualifications_give(clone: Path) -> None:
    rows = _hf(json.loads((clone / GATE).read_text()))
    assert [(r["format"], r["producer"], r["producer_version"]) for r in rows] == [
        ("hf-sharded-safetensors", "huggingface_hub", "2.4.0")]
    assert rows[0]["topology"]["world_size"] == 1 and rows[0]["evidence"].startswith("attestations/evidence/")
    committed = json.loads((clone / GATE).read_text())
    generated = _generated(clone)
    assert generated["adapters"] == committed["adapters"]
    assert generated["hf_mapping"] == committed["hf_mapping"] == {"qualified": []}  # no mapping fixture here


def test_a_failing_qualification_does_not_enter_the_gate(clone: Path, qualified_repo: EvidenceRepo) -> None:
    _resign(clone, qualified_repo.key, lambda p: p["result"].update(status="failed"))
    assert _hf(_generated(clone)) == []


def test_a_qualification_without_its_retained_evidence_does_not_enter_the_gate(clone: Path) -> None:
    [log] = (clone / "attestations" / "evidence").glob("*/*.log.json")
    log.write_bytes(log.read_bytes().replace(b'"status": "passed"', b'"status": "passed" '))  # other bytes
    assert _hf(_generated(clone)) == []
    log.unlink()
    assert _hf(_generated(clone)) == []


def test_a_new_release_that_passes_qualification_enters_the_gate(clone: Path, qualified_repo: EvidenceRepo) -> None:
    _resign(clone, qualified_repo.key, lambda p: p["producer"].update(version="2.9.0"))
    assert [r["producer_version"] for r in _hf(_generated(clone))] == ["2.9.0"]


def test_check_fails_on_a_hand_edited_gate_and_the_edit_does_not_move_the_candidate(clone: Path) -> None:
    layout = RepoLayout.default(clone)
    before = candidate_commit(clone, exclude=layout.evidence_paths)
    gate = json.loads((clone / GATE).read_text())
    row = dict(gate["adapters"]["hf-safetensors"]["rows"][0], producer_version="9.9.9")
    gate["adapters"]["dcp"]["rows"].append(dict(row, format="dcp-torch-save", producer="torch"))
    (clone / GATE).write_text(json.dumps(gate, indent=2, sort_keys=True) + "\n")
    commit_all(clone, "admit torch 9.9.9 by hand")
    assert candidate_commit(clone, exclude=layout.evidence_paths) == before  # evidence, not code
    report = run_check(clone, options=_options(clone), skip=FAST)
    results = {r.name: r for r in report.results}
    assert not results["gate_drift"].passed and not report.passed
    [finding] = results["gate_drift"].findings
    assert finding.code == "check.gate.drift" and finding.file == GATE.as_posix()
    assert finding.detail is not None
    assert any(line.startswith("-") and '"producer_version": "9.9.9"' in line for line in finding.detail.splitlines())


def test_matrix_build_writes_the_gate_and_check_passes_again(clone: Path) -> None:
    (clone / GATE).write_text('{"adapters": {}, "generated": {"by": "x", "note": "y"}}\n')
    commit_all(clone, "gate emptied by hand")
    assert not {r.name: r for r in run_check(clone, options=_options(clone), skip=FAST).results}["gate_drift"].passed
    res = subprocess.run([sys.executable, "-m", "ckptgate", "matrix", "build", "--repo", str(clone)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"wrote {clone / GATE}" in res.stdout
    commit_all(clone, "evidence: gate regenerated")
    report = run_check(clone, options=_options(clone), skip=FAST)
    assert {r.name: r.passed for r in report.results} == {
        "matrix_drift": True, "gate_drift": True, "evidence": True, "claims": True}
