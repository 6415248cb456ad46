"""The policy tools ``ckptgate check`` runs: ``opa test``, ``opa fmt``, ``regal lint``, each found
where the repository pins it, and run only at the pinned version where its output depends on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from ckptgate._resources import GO_TOOLS, clone_tool, policies_dir
from ckptgate.decide.bundle import OPA_ZONE_ENV, selected_opa_binary
from ckptgate.decide.install import reported_version
from ckptgate.evidence.findings import CheckFinding, CheckResult

__all__ = [
    "NETWORK_BUILTINS",
    "PINNED_ONLY",
    "capabilities_without_network",
    "extra_checks",
    "find_tool",
    "opa_fmt",
    "parse_opa_test_json",
    "policy_tests",
    "regal_lint",
    "tool_version",
    "version_skip_reason",
]

TOOL_TIMEOUT_S = 300
#: How long one Rego test may run under ``opa test`` (its ``--timeout``, passed explicitly rather than left to
#: the OPA release's default): a judged tree's test that loops is cut off there and reported by name
#: (``check.policy_tests.timeout``), instead of the whole run meeting :data:`TOOL_TIMEOUT_S`.
POLICY_TEST_TIMEOUT_S = 5


def find_tool(name: str, repo: Path) -> str | None:
    """``--opa-binary`` for OPA, else ``$CKPTGATE_<NAME>``, else ``name`` on PATH, else the development
    clone's pinned ``.tools/bin``: the order :func:`ckptgate.decide.bundle.find_opa` uses, so ``opa test``
    runs the binary the engine runs.  Never the judged repository's own ``REPO/.tools/bin``: in CI that
    directory is the change under review, and a tool found there would run (``NAME version`` first) as
    the change wrote it.  ``repo`` is kept for the callers; ckptgate's own clone is ``clone_tool``'s."""
    selected = selected_opa_binary() if name == "opa" else None
    if selected is not None:
        return str(selected)
    explicit = os.environ.get(f"CKPTGATE_{name.upper()}")
    if explicit:
        return explicit
    found = shutil.which(name)
    if found:
        return found
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


#: The builtins no ``opa test`` that ``ckptgate check`` runs may call: the network.  The work tree's
#: Rego (a policy tree a changed configuration names, its tests, extra Rego) is the change under review,
#: and in CI it must not reach the network.  ``opa.runtime`` stays (the bundled
#: ``policies/system/authz/authz.rego`` reads it); the environment it shows is :func:`_tool_env`'s.
NETWORK_BUILTINS = frozenset({"http.send", "net.lookup_ip_addr"})

#: The Regal configuration used where the installed ckptgate carries none (``policies/.regal/config.yaml``):
#: Regal's defaults, and no version check (that would reach the network).
DEFAULT_REGAL_CONFIG = "features:\n  remote:\n    check-version: false\n"


def _tool_env(home: Path) -> dict[str, str]:
    """The whole environment of a policy tool: ``PATH``, a private, empty ``HOME`` and ``TZ=UTC``
    (:data:`~ckptgate.decide.bundle.OPA_ZONE_ENV`, as the engine has); nothing else, so ``opa.runtime().env``
    in a judged test shows no CI secret, no tool reads the user's configuration, and a test's ``"Local"``
    time zone is the engine's on every machine."""
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home), **OPA_ZONE_ENV}


def _run(cmd: Sequence[str], cwd: Path) -> tuple[int, str]:
    try:
        with tempfile.TemporaryDirectory(prefix="ckptgate-home-") as home:
            proc = subprocess.run(
                list(cmd),
                cwd=cwd,
                env=_tool_env(Path(home)),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=TOOL_TIMEOUT_S,
                check=False,
            )
    except subprocess.TimeoutExpired:
        return 124, f"{cmd[0]} did not finish in {TOOL_TIMEOUT_S} s"
    except OSError as e:
        return 127, f"cannot run {cmd[0]}: {e.strerror}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def capabilities_without_network(opa: str, into: Path) -> Path | None:
    """``INTO/capabilities.json``: ``opa capabilities --current`` less :data:`NETWORK_BUILTINS`, with no
    host allowed (``allow_net: []``), for ``opa test --capabilities``; ``None`` when this OPA does not list
    them."""
    rc, out = _run([opa, "capabilities", "--current"], cwd=into)
    try:
        doc = json.loads(out) if rc == 0 else None
        builtins = doc["builtins"] if isinstance(doc, dict) else None
    except (ValueError, KeyError):
        builtins = None
    if not isinstance(builtins, list) or not any(
        isinstance(b, dict) and b.get("name") == "http.send" for b in builtins
    ):
        return None
    assert isinstance(doc, dict)
    doc["builtins"] = [b for b in builtins if not (isinstance(b, dict) and b.get("name") in NETWORK_BUILTINS)]
    # and no host at all for what stays: a JSON schema's remote $ref (json.match_schema, json.verify_schema,
    # which the bundled config tests use) is fetched unless allow_net says otherwise
    doc["allow_net"] = []
    path = into / "capabilities.json"
    path.write_text(json.dumps(doc))
    return path


def regal_config(into: Path) -> Path:
    """``INTO/regal.yaml``: the Regal configuration the installed ckptgate lints its own policies with
    (``policies/.regal/config.yaml`` of :func:`ckptgate._resources.policies_dir`), else
    :data:`DEFAULT_REGAL_CONFIG`; never one from the judged repository, whose ``.regal/`` could load
    custom rules (Rego that Regal evaluates with no builtin limits) or turn rules off."""
    own = policies_dir()
    source = own / ".regal" / "config.yaml" if own is not None else None
    text = source.read_text(encoding="utf-8") if source is not None and source.is_file() else DEFAULT_REGAL_CONFIG
    path = into / "regal.yaml"
    path.write_text(text, encoding="utf-8")
    return path


#: What ``opa test`` loads from a directory: Rego and its data files.
POLICY_SUFFIXES = (".rego", ".json", ".yaml", ".yml")


def stage_rego(tree: Path, into: Path, suffixes: tuple[str, ...] = (".rego",)) -> Path:
    """``INTO/tree``: a copy of every regular ``*.rego`` file (``suffixes``) under ``tree`` at the same relative
    path, for the policy tools: no symbolic link is followed or copied (``x.rego -> /etc/passwd`` was quoted
    back in OPA's parse error; a linked ``x.json`` loaded a file outside the repository as data), and no
    ``.regal`` directory is (Regal would load its configuration and custom rules); outside the repository,
    Regal finds none of its."""
    staged = into / "tree"
    staged.mkdir()
    for dirpath, dirnames, filenames in os.walk(tree, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".regal")
        here = Path(dirpath)
        for name in sorted(filenames):
            f = here / name
            if name.endswith(suffixes) and not f.is_symlink() and f.is_file():
                dest = staged / f.relative_to(tree)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest, follow_symlinks=False)
    return staged


def stage_sources(sources: dict[str, bytes], into: Path) -> Path:
    """``INTO/tree``: exactly ``sources`` (relative path: bytes), the extra Rego the checker read and
    checked, so the tools run on the bytes that were checked and on nothing else."""
    staged = into / "tree"
    staged.mkdir()
    for rel, data in sorted(sources.items()):
        dest = staged / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    return staged


def _missing(name: str, tool: str) -> CheckResult:
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


def _tool_check(
    name: str,
    tool: str,
    args: Sequence[str],
    cwd: Path,
    repo: Path,
    parse: Callable[[str], list[CheckFinding]],
    *,
    exe: str | None = None,
) -> CheckResult:
    exe = exe or find_tool(tool, repo)
    if exe is None:
        return _missing(name, tool)
    started = time.monotonic()
    rc, out = _run([exe, *args], cwd=cwd)
    seconds = time.monotonic() - started
    shown = " ".join(a for a in args if not a.startswith(os.sep))
    if rc == 0:
        return CheckResult(name=name, passed=True, summary=f"{tool} {shown}: ok", seconds=seconds)
    findings = parse(out) or [
        CheckFinding(check=name, code=f"check.{name}.failed", message=f"{tool} {shown} exited {rc}", detail=out[-4000:])
    ]
    return CheckResult(
        name=name, passed=False, summary=f"{len(findings)} problem(s)", findings=tuple(findings), seconds=seconds
    )


def _rel_policy(cwd: Path, repo: Path, path: str, origin: Path | None = None) -> str:
    """``path`` as a tool printed it (relative to ``cwd``), relative to ``repo``; where ``cwd`` is a
    staged copy of ``origin``, the work-tree file it was copied from."""
    p = (cwd / path).resolve()
    if origin is not None:
        try:
            p = origin.resolve() / p.relative_to(cwd.resolve())
        except ValueError:
            pass
    try:
        return p.relative_to(repo.resolve()).as_posix()
    except ValueError:
        return path


def parse_opa_test_json(out: str, policies: Path, repo: Path, origin: Path | None = None) -> list[CheckFinding]:
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
        if isinstance(err, dict) and err.get("code") == "eval_cancel_error":  # the per-test --timeout
            code = "check.policy_tests.timeout"
            what = f"did not finish within the per-test limit of {POLICY_TEST_TIMEOUT_S} s and was stopped"
        found.append(
            CheckFinding(
                check="policy_tests",
                code=code,
                message=f"policy test {name} {what}",
                file=_rel_policy(policies, repo, str(loc["file"]), origin) if loc.get("file") else None,
                line=row if isinstance(row, int) and row > 0 else None,
            )
        )
    return found


def _opa_test(paths: Sequence[str], cwd: Path, repo: Path, origin: Path | None = None) -> CheckResult:
    """``opa test`` of ``paths`` in ``cwd`` with the network builtins removed (:data:`NETWORK_BUILTINS`), each
    test stopped after :data:`POLICY_TEST_TIMEOUT_S`."""
    exe = find_tool("opa", repo)
    if exe is None:
        return _missing("policy_tests", "opa")
    with tempfile.TemporaryDirectory(prefix="ckptgate-check-") as private:
        caps = capabilities_without_network(exe, Path(private))
        if caps is None:
            return CheckResult(
                name="policy_tests",
                passed=False,
                summary="opa did not list its builtins",
                findings=(
                    CheckFinding(
                        check="policy_tests",
                        code="check.policy_tests.capabilities",
                        message=f"{exe} capabilities --current did not list its builtins: the policy tests run "
                        "only without the network builtins, and this OPA did not say which those are",
                    ),
                ),
            )
        return _tool_check(
            "policy_tests",
            "opa",
            ["test", "--capabilities", str(caps), "--timeout", f"{POLICY_TEST_TIMEOUT_S}s", "--format", "json", *paths],
            cwd,
            repo,
            lambda out: parse_opa_test_json(out, cwd, repo, origin),
            exe=exe,
        )


def policy_tests(policies: Path, repo: Path) -> CheckResult:
    """``opa test`` of a staged copy of the Rego and data files under ``policies`` (:func:`stage_rego`)."""
    with tempfile.TemporaryDirectory(prefix="ckptgate-check-") as private:
        staged = stage_rego(policies, Path(private), POLICY_SUFFIXES)
        return _opa_test(["."], staged, repo, policies)


def _fmt(cwd: Path, repo: Path, origin: Path | None = None) -> CheckResult:
    def parse(out: str) -> list[CheckFinding]:
        return [
            CheckFinding(
                check="opa_fmt",
                code="check.opa_fmt.unformatted",
                message="not formatted (run opa fmt -w on it)",
                file=_rel_policy(cwd, repo, line.strip(), origin),
            )
            for line in out.splitlines()
            if line.strip().endswith(".rego")
        ]

    return _tool_check("opa_fmt", "opa", ["fmt", "--fail", "-l", "."], cwd, repo, parse)


def opa_fmt(policies: Path, repo: Path) -> CheckResult:
    """``opa fmt`` of a staged copy of the ``*.rego`` files under ``policies`` (:func:`stage_rego`)."""
    with tempfile.TemporaryDirectory(prefix="ckptgate-check-") as private:
        return _fmt(stage_rego(policies, Path(private)), repo, policies)


def _regal(staged: Path, config: Path, repo: Path, origin: Path) -> CheckResult:
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
                    file=(_rel_policy(staged, repo, str(loc.get("file", "")), origin) if loc.get("file") else None),
                    line=loc.get("row"),
                )
            )
        return found

    return _tool_check(
        "regal_lint", "regal", ["lint", "--config-file", str(config), "--format", "json", "."], staged, repo, parse
    )


def regal_lint(policies: Path, repo: Path) -> CheckResult:
    """``regal lint`` of a staged copy of the ``*.rego`` files under ``policies`` (:func:`stage_rego`),
    outside the repository, with ckptgate's configuration (:func:`regal_config`)."""
    with tempfile.TemporaryDirectory(prefix="ckptgate-check-") as private:
        staged = stage_rego(policies, Path(private))
        return _regal(staged, regal_config(Path(private)), repo, policies)


def extra_checks(
    extra: Path, sources: dict[str, bytes], repo: Path, bundled: Path, names: Collection[str]
) -> dict[str, CheckResult]:
    """``opa test`` (with the bundled policies beside it), ``opa fmt`` and ``regal lint`` of the extra
    Rego, each on a private staged copy of ``sources``: the bytes the extra-Rego checker read from
    ``extra`` and checked (:func:`ckptgate.decide.extra_rego.checked_extra_rego`), never the work-tree
    directory (a linked directory, a data file or a file changed after the check is not run).  Only the
    checks in ``names`` run."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="ckptgate-check-") as private:
        staged = stage_sources(sources, Path(private))
        if "policy_tests" in names:
            out["policy_tests"] = _opa_test([str(bundled), "."], staged, repo, extra)
        if "opa_fmt" in names:
            out["opa_fmt"] = _fmt(staged, repo, extra)
        if "regal_lint" in names:
            out["regal_lint"] = _regal(staged, regal_config(Path(private)), repo, extra)
    return out
