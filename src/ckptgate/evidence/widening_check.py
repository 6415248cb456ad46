"""``check --base REV``: every change between REV and the work tree that widens the gate, as findings.

The pull request's own configuration, overlay, extra Rego, trust data and policy data do not decide
about it (intake, decide and verify read them at ``--base``), but a reviewer must still see what the
change would widen once merged: a signer added, the freshness window lengthened, a gate widened, an
exception added, extra Rego changed.  Each is a finding of the ``widening`` check with a code of its
own (a SARIF rule each), an error unless the *base* revision's configuration sets
``widening = "warning"``: the change itself cannot lower it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptgate._resources import default_policy_dir
from ckptgate.config import Config
from ckptgate.evidence.findings import CheckFinding, CheckResult
from ckptgate.gitbase import BaseConfig
from ckptgate.widening import Effective, effective, widenings

__all__ = ["widening_check"]


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
