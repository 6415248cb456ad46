"""The generated support matrix: verify every stored attestation, let ``ckptgate.support`` decide
each row's status, and render ``matrix/SUPPORT.md``, ``matrix/support.json`` and ``matrix/index.html``.

Generation is deterministic: the policy is evaluated "as of" the newest of the candidate commit's
time and the stored statements' ``issued_at`` (never the wall clock), attestation sources are
repository-relative, and nothing names HEAD.  So regenerating at the same candidate commit with the
same attestations and policies gives the same bytes, and ``ckptgate check`` detects drift.
A row is a claim about one exact producer version, adapter version, fixture digest, candidate
commit, environment and topology (register claim rule 3), nothing more.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptgate.digest import Digest, fixture_digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.evidence.candidate import _filtered_tree, candidate_commit, commit_time, git, head_commit
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.fixtures import Fixture, list_fixtures
from ckptgate.evidence.gates import GATES_IN_BUNDLE, gates_data
from ckptgate.evidence.layout import DEFAULT_MATRIX, RepoLayout, as_layout
from ckptgate.evidence.matrix_render import GENERATOR, STATUSES, formats, render_html, render_json, render_markdown
from ckptgate.inspect import SafeTree
from ckptgate.userfiles import check_output_file, read_regular_file, write_output_file
from ckptgate.verify import AttestationStore, verify_attestation
from ckptgate.verify.facts import rejection_facts
from ckptgate.verify.statement import field_at, iso_utc, parse_time
from ckptgate.verify.store import statement_of

if TYPE_CHECKING:
    from ckptgate.decide.engine import PolicyEngine
    from ckptgate.verify import TrustData

ROWS_ENTRYPOINT = "ckptgate/support/rows"
QUALIFIED_ENTRYPOINT = "ckptgate/support/qualified"
MATRIX_DIR = DEFAULT_MATRIX  # ckptgate's own; a configured repository's is RepoLayout.matrix
FILES = ("SUPPORT.md", "support.json", "index.html")


@dataclass(frozen=True, slots=True, kw_only=True)
class Head:
    """``input.head`` of the support policy: HEAD, the candidate commit and the evidence commits."""

    commit: str
    candidate_commit: str
    source_tree: str
    candidate_source_tree: str
    evidence_commits: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "commit": self.commit,
            "candidate_commit": self.candidate_commit,
            "source_tree": self.source_tree,
            "candidate_source_tree": self.candidate_source_tree,
            "evidence_commits": list(self.evidence_commits),
        }


def _source_tree_id(layout: RepoLayout, commit: str) -> str:
    lines = _filtered_tree(layout.root, commit, layout.evidence_paths)
    return "sha256:" + hashlib.sha256("\0".join(lines).encode()).hexdigest()


def head_facts(repo: Path | RepoLayout) -> Head:
    layout = as_layout(repo)
    repo = layout.root
    head = head_commit(repo)
    cand = candidate_commit(repo, exclude=layout.evidence_paths)
    between = git(repo, "rev-list", "--first-parent", f"{cand}..{head}").split() if cand != head else []
    return Head(
        commit=head,
        candidate_commit=cand,
        source_tree=_source_tree_id(layout, head),
        candidate_source_tree=_source_tree_id(layout, cand),
        evidence_commits=tuple(sorted(between)),
    )


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


def _parse_time(s: Any) -> datetime | None:
    try:
        return parse_time(s) if isinstance(s, str) else None
    except ValueError:
        return None


def fixture_digests(repo: Path | RepoLayout) -> dict[Digest, Fixture]:
    """Digest -> fixture, measured now over every fixture's ``checkpoint/``."""
    out: dict[Digest, Fixture] = {}
    for f in list_fixtures(repo):
        with SafeTree.open(f.checkpoint) as tree:
            out[fixture_digest(tree).digest] = f
    return out


def fixture_label(f: Fixture) -> dict[str, Any]:
    """What the matrix shows of a row's fixture: its name, and the device whose location records a
    synthetic GPU-written fixture carries (written on CPU: ``meta.json`` ``synthetic_device``)."""
    synthetic = f.meta.get("synthetic_device")
    location = synthetic.get("location") if isinstance(synthetic, dict) else None
    return {"name": f.name, "synthetic_device": location if isinstance(location, str) else None}


def collect(
    repo: Path | RepoLayout, trust: TrustData, *, now: datetime | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], datetime, dict[Digest, Fixture]]:
    """Verify every stored attestation against the fixture it names; (facts, rejected, as-of time,
    the measured fixture names by digest)."""
    layout = as_layout(repo)
    repo = layout.root
    # (source, the subject digest its directory names, its bytes): each stored file is read once
    stored = [
        (layout.rel(p), Digest.from_filename_stem(p.parent.name), p.read_bytes())
        for p in AttestationStore(layout.attestations).iter()
    ]
    if now is None:  # the newest signed issue time: a file nobody trusted signed cannot move it
        times = [commit_time(repo, candidate_commit(repo, exclude=layout.evidence_paths))]
        for source, digest, raw in stored:
            issued = _signed_issue_time(raw, source=source, trust=trust, digest=digest)
            if issued is not None:
                times.append(issued)
        now = max(times)
    measured = fixture_digests(layout) if stored else {}
    facts: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for source, digest, raw in stored:
        if digest not in measured:
            rejected.append(
                {
                    "source": source,
                    "code": "evidence.fixture_unknown",
                    "message": f"no fixture under {layout.rel(layout.fixtures)} has digest {digest}",
                }
            )
            continue
        try:
            va = verify_attestation(raw, source=source, trust=trust, measured_digest=digest, now=now)
        except VerificationError as e:
            rejected.append(rejection_facts(source, e))
        else:
            facts.append({**va.to_facts(), "retained_result": retained_result(repo, va.statement)})
    return facts, rejected, now, measured


#: The largest result log read back to check its digest (qualification logs are a few KiB).
MAX_RESULT_LOG_BYTES = 16 << 20


def retained_result(repo: Path, statement: dict[str, Any]) -> dict[str, Any]:
    """The fact the support policy checks a row's retained result against: the sha256 of the file
    at the statement's ``result.evidence.location`` in ``repo`` (``None`` when there is no regular
    file of at most :data:`MAX_RESULT_LOG_BYTES` there, inside the repository), and the format that
    file records (``inspected_format``), which the generated gate keys its rows by.  Policy uses the
    format only when the sha256 is the attested evidence digest."""
    location = field_at(statement, "predicate", "result", "evidence", "location")
    digest = None
    fmt = None
    mapping = None
    if isinstance(location, str) and location and not location.startswith("/"):
        path = repo / location
        try:
            inside = path.resolve().is_relative_to(repo.resolve())
            raw = read_regular_file(path, limit=MAX_RESULT_LOG_BYTES) if inside else None
        except OSError:
            raw = None
        if raw is not None and len(raw) <= MAX_RESULT_LOG_BYTES:
            digest = "sha256:" + hashlib.sha256(raw).hexdigest()
            fmt = _logged_format(raw)
            mapping = _logged_mapping(raw)
    return {"location": location, "sha256": digest, "format": fmt, "mapping": mapping}


def _logged_format(raw: bytes) -> str | None:
    """The format a result log records its fixture was inspected as (``inspected_format``), from the
    very bytes whose digest :func:`retained_result` reports; ``None`` when it names none."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    fmt = doc.get("inspected_format") if isinstance(doc, dict) else None
    return fmt if isinstance(fmt, str) and fmt else None


def _logged_mapping(raw: bytes) -> dict[str, Any] | None:
    """The mapping a mapping qualification's log records (its family, and the measured logits
    delta), from the same bytes as :func:`_logged_format`; ``None`` for a name-preserving one."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    mapping = doc.get("mapping") if isinstance(doc, dict) else None
    if not isinstance(mapping, dict) or not isinstance(mapping.get("family"), str):
        return None
    logits = mapping.get("logits")
    delta = logits.get("max_abs_delta") if isinstance(logits, dict) else None
    return {
        "family": mapping["family"],
        "max_abs_delta": delta if isinstance(delta, (int, float)) and not isinstance(delta, bool) else None,
    }


def _signed_issue_time(raw: bytes, *, source: str, trust: TrustData, digest: Digest) -> datetime | None:
    """``issued_at`` of an attestation that verifies at that instant (trusted signature, known
    statement shape, subject ``digest``); ``None`` for anything else, however it is malformed."""
    try:
        _f, stmt, _ = statement_of(raw)
    except VerificationError:
        return None
    issued = _parse_time(field_at(stmt, "predicate", "validity", "issued_at"))
    if issued is None:
        return None
    try:
        verify_attestation(raw, source=source, trust=trust, measured_digest=digest, now=issued)
    except VerificationError:
        return None
    return issued


def targets(repo: Path | RepoLayout) -> list[str]:
    """Every adapter the gates data knows: each gets a row, unqualified until evidence supports it."""
    gates = gates_data(repo)
    if gates is None:
        raise EvidenceError("evidence.matrix.gates_unreadable", f"cannot read the policies' {GATES_IN_BUNDLE}")
    return sorted(a for a in (gates.get("adapters") or {}) if isinstance(a, str))


def support_input(repo: Path | RepoLayout, trust: TrustData, *, now: datetime | None = None) -> dict[str, Any]:
    facts, rejected, as_of, names = collect(repo, trust, now=now)
    return {
        "fixtures": {d.prefixed(): fixture_label(f) for d, f in sorted(names.items(), key=lambda kv: kv[1].name)},
        "attestations": facts,
        "rejected_attestations": rejected,
        "now": iso_utc(as_of),
        "head": head_facts(repo).to_json(),
        "targets": targets(repo),
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
            out.append(
                "".join(
                    difflib.unified_diff(
                        old.splitlines(keepends=True),
                        new.splitlines(keepends=True),
                        fromfile=f"committed/{name}",
                        tofile=f"regenerated/{name}",
                        n=1,
                    )
                )
                or f"{name} differs\n"
            )
    return out


# ---------------------------------------------------------------------------------------- the gate
def render_gate(m: Matrix) -> bytes:
    """The generated gate file (``data.ckptgate.config.qualified``): every adapter's qualified rows,
    in a stable order.  It names nothing that moves with the code (no candidate commit, no policy
    revision), so it changes only when the retained qualifications do."""
    adapters: dict[str, Any] = {}
    for name, entry in sorted((m.qualified.get("adapters") or {}).items()):
        rows = sorted(
            entry.get("rows") or [],
            key=lambda r: (
                str(r.get("format")),
                _version_key(r.get("producer_version")),
                json.dumps(r.get("topology"), sort_keys=True),
                str(r.get("fixture_digest")),
                str(r.get("attestation")),
            ),
        )
        versions = {fmt: sorted(vs, key=_version_key) for fmt, vs in sorted((entry.get("versions") or {}).items())}
        adapters[name] = {"producer": entry.get("producer"), "versions": versions, "rows": rows}
    hf_rows = sorted(
        (m.qualified.get("hf_mapping") or {}).get("qualified") or [],
        key=lambda r: (
            str(r.get("family")),
            _version_key(r.get("release")),
            [r.get(a) for a in ("tp", "pp", "ep")],
            str(r.get("fixture_digest")),
            str(r.get("attestation")),
        ),
    )
    doc = {
        "generated": {
            "by": GENERATOR,
            "note": "generated from passing qualification attestations with retained evidence; do not edit by hand",
        },
        "adapters": adapters,
        "hf_mapping": {"qualified": hf_rows},
    }
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _version_key(v: Any) -> tuple[tuple[int, ...], str]:
    text = str(v)
    nums = []
    for part in text.split("+", 1)[0].split("-", 1)[0].split("."):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums), text


def gate_diff(m: Matrix, gate_file: Path) -> str | None:
    """A unified diff between the regenerated gate and ``gate_file`` (``None`` when equal)."""
    new = render_gate(m).decode()
    try:
        old = gate_file.read_text(encoding="utf-8")
    except OSError:
        old = ""
    if old == new:
        return None
    return (
        "".join(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile=f"committed/{gate_file.name}",
                tofile=f"regenerated/{gate_file.name}",
                n=2,
            )
        )
        or f"{gate_file.name} differs\n"
    )


def write_gate(m: Matrix, gate_file: Path) -> bool:
    """Write the generated gate into ``gate_file`` whole; True when its bytes changed."""
    data = render_gate(m)
    try:
        if gate_file.read_bytes() == data:
            return False
    except OSError:
        pass
    try:
        gate_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            "usage.output_parent",
            f"cannot create {gate_file.parent}: {e.strerror}",
            advice=f"Make {gate_file.parent} creatable by this user (`ls -ld {gate_file.parent.parent}`), then run "
            "again.",
        ) from None
    check_output_file(gate_file, what="the generated gate")
    write_output_file(gate_file, data, what="the generated gate")
    return True


__all__ = [
    "FILES",
    "QUALIFIED_ENTRYPOINT",
    "ROWS_ENTRYPOINT",
    "STATUSES",
    "Head",
    "Matrix",
    "build",
    "collect",
    "diff",
    "fixture_digests",
    "gate_diff",
    "head_facts",
    "render_gate",
    "support_input",
    "targets",
    "write",
    "write_gate",
]
