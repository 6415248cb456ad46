"""The reviewer report for one checkpoint: what it is, whether its digest matches the attestation
subjects, who signed what, which policy revision decided (allow or deny, and why), and which
containment controls a load would need.  Nothing in the checkpoint is loaded: the report comes
from :func:`ckptgate.pipeline.evaluate` (inspect, digest, verify, decide).
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckptgate import __version__
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.inspect import SafeTree
from ckptgate.pipeline import evaluate
from ckptgate.verify.oms import load_verification_material
from ckptgate.verify.statement import field_at


def build_report(
    path: Path,
    attestations: Sequence[Path],
    *,
    options: EngineOptions | None = None,
    now: datetime | None = None,
    signatures: Sequence[Path] = (),
    key: Path | None = None,
    on_hash_plan: Callable[[int], None] | None = None,
    on_hash_bytes: Callable[[int], None] | None = None,
    certificate_chain: Sequence[Path] = (),
) -> dict[str, Any]:
    """The report document (JSON-serialisable) for the checkpoint at ``path``; ``signatures`` are
    OpenSSF Model Signing bundles verified under ``key`` or against ``certificate_chain``.  Every value
    is complete: no digest, path or predicate field is shortened.  ``on_hash_plan``/``on_hash_bytes`` report the
    digest's progress (:func:`ckptgate.pipeline.evaluate`)."""
    options = options or EngineOptions()
    trust = load_trust(options)
    offered, chain = load_verification_material(signatures, key, certificate_chain, options.sigstore_trust_root)
    with SafeTree.open(path) as tree, engine_for(options, trust) as engine:
        ev = evaluate(
            tree,
            attestations=list(attestations),
            engine=engine,
            trust=trust,
            action="verify",
            now=now,
            sigstore_trust_root=options.sigstore_trust_root,
            signatures=signatures,
            offered_key=offered,
            on_hash_plan=on_hash_plan,
            on_hash_bytes=on_hash_bytes,
            certificate_chain=chain,
        )
    facts = ev.inspection.to_facts()
    pin = ev.policy_input.to_json()
    d = ev.decision
    signed = []
    for att in pin.get("attestations") or []:
        # Every field is read with field_at: a predicate ckptgate has no schema for may hold any shape.
        pred = field_at(att, "statement", "predicate")
        subjects = field_at(att, "statement", "subject")
        subjects = subjects if isinstance(subjects, list) else []
        checks = field_at(att, "verification", "checks")
        signed.append(
            {
                "source": att.get("source"),
                "predicate_type": field_at(att, "statement", "predicateType"),
                "subjects": [f"sha256:{field_at(s, 'digest', 'sha256')}" for s in subjects],
                # The bound subject is this checkpoint, and the predicate is about that subject (not a
                # co-subject beside a statement about another fixture).
                "digest_matches": bool(field_at(att, "verification", "subject_matches_fixture"))
                and field_at(att, "verification", "measured_digest") == ev.digest.digest.prefixed()
                and (
                    _predicate_about_subject(att) or field_at(att, "verification", "manifest_matches_fixture") is True
                ),
                "method": field_at(att, "verification", "method"),
                "binding": field_at(att, "verification", "binding"),
                "subject_name": field_at(att, "verification", "subject_name"),
                "model_name": field_at(subjects[0], "name")
                if field_at(att, "verification", "method") == "model_signing" and subjects
                else None,
                "files_bound": field_at(att, "verification", "manifest"),
                "builder": field_at(pred, "runDetails", "builder", "id"),
                "training": att.get("training"),
                "signers": att.get("signers") or [],
                "issued_at": field_at(att, "verification", "validity", "issued_at")
                or field_at(pred, "validity", "issued_at"),
                "expires_at": field_at(att, "verification", "validity", "expires_at"),
                "timing": field_at(att, "verification", "timing"),
                "verified_at": field_at(att, "verification", "verified_at"),
                "payload_sha256": field_at(att, "verification", "payload_sha256"),
                "checks": [str(c) for c in checks] if isinstance(checks, list) else [],
                "claims": {
                    k: pred[k]
                    for k in ("producer", "adapter", "candidate_commit", "topology", "result")
                    if isinstance(pred, dict) and k in pred
                },
                "predicate": pred,
            }
        )
    generated_at = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "report_version": 2,
        "generated": {
            "at": generated_at,
            "ckptgate_version": __version__,
            "policy_revision": d.policy_revision,
            "trust_data": {"source": trust.source, "sha256": f"sha256:{hashlib.sha256(trust.raw).hexdigest()}"},
        },
        "checkpoint": {
            "path": str(path),
            "format": facts.get("format"),
            "clean": facts.get("clean"),
            "digest": ev.digest.digest.prefixed(),
            "file_count": len(facts.get("files") or []),
            "files": facts.get("files") or [],
            "loaders": facts.get("loaders") or [],
            "findings": facts.get("findings") or [],
        },
        "attestations": signed,
        "rejected_attestations": pin.get("rejected_attestations") or [],
        "digest_matches_any_attestation": any(a["digest_matches"] for a in signed),
        "decision": d.to_json(
            "allow",
            "plane",
            "refusal",
            "decision_id",
            "policy_revision",
            "engine",
            "reasons",
            "permitted_loaders",
            "inputs",
        ),
        "load_requires": {
            "plane": d.plane,
            "controls": list(d.required_controls),
            "containment_observed": pin.get("containment"),
            "note": "containment controls limit what a loader can reach; they are not proof "
            "that deserialization is safe [R28, R30]",
        },
    }


def training_rows(training: Any) -> list[tuple[str, str]]:
    """A training provenance's facts (``training`` of an attestation's facts) as ``(label, text)`` rows:
    builder, code commit, producer versions, topology, base model; none for another predicate."""
    if not isinstance(training, dict):
        return []
    topo = training.get("topology") or {}
    code = training.get("code")
    base = training.get("base_model")
    rows = [
        ("builder", str(training.get("builder_id"))),
        ("code", f"{code.get('uri')} at {code.get('commit')}" if isinstance(code, dict) else "not recorded"),
        (
            "producers",
            ", ".join(
                f"{p.get('name')} {p.get('version')} ({p.get('source')})" for p in training.get("producers") or []
            )
            or "none recorded",
        ),
        ("topology", ", ".join(f"{k}={x}" for k, x in topo.items()) or "not recorded"),
        ("step", f"{training.get('step')} ({training.get('format')}, {training.get('dtype')})"),
    ]
    if isinstance(base, dict):
        rows.append(("base", f"{base.get('repo')} revision {base.get('revision')}"))
    return rows


def _predicate_about_subject(att: dict[str, Any]) -> bool:
    """No predicate field Python checked names another fixture than the bound subject."""
    named = field_at(att, "verification", "predicate_subject")
    return isinstance(named, dict) and all(v is True for v in named.values())


def render_text(doc: dict[str, Any]) -> list[str]:
    c, d = doc["checkpoint"], doc["decision"]
    out = [
        f"checkpoint  {c['path']}",
        f"  format    {c['format']} ({c['file_count']} files, inspection {'clean' if c['clean'] else 'NOT clean'})",
        f"  digest    {c['digest']}",
    ]
    for f in c["findings"]:
        out.append(f"  finding   [{f.get('severity')}] {f.get('code')}: {f.get('message')}")
    if not doc["attestations"] and not doc["rejected_attestations"]:
        out.append("attestations  none offered")
    for a in doc["attestations"]:
        out.append(f"attestation {a['source']}  digest {'MATCHES' if a['digest_matches'] else 'DOES NOT MATCH'}")
        for s in a["signers"]:
            who = s.get("signer_id") or s.get("identity")
            via = f", offered as {s['offered']}" if s.get("offered") else ""
            out.append(
                f"  signed by {s.get('kind')} {who} ({s.get('algorithm') or s.get('issuer')}, "
                f"spki {s.get('spki_sha256') or '-'}{via})"
            )
        if a.get("model_name"):
            out.append(f"  model     {a['model_name']} ({a.get('method')}, every file bound by sha256)")
        out.append(f"  issued    {a['issued_at']}  expires {a['expires_at']}")
        claims = a["claims"]
        if claims:
            out.append(f"  states    {json.dumps(claims, sort_keys=True)}")
        for label, text in training_rows(a.get("training")):
            out.append(f"  {label:<9} {text}")
    for r in doc["rejected_attestations"]:
        out.append(f"REJECTED    {r.get('source')}: [{r.get('code')}] {r.get('message')}")
    out.append(
        f"decision    {'ALLOW' if d['allow'] else 'DENY'} plane={d['plane']} "
        f"policy revision {d['policy_revision']} (decision {d['decision_id'] or '-'})"
    )
    for i in d.get("inputs") or []:
        out.append(f"  input     {i.get('role')} {i.get('path')} ({i.get('origin')}, {i.get('sha256')})")
    for r in d["reasons"]:
        label = "because" if r.get("severity") == "deny" else "note"
        out.append(f"  {label:<9} [{r.get('code')}] {r.get('message')}")
    lr = doc["load_requires"]
    out.append(f"a load needs plane {lr['plane']} with controls: {', '.join(lr['controls']) or 'none'}")
    out.append(f"  note      {lr['note']}")
    g = doc.get("generated") or {}
    trust = g.get("trust_data") or {}
    out.append(
        f"report      ckptgate {g.get('ckptgate_version')}, generated {g.get('at')}, "
        f"trust data {trust.get('sha256')} ({trust.get('source')})"
    )
    return out


_CSS = """
:root{color-scheme:light}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1b1b1b;margin:0 auto;padding:1.5rem;
max-width:72rem}
h1{font-size:1.5rem;margin:0 0 .5rem}
h2{font-size:1.2rem;border-bottom:2px solid #d0d7de;padding-bottom:.2rem;margin:1.8rem 0 .6rem}
h3{font-size:1.05rem;margin:1.2rem 0 .4rem}
h4{font-size:.95rem;margin:.9rem 0 .3rem}
code,.digest,pre{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:.88em}
code,.digest,td,th,dd,pre,h3{overflow-wrap:anywhere;word-break:normal}
pre{white-space:pre-wrap;background:#f6f8fa;border:1px solid #d0d7de;padding:.75rem;margin:0}
table{border-collapse:collapse;width:100%;table-layout:auto;margin:.3rem 0 .8rem}
th,td{border:1px solid #d0d7de;padding:.3rem .5rem;text-align:left;vertical-align:top}
thead th{background:#f6f8fa}
table.predicate td:first-child{width:35%}
dl{display:grid;grid-template-columns:minmax(9rem,max-content) minmax(0,1fr);gap:.25rem 1rem;margin:.3rem 0 .8rem}
dt{font-weight:600}
dd{margin:0;min-width:0}
.verdict{font-size:1.4rem;font-weight:700;padding:.6rem 1rem;border:2px solid;border-radius:4px;margin:.5rem 0}
.verdict-allow{background:#dafbe1;border-color:#1a7f37;color:#0f5323}
.verdict-deny{background:#ffebe9;border-color:#cf222e;color:#82071e}
.ok{color:#1a7f37;font-weight:600}
.bad{color:#cf222e;font-weight:600}
.attestation{border-left:4px solid #d0d7de;padding-left:1rem;margin:1rem 0}
.rejected{border-left-color:#cf222e}
.muted{color:#57606a}
@media print{
 body{font-size:10.5pt;max-width:none;padding:0}
 h2,h3,h4{break-after:avoid}
 tr,dt,dd,.verdict{break-inside:avoid}
 .attestation{break-inside:auto}
 details>summary{display:none}
 a{color:inherit}
}
@page{margin:15mm}
"""


def _text(value: Any) -> str:
    """A value as the reviewer reads it: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return "-"
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def predicate_rows(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """The predicate flattened to ``(field path, value)`` rows: ``a.b[0].c``; every leaf, in order."""
    if isinstance(value, dict) and value:
        rows: list[tuple[str, str]] = []
        for k in sorted(value, key=str):
            rows += predicate_rows(value[k], f"{prefix}.{k}" if prefix else str(k))
        return rows
    if isinstance(value, list) and value:
        rows = []
        for i, item in enumerate(value):
            rows += predicate_rows(item, f"{prefix}[{i}]")
        return rows
    return [(prefix or "(predicate)", _text(value))]


def render_html(doc: dict[str, Any]) -> str:
    """The report as one self-contained HTML document (inline CSS, no network, every value escaped)."""
    e = html.escape

    def v(value: Any, *, mono: bool = False) -> str:
        text = e(_text(value))
        return f'<code class="digest">{text}</code>' if mono else text

    def dl(pairs: Sequence[tuple[str, str]]) -> str:
        return "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{val}</dd>" for k, val in pairs) + "</dl>"

    def table(cls: str, head: Sequence[str], rows: Sequence[Sequence[str]], empty: str) -> str:
        if not rows:
            return f'<p class="muted {cls}-none">{e(empty)}</p>'
        return (
            f'<table class="{cls}"><thead><tr>'
            + "".join(f'<th scope="col">{e(h)}</th>' for h in head)
            + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
            + "</tbody></table>"
        )

    c, d, g, lr = doc["checkpoint"], doc["decision"], doc.get("generated") or {}, doc["load_requires"]
    verdict = "allow" if d["allow"] else "deny"
    summary = (
        "The policy allows this checkpoint"
        if d["allow"]
        else f"The policy denies this checkpoint (refusal: {d['refusal']})"
    )
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>ckptgate reviewer report: {e(verdict.upper())} {e(str(c['digest']))}</title>"
        f"<style>{_CSS}</style></head><body>",
        f"<header><h1>ckptgate reviewer report</h1>"
        f'<p id="verdict" class="verdict verdict-{verdict}" role="status">{verdict.upper()}: {e(summary)}</p>'
        f'<p>Checkpoint <code class="digest">{e(str(c["digest"]))}</code>, decided by policy revision '
        f'<code class="digest">{e(_text(d["policy_revision"]))}</code>. Nothing in the checkpoint was loaded '
        "to make this report.</p></header><main>",
    ]
    files = [[v(f.get("path"), mono=True), v(f.get("kind")), v(f.get("size")), v(f.get("detail"))] for f in c["files"]]
    findings = [
        [v(f.get("severity")), v(f.get("code"), mono=True), v(f.get("path"), mono=True), v(f.get("message"))]
        for f in c["findings"]
    ]
    parts.append(
        '<section id="inspected" aria-labelledby="h-inspected"><h2 id="h-inspected">What was inspected</h2>'
        + dl(
            [
                ("Path", v(c["path"], mono=True)),
                ("Format", v(c["format"])),
                ("Digest", v(c["digest"], mono=True)),
                ("Inspection", '<span class="ok">clean</span>' if c["clean"] else '<span class="bad">NOT clean</span>'),
                ("Loaders", v(", ".join(str(x) for x in c["loaders"]) or "none")),
                ("Files", e(str(c["file_count"]))),
            ]
        )
        + f"<h3>Files ({len(files)})</h3>"
        + table("files", ["Path", "Kind", "Bytes", "Detail"], files, "No files.")
        + f"<h3>Findings ({len(findings)})</h3>"
        + table("findings", ["Severity", "Code", "File", "Message"], findings, "No findings.")
        + "</section>"
    )
    atts = ['<section id="attestations" aria-labelledby="h-attestations"><h2 id="h-attestations">Attestations</h2>']
    if not doc["attestations"] and not doc["rejected_attestations"]:
        atts.append('<p class="muted">No attestation was offered.</p>')
    for i, a in enumerate(doc["attestations"], 1):
        match = (
            '<span class="ok">matches this checkpoint</span>'
            if a["digest_matches"]
            else '<span class="bad">does NOT match this checkpoint</span>'
        )
        signers = []
        for s in a["signers"]:
            if s.get("kind") in ("sigstore", "certificate"):
                how = f"identity {v(s.get('identity'), mono=True)}<br>issuer {v(s.get('issuer'), mono=True)}"
                ext = s.get("extensions") or {}
                if ext:
                    how += "<br>" + "<br>".join(f"{e(str(k))}: {v(x, mono=True)}" for k, x in sorted(ext.items()))
            else:
                how = f"algorithm {v(s.get('algorithm'))}<br>key SPKI SHA-256 {v(s.get('spki_sha256'), mono=True)}" + (
                    f"<br>offered as {v(s.get('offered'))}" if s.get("offered") else ""
                )
            signers.append([v(s.get("signer_id")), v(s.get("kind")), how])
        timing = a.get("timing") or {}
        pairs = [
            ("Source", v(a["source"], mono=True)),
            ("Predicate type", v(a["predicate_type"], mono=True)),
            ("Method", v(a.get("method"))),
            ("Subject binding", v(a.get("binding"))),
            ("Subject", v(a.get("subject_name")) + "<br>" + "<br>".join(v(x, mono=True) for x in a["subjects"])),
            ("Digest", match),
            ("Issued", v(a["issued_at"])),
            ("Expires", v(a["expires_at"])),
            ("Verified at", v(a.get("verified_at"))),
            ("Signed payload", v(a.get("payload_sha256"), mono=True)),
        ]
        if a.get("model_name"):
            pairs.append(("Model", v(a["model_name"]) + " (every file bound by sha256)"))
        pairs += [(f"Training {label}", v(text)) for label, text in training_rows(a.get("training"))]
        pairs += [(f"Timing: {k}", v(x)) for k, x in sorted(timing.items())]
        rows = [[v(k, mono=True), v(x)] for k, x in predicate_rows(a.get("predicate"))]
        atts.append(
            f'<section class="attestation" id="attestation-{i}" aria-labelledby="h-att-{i}">'
            f'<h3 id="h-att-{i}">Attestation {i}: {e(Path(str(a["source"])).name)}</h3>'
            + dl(pairs)
            + "<h4>Signers</h4>"
            + table("signers", ["Signer", "Kind", "Algorithm or identity"], signers, "No signer.")
            + "<h4>Predicate</h4>"
            + table("predicate", ["Field", "Value"], rows, "Empty predicate.")
            + "<h4>Verification checks passed</h4>"
            + (
                '<ul class="checks">'
                + "".join(f"<li><code>{e(x)}</code></li>" for x in a.get("checks") or [])
                + "</ul>"
                if a.get("checks")
                else '<p class="muted">none recorded</p>'
            )
            + "</section>"
        )
    for j, r in enumerate(doc["rejected_attestations"], 1):
        atts.append(
            f'<section class="attestation rejected" id="rejected-{j}" aria-labelledby="h-rej-{j}">'
            f'<h3 id="h-rej-{j}">Rejected: {e(Path(str(r.get("source"))).name)}</h3>'
            + dl(
                [
                    ("Source", v(r.get("source"), mono=True)),
                    ("Code", v(r.get("code"), mono=True)),
                    ("Why", v(r.get("message"))),
                ]
            )
            + "</section>"
        )
    atts.append("</section>")
    parts += atts
    reasons = [[v(r.get("severity")), v(r.get("code"), mono=True), v(r.get("message"))] for r in d["reasons"]]
    parts.append(
        '<section id="decision" aria-labelledby="h-decision"><h2 id="h-decision">Decision</h2>'
        + dl(
            [
                ("Verdict", f'<span class="{"ok" if d["allow"] else "bad"}">{verdict.upper()}</span>'),
                ("Refusal class", v(d["refusal"])),
                ("Plane", v(d["plane"])),
                ("Permitted loaders", v(", ".join(d["permitted_loaders"]) or "none")),
                ("Decision id", v(d["decision_id"], mono=True)),
                ("Engine", v(d["engine"])),
            ]
        )
        + "<h3>Reasons</h3>"
        + table("reasons", ["Severity", "Code", "Message"], reasons, "No reasons given.")
        + "<h3>What a load needs</h3>"
        + dl(
            [
                ("Plane", v(lr["plane"])),
                ("Controls", "<br>".join(f"<code>{e(str(x))}</code>" for x in lr["controls"]) or "none"),
                ("Containment observed", v(lr.get("containment_observed"), mono=True)),
            ]
        )
        + f'<p class="muted">{e(lr["note"])}</p></section>'
    )
    trust = g.get("trust_data") or {}
    parts.append(
        '<section id="about" aria-labelledby="h-about"><h2 id="h-about">About this report</h2>'
        + dl(
            [
                ("Policy revision", v(d["policy_revision"], mono=True)),
                ("Trust data", v(trust.get("sha256"), mono=True) + "<br>" + v(trust.get("source"), mono=True)),
                *(
                    (
                        f"Decided with ({i.get('role', '').replace('_', ' ')})",
                        v(i.get("path"), mono=True)
                        + f" ({e(str(i.get('origin')))})<br>"
                        + v(i.get("sha256"), mono=True),
                    )
                    for i in d.get("inputs") or []
                ),
                ("ckptgate version", v(g.get("ckptgate_version"))),
                ("Generated at", v(g.get("at"))),
                ("Report version", v(doc.get("report_version"))),
            ]
        )
        + "</section>"
    )
    parts.append(
        '<section id="json" aria-labelledby="h-json"><h2 id="h-json">Report JSON</h2>'
        "<details open><summary>The complete report document, as <code>verify --json</code> prints it</summary>"
        f"<pre>{e(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False))}</pre></details></section>"
    )
    parts.append("</main></body></html>\n")
    return "".join(parts)


__all__ = ["build_report", "predicate_rows", "render_html", "render_text"]
