"""The policy tools ``ckptgate check`` runs: ``opa test``, ``opa fmt``, ``regal lint``, each found
where the repository pins it, and run only at the pinned version where its output depends on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ckptgate._resources import GO_TOOLS, clone_tool
from ckptgate.decide.bundle import selected_opa_binary
from ckptgate.decide.install import reported_version
from ckptgate.evidence.findings import CheckFinding, CheckResult

__all__ = [
    "PINNED_ONLY",
    "extra_policy_tests",
    "find_tool",
    "opa_fmt",
    "parse_opa_test_json",
    "policy_tests",
    "regal_lint",
    "tool_version",
    "version_skip_reason",
]

TOOL_TIMEOUT_S = 300


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
