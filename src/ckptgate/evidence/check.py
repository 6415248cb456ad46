"""``ckptgate check``: the pre-merge gate.

Checks, in order: policy unit tests (``opa test``), ``opa fmt``, ``regal lint``, matrix drift
(regenerate and diff against the committed ``matrix/``), retained evidence for every supported row
(the attestation and the result log exist and the log's digest matches), and the claims lint.
Every failure is a :class:`Finding` with a stable code; reports render as text, JSON, SARIF 2.1.0
and JUnit XML.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from ckptgate import __version__
from ckptgate.errors import Error

CHECK_NAMES = ("policy_tests", "opa_fmt", "regal_lint", "matrix_drift", "evidence", "claims")
TOOL_TIMEOUT_S = 300
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One failure: which check, a stable code, a message, and where (file/line) when known."""

    check: str
    code: str
    message: str
    file: str | None = None
    line: int | None = None
    detail: str | None = None
    severity: str = "error"

    def __post_init__(self) -> None:
        if self.check not in CHECK_NAMES or not self.code or not self.message:
            raise ValueError(f"bad finding {self.check!r}/{self.code!r}")
        if self.severity not in ("error", "warning"):
            raise ValueError(f"bad severity {self.severity!r}")

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "code": self.code, "message": self.message, "file": self.file,
                "line": self.line, "detail": self.detail, "severity": self.severity}


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    name: str
    passed: bool
    summary: str
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    results: tuple[CheckResult, ...]
    candidate_commit: str | None = None
    policy_revision: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.results for f in r.findings]

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "candidate_commit": self.candidate_commit,
                "policy_revision": self.policy_revision,
                "checks": [{"name": r.name, "passed": r.passed, "summary": r.summary,
                            "findings": [f.to_json() for f in r.findings]} for r in self.results]}


# --------------------------------------------------------------------------------------------- tools
def find_tool(name: str, repo: Path) -> str | None:
    """``$CKPTGATE_<NAME>``, else ``name`` on PATH, else the pinned ``REPO/.tools/bin`` (or the
    development clone's): the order :func:`ckptgate.decide.bundle.find_opa` uses, so ``opa test``
    runs the binary the engine runs."""
    from ckptgate._resources import clone_tool  # noqa: PLC0415

    explicit = os.environ.get(f"CKPTGATE_{name.upper()}")
    if explicit:
        return explicit
    found = shutil.which(name)
    if found:
        return found
    p = repo / ".tools" / "bin" / name
    if p.exists():
        return str(p)
    local = clone_tool(name)
    return str(local) if local is not None else None


def _run(cmd: Sequence[str], cwd: Path) -> tuple[int, str]:
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        return 124, f"{cmd[0]} did not finish in {TOOL_TIMEOUT_S} s"
    except OSError as e:
        return 127, f"cannot run {cmd[0]}: {e.strerror}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _tool_check(name: str, tool: str, args: Sequence[str], policies: Path, repo: Path,
                parse: Callable[[str], list[Finding]]) -> CheckResult:
    exe = find_tool(tool, repo)
    if exe is None:
        return CheckResult(name=name, passed=False, summary=f"{tool} not found", findings=(
            Finding(check=name, code=f"check.{name}.tool_missing",
                    message=f"{tool} is not installed (set CKPTGATE_{tool.upper()} or run scripts/bootstrap.py setup)"),))
    rc, out = _run([exe, *args], cwd=policies)
    if rc == 0:
        return CheckResult(name=name, passed=True, summary=f"{tool} {' '.join(args)}: ok")
    findings = parse(out) or [Finding(check=name, code=f"check.{name}.failed",
                                      message=f"{tool} {' '.join(args)} exited {rc}", detail=out[-4000:])]
    return CheckResult(name=name, passed=False, summary=f"{len(findings)} problem(s)", findings=tuple(findings))


def _rel_policy(policies: Path, repo: Path, path: str) -> str:
    p = (policies / path).resolve()
    try:
        return p.relative_to(repo.resolve()).as_posix()
    except ValueError:
        return path


def policy_tests(policies: Path, repo: Path) -> CheckResult:
    def parse(out: str) -> list[Finding]:
        found = []
        for line in out.splitlines():
            if line.rstrip().endswith(("FAIL", "ERROR")) or ": FAIL (" in line or ": ERROR (" in line:
                found.append(Finding(check="policy_tests", code="check.policy_tests.failed",
                                     message=f"policy test failed: {line.strip()}"))
        return found
    return _tool_check("policy_tests", "opa", ["test", "."], policies, repo, parse)


def opa_fmt(policies: Path, repo: Path) -> CheckResult:
    def parse(out: str) -> list[Finding]:
        return [Finding(check="opa_fmt", code="check.opa_fmt.unformatted",
                        message=f"{line.strip()} is not formatted (run opa fmt -w)",
                        file=_rel_policy(policies, repo, line.strip()))
                for line in out.splitlines() if line.strip().endswith(".rego")]
    return _tool_check("opa_fmt", "opa", ["fmt", "--fail", "-l", "."], policies, repo, parse)


def regal_lint(policies: Path, repo: Path) -> CheckResult:
    def parse(out: str) -> list[Finding]:
        try:
            doc = json.loads(out[out.find("{"):]) if "{" in out else {}
        except ValueError:
            return []
        found = []
        for v in doc.get("violations") or []:
            loc = v.get("location") or {}
            found.append(Finding(check="regal_lint", code=f"check.regal_lint.{v.get('title', 'violation')}",
                                 message=f"{v.get('title')}: {v.get('description')}",
                                 file=_rel_policy(policies, repo, str(loc.get("file", ""))) if loc.get("file") else None,
                                 line=loc.get("row")))
        return found
    return _tool_check("regal_lint", "regal", ["lint", "--format", "json", "."], policies, repo, parse)


# --------------------------------------------------------------------------------------------- matrix
def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def evidence_findings(repo: Path, rows: Sequence[dict[str, Any]], *, origin: str) -> list[Finding]:
    """For every supported row: its attestation and result log exist and the log digest matches."""
    from ckptgate.evidence.matrix import evidence_location

    out: list[Finding] = []
    for row in rows:
        if row.get("status") != "supported":
            continue
        who = f"{row.get('adapter')} on {row.get('fixture_digest')} ({origin})"
        source = row.get("source")
        if not isinstance(source, str) or not (repo / source).is_file():
            out.append(Finding(check="evidence", code="check.evidence.attestation_missing",
                               message=f"supported row {who}: attestation {source} does not exist",
                               file=source if isinstance(source, str) else None))
        loc = evidence_location(row)
        ev = row.get("evidence") if isinstance(row.get("evidence"), dict) else {}
        if loc is None or not (repo / loc).is_file():
            out.append(Finding(check="evidence", code="check.evidence.log_missing",
                               message=f"supported row {who}: retained result log {loc} does not exist", file=loc))
        elif _sha256(repo / loc) != ev.get("digest"):
            out.append(Finding(check="evidence", code="check.evidence.log_digest_mismatch",
                               message=f"supported row {who}: {loc} has digest {_sha256(repo / loc)}, "
                                       f"the attestation names {ev.get('digest')}", file=loc))
    return out


def run_check(repo: Path, *, options: Any = None, skip: Sequence[str] = ()) -> Report:
    """Run every check (except ``skip``) and return the report; never raises for a failing check."""
    from ckptgate.evidence import claims, matrix
    from ckptgate.evidence.candidate import candidate_commit
    from ckptgate.pipeline import EngineOptions, engine_for, load_trust

    repo = repo.resolve()
    options = (options or EngineOptions()).in_repo(repo)
    policies = options.policy_dir
    results: list[CheckResult] = []
    for name, fn in (("policy_tests", policy_tests), ("opa_fmt", opa_fmt), ("regal_lint", regal_lint)):
        if name not in skip:
            results.append(fn(policies, repo))
    revision = None
    if {"matrix_drift", "evidence", "claims"} <= set(skip):
        return Report(results=tuple(results), candidate_commit=candidate_commit(repo), policy_revision=revision)
    try:
        trust = load_trust(options)
        with engine_for(options, trust) as engine:
            built = matrix.build(repo, engine, trust)
            revision = built.policy_revision
            if "matrix_drift" not in skip:
                diffs = matrix.diff(built, repo / matrix.MATRIX_DIR)
                results.append(CheckResult(
                    name="matrix_drift", passed=not diffs,
                    summary="matrix/ matches a fresh build" if not diffs else
                    f"{len(diffs)} generated file(s) differ; run `ckptgate matrix build` and commit matrix/",
                    findings=tuple(Finding(check="matrix_drift", code="check.matrix.drift",
                                           message=f"matrix/{_diff_name(d)} differs from a fresh build: "
                                                   "policies, attestations or fixtures changed without "
                                                   "`ckptgate matrix build`",
                                           file=f"matrix/{_diff_name(d)}", detail=d[:20000]) for d in diffs)))
            if "evidence" not in skip:
                found = evidence_findings(repo, claims.committed_rows(repo), origin="matrix/support.json")
                found += [f for f in evidence_findings(repo, built.rows, origin="fresh build") if f not in found]
                n = sum(1 for r in built.rows if r.get("status") == "supported")
                results.append(CheckResult(name="evidence", passed=not found,
                                           summary=f"{n} supported row(s), evidence retained" if not found
                                           else f"{len(found)} evidence problem(s)", findings=tuple(found)))
            if "claims" not in skip:
                violations = claims.lint(engine, repo, list(built.rows))
                found_c = [Finding(check="claims", code=f"check.claims.{v.get('code')}",
                                   message=str(v.get("message")),
                                   file=(v.get("location") or {}).get("file"),
                                   line=(v.get("location") or {}).get("line"),
                                   detail=str((v.get("evidence") or {}).get("text")),
                                   severity="warning" if v.get("severity") == "warning" else "error")
                           for v in violations]
                errors = [f for f in found_c if f.severity == "error"]
                warned = len(found_c) - len(errors)
                results.append(CheckResult(name="claims", passed=not errors,
                                           summary=(f"{len(errors)} claim violation(s)" if errors else "claims lint: ok")
                                           + (f", {warned} warning(s)" if warned else ""),
                                           findings=tuple(found_c)))
    except Error as e:  # the checks below need the matrix; none of them ran
        results.append(CheckResult(name="matrix_build", passed=False, summary=f"could not build the matrix: {e.code}",
                                   findings=(Finding(check="matrix_build", code=e.code, message=e.message),)))
    return Report(results=tuple(results), candidate_commit=candidate_commit(repo), policy_revision=revision)


def _diff_name(d: str) -> str:
    first = d.splitlines()[0] if d else ""
    return first.rsplit("/", 1)[-1].strip() if "/" in first else first.split(" ", 1)[0]


# --------------------------------------------------------------------------------------------- outputs
def to_sarif(report: Report) -> dict[str, Any]:
    """SARIF 2.1.0: one rule per finding code, one result per finding."""
    codes = sorted({f.code for f in report.findings})
    results = []
    for f in report.findings:
        res: dict[str, Any] = {"ruleId": f.code, "level": f.severity, "message": {"text": f.message}}
        if f.file:
            region = {"startLine": f.line} if f.line else {}
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": f.file}}}
            if region:
                loc["physicalLocation"]["region"] = region
            res["locations"] = [loc]
        results.append(res)
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "ckptgate check", "version": __version__,
                                          "informationUri": "https://ckptgate.dev/docs/user-guide",
                                          "rules": [{"id": c, "shortDescription": {"text": c}} for c in codes]}},
                      "results": results}]}


def to_junit(report: Report) -> bytes:
    """JUnit XML: one testcase per check, a failure element listing its findings."""
    failures = sum(1 for r in report.results if not r.passed)
    suites = ET.Element("testsuites", name="ckptgate check", tests=str(len(report.results)), failures=str(failures))
    suite = ET.SubElement(suites, "testsuite", name="ckptgate.check", tests=str(len(report.results)),
                          failures=str(failures), errors="0", skipped="0")
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname="ckptgate.check", name=r.name)
        if not r.passed:
            fail = ET.SubElement(case, "failure", message=r.summary, type="ckptgate.check")
            fail.text = "\n".join(f"[{f.code}] {f.file or ''}{':' + str(f.line) if f.line else ''} {f.message}"
                                  for f in r.findings)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


__all__ = ["CHECK_NAMES", "CheckResult", "Finding", "Report", "evidence_findings", "find_tool", "opa_fmt",
           "policy_tests", "regal_lint", "run_check", "to_junit", "to_sarif"]
