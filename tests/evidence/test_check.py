"""``ckptgate check`` fails with a precise message on an over-claim, a deleted attestation and a
policy change without a regenerated matrix; it passes on the qualified repository."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from ckptgate.evidence.check import run_check, to_junit, to_sarif
from ckptgate.pipeline import EngineOptions
from evidence_helpers import commit_all

FAST = ("policy_tests", "opa_fmt", "regal_lint")


def _check(repo: Path, skip: tuple[str, ...] = FAST):
    return run_check(repo, options=EngineOptions(policy_dir=repo / "policies"), skip=skip)


def _by_name(report):
    return {r.name: r for r in report.results}


def test_qualified_repository_passes_drift_evidence_and_claims(clone: Path) -> None:
    report = _check(clone)
    results = _by_name(report)
    assert set(results) == {"matrix_drift", "evidence", "claims"}
    failing = {n: [f.message for f in r.findings] for n, r in results.items() if not r.passed}
    assert failing == {}
    assert report.passed


def test_over_claiming_doc_fails_claims(clone: Path) -> None:
    doc = clone / "docs" / "overclaim.md"
    doc.parent.mkdir(exist_ok=True)
    doc.write_text("# Loading\n\nA matching checksum is sufficient to trust a checkpoint.\n\n"
                   "ckptgate supports Megatron torch_dist checkpoints.\n")
    commit_all(clone, "docs: over-claim")
    claims = _by_name(_check(clone))["claims"]
    assert not claims.passed
    got = {(f.code, f.file, f.line) for f in claims.findings}
    assert ("check.claims.claims_surrogate_trust", "docs/overclaim.md", 3) in got
    assert ("check.claims.claims_support_not_in_matrix", "docs/overclaim.md", 5) in got


def test_deleted_attestation_fails_drift_and_evidence(clone: Path) -> None:
    [att] = list((clone / "attestations").glob("sha256-*/*.dsse.json"))
    att.unlink()
    commit_all(clone, "delete the attestation")
    results = _by_name(_check(clone))
    assert not results["matrix_drift"].passed
    assert not results["evidence"].passed
    rel = att.relative_to(clone).as_posix()
    [missing] = [f for f in results["evidence"].findings if f.code == "check.evidence.attestation_missing"]
    assert rel in missing.message and missing.file == rel


def test_policy_change_without_regenerating_fails_with_the_diff(clone: Path) -> None:
    gates = clone / "policies" / "ckptgate" / "config" / "gates" / "data.json"
    doc = json.loads(gates.read_text())
    doc["adapters"]["hf-safetensors"]["note"] = "changed without regenerating the matrix"
    gates.write_text(json.dumps(doc, indent=2) + "\n")
    commit_all(clone, "policy change")
    report = _check(clone)
    drift = _by_name(report)["matrix_drift"]
    assert not drift.passed
    names = {f.file for f in drift.findings}
    assert names == {"matrix/SUPPORT.md", "matrix/support.json", "matrix/index.html"}
    md = next(f for f in drift.findings if f.file == "matrix/SUPPORT.md")
    assert "-> Policy revision:" in md.detail and "+> Policy revision:" in md.detail
    sarif = to_sarif(report)
    assert sarif["version"] == "2.1.0"
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} >= {"check.matrix.drift"}
    junit = ET.fromstring(to_junit(report))
    case = junit.find(".//testcase[@name='matrix_drift']")
    assert case is not None and case.find("failure") is not None


def test_policy_tools_pass_on_the_policies_and_fail_on_a_broken_test_or_format(clone: Path) -> None:
    only_tools = ("matrix_drift", "evidence", "claims")
    report = _check(clone, skip=only_tools)
    assert [r.name for r in report.results] == ["policy_tests", "opa_fmt", "regal_lint"]
    assert {r.name: r.passed for r in report.results} == dict.fromkeys(FAST, True), report.results
    broken = clone / "policies" / "ckptgate" / "gates" / "broken_test.rego"
    broken.write_text("package ckptgate.gates_test\n\ntest_fails if {\n    1 == 2\n}\n")
    results = _by_name(_check(clone, skip=only_tools))
    assert not results["policy_tests"].passed and not results["opa_fmt"].passed
    assert [f.code for f in results["policy_tests"].findings] == ["check.policy_tests.failed"]
    assert any(f.file and f.file.endswith("broken_test.rego") for f in results["opa_fmt"].findings)
