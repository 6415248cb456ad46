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
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptgate._resources import default_policy_dir
from ckptgate.config import from_table
from ckptgate.decide.extra_rego import checked_extra_rego
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.errors import ConfigError, Error
from ckptgate.evidence import claims, matrix
from ckptgate.evidence.candidate import candidate_commit
from ckptgate.evidence.check_render import Report, to_github, to_junit, to_sarif
from ckptgate.evidence.check_tools import (
    PINNED_ONLY,
    extra_checks,
    find_tool,
    opa_fmt,
    parse_opa_test_json,
    policy_tests,
    regal_lint,
    version_skip_reason,
)
from ckptgate.evidence.findings import CHECK_NAMES, CheckFinding, CheckResult
from ckptgate.evidence.layout import RepoLayout
from ckptgate.evidence.matrix_render import evidence_location
from ckptgate.evidence.widening_check import widening_check
from ckptgate.gitbase import BaseConfig


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


def _base_settings(base: BaseConfig, repo: Path) -> Any:
    """The base revision's configuration table, with its paths in the work tree (``None``: none)."""
    if base.config is None:
        return None
    return from_table(dict(base.table), root=repo / base.directory, source=repo / base.directory)


def _extra_rego_checks(extra: Path, repo: Path, bundled: Path, names: Sequence[str]) -> list[CheckResult]:
    """The policy tools on the extra Rego, staged from the bytes the extra-Rego checker read and checked
    (:func:`~ckptgate.decide.extra_rego.checked_extra_rego`); extra Rego the checker refuses fails
    ``policy_tests`` with the refusal's code, and no tool runs."""
    try:
        sources = checked_extra_rego(extra)
    except ConfigError as e:
        file = e.evidence.get("file") if isinstance(e.evidence, dict) else None
        return [
            CheckResult(
                name="policy_tests",
                passed=False,
                summary=f"the extra Rego is refused: {e.code}",
                findings=(
                    CheckFinding(
                        check="policy_tests",
                        code=e.code,
                        message=e.message,
                        file=_in_repo(str(file), repo) if file else None,
                    ),
                ),
            )
        ]
    found = extra_checks(extra, sources, repo, bundled, names)
    return [found[n] for n in names]


def _in_repo(path: str, repo: Path) -> str:
    try:
        return Path(os.path.abspath(path)).relative_to(repo).as_posix()
    except ValueError:
        return path


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
    tools = [n for n in ("policy_tests", "opa_fmt", "regal_lint") if n not in skip]
    if config is not None and config.policies is None and config.extra_rego is not None:
        if tools:
            results += _extra_rego_checks(config.extra_rego, repo, policies or default_policy_dir(), tools)
    else:
        # policies is None only where plan() skips all three (a configuration with neither)
        def tested() -> Path:
            return policies or default_policy_dir()

        tool_checks: dict[str, Callable[[], CheckResult]] = {
            "policy_tests": lambda: policy_tests(tested(), repo),
            "opa_fmt": lambda: opa_fmt(tested(), repo),
            "regal_lint": lambda: regal_lint(tested(), repo),
        }
        results += [tool_checks[name]() for name in tools]
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
