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
import html
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptgate.digest import Digest, fixture_digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.evidence.candidate import _filtered_tree, candidate_commit, commit_time, git, head_commit
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.fixtures import list_fixtures
from ckptgate.evidence.gates import GATES_IN_BUNDLE, gates_data
from ckptgate.evidence.layout import DEFAULT_MATRIX, RepoLayout, as_layout
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
STATUSES = ("supported", "stale", "unqualified", "refused")
GENERATOR = "ckptgate matrix build"


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


def fixture_digests(repo: Path | RepoLayout) -> dict[Digest, str]:
    """Digest -> fixture name, measured now over every fixture's ``checkpoint/``."""
    out: dict[Digest, str] = {}
    for f in list_fixtures(repo):
        with SafeTree.open(f.checkpoint) as tree:
            out[fixture_digest(tree).digest] = f.name
    return out


def collect(
    repo: Path | RepoLayout, trust: TrustData, *, now: datetime | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], datetime]:
    """Verify every stored attestation against the fixture it names; (facts, rejected, as-of time)."""
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
    return facts, rejected, now


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
    return {"location": location, "sha256": digest, "format": fmt}


def _logged_format(raw: bytes) -> str | None:
    """The format a result log records its fixture was inspected as (``inspected_format``), from the
    very bytes whose digest :func:`retained_result` reports; ``None`` when it names none."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    fmt = doc.get("inspected_format") if isinstance(doc, dict) else None
    return fmt if isinstance(fmt, str) and fmt else None


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
    facts, rejected, as_of = collect(repo, trust, now=now)
    return {
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
    ordered = sorted(rows, key=_row_key)
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
        str(_formats(row)),
        str(row.get("producer_version") or ""),
        str(row.get("fixture_digest") or ""),
        str(row.get("source") or ""),
        str(row.get("status")),
    )


# --------------------------------------------------------------------------------------------- render
def _formats(row: dict[str, Any]) -> str:
    f = row.get("format")
    if isinstance(f, list):
        return ", ".join(str(x) for x in f) or "-"
    return str(f) if f else "-"


def _topology(row: dict[str, Any]) -> str:
    t = row.get("topology")
    if not isinstance(t, dict):
        return "-"
    return " ".join(f"{k}={t[k]}" for k in sorted(t) if t[k] not in (None, False)) or "-"


def _env(row: dict[str, Any]) -> str:
    e = row.get("environment")
    if not isinstance(e, dict):
        return "-"
    return ", ".join(f"{k} {e[k]}" for k in ("python", "torch", "arch", "accelerator") if e.get(k)) or "-"


def _producer(row: dict[str, Any]) -> str:
    p, v = row.get("producer"), row.get("producer_version")
    return f"{p} {v}" if p and v else str(p or "-")


def _adapter(row: dict[str, Any]) -> str:
    a, v = row.get("adapter"), row.get("adapter_version")
    return f"{a} {v}" if a and v else str(a or "-")


def evidence_location(row: dict[str, Any]) -> str | None:
    ev = row.get("evidence")
    loc = ev.get("location") if isinstance(ev, dict) else None
    return loc if isinstance(loc, str) and loc else None


def _link(row: dict[str, Any]) -> str | None:
    """Where a cell links, relative to ``matrix/``: the evidence log, else the attestation file."""
    target = evidence_location(row) or (row.get("source") if isinstance(row.get("source"), str) else None)
    return f"../{target}" if target else None


def _reasons(row: dict[str, Any]) -> list[str]:
    out = []
    for r in row.get("reasons") or []:
        if isinstance(r, dict):
            out.append(f"{r.get('code')}: {r.get('message')}")
    return out


def _columns(row: dict[str, Any]) -> list[tuple[str, str]]:
    digest = str(row.get("fixture_digest") or "-")
    commit = str(row.get("candidate_commit") or "-")
    return [
        ("status", str(row.get("status"))),
        ("format", _formats(row)),
        ("adapter", _adapter(row)),
        ("producer", _producer(row)),
        ("fixture", digest[:19] + "…" if len(digest) > 20 else digest),
        ("topology", _topology(row)),
        ("environment", _env(row)),
        ("commit", commit[:12] if len(commit) == 40 else commit),
    ]


def _header_lines(m: Matrix) -> list[str]:
    return [
        f"Generated by `{GENERATOR}`; do not edit by hand.",
        f"Policy revision: {m.policy_revision}.",
        f"Candidate commit: {m.candidate_commit}; evaluated as of {m.as_of}.",
    ]


def render_json(m: Matrix) -> str:
    doc = {
        "generated": {
            "by": GENERATOR,
            "note": "generated file; do not edit by hand",
            "policy_revision": m.policy_revision,
            "candidate_commit": m.candidate_commit,
            "as_of": m.as_of,
        },
        "summary": m.summary(),
        "rows": list(m.rows),
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_markdown(m: Matrix) -> str:
    lines = [
        f"<!-- {GENERATOR}: generated file, do not edit. policy revision {m.policy_revision} -->",
        "",
        "# Support matrix",
        "",
    ]
    lines += [f"> {h}" for h in _header_lines(m)]
    lines += [
        "",
        "A row is supported only at its exact producer version, adapter version, fixture digest, "
        "candidate commit, environment and topology, with retained evidence (register rule 3). "
        "The HTML view is [index.html](index.html).",
        "",
    ]
    summary = m.summary()
    lines += ["Summary: " + ", ".join(f"{summary[s]} {s}" for s in STATUSES) + ".", ""]
    cols = [c for c, _ in _columns({})] + ["evidence", "reasons"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in m.rows:
        cells = [_md(v) for _, v in _columns(row)]
        link = _link(row)
        cells.append(f"[{_md(evidence_location(row) or str(row.get('source') or '-'))}]({link})" if link else "-")
        cells.append(_md("; ".join(_reasons(row)) or "-"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%}\
th,td{border:1px solid #ccc;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}a{color:#0550ae;text-decoration:underline}a:visited{color:#6639ba}\
a:hover,a:focus{color:#033d8b;text-decoration-thickness:2px}
.c-evidence a{display:block;white-space:nowrap}
tr.status-supported td.c-status{background:#c8efc8}tr.status-stale td.c-status{background:#fbe6a6}
tr.status-unqualified td.c-status{background:#e4e4e4}tr.status-refused td.c-status{background:#f6b8b8}
.meta{color:#555}#filters{margin:1em 0}#filters label{margin-right:1em}.reasons{font-size:12px;color:#444}
"""

_JS = """
(function(){
  var q=document.getElementById('q'), st=document.getElementById('status');
  function apply(){
    var text=q.value.toLowerCase(), want=st.value, shown=0;
    var rows=document.querySelectorAll('#matrix tbody tr');
    for(var i=0;i<rows.length;i++){
      var r=rows[i], ok=(!want||r.getAttribute('data-status')===want)&&
        (!text||r.textContent.toLowerCase().indexOf(text)>=0);
      r.hidden=!ok; if(ok){shown++;}
    }
    document.getElementById('shown').textContent=String(shown);
  }
  q.addEventListener('input',apply); st.addEventListener('change',apply);
  var params=new URLSearchParams(window.location.search);
  if(params.get('status')){st.value=params.get('status');}
  if(params.get('q')){q.value=params.get('q');}
  apply();
})();
"""


def signers(row: dict[str, Any]) -> list[str]:
    """The trusted signer ids of a row's attestation (none for a refused row: no trusted key signed it)."""
    ev = row.get("evidence")
    ids = ev.get("signers") if isinstance(ev, dict) else None
    return [str(s) for s in ids if s] if isinstance(ids, list) else []


def _evidence_links(row: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(class, label, href)`` for a row's attestation file and result log, relative to ``matrix/``."""
    out = []
    source = row.get("source")
    if isinstance(source, str) and source:
        out.append(("attestation", "attestation", f"../{source}"))
    location = evidence_location(row)
    if location:
        out.append(("log", "result log", f"../{location}"))
    return out


def render_html(m: Matrix) -> str:
    e = html.escape
    head = "".join(f'<p class="meta">{e(h.replace("`", ""))}</p>' for h in _header_lines(m))
    options = "".join(f'<option value="{s}">{s}</option>' for s in STATUSES)
    cols = [c for c, _ in _columns({})] + ["signed by", "evidence", "reasons"]
    body = []
    for row in m.rows:
        status = str(row.get("status"))
        cells = [f'<td class="c-{name}">{e(value)}</td>' for name, value in _columns(row)]
        cells.append(f'<td class="c-signers">{"<br>".join(e(s) for s in signers(row)) or "-"}</td>')
        links = "".join(f'<a class="{cls}" href="{e(href)}">{label}</a>' for cls, label, href in _evidence_links(row))
        cells.append(f'<td class="c-evidence">{links or "-"}</td>')
        reasons = "<br>".join(e(r) for r in _reasons(row)) or "-"
        cells.append(f'<td class="c-reasons reasons">{reasons}</td>')
        body.append(f'<tr class="status-{e(status)}" data-status="{e(status)}">{"".join(cells)}</tr>')
    summary = m.summary()
    return (
        "<!DOCTYPE html>\n"
        f"<!-- {GENERATOR}: generated file, do not edit. policy revision {e(m.policy_revision)} -->\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="generator" content="{GENERATOR}">'
        f'<meta name="policy-revision" content="{e(m.policy_revision)}">'
        "<title>ckptgate support matrix</title>"
        f"<style>{_CSS}</style></head><body>\n"
        "<h1>ckptgate support matrix</h1>\n"
        f"{head}\n"
        '<p class="meta">Summary: ' + ", ".join(f"{summary[s]} {s}" for s in STATUSES) + ".</p>\n"
        '<div id="filters"><label>Filter <input id="q" type="search" placeholder="adapter, format, producer…">'
        '</label><label>Status <select id="status"><option value="">all</option>'
        f'{options}</select></label> <span id="shown">{len(m.rows)}</span> shown</div>\n'
        '<table id="matrix"><thead><tr>'
        + "".join(f"<th>{c}</th>" for c in cols)
        + "</tr></thead><tbody>\n"
        + "\n".join(body)
        + "\n</tbody></table>\n"
        f"<script>{_JS}</script>\n</body></html>\n"
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
    doc = {
        "generated": {
            "by": GENERATOR,
            "note": "generated from passing qualification attestations with retained evidence; do not edit by hand",
        },
        "adapters": adapters,
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
    "evidence_location",
    "fixture_digests",
    "gate_diff",
    "head_facts",
    "render_gate",
    "render_html",
    "render_json",
    "render_markdown",
    "support_input",
    "targets",
    "write",
    "write_gate",
]
