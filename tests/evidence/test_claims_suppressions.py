"""Claims-lint suppressions (#35): the inline comment and its required reason, ``claims_ignore`` in
``ckptgate.toml``, both as SARIF suppressions counted in the summary, and ``check --base`` reporting
one the change adds as widening; the message naming whose matrix was read; the listed capabilities'
tests (``claims_capability_untested``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptgate.evidence import suppressions
from ckptgate.evidence.check import Report, to_sarif
from ckptgate.evidence.claimfacts import Vocabulary
from ckptgate.evidence.claims import capability_violations
from ckptgate.evidence.findings import CheckFinding, CheckResult

OVER_CLAIM = "ckptgate runs unchanged on macOS."
SKIP = ("--skip", "policy_tests", "--skip", "opa_fmt", "--skip", "regal_lint", "--skip", "evidence",
        "--skip", "matrix_drift")


def _v(code: str, file: str, line: int) -> dict[str, Any]:
    return {"code": code, "severity": "error", "message": "m", "location": {"file": file, "line": line}}


# ------------------------------------------------------------------------------------ the parser
def test_a_comment_on_its_own_line_covers_the_next_paragraph_only() -> None:
    text = ("# T\n\n<!-- ckptgate: allow claims_support_not_in_matrix \u2014 quotes upstream's README -->\n"
            "first line\nsecond line\n\nnext paragraph\n")
    [s], bad = suppressions.inline(text, file="README.md")
    assert bad == []
    assert (s.file, s.line, s.first, s.last, s.code) == ("README.md", 3, 4, 5, "claims_support_not_in_matrix")
    assert s.reason == "quotes upstream's README" and s.kind == "inSource"
    assert s.covers(_v("claims_support_not_in_matrix", "README.md", 5))
    assert not s.covers(_v("claims_support_not_in_matrix", "README.md", 7))  # the next paragraph
    assert not s.covers(_v("claims_containment_as_proof", "README.md", 4))  # another code
    assert not s.covers(_v("claims_support_not_in_matrix", "docs/x.md", 4))  # another file


def test_a_comment_at_a_line_end_covers_its_own_paragraph_and_stops_at_a_list_item() -> None:
    text = ("intro\n\nfirst line\nsecond <!-- ckptgate: allow claims_containment_as_proof -- an example -->\n"
            "third\n- a list item\n")
    [s], _ = suppressions.inline(text, file="d.md")
    assert (s.first, s.last, s.reason) == (3, 5, "an example")
    assert not s.covers(_v("claims_containment_as_proof", "d.md", 1))
    assert not s.covers(_v("claims_containment_as_proof", "d.md", 6))


@pytest.mark.parametrize("dash", ["\u2014", "\u2013", "--", "-", ":"])
def test_each_dash_form_separates_the_reason(dash: str) -> None:
    [s], bad = suppressions.inline(f"<!-- ckptgate: allow claims_surrogate_trust {dash} quoted from R27 -->\nx\n",
                                   file="d.md")
    assert bad == [] and s.reason == "quoted from R27" and s.code == "claims_surrogate_trust"


def test_the_sarif_rule_id_form_of_the_code_is_accepted() -> None:
    [s], _ = suppressions.inline("<!-- ckptgate: allow check.claims.claims_surrogate_trust \u2014 why -->\nx\n",
                                 file="d.md")
    assert s.code == "claims_surrogate_trust"


@pytest.mark.parametrize(("comment", "missing"), [
    ("<!-- ckptgate: allow claims_support_not_in_matrix -->", "a reason"),
    ("<!-- ckptgate: allow claims_support_not_in_matrix \u2014 -->", "a reason"),
    ("<!-- ckptgate: allow claims_support_not_in_matrix \u2014 ok -->", "a reason"),  # too short to be one
    ("<!-- ckptgate: allow \u2014 the lint is wrong here -->", "a claims code"),
    ("<!-- ckptgate: allow MD013 \u2014 long line -->", "a claims code"),
])
def test_a_comment_without_a_reason_or_a_claims_code_suppresses_nothing_and_is_an_error(
        comment: str, missing: str) -> None:
    found, [bad] = suppressions.inline(f"# T\n\n{comment}\n{OVER_CLAIM}\n", file="README.md")
    assert found == []
    assert bad["code"] == "claims_suppression_invalid" and bad["severity"] == "error"
    assert bad["location"] == {"file": "README.md", "line": 3}
    assert f"needs {missing}" in bad["message"]


def test_ignores_match_globs_per_file_and_apply_keeps_the_violation() -> None:
    got = suppressions.ignores([("docs/vendor/*.md", ("claims_vendor_phrasing",), "upstream text")],
                               ["docs/vendor/a.md", "docs/user.md", "README.md"])
    assert [(s.file, s.code, s.kind) for s in got] == [("docs/vendor/a.md", "claims_vendor_phrasing", "external")]
    out = suppressions.apply([_v("claims_vendor_phrasing", "docs/vendor/a.md", 900),
                              _v("claims_vendor_phrasing", "docs/user.md", 1)], got)
    assert out[0]["suppression"] == {"kind": "external", "justification": "upstream text"}
    assert "suppression" not in out[1]
    assert [v["code"] for v in out] == ["claims_vendor_phrasing"] * 2  # nothing dropped


# ------------------------------------------------------------------------------------- SARIF
def test_a_suppressed_finding_is_a_sarif_suppression_and_an_open_one_is_not() -> None:
    quiet = CheckFinding(check="claims", code="claims_support_not_in_matrix", message="m", file="README.md", line=4,
                         suppressed=("inSource", "quotes upstream"))
    loud = CheckFinding(check="claims", code="claims_support_not_in_matrix", message="m", file="README.md", line=9)
    report = Report(results=(CheckResult(name="claims", passed=True, summary="s", findings=(quiet, loud)),),
                    skipped=())
    results = to_sarif(report)["runs"][0]["results"]
    assert results[0]["suppressions"] == [{"kind": "inSource", "justification": "quotes upstream"}]
    assert "suppressions" not in results[1]
    assert quiet.to_json()["suppressed"] == {"kind": "inSource", "justification": "quotes upstream"}


# ------------------------------------------------------------------------- ckptgate check, end to end
def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    return subprocess.run([sys.executable, "-m", "ckptgate", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240, check=False)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd, check=True,
                   capture_output=True)


def _consumer(tmp_path: Path, readme: str, toml: str = 'docs = ["README.md", "docs/*.md"]\n') -> Path:
    root = tmp_path / "acme"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(readme)
    (root / "ckptgate.toml").write_text(toml)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    return root


def _claims(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    [claims] = [r for r in json.loads(out.stdout)["checks"] if r["name"] == "claims"]
    return claims


def test_check_counts_suppressions_and_reports_them_in_sarif(tmp_path: Path) -> None:
    root = _consumer(
        tmp_path,
        f"# Acme\n\n<!-- ckptgate: allow claims_support_not_in_matrix \u2014 a quote of our vendor -->\n{OVER_CLAIM}\n",
        'docs = ["README.md", "docs/*.md"]\n\n[claims_ignore]\n'
        '"docs/vendor*.md" = {codes = ["claims_support_not_in_matrix"], reason = "upstream text, verbatim"}\n')
    (root / "docs" / "vendor-notes.md").write_text(f"# Notes\n\n{OVER_CLAIM}\n")
    out = _run(root, "check", "--json", "--sarif", str(tmp_path / "out.sarif"), *SKIP)
    claims = _claims(out)
    assert out.returncode == 0 and claims["passed"], out.stdout + out.stderr
    assert "0 claim violation" not in claims["summary"] and "2 suppressed" in claims["summary"], claims["summary"]
    kinds = {(f["file"], f["suppressed"]["kind"], f["suppressed"]["justification"]) for f in claims["findings"]}
    assert kinds == {("README.md", "inSource", "a quote of our vendor"),
                     ("docs/vendor-notes.md", "external", "upstream text, verbatim")}
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    supp = [r["suppressions"] for r in sarif["runs"][0]["results"] if r.get("suppressions")]
    assert sorted(s[0]["kind"] for s in supp) == ["external", "inSource"]
    # the same over-claim without the comment fails the check
    (root / "README.md").write_text(f"# Acme\n\n{OVER_CLAIM}\n")
    out = _run(root, "check", "--json", *SKIP)
    assert out.returncode == 3 and not _claims(out)["passed"], out.stdout
    # and a comment without a reason fails it too, suppressing nothing
    (root / "README.md").write_text(f"# Acme\n\n<!-- ckptgate: allow claims_support_not_in_matrix -->\n{OVER_CLAIM}\n")
    codes = {f["code"] for f in _claims(_run(root, "check", "--json", *SKIP))["findings"] if not f["suppressed"]}
    assert codes == {"check.claims.claims_suppression_invalid", "check.claims.claims_support_not_in_matrix"}


def test_check_base_reports_added_suppressions_and_ignores_as_widening(tmp_path: Path) -> None:
    kept = "<!-- ckptgate: allow claims_containment_as_proof \u2014 in the base already -->\n"
    root = _consumer(tmp_path, f"# Acme\n\n{kept}The worker makes a load harmless.\n")
    (root / "README.md").write_text(
        f"# Acme\n\n{kept}The worker makes a load harmless.\n\n"
        f"<!-- ckptgate: allow claims_support_not_in_matrix \u2014 the pull request says so -->\n{OVER_CLAIM}\n")
    (root / "ckptgate.toml").write_text(
        'docs = ["README.md", "docs/*.md"]\n\n[claims_ignore]\n'
        '"docs/*.md" = {codes = ["claims_surrogate_trust"], reason = "the pull request says so"}\n')
    out = _run(root, "check", "--base", "main", "--json", *SKIP)
    [widening] = [r for r in json.loads(out.stdout)["checks"] if r["name"] == "widening"]
    got = sorted((f["code"], f["file"]) for f in widening["findings"])
    assert got == [("widening.claims_ignore_added", "ckptgate.toml"),
                   ("widening.claims_suppression_added", "README.md")], widening
    assert out.returncode == 3 and not widening["passed"]
    assert any("README.md:6" in f["message"] and "claims_support_not_in_matrix" in f["message"]
               for f in widening["findings"])
    # once merged, the same suppressions widen nothing
    _git(root, "commit", "-qam", "merged")
    out = _run(root, "check", "--base", "main", "--json", *SKIP)
    [widening] = [r for r in json.loads(out.stdout)["checks"] if r["name"] == "widening"]
    assert widening["passed"] and widening["findings"] == [], widening


# ------------------------------------------------------------------------------- whose matrix
def test_the_message_says_whose_matrix_was_read(tmp_path: Path) -> None:
    root = _consumer(tmp_path, f"# Acme\n\n{OVER_CLAIM}\n")
    [f] = _claims(_run(root, "check", "--json", *SKIP))["findings"]
    assert "acme has no support matrix" in f["message"], f
    (root / "matrix").mkdir()
    (root / "matrix" / "support.json").write_text(json.dumps({"rows": []}))
    [f] = _claims(_run(root, "check", "--json", *SKIP))["findings"]
    assert "the support matrix read is acme's matrix/support.json, with 0 supported row(s)" in f["message"], f


# ------------------------------------------------------------------------- listed capabilities
def test_each_listed_capability_needs_a_test_that_names_it(tmp_path: Path) -> None:
    (tmp_path / "src" / "ckptgate").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        'def test_shown():\n    """Header validation: each bad header has its code."""\n\n'
        'def test_silent():\n    """Something else."""\n')
    caps = [
        {"name": "header validation", "test": "tests/test_x.py::test_shown"},
        {"name": "revocation", "test": "tests/test_x.py::test_silent"},
        {"name": "licenses", "test": "tests/test_x.py::test_missing"},
        {"name": "backdoors", "test": "tests/test_gone.py::test_x"},
        {"name": "malware", "test": ""},
    ]
    got = {v["evidence"]["text"]: v for v in capability_violations(tmp_path, Vocabulary({"capabilities": caps}))}
    assert {v["code"] for v in got.values()} == {"claims_capability_untested"}
    assert "tests/test_x.py::test_shown" not in got
    assert "does not name 'revocation'" in got["tests/test_x.py::test_silent"]["message"]
    assert "defines no test_missing" in got["tests/test_x.py::test_missing"]["message"]
    assert "test_gone.py does not exist" in got["tests/test_gone.py::test_x"]["message"]
    assert "names no test" in got[""]["message"]
    # a consumer repository (no src/ckptgate) is not asked for ckptgate's tests
    (tmp_path / "src" / "ckptgate").rmdir()
    assert capability_violations(tmp_path, Vocabulary({"capabilities": caps})) == []


def test_the_bundled_capabilities_are_all_shown_by_their_tests() -> None:
    repo = Path(__file__).resolve().parents[2]
    data = json.loads((repo / "policies" / "ckptgate" / "config" / "claims" / "data.json").read_text())
    found = capability_violations(repo, Vocabulary(data), last_run=repo / "no-record.xml")
    # without a record of the last test run, only the warning that nothing confirms they ran
    assert data["capabilities"] and [v["severity"] for v in found] == ["warning"], found


def test_a_capability_test_the_last_run_did_not_pass_is_an_error(tmp_path: Path) -> None:
    """The last test run's JUnit record must show each capability's test collected and passed."""
    (tmp_path / "src" / "ckptgate").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        'def test_a():\n    """Header validation."""\n\ndef test_b():\n    """Revocation."""\n\n'
        'def test_c():\n    """Licenses."""\n')
    caps = [{"name": "header validation", "test": "tests/test_x.py::test_a"},
            {"name": "revocation", "test": "tests/test_x.py::test_b"},
            {"name": "licenses", "test": "tests/test_x.py::test_c"}]
    record = tmp_path / "run.xml"
    record.write_text('<testsuites><testsuite><testcase classname="tests.test_x" name="test_a[p1]"/>'
                      '<testcase classname="tests.test_x" name="test_b"><skipped/></testcase></testsuite></testsuites>')
    got = {v["evidence"]["text"]: v for v in capability_violations(tmp_path, Vocabulary({"capabilities": caps}),
                                                                    last_run=record)}
    assert set(got) == {"tests/test_x.py::test_b", "tests/test_x.py::test_c"}
    assert all(v["severity"] == "error" and "last test run" in v["message"] for v in got.values())


def test_the_test_command_records_the_run_where_check_reads_it() -> None:
    from ckptgate.evidence.claims import LAST_TEST_RUN

    repo = Path(__file__).resolve().parents[2]
    assert f'LAST_TEST_RUN = "{LAST_TEST_RUN}"' in (repo / "scripts" / "bootstrap.py").read_text()
    assert f"/{LAST_TEST_RUN}" in (repo / ".gitignore").read_text().splitlines()


def test_a_suppression_shown_as_code_is_text_not_a_suppression() -> None:
    """Documentation that shows the suppression syntax (in a code span or a code block) suppresses nothing
    and is not an invalid suppression."""
    from ckptgate.evidence import suppressions

    text = ("Write `<!-- ckptgate: allow CODE — reason -->` above the paragraph.\n\n```\n"
            "<!-- ckptgate: allow claims_x — an example -->\n```\n")
    assert suppressions.inline(text, file="d.md") == ([], [])
    real = "<!-- ckptgate: allow claims_support_not_in_matrix — reviewed wording -->\nA sentence.\n"
    found, bad = suppressions.inline(real, file="d.md")
    assert [s.code for s in found] == ["claims_support_not_in_matrix"] and bad == []
