"""The reviewer report for one checkpoint: what it is, whether its digest matches the attestation
subjects, who signed what, which policy revision decided (allow or deny, and why), and which
containment controls a load would need.  Nothing in the checkpoint is loaded: the report comes
from :func:`ckptgate.pipeline.evaluate` (inspect, digest, verify, decide).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

from ckptgate import __version__
from ckptgate.decide.bundle import opa_version
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.evidence.pages import predicate_rows, render
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
    hashes = ev.digest.file_hashes()
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
            # from the decision, not the options: $CKPTGATE_OPA_URL may have named the engine, and
            # the URL as given may carry credentials
            "engine": d.engine_json(None if d.remote else opa_version()),
        },
        "checkpoint": {
            "path": str(Path(path).absolute()),
            "path_as_given": str(path),
            "format": facts.get("format"),
            "clean": facts.get("clean"),
            "digest": ev.digest.digest.prefixed(),
            "file_count": len(facts.get("files") or []),
            "files": [{**f, "sha256": hashes.get(str(f.get("path")))} for f in facts.get("files") or []],
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
            "fixture_digest",
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


def render_html(doc: dict[str, Any]) -> str:
    """The report as one self-contained HTML document (``templates/report.html.j2``: inline CSS, no
    script, no network, every value escaped)."""
    return render(
        "report.html.j2",
        doc=doc,
        engine=engine_text(doc),
        training=[training_rows(a.get("training")) for a in doc["attestations"]],
        references=cited_references(doc),
    )


def engine_text(doc: dict[str, Any]) -> str:
    """Which OPA decided, as a filed record wants it: its version, or the server it was asked."""
    engine = (doc.get("generated") or {}).get("engine") or {}
    if engine.get("kind") == "remote":
        revision = engine.get("revision")
        return f"OPA server {engine.get('url')}" + (f", bundle revision {revision}" if revision else "")
    return f"OPA {engine.get('opa_version') or '(version not reported)'}, embedded: started and owned by this run"


def cited_references(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Every register ID that the report's own text cites in brackets (``[R28, R30]``,
    ``[R30-R35]``, with an en dash or a hyphen), with its title from the register ckptgate's docs follow."""
    register: dict[str, str] = json.loads(files("ckptgate.evidence").joinpath("register.json").read_text())
    cited: set[int] = set()
    for group in re.findall(r"\[(R\d\d(?:\s*[,\u2013-]\s*R\d\d)*)\]", json.dumps(doc, ensure_ascii=False)):
        for lo, hi in re.findall(r"R(\d\d)(?:\s*[\u2013-]\s*R(\d\d))?", group):
            cited.update(range(int(lo), int(hi or lo) + 1))
    return [(f"R{n:02d}", register[f"R{n:02d}"]) for n in sorted(cited) if f"R{n:02d}" in register]


__all__ = ["build_report", "predicate_rows", "render_html", "render_text"]
