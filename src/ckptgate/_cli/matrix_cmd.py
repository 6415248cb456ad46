"""``ckptgate matrix build``: regenerate matrix/ and the generated gate from the stored attestations
and the support policy."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, stdout
from ckptgate._cli._options import engine_options, evidence_repo, repo_option

if TYPE_CHECKING:
    from ckptgate.decide.options import EngineOptions


@click.group("matrix")
def matrix() -> None:
    """The generated support matrix (matrix/SUPPORT.md, support.json, index.html)."""


@matrix.command("build")
@click.option("--check", "check_only", is_flag=True, help="Write nothing; exit 3 with the diff if matrix/ is stale.")
@click.option(
    "--out",
    "out_dir",
    type=UserPath(file_okay=False, path_type=Path),
    default=None,
    help="Write here instead of the configured matrix directory (default: REPO/matrix).",
)
@repo_option
@engine_options
@json_option
def build_command(
    check_only: bool, out_dir: Path | None, repo: Path | None, engine: EngineOptions, as_json: bool
) -> int:
    """Verify every attestation, evaluate data.ckptgate.support.rows and render matrix/.

    Also writes the generated gate (the policies' ckptgate/config/qualified/data.json, with --out:
    OUT/qualified.json): every passing qualification with retained evidence, by adapter and format.

    Exit 0 written (or up to date with --check); 3 --check found drift; 6 policy engine unavailable.
    """
    from ckptgate.decide.options import engine_for, load_trust  # noqa: PLC0415 - ~900 ms (the engine stack)
    from ckptgate.evidence import matrix as mx  # noqa: PLC0415 - the evidence machinery
    from ckptgate.evidence.errors import CheckFailed  # noqa: PLC0415 - the evidence machinery

    layout, options = evidence_repo(repo, engine)
    trust = load_trust(options)
    with engine_for(options, trust) as policy_engine:
        m = mx.build(layout, policy_engine, trust)
    target = out_dir or layout.matrix
    gate_file = layout.gate_file if out_dir is None else out_dir / "qualified.json"
    if check_only:
        failures = [{"code": "matrix_drift", "message": d} for d in mx.diff(m, target)]
        gate_drift = mx.gate_diff(m, gate_file) if gate_file is not None and out_dir is None else None
        if gate_drift:
            failures.append({"code": "gate_drift", "message": gate_drift})
        if failures:
            raise CheckFailed(
                "check.matrix.drift",
                "the committed matrix or generated gate differs from a fresh build; run "
                f"`ckptgate matrix build` and commit {layout.rel(target)}/"
                + (f" and {layout.rel(gate_file)}" if gate_drift and gate_file is not None else ""),
                failures=failures,
            )
        if as_json:
            emit_json({"up_to_date": True, "policy_revision": m.policy_revision, "summary": m.summary()})
        else:
            stdout.print(f"{layout.rel(target)}/ is up to date (policy revision {m.policy_revision[:19]})")
        return 0
    written = []
    if gate_file is not None and mx.write_gate(m, gate_file):
        written.append(gate_file)
        if out_dir is None:  # the engine decided with the old gate: the matrix names the new one's revision
            with engine_for(options, trust) as policy_engine:
                m = mx.build(layout, policy_engine, trust, doc=m.input)
    written += mx.write(m, target)
    if as_json:
        emit_json(
            {
                "written": [str(p) for p in written],
                "policy_revision": m.policy_revision,
                "summary": m.summary(),
                "rows": list(m.rows),
            }
        )
    else:
        for p in written:
            stdout.print(f"wrote {p}")
        stdout.print(", ".join(f"{n} {s}" for s, n in m.summary().items()))
    sys.stdout.flush()
    return 0


def register(cli: click.Group) -> None:
    cli.add_command(matrix)
