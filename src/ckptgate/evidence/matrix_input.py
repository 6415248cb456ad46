"""The support policy's input (``input`` of ``ckptgate.support``): every stored attestation verified
against the fixture it names, with its retained result; the fixtures by digest; HEAD, the candidate
commit and the evidence commits; and the adapters that get a row.

The as-of time is the newest of the candidate commit's time and the trusted statements'
``issued_at``, never the wall clock, so the same commit and attestations give the same input.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptgate.digest import Digest, fixture_digest
from ckptgate.errors import VerificationError
from ckptgate.evidence.candidate import _filtered_tree, candidate_commit, commit_time, git, head_commit
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.fixtures import Fixture, list_fixtures
from ckptgate.evidence.gates import GATES_IN_BUNDLE, gates_data
from ckptgate.evidence.layout import RepoLayout, as_layout
from ckptgate.inspect import SafeTree
from ckptgate.userfiles import read_regular_file
from ckptgate.verify import AttestationStore, verify_attestation
from ckptgate.verify.facts import rejection_facts
from ckptgate.verify.statement import field_at, iso_utc, parse_time
from ckptgate.verify.store import statement_of

if TYPE_CHECKING:
    from ckptgate.verify import TrustData


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
