"""``ckptgate check`` fails with a precise message on an over-claim, a deleted attestation and a
policy change without a regenerated matrix; it passes on the qualified repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from evidence_helpers import commit_all

from ckptgate.config import Config
from ckptgate.decide.options import EngineOptions
from ckptgate.evidence import check, check_tools
from ckptgate.evidence.check import parse_opa_test_json, run_check, to_junit, to_sarif

FAST = ("policy_tests", "opa_fmt", "regal_lint")


def _check(repo: Path, skip: tuple[str, ...] = FAST):
    return run_check(repo, options=EngineOptions(policy_dir=repo / "policies"), skip=skip)


def _by_name(report):
    return {r.name: r for r in report.results}


def test_qualified_repository_passes_drift_evidence_and_claims(clone: Path) -> None:
    report = _check(clone)
    results = _by_name(report)
    assert set(results) == {"matrix_drift", "gate_drift", "evidence", "claims"}
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
    only_tools = ("matrix_drift", "gate_drift", "evidence", "claims")
    report = _check(clone, skip=only_tools)
    assert [r.name for r in report.results] == ["policy_tests", "opa_fmt", "regal_lint"]
    assert {r.name: r.passed for r in report.results} == dict.fromkeys(FAST, True), report.results
    broken = clone / "policies" / "ckptgate" / "gates" / "broken_test.rego"
    broken.write_text("package ckptgate.gates_test\n\ntest_fails if {\n    1 == 2\n}\n")
    results = _by_name(_check(clone, skip=only_tools))
    assert not results["policy_tests"].passed and not results["opa_fmt"].passed
    assert [f.code for f in results["policy_tests"].findings] == ["check.policy_tests.failed"]
    failed = results["policy_tests"].findings[0]
    assert failed.file == "policies/ckptgate/gates/broken_test.rego" and failed.line == 3
    assert "ckptgate.gates_test.test_fails" in failed.message
    assert any(f.file and f.file.endswith("broken_test.rego") for f in results["opa_fmt"].findings)


BROKEN = "package ckptgate.gates_test\n\ntest_fails if {\n    1 == 2\n}\n"
SKIPPED = ("regal_lint", "matrix_drift", "gate_drift", "evidence", "claims")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ckptgate", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ), check=False)


def _broken(clone: Path) -> Path:
    path = clone / "policies" / "ckptgate" / "gates" / "broken_test.rego"
    path.write_text(BROKEN)
    return path


def test_check_reports_failures_and_skips_in_json_sarif_and_junit(clone: Path, tmp_path: Path) -> None:
    _broken(clone)
    skips = [a for name in SKIPPED for a in ("--skip", name)]
    res = _cli("check", "--repo", clone, *skips, "--sarif", tmp_path / "r.sarif", "--junit", tmp_path / "r.xml",
               "--json")
    assert res.returncode == 3, res.stderr
    doc = json.loads(res.stdout)
    assert doc["passed"] is False and doc["skipped"] == list(SKIPPED)
    checks = {c["name"]: c for c in doc["checks"]}
    assert set(checks) == {"policy_tests", "opa_fmt"}
    assert all(isinstance(c["seconds"], float) and c["seconds"] >= 0 for c in checks.values())
    [failed] = checks["policy_tests"]["findings"]
    assert (failed["file"], failed["line"]) == ("policies/ckptgate/gates/broken_test.rego", 3)
    [fmt] = checks["opa_fmt"]["findings"]
    assert fmt["file"] == "policies/ckptgate/gates/broken_test.rego" and "broken_test" not in fmt["message"]

    sarif = json.loads((tmp_path / "r.sarif").read_text())
    run = sarif["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert set(rules) == {"check.policy_tests.failed", "check.opa_fmt.unformatted"}
    for rule in rules.values():
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert "#check-" in rule["helpUri"]
    assert rules["check.opa_fmt.unformatted"]["helpUri"].endswith("#check-opa-fmt")
    for r in run["results"]:
        assert len(r["partialFingerprints"]["ckptgateFinding/v1"]) == 32
        assert run["tool"]["driver"]["rules"][r["ruleIndex"]]["id"] == r["ruleId"]
    located = {r["ruleId"]: r["locations"][0]["physicalLocation"] for r in run["results"]}
    assert located["check.policy_tests.failed"]["region"] == {"startLine": 3}
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert [n["message"]["text"].split()[1] for n in notes] == list(SKIPPED)

    junit = ET.fromstring((tmp_path / "r.xml").read_bytes())
    suite = junit.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("7", "2", "5")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert all(float(c.get("time")) >= 0 for c in cases.values())
    assert cases["policy_tests"].find("failure") is not None
    assert all(cases[n].find("skipped") is not None for n in SKIPPED)


def test_check_format_github_emits_workflow_annotations(clone: Path) -> None:
    _broken(clone)
    skips = [a for name in SKIPPED for a in ("--skip", name)]
    res = _cli("check", "--repo", clone, *skips, "--format", "github")
    assert res.returncode == 3, res.stderr
    lines = res.stdout.splitlines()
    assert ("::error file=policies/ckptgate/gates/broken_test.rego,line=3,title=check.policy_tests.failed::"
            "policy test ckptgate.gates_test.test_fails failed") in lines
    assert any(line.startswith("::error file=policies/ckptgate/gates/broken_test.rego,title=check.opa_fmt")
               for line in lines)
    assert [line for line in lines if line.startswith("::notice")] == [
        f"::notice title=check.skipped::check {n} skipped (--skip {n})" for n in SKIPPED]
    clash = _cli("check", "--repo", clone, *skips, "--format", "github", "--json")
    assert clash.returncode == 2 and json.loads(clash.stdout)["error"]["code"] == "usage.conflicting_options"


def test_text_output_names_the_unformatted_path_once(clone: Path) -> None:
    _broken(clone)
    skips = [a for name in ("policy_tests", *SKIPPED) for a in ("--skip", name)]
    res = _cli("check", "--repo", clone, *skips)
    assert res.returncode == 3
    assert res.stdout.count("broken_test.rego") == 1, res.stdout
    assert "SKIP policy_tests" in " ".join(res.stdout.split())


def test_opa_test_json_parsing_names_errors_and_ignores_passes(tmp_path: Path) -> None:
    out = json.dumps([
        {"location": {"file": "a_test.rego", "row": 7, "col": 1}, "package": "data.x_test", "name": "test_ok"},
        {"location": {"file": "a_test.rego", "row": 9, "col": 1}, "package": "data.x_test", "name": "test_err",
         "error": {"code": "eval_conflict_error", "message": "functions must not produce multiple outputs"}},
    ])
    [f] = parse_opa_test_json(out, tmp_path / "policies", tmp_path)
    assert (f.code, f.file, f.line) == ("check.policy_tests.error", "policies/a_test.rego", 9)
    assert "multiple outputs" in f.message
    assert parse_opa_test_json("1 error occurred: parse error", tmp_path, tmp_path) == []


def test_sarif_validates_against_the_sarif_2_1_0_schema() -> None:
    """Against the SARIF 2.1.0 JSON schema when a local copy is named (no download at test time)."""
    import pytest

    from ckptgate.evidence.check import CheckFinding, CheckResult, Report

    doc = to_sarif(Report(results=(CheckResult(name="policy_tests", passed=False, summary="1 problem(s)", findings=(
        CheckFinding(check="policy_tests", code="check.policy_tests.failed", message="policy test x failed",
                     file="policies/x_test.rego", line=3),
        CheckFinding(check="policy_tests", code="check.policy_tests.tool_missing", message="opa is not installed"))),),
        skipped=("claims",)))
    schema_path = os.environ.get("CKPTGATE_SARIF_SCHEMA")
    if not schema_path:
        pytest.skip("set CKPTGATE_SARIF_SCHEMA to a local sarif-schema-2.1.0.json to validate against it")
    import jsonschema

    schema = json.loads(Path(schema_path).read_text())
    jsonschema.Draft4Validator(schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER).validate(doc)


def test_run_check_tests_the_configured_policies_when_the_options_name_none(tmp_path: Path, monkeypatch) -> None:
    """An API caller's configuration names policies and its options do not: the policy tools run in
    the configured policies, never in the current directory (found by mypy: a ``None`` cwd)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "p.rego").write_text("package p\n")
    cwds: list[Path] = []
    staged: list[list[str]] = []

    def fake_run(cmd, cwd):
        if cmd[1] == "capabilities":  # opa test runs without the network builtins (check_tools.NETWORK_BUILTINS)
            return 0, '{"builtins": [{"name": "http.send"}]}'
        cwds.append(cwd)
        staged.append(sorted(p.name for p in Path(cwd).rglob("*.rego")))
        return 0, "[]"

    monkeypatch.setattr(check_tools, "_run", fake_run)
    monkeypatch.setattr(check_tools, "find_tool", lambda name, repo: name)
    monkeypatch.setattr(check_tools, "tool_version", lambda exe: check_tools.GO_TOOLS[exe].version)
    monkeypatch.setattr(check, "candidate_commit", lambda repo, exclude=(): "0" * 40)
    config = Config(root=tmp_path, policies=policies)
    report = run_check(tmp_path, options=EngineOptions(), config=config,
                       skip=("matrix_drift", "gate_drift", "evidence", "claims"))
    assert [r.name for r in report.results] == ["policy_tests", "opa_fmt", "regal_lint"]
    # each tool runs on a staged copy of the configured policies, outside the repository (never the cwd)
    assert not any(c.is_relative_to(tmp_path) or c == Path.cwd() for c in cwds)
    assert staged == [["p.rego"]] * 3


def _fake_tool(bin_dir: Path, name: str, version: str, log: Path) -> Path:
    """A fake ``opa``/``regal``: reports ``version`` and records every other call."""
    exe = bin_dir / name
    exe.write_text(f"""#!/bin/sh
if [ "$1" = version ]; then echo "Version: {version}"; exit 0; fi
if [ "$1" = capabilities ]; then echo '{{"builtins": [{{"name": "http.send"}}]}}'; exit 0; fi
echo "{name} $*" >> "{log}"
echo '[]'
""")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize(("opa", "regal", "ran"), [
    ("1.22.3", "0.38.1", ["policy_tests", "opa_fmt", "regal_lint"]),
    ("1.23.0", "0.37.0", ["policy_tests"]),  # opa test runs on any supported OPA; fmt and Regal do not
])
def test_opa_fmt_and_regal_run_only_at_the_pinned_versions(tmp_path: Path, monkeypatch, opa, regal, ran) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("CKPTGATE_OPA", str(_fake_tool(tmp_path, "opa", opa, log)))
    monkeypatch.setenv("CKPTGATE_REGAL", str(_fake_tool(tmp_path, "regal", regal, log)))
    monkeypatch.setattr(check, "candidate_commit", lambda repo, exclude=(): "0" * 40)
    report = run_check(tmp_path, options=EngineOptions(), config=Config(root=tmp_path, policies=policies),
                       skip=("matrix_drift", "gate_drift", "evidence", "claims"))
    assert [r.name for r in report.results] == ran
    assert report.passed
    calls = [line.split()[:2] for line in log.read_text().splitlines()]
    assert calls == [["opa", "test"], ["opa", "fmt"], ["regal", "lint"]][: len(ran)]
    reasons = report.to_json()["skip_reasons"]
    if len(ran) == 3:
        assert set(reasons) == {"matrix_drift", "gate_drift", "evidence", "claims"}
    else:
        assert report.skipped == ("opa_fmt", "regal_lint", "matrix_drift", "gate_drift", "evidence", "claims")
        assert "1.23.0" in reasons["opa_fmt"] and "not the pinned 1.22.3" in reasons["opa_fmt"]
        assert "0.37.0" in reasons["regal_lint"] and "not the pinned 0.38.1" in reasons["regal_lint"]


def test_a_tool_that_reports_no_version_is_skipped_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    broken = tmp_path / "regal"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CKPTGATE_REGAL", str(broken))
    assert "an unknown version, not the pinned 0.38.1" in (check.version_skip_reason("regal_lint", tmp_path) or "")


def test_check_runs_the_opa_binary_named_by_opa_binary(tmp_path: Path, monkeypatch) -> None:
    """`ckptgate check --opa-binary PATH` runs `opa test` and `opa fmt` with PATH, as the engine
    does, not with $CKPTGATE_OPA or the one on PATH."""
    from ckptgate.decide import bundle

    named = tmp_path / "named" / "opa"
    monkeypatch.setenv("CKPTGATE_OPA", str(tmp_path / "env" / "opa"))
    monkeypatch.setattr(bundle, "_selected_opa", None)
    assert check.find_tool("opa", tmp_path) == str(tmp_path / "env" / "opa")
    bundle.select_opa_binary(named)
    assert check.find_tool("opa", tmp_path) == str(named)
    assert check.find_tool("regal", tmp_path) != str(named)
