"""``check --base REV``: every change between REV and the work tree that widens the gate, as findings.

The pull request's own configuration, overlay, extra Rego, trust data and policy data do not decide
about it (intake, decide and verify read them at ``--base``), but a reviewer must still see what the
change would widen once merged: a signer added, the freshness window lengthened, a gate widened, an
exception added, extra Rego changed, a claims-lint suppression added (an inline comment or a
``claims_ignore`` entry).  Each is a finding of the ``widening`` check with a code of its
own (a SARIF rule each), an error unless the *base* revision's configuration sets
``widening = "warning"``: the change itself cannot lower it.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from ckptgate._resources import default_policy_dir
from ckptgate.config import Config, claims_ignores
from ckptgate.evidence import claims, suppressions
from ckptgate.evidence.findings import CheckFinding, CheckResult
from ckptgate.gitbase import BaseConfig
from ckptgate.widening import Effective, Widening, effective, widenings

__all__ = ["claims_suppressions_added", "widening_check"]


def _effective(config: Config | None, show: Any, policy_dir: Path | None = None) -> Effective:
    if config is None and policy_dir is None:
        return effective(default_policy_dir())
    tree = policy_dir or (config.policies if config is not None else None) or default_policy_dir()
    if config is None:
        return effective(tree, where={"policies": show(tree)})
    return effective(
        tree,
        trust_file=config.trust,
        overlay=config.policy_data,
        extra_rego=config.extra_rego,
        where={
            "trust": show(config.trust) if config.trust is not None else show(tree / "ckptgate/config/trust/data.json"),
            "overlay": show(config.policy_data.source) if config.policy_data is not None else show(tree),
            "policies": show(tree),
            "extra_rego": show(config.extra_rego) if config.extra_rego is not None else "extra Rego",
        },
    )


def _at_base(repo: Path, commit: str, rel: str) -> str | None:
    """The text of ``rel`` (relative to ``repo``) at ``commit``, or ``None`` where it did not exist."""
    proc = subprocess.run(
        ["git", "cat-file", "blob", f"{commit}:./{rel}"], cwd=repo, capture_output=True, timeout=60, check=False
    )
    return proc.stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else None


def claims_suppressions_added(base: BaseConfig, config: Config | None, repo: Path) -> list[Widening]:
    """Claims-lint suppressions the change adds: an inline ``<!-- ckptgate: allow CODE — reason -->``
    in a linted document that the base revision's copy of it does not have (as many times), and a
    ``claims_ignore`` glob or code the base configuration does not list."""
    out: list[Widening] = []
    for f in config.doc_files() if config is not None else claims.doc_files(repo):
        text = f.read_text(encoding="utf-8", errors="replace")
        if suppressions.MARKER not in text:
            continue
        rel = f.relative_to(repo).as_posix()
        now, _ = suppressions.inline(text, file=rel)
        old_text = _at_base(repo, base.commit, rel)
        old = Counter(s.code for s in suppressions.inline(old_text, file=rel)[0]) if old_text else Counter()
        for s in now:
            if old[s.code] > 0:
                old[s.code] -= 1
                continue
            out.append(
                Widening(
                    code="widening.claims_suppression_added",
                    message=f"{rel}:{s.line} adds a claims suppression of {s.code} ({s.reason!r}): "
                    "the sentences it covers are no longer linted for it",
                    file=rel,
                )
            )
    had = {(g, c) for g, codes, _ in claims_ignores(dict(base.table)) for c in codes}
    for g, codes, reason in config.claims_ignore if config is not None else ():
        for c in codes:
            if (g, c) not in had:
                out.append(
                    Widening(
                        code="widening.claims_ignore_added",
                        message=f"claims_ignore adds {c} for {g!r} ({reason!r}): those files are no longer "
                        "linted for it",
                        file=config.source.relative_to(repo).as_posix()
                        if config is not None and config.source is not None and config.source.is_relative_to(repo)
                        else "ckptgate.toml",
                    )
                )
    return out


def widening_check(
    base: BaseConfig, config: Config | None, repo: Path, *, policy_dir: Path | None = None
) -> CheckResult:
    """The widening changes from ``base`` to the work tree's ``config`` (``repo`` its root);
    ``policy_dir``: the policy tree the work tree implies where its configuration names none (its
    own ``policies/``), which the check's engine judges with."""

    def in_tree(p: Path) -> str:
        try:
            return p.resolve().relative_to(repo.resolve()).as_posix()
        except ValueError:
            return str(p)

    found = widenings(_effective(base.config, lambda p: "-"), _effective(config, in_tree, policy_dir))
    found += claims_suppressions_added(base, config, repo)
    severity = "warning" if base.config is not None and base.config.widening == "warning" else "error"
    findings = tuple(
        CheckFinding(
            check="widening", code=w.code, message=f"{w.message} (since {base.rev})", file=w.file, severity=severity
        )
        for w in found
    )
    errors = [f for f in findings if f.severity == "error"]
    return CheckResult(
        name="widening",
        passed=not errors,
        summary=f"nothing widens the gate since {base.rev}"
        if not findings
        else f"{len(findings)} change(s) since {base.rev} widen the gate"
        + ("" if errors else ' (warnings: the base configuration sets widening = "warning")'),
        findings=findings,
    )
