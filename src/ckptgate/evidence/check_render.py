"""The report of ``ckptgate check`` and its renderings: JSON, SARIF 2.1.0, JUnit XML, GitHub annotations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree as ET

from ckptgate import __version__
from ckptgate.evidence.findings import CHECK_DESCRIPTIONS, CheckFinding, CheckResult

__all__ = ["Report", "to_github", "to_junit", "to_sarif"]

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
