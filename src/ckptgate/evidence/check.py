"""``ckptgate check``: the pre-merge gate.

Checks, in order: policy unit tests (``opa test``), ``opa fmt``, ``regal lint``, matrix drift
(regenerate and diff against the committed ``matrix/``), gate drift (the generated gate
``policies/ckptgate/config/qualified/data.json`` against the retained qualifications), retained
evidence for every supported row (the attestation and the result log exist and the log's digest
matches), and the claims lint.
Every failure is a :class:`CheckFinding` with a stable code; reports render as text, JSON, SARIF 2.1.0
and JUnit XML.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from ckptgate import __version__
from ckptgate._resources import GO_TOOLS, clone_tool, default_policy_dir
from ckptgate.config import from_table
from ckptgate.decide.bundle import selected_opa_binary
from ckptgate.decide.install import reported_version
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.errors import Error
from ckptgate.evidence import claims, matrix
from ckptgate.evidence.candidate import candidate_commit
from ckptgate.evidence.findings import CHECK_DESCRIPTIONS, CHECK_NAMES, CheckFinding, CheckResult
from ckptgate.evidence.layout import RepoLayout
from ckptgate.evidence.matrix import evidence_location
from ckptgate.evidence.widening_check import widening_check
from ckptgate.gitbase import BaseConfig

TOOL_TIMEOUT_S = 300
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
DOCS_URI = "https://ckptgate.dev/docs/user-guide"


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    results: tuple[CheckResult, ...]
    skipped: tuple[str, ...] = ()
    #: (check, why) for each skipped check.
    skip_reasons: tuple[tuple[str, str], ...] = ()
    candidate_commit: str | None = None
    policy_revision: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def findings(self) -> list[CheckFinding]:
        return [f for r in self.results for f in r.findings]

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "candidate_commit": self.candidate_commit,
            "policy_revision": self.policy_revision,
            "checks": [
                {
                    "name": r.name,
                    "passed": r.passed,
                    "summary": r.summary,
                    "seconds": round(r.seconds, 3),
                    "findings": [f.to_json() for f in r.findings],
                }
                for r in self.results
            ],
            "skipped": list(self.skipped),
            "skip_reasons": dict(self.skip_reasons),
        }

    def reason(self, name: str) -> str:
        """Why ``name`` was skipped."""
        return dict(self.skip_reasons).get(name, f"--skip {name}")


# --------------------------------------------------------------------------------------------- tools
def find_tool(name: str, repo: Path) -> str | None:
    """``--opa-binary`` for OPA, else ``$CKPTGATE_<NAME>``, else ``name`` on PATH, else the pinned
    ``REPO/.tools/bin`` (or the development clone's): the order
    :func:`ckptgate.decide.bundle.find_opa` uses, so ``opa test`` runs the binary the engine runs."""
    selected = selected_opa_binary() if name == "opa" else None
    if selected is not None:
        return str(selected)
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


#: The checks whose verdict depends on the tool's release (formatting and lint rules change between
#: releases): they run only with the pinned version.  ``opa test`` runs on any supported OPA.
PINNED_ONLY = {"opa_fmt": "opa", "regal_lint": "regal"}


def tool_version(exe: str) -> tuple[int, int, int] | None:
    """The version ``EXE version`` reports, else ``None``."""
    return reported_version(Path(exe))


def version_skip_reason(name: str, repo: Path) -> str | None:
    """Why the pinned-only check ``name`` is skipped: its tool is not the pinned release (found and
    pinned versions named); ``None`` when it runs (pinned, or not found: then it fails as missing)."""
    tool = PINNED_ONLY[name]
    exe = find_tool(tool, repo)
    if exe is None:
        return None
    found = tool_version(exe)
    pinned = GO_TOOLS[tool]
    if found == pinned.version:
        return None
    shown = ".".join(map(str, found)) if found else "an unknown version"
    return (
        f"{tool} at {exe} is {shown}, not the pinned {pinned.version_text}; {name} runs only with the "
        f"pinned release (`ckptgate engine install{' --regal' if tool == 'regal' else ''}` installs it)"
    )


def _run(cmd: Sequence[str], cwd: Path) -> tuple[int, str]:
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"{cmd[0]} did not finish in {TOOL_TIMEOUT_S} s"
    except OSError as e:
        return 127, f"cannot run {cmd[0]}: {e.strerror}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _tool_check(
    name: str, tool: str, args: Sequence[str], policies: Path, repo: Path, parse: Callable[[str], list[CheckFinding]]
) -> CheckResult:
    exe = find_tool(tool, repo)
    if exe is None:
        return CheckResult(
            name=name,
            passed=False,
            summary=f"{tool} not found",
            findings=(
                CheckFinding(
                    check=name,
                    code=f"check.{name}.tool_missing",
                    message=f"{tool} is not installed (set CKPTGATE_{tool.upper()} or run scripts/bootstrap.py setup)",
                ),
            ),
        )
    started = time.monotonic()
    rc, out = _run([exe, *args], cwd=policies)
    seconds = time.monotonic() - started
    if rc == 0:
        return CheckResult(name=name, passed=True, summary=f"{tool} {' '.join(args)}: ok", seconds=seconds)
    findings = parse(out) or [
        CheckFinding(
            check=name, code=f"check.{name}.failed", message=f"{tool} {' '.join(args)} exited {rc}", detail=out[-4000:]
        )
    ]
    return CheckResult(
        name=name, passed=False, summary=f"{len(findings)} problem(s)", findings=tuple(findings), seconds=seconds
    )


def _rel_policy(policies: Path, repo: Path, path: str) -> str:
    p = (policies / path).resolve()
    try:
        return p.relative_to(repo.resolve()).as_posix()
    except ValueError:
        return path


def parse_opa_test_json(out: str, policies: Path, repo: Path) -> list[CheckFinding]:
    """Failed and erroring tests from ``opa test --format json``, each with its file and line."""
    start = out.find("[")
    try:
        doc = json.loads(out[start:]) if start >= 0 else None
    except ValueError:
        return []
    if not isinstance(doc, list):
        return []
    found = []
    for t in doc:
        if not isinstance(t, dict) or not (t.get("fail") or t.get("error")):
            continue
        raw_loc = t.get("location")
        loc: dict[str, Any] = raw_loc if isinstance(raw_loc, dict) else {}
        name = f"{t.get('package', '?')}.{t.get('name', '?')}".removeprefix("data.")
        err = t.get("error")
        what = "raised an error" if err else "failed"
        if isinstance(err, dict) and err.get("message"):
            what += f": {err['message']}"
        row = loc.get("row")
        code = "check.policy_tests.error" if err else "check.policy_tests.failed"
        found.append(
            CheckFinding(
                check="policy_tests",
                code=code,
                message=f"policy test {name} {what}",
                file=_rel_policy(policies, repo, str(loc["file"])) if loc.get("file") else None,
                line=row if isinstance(row, int) and row > 0 else None,
            )
        )
    return found


def policy_tests(policies: Path, repo: Path) -> CheckResult:
    return _tool_check(
        "policy_tests",
        "opa",
        ["test", "--format", "json", "."],
        policies,
        repo,
        lambda out: parse_opa_test_json(out, policies, repo),
    )


def opa_fmt(policies: Path, repo: Path) -> CheckResult:
    def parse(out: str) -> list[CheckFinding]:
        return [
            CheckFinding(
                check="opa_fmt",
                code="check.opa_fmt.unformatted",
                message="not formatted (run opa fmt -w on it)",
                file=_rel_policy(policies, repo, line.strip()),
            )
            for line in out.splitlines()
            if line.strip().endswith(".rego")
        ]

    return _tool_check("opa_fmt", "opa", ["fmt", "--fail", "-l", "."], policies, repo, parse)


def regal_lint(policies: Path, repo: Path) -> CheckResult:
    def parse(out: str) -> list[CheckFinding]:
        try:
            doc = json.loads(out[out.find("{") :]) if "{" in out else {}
        except ValueError:
            return []
        found = []
        for v in doc.get("violations") or []:
            loc = v.get("location") or {}
            found.append(
                CheckFinding(
                    check="regal_lint",
                    code=f"check.regal_lint.{v.get('title', 'violation')}",
                    message=f"{v.get('title')}: {v.get('description')}",
                    file=(_rel_policy(policies, repo, str(loc.get("file", ""))) if loc.get("file") else None),
                    line=loc.get("row"),
                )
            )
        return found

    return _tool_check("regal_lint", "regal", ["lint", "--format", "json", "."], policies, repo, parse)


# --------------------------------------------------------------------------------------------- matrix
def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def evidence_findings(repo: Path, rows: Sequence[dict[str, Any]], *, origin: str) -> list[CheckFinding]:
    """For every supported row: its attestation and result log exist and the log digest matches."""
    out: list[CheckFinding] = []
    for row in rows:
        if row.get("status") != "supported":
            continue
        who = f"{row.get('adapter')} on {row.get('fixture_digest')} ({origin})"
        source = row.get("source")
        if not isinstance(source, str) or not (repo / source).is_file():
            out.append(
                CheckFinding(
                    check="evidence",
                    code="check.evidence.attestation_missing",
                    message=f"supported row {who}: attestation {source} does not exist",
                    file=source if isinstance(source, str) else None,
                )
            )
        loc = evidence_location(row)
        raw_ev = row.get("evidence")
        ev: dict[str, Any] = raw_ev if isinstance(raw_ev, dict) else {}
        if loc is None or not (repo / loc).is_file():
            out.append(
                CheckFinding(
                    check="evidence",
                    code="check.evidence.log_missing",
                    message=f"supported row {who}: retained result log {loc} does not exist",
                    file=loc,
                )
            )
        elif _sha256(repo / loc) != ev.get("digest"):
            out.append(
                CheckFinding(
                    check="evidence",
                    code="check.evidence.log_digest_mismatch",
                    message=f"supported row {who}: {loc} has digest {_sha256(repo / loc)}, "
                    f"the attestation names {ev.get('digest')}",
                    file=loc,
                )
            )
    return out


def plan(config: Any, skip: Sequence[str] = ()) -> dict[str, str]:
    """The checks a configuration does not enable (or ``skip`` names), each with the reason."""
    reasons = {name: f"--skip {name}" for name in CHECK_NAMES if name in skip}
    if config is None:  # no configuration: ckptgate's own layout, every check
        return reasons
    if config.policies is None and config.extra_rego is None:
        for name in ("policy_tests", "opa_fmt", "regal_lint"):
            reasons.setdefault(
                name,
                "the configuration names no policies and no extra_rego; the bundled "
                "policies are tested where ckptgate is built",
            )
    if config.matrix is None:
        for name in ("matrix_drift", "gate_drift", "evidence"):
            reasons.setdefault(name, "the configuration names no matrix (this repository qualifies no adapters)")
    if config.policies is None:
        reasons.setdefault(
            "gate_drift",
            "the configuration names no policies: the bundled gate is ckptgate's own, checked where ckptgate is built",
        )
    return reasons


def _gate_drift(built: matrix.Matrix, layout: RepoLayout) -> CheckResult:
    """The generated gate file against a fresh generation from the retained qualifications."""
    gate_file = layout.gate_file
    assert gate_file is not None
    rel = layout.rel(gate_file)
    drift = matrix.gate_diff(built, gate_file)
    if drift is None:
        return CheckResult(name="gate_drift", passed=True, summary=f"{rel} matches the retained qualifications")
    return CheckResult(
        name="gate_drift",
        passed=False,
        summary=f"{rel} differs from the retained qualifications; run `ckptgate matrix build` and commit it",
        findings=(
            CheckFinding(
                check="gate_drift",
                code="check.gate.drift",
                message=f"{rel} and the passing qualifications with retained evidence disagree: the producer "
                "releases a gate passes are generated from them, never edited by hand",
                file=rel,
                detail=drift[:20000],
            ),
        ),
    )


def extra_policy_tests(extra: Path, repo: Path, bundled: Path) -> CheckResult:
    """``opa test`` of the extra Rego with the bundled policies loaded beside it."""
    return _tool_check(
        "policy_tests",
        "opa",
        ["test", "--format", "json", str(bundled), "."],
        extra,
        repo,
        lambda out: parse_opa_test_json(out, extra, repo),
    )


def _base_settings(base: BaseConfig, repo: Path) -> Any:
    """The base revision's configuration table, with its paths in the work tree (``None``: none)."""
    if base.config is None:
        return None
    return from_table(dict(base.table), root=repo / base.directory, source=repo / base.directory)


def run_check(
    repo: Path,
    *,
    options: EngineOptions | None = None,
    skip: Sequence[str] = (),
    config: Any = None,
    base: BaseConfig | None = None,
    judged_policies: Path | None = None,
) -> Report:
    """Run every check that ``config`` enables (all of them without one), except ``skip``, and return
    the report; never raises for a failing check.  The matrix, the store and the fixtures are where
    ``config`` puts them (:class:`~ckptgate.evidence.layout.RepoLayout`).  With ``base`` (``--base
    REV``), which checks run and what they read are the base revision's settings, applied to the work
    tree, so the change under review cannot turn a check off; and the ``widening`` check reports what
    the change widens.  ``judged_policies``: the policy tree in ``options`` that the work tree implies
    (its own ``policies/`` where no configuration names one), compared with the base's like a
    configured one."""
    repo = repo.resolve()
    judged = config
    if base is not None:
        config = _base_settings(base, repo)
    if config is None and options is not None and options.policy_dir is None:
        judged_policies = judged_policies or repo / "policies"  # in_repo, below: the work tree's own tree
    # the widening is that of the policy tree the checks below judge with, wherever it came from
    widening = [widening_check(base, judged, repo, policy_dir=judged_policies)] if base is not None else []
    layout = RepoLayout.from_config(repo, config)
    reasons = plan(config, skip)
    for name in PINNED_ONLY:
        why = None if name in reasons else version_skip_reason(name, repo)
        if why is not None:
            reasons[name] = why
    skip = tuple(reasons)
    skipped = tuple(n for n in CHECK_NAMES if n in reasons)
    skip_reasons = tuple((n, reasons[n]) for n in skipped)
    options = options or EngineOptions()
    if config is None:
        options = options.in_repo(repo)
    # the policies tested: the options', else the configuration's (an API caller may pass a
    # configuration naming policies with options that name none: the tools must not run in the cwd)
    policies: Path | None = options.policy_dir or (config.policies if config is not None else None)
    results: list[CheckResult] = []
    if config is not None and config.policies is None and config.extra_rego is not None:
        extra = config.extra_rego
        tool_checks: tuple[tuple[str, Callable[[], CheckResult]], ...] = (
            ("policy_tests", lambda: extra_policy_tests(extra, repo, policies or default_policy_dir())),
            ("opa_fmt", lambda: opa_fmt(extra, repo)),
            ("regal_lint", lambda: regal_lint(extra, repo)),
        )
    else:
        # policies is None only where plan() skips all three (a configuration with neither)
        def tested() -> Path:
            return policies or default_policy_dir()

        tool_checks = (
            ("policy_tests", lambda: policy_tests(tested(), repo)),
            ("opa_fmt", lambda: opa_fmt(tested(), repo)),
            ("regal_lint", lambda: regal_lint(tested(), repo)),
        )
    for name, run in tool_checks:
        if name not in skip:
            results.append(run())
    results += widening
    revision = None
    if {"matrix_drift", "gate_drift", "evidence", "claims"} <= set(skip):
        return Report(
            results=tuple(results),
            skipped=skipped,
            skip_reasons=skip_reasons,
            candidate_commit=candidate_commit(repo, exclude=layout.evidence_paths),
            policy_revision=revision,
        )
    docs = config.doc_files() if config is not None else None
    with_matrix = config is None or config.matrix is not None
    started = time.monotonic()

    def timed(result: CheckResult) -> CheckResult:
        # The first check after the shared matrix build carries the build's time too.
        nonlocal started
        now = time.monotonic()
        result = replace(result, seconds=now - started)
        started = now
        return result

    try:
        trust = load_trust(options)
        with engine_for(options, trust) as engine:
            built = matrix.build(layout, engine, trust) if with_matrix else None
            revision = built.policy_revision if built is not None else None
            if "matrix_drift" not in skip and built is not None:
                diffs = matrix.diff(built, layout.matrix)
                mdir = layout.rel(layout.matrix)
                results.append(
                    timed(
                        CheckResult(
                            name="matrix_drift",
                            passed=not diffs,
                            summary=f"{mdir}/ matches a fresh build"
                            if not diffs
                            else f"{len(diffs)} generated file(s) differ; "
                            f"run `ckptgate matrix build` and commit {mdir}/",
                            findings=tuple(
                                CheckFinding(
                                    check="matrix_drift",
                                    code="check.matrix.drift",
                                    message=f"{mdir}/{_diff_name(d)} differs from a fresh build: "
                                    "policies, attestations or fixtures changed without "
                                    "`ckptgate matrix build`",
                                    file=f"{mdir}/{_diff_name(d)}",
                                    detail=d[:20000],
                                )
                                for d in diffs
                            ),
                        )
                    )
                )
            if "gate_drift" not in skip and built is not None and layout.gate_file is not None:
                results.append(timed(_gate_drift(built, layout)))
            if "evidence" not in skip and built is not None:
                found = evidence_findings(
                    repo, claims.committed_rows(layout), origin=f"{layout.rel(layout.matrix)}/support.json"
                )
                found += [f for f in evidence_findings(repo, built.rows, origin="fresh build") if f not in found]
                n = sum(1 for r in built.rows if r.get("status") == "supported")
                results.append(
                    timed(
                        CheckResult(
                            name="evidence",
                            passed=not found,
                            summary=f"{n} supported row(s), evidence retained"
                            if not found
                            else f"{len(found)} evidence problem(s)",
                            findings=tuple(found),
                        )
                    )
                )
            if "claims" not in skip:
                violations = claims.lint(
                    engine,
                    layout,
                    list(built.rows) if built is not None else [],
                    docs=docs,
                    ignore=config.claims_ignore if config is not None else (),
                )
                found_c = [
                    CheckFinding(
                        check="claims",
                        code=f"check.claims.{v.get('code')}",
                        message=str(v.get("message")),
                        file=(v.get("location") or {}).get("file"),
                        line=(v.get("location") or {}).get("line"),
                        detail=str((v.get("evidence") or {}).get("text")),
                        severity="warning" if v.get("severity") == "warning" else "error",
                        suppressed=_suppressed(v),
                    )
                    for v in violations
                ]
                errors = [f for f in found_c if f.severity == "error" and f.suppressed is None]
                quiet = sum(1 for f in found_c if f.suppressed is not None)
                warned = len(found_c) - len(errors) - quiet
                results.append(
                    timed(
                        CheckResult(
                            name="claims",
                            passed=not errors,
                            summary=(f"{len(errors)} claim violation(s)" if errors else "claims lint: ok")
                            + (f", {warned} warning(s)" if warned else "")
                            + (f", {quiet} suppressed (each with its reason)" if quiet else ""),
                            findings=tuple(found_c),
                        )
                    )
                )
    except Error as e:  # the checks below need the matrix; none of them ran
        results.append(
            CheckResult(
                name="matrix_build",
                passed=False,
                summary=f"could not build the matrix: {e.code}",
                findings=(CheckFinding(check="matrix_build", code=e.code, message=e.message),),
            )
        )
    return Report(
        results=tuple(results),
        skipped=skipped,
        skip_reasons=skip_reasons,
        candidate_commit=candidate_commit(repo, exclude=layout.evidence_paths),
        policy_revision=revision,
    )


def _suppressed(v: dict[str, Any]) -> tuple[str, str] | None:
    s = v.get("suppression")
    return (str(s.get("kind")), str(s.get("justification"))) if isinstance(s, dict) else None


def _diff_name(d: str) -> str:
    first = d.splitlines()[0] if d else ""
    return first.rsplit("/", 1)[-1].strip() if "/" in first else first.split(" ", 1)[0]


# --------------------------------------------------------------------------------------------- outputs
def _rule(code: str, findings: Sequence[CheckFinding]) -> dict[str, Any]:
    check = findings[0].check
    short, full = CHECK_DESCRIPTIONS.get(check, (f"ckptgate check finding {code}.", f"ckptgate check finding {code}."))
    return {
        "id": code,
        "name": code.replace(".", "_"),
        "shortDescription": {"text": short},
        "fullDescription": {"text": f"{full} (check {check}, code {code})"},
        "helpUri": f"{DOCS_URI}#check-{check.replace('_', '-')}",
        "properties": {"check": check},
        "defaultConfiguration": {"level": findings[0].severity},
    }


def to_sarif(report: Report) -> dict[str, Any]:
    """SARIF 2.1.0: one rule per finding code (with descriptions and a link into the docs), one result
    per finding (with a fingerprint), and each skipped check as a tool execution notification."""
    by_code: dict[str, list[CheckFinding]] = {}
    for f in report.findings:
        by_code.setdefault(f.code, []).append(f)
    codes = sorted(by_code)
    results = []
    for f in report.findings:
        res: dict[str, Any] = {
            "ruleId": f.code,
            "ruleIndex": codes.index(f.code),
            "level": f.severity,
            "message": {"text": f.message},
            "partialFingerprints": {"ckptgateFinding/v1": f.fingerprint},
        }
        if f.suppressed is not None:
            res["suppressions"] = [{"kind": f.suppressed[0], "justification": f.suppressed[1]}]
        if f.file:
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": f.file}}}
            if f.line:
                loc["physicalLocation"]["region"] = {"startLine": f.line}
            res["locations"] = [loc]
        results.append(res)
    notifications = [
        {
            "level": "note",
            "descriptor": {"id": "check.skipped"},
            "message": {"text": f"check {name} skipped ({report.reason(name)})"},
        }
        for name in report.skipped
    ]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "ckptgate check",
                        "version": __version__,
                        "informationUri": DOCS_URI,
                        "rules": [_rule(c, by_code[c]) for c in codes],
                    }
                },
                "invocations": [{"executionSuccessful": True, "toolExecutionNotifications": notifications}],
                "results": results,
            }
        ],
    }


def to_junit(report: Report) -> bytes:
    """JUnit XML: one testcase per check, with its time; a failure element listing its findings; a
    skipped element for each skipped check."""
    failures = sum(1 for r in report.results if not r.passed)
    tests = len(report.results) + len(report.skipped)
    total = f"{sum(r.seconds for r in report.results):.3f}"
    suites = ET.Element(
        "testsuites",
        name="ckptgate check",
        tests=str(tests),
        failures=str(failures),
        skipped=str(len(report.skipped)),
        time=total,
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name="ckptgate.check",
        tests=str(tests),
        failures=str(failures),
        errors="0",
        skipped=str(len(report.skipped)),
        time=total,
    )
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname="ckptgate.check", name=r.name, time=f"{r.seconds:.3f}")
        if not r.passed:
            fail = ET.SubElement(case, "failure", message=r.summary, type="ckptgate.check")
            fail.text = "\n".join(
                f"[{f.code}] {f.file or ''}{':' + str(f.line) if f.line else ''} {f.message}" for f in r.findings
            )
    for name in report.skipped:
        case = ET.SubElement(suite, "testcase", classname="ckptgate.check", name=name, time="0.000")
        ET.SubElement(case, "skipped", message=f"skipped: {report.reason(name)}")
    data: bytes = ET.tostring(suites, encoding="utf-8", xml_declaration=True)  # typeshed: Any for this overload
    return data


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def to_github(report: Report) -> list[str]:
    """GitHub Actions workflow commands: ``::error``/``::warning`` per finding (with file and line when
    known), ``::notice`` per skipped check."""
    lines = []
    for f in report.findings:
        props = [f"title={_gh_prop(f.code)}"]
        if f.file:
            props.insert(0, f"file={_gh_prop(f.file)}")
            if f.line:
                props.insert(1, f"line={f.line}")
        level = "notice" if f.suppressed else f.severity
        lines.append(f"::{level} {','.join(props)}::{_gh_data(f.message)}")
    lines += [
        f"::notice title=check.skipped::check {name} skipped ({_gh_data(report.reason(name))})"
        for name in report.skipped
    ]
    return lines


__all__ = [
    "CHECK_NAMES",
    "CheckFinding",
    "CheckResult",
    "Report",
    "evidence_findings",
    "find_tool",
    "opa_fmt",
    "parse_opa_test_json",
    "policy_tests",
    "regal_lint",
    "run_check",
    "to_github",
    "to_junit",
    "to_sarif",
]
