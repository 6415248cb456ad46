"""The generated support matrix: verify every stored attestation, let ``ckptgate.support`` decide
each row's status, and render ``matrix/SUPPORT.md``, ``matrix/support.json`` and ``matrix/index.html``.

Generation is deterministic: the policy is evaluated "as of" the newest of the candidate commit's
time and the stored statements' ``issued_at`` (never the wall clock), attestation sources are
repository-relative, and nothing names HEAD.  So regenerating at the same candidate commit with the
same attestations and policies gives the same bytes, and ``ckptgate check`` detects drift.
A row is a claim about one exact producer version, adapter version, fixture digest, candidate
commit, environment and topology (register claim rule 3), nothing more.

This module evaluates the policy (:func:`build`) and writes or compares the files; the policy's
input is collected by :mod:`~ckptgate.evidence.matrix_input`, the pages rendered by
:mod:`~ckptgate.evidence.matrix_render`, and the generated gate made by
:mod:`~ckptgate.evidence.matrix_gate`.  Their names used elsewhere are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptgate.errors import UsageError
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.layout import DEFAULT_MATRIX, RepoLayout
from ckptgate.evidence.matrix_gate import drift, gate_diff, render_gate, write_gate
from ckptgate.evidence.matrix_input import (
    MAX_RESULT_LOG_BYTES,
    Head,
    collect,
    fixture_digests,
    fixture_label,
    head_facts,
    retained_result,
    support_input,
    targets,
)
from ckptgate.evidence.matrix_render import STATUSES, formats, render_html, render_json, render_markdown
from ckptgate.userfiles import check_output_file, write_output_file

if TYPE_CHECKING:
    from ckptgate.decide.engine import PolicyEngine
    from ckptgate.verify import TrustData

ROWS_ENTRYPOINT = "ckptgate/support/rows"
QUALIFIED_ENTRYPOINT = "ckptgate/support/qualified"
MATRIX_DIR = DEFAULT_MATRIX  # ckptgate's own; a configured repository's is RepoLayout.matrix
FILES = ("SUPPORT.md", "support.json", "index.html")


@dataclass(frozen=True, slots=True, kw_only=True)
class Matrix:
    """The rendered matrix: rows from policy, the policy revision, and the evaluation time."""

    rows: tuple[dict[str, Any], ...]
    policy_revision: str
    candidate_commit: str
    as_of: str
    qualified: dict[str, Any] = field(default_factory=dict, repr=False)
    """The generated gate as policy computed it (``data.ckptgate.support.qualified``)."""
    input: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The support input it was evaluated on (to evaluate again without verifying again)."""

    def summary(self) -> dict[str, int]:
        return {s: sum(1 for r in self.rows if r.get("status") == s) for s in STATUSES}

    def files(self) -> dict[str, bytes]:
        return {
            "SUPPORT.md": render_markdown(self).encode(),
            "support.json": render_json(self).encode(),
            "index.html": render_html(self).encode(),
        }


def build(
    repo: Path | RepoLayout,
    engine: PolicyEngine,
    trust: TrustData,
    *,
    now: datetime | None = None,
    doc: dict[str, Any] | None = None,
) -> Matrix:
    """Evaluate ``data.ckptgate.support.rows`` and ``qualified`` over the verified facts (``doc``:
    a :func:`support_input` already collected) and return the matrix with its generated gate."""
    doc = doc if doc is not None else support_input(repo, trust, now=now)
    gate = engine.evaluate(QUALIFIED_ENTRYPOINT, doc).result
    if not isinstance(gate, dict) or not isinstance(gate.get("adapters"), dict):
        raise EvidenceError(
            "evidence.matrix.bad_gate",
            "data.ckptgate.support.qualified is not an object of adapters",
            evidence={"type": type(gate).__name__},
        )
    raw = engine.evaluate(ROWS_ENTRYPOINT, doc)
    rows = raw.result
    if isinstance(rows, dict) and isinstance(rows.get("rows"), list):
        rows = rows["rows"]
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise EvidenceError(
            "evidence.matrix.bad_rows",
            "data.ckptgate.support.rows is not a list of objects",
            evidence={"type": type(rows).__name__},
        )
    # Which committed fixture a row's digest is, for the reader (measured by collect; not a policy input).
    names = doc.get("fixtures") or {}
    ordered = sorted(({**r, "fixture": names.get(str(r.get("fixture_digest")))} for r in rows), key=_row_key)
    return Matrix(
        rows=tuple(ordered),
        policy_revision=raw.policy_revision,
        candidate_commit=doc["head"]["candidate_commit"],
        as_of=doc["now"],
        qualified=gate,
        input=doc,
    )


def _row_key(row: dict[str, Any]) -> tuple[str, ...]:
    return (
        str(row.get("adapter") or ""),
        str(formats(row)),
        str(row.get("producer_version") or ""),
        str(row.get("fixture_digest") or ""),
        str(row.get("source") or ""),
        str(row.get("status")),
    )


def write(m: Matrix, out_dir: Path) -> list[Path]:
    """Write the matrix files into ``out_dir``, each whole (:func:`~ckptgate.userfiles.write_output_file`);
    every target is checked before the first is written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            "usage.output_parent",
            f"cannot create the matrix directory {out_dir}: {e.strerror}",
            advice=f"Name with --out a directory this user can create (`ls -ld {out_dir.parent}`).",
        ) from None
    files = m.files()
    for name in files:
        check_output_file(out_dir / name, what="the matrix file")
    for name, data in files.items():
        write_output_file(out_dir / name, data, what="the matrix file")
    return [out_dir / name for name in files]


def diff(m: Matrix, committed_dir: Path) -> list[str]:
    """Unified diffs between the regenerated files and ``committed_dir`` (empty when equal)."""
    out = []
    for name, data in m.files().items():
        p = committed_dir / name
        old = p.read_text(encoding="utf-8") if p.is_file() else ""
        new = data.decode()
        if old != new:
            out.append(drift(old, new, name, context=1))
    return out


__all__ = [
    "FILES",
    "MAX_RESULT_LOG_BYTES",
    "QUALIFIED_ENTRYPOINT",
    "ROWS_ENTRYPOINT",
    "STATUSES",
    "Head",
    "Matrix",
    "build",
    "collect",
    "diff",
    "fixture_digests",
    "fixture_label",
    "gate_diff",
    "head_facts",
    "render_gate",
    "retained_result",
    "support_input",
    "targets",
    "write",
    "write_gate",
]
