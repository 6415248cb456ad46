"""The reviewer report for one checkpoint: what it is, whether its digest matches the attestation
subjects, who signed what, which policy revision decided (allow or deny, and why), and which
containment controls a load would need.  Nothing in the checkpoint is loaded: the report comes
from :func:`ckptgate.pipeline.evaluate` (inspect, digest, verify, decide).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any


def build_report(path: Path, attestations: Sequence[Path], *, options: Any = None,
                 now: datetime | None = None, signatures: Sequence[Path] = (),
                 key: Path | None = None) -> dict[str, Any]:
    """The report document (JSON-serialisable) for the checkpoint at ``path``; ``signatures`` are
    OpenSSF Model Signing bundles verified under ``key``."""
    from ckptgate.inspect import SafeTree
    from ckptgate.pipeline import EngineOptions, engine_for, evaluate, load_trust
    from ckptgate.verify.statement import field_at

    from ckptgate.verify.oms import OfferedKey, check_signature_flags

    options = options or EngineOptions()
    trust = load_trust(options)
    check_signature_flags(signatures, key)
    offered = OfferedKey.from_file(key) if key is not None else None
    with SafeTree.open(path) as tree, engine_for(options, trust) as engine:
        ev = evaluate(tree, attestations=list(attestations), engine=engine, trust=trust, action="verify", now=now,
                      sigstore_trust_root=options.sigstore_trust_root, signatures=signatures, offered_key=offered)
    facts = ev.inspection.to_facts()
    pin = ev.policy_input.to_json()
    d = ev.decision
    signed = []
    for att in pin.get("attestations") or []:
        # Every field is read with field_at: a predicate ckptgate has no schema for may hold any shape.
        pred = field_at(att, "statement", "predicate")
        subjects = field_at(att, "statement", "subject")
        subjects = subjects if isinstance(subjects, list) else []
        signed.append({
            "source": att.get("source"),
            "predicate_type": field_at(att, "statement", "predicateType"),
            "subjects": [f"sha256:{field_at(s, 'digest', 'sha256')}" for s in subjects],
            # The bound subject is this checkpoint, and the predicate is about that subject (not a
            # co-subject beside a statement about another fixture).
            "digest_matches": bool(field_at(att, "verification", "subject_matches_fixture"))
            and field_at(att, "verification", "measured_digest") == ev.digest.digest
            and (_predicate_about_subject(att) or field_at(att, "verification", "manifest_matches_fixture") is True),
            "method": field_at(att, "verification", "method"),
            "model_name": field_at(subjects[0], "name") if field_at(att, "verification", "method") == "model_signing"
            and subjects else None,
            "files_bound": field_at(att, "verification", "manifest"),
            "builder": field_at(pred, "runDetails", "builder", "id"),
            "signers": att.get("signers") or [],
            "issued_at": field_at(att, "verification", "validity", "issued_at")
            or field_at(pred, "validity", "issued_at"),
            "expires_at": field_at(att, "verification", "validity", "expires_at"),
            "timing": field_at(att, "verification", "timing"),
            "claims": {k: pred[k] for k in ("producer", "adapter", "candidate_commit", "topology", "result")
                       if isinstance(pred, dict) and k in pred},
        })
    return {
        "report_version": 1,
        "checkpoint": {"path": str(path), "format": facts.get("format"), "clean": facts.get("clean"),
                       "digest": ev.digest.digest, "file_count": len(facts.get("files") or []),
                       "files": facts.get("files") or [], "loaders": facts.get("loaders") or [],
                       "findings": facts.get("findings") or []},
        "attestations": signed,
        "rejected_attestations": pin.get("rejected_attestations") or [],
        "digest_matches_any_attestation": any(a["digest_matches"] for a in signed),
        "decision": {"allow": d.allow, "plane": d.plane, "refusal": d.refusal, "decision_id": d.decision_id,
                     "policy_revision": d.policy_revision, "engine": d.engine,
                     "reasons": [r.to_json() for r in d.reasons],
                     "permitted_loaders": list(d.permitted_loaders)},
        "load_requires": {"plane": d.plane, "controls": list(d.required_controls),
                          "containment_observed": pin.get("containment"),
                          "note": "containment controls limit what a loader can reach; they are not proof "
                                  "that deserialization is safe [R28, R30]"},
    }


def _predicate_about_subject(att: dict[str, Any]) -> bool:
    """No predicate field Python checked names another fixture than the bound subject."""
    from ckptgate.verify.statement import field_at

    named = field_at(att, "verification", "predicate_subject")
    return isinstance(named, dict) and all(v is True for v in named.values())


def render_text(doc: dict[str, Any]) -> list[str]:
    c, d = doc["checkpoint"], doc["decision"]
    out = [f"checkpoint  {c['path']}",
           f"  format    {c['format']} ({c['file_count']} files, inspection {'clean' if c['clean'] else 'NOT clean'})",
           f"  digest    {c['digest']}"]
    for f in c["findings"]:
        out.append(f"  finding   [{f.get('severity')}] {f.get('code')}: {f.get('message')}")
    if not doc["attestations"] and not doc["rejected_attestations"]:
        out.append("attestations  none offered")
    for a in doc["attestations"]:
        out.append(f"attestation {a['source']}  digest {'MATCHES' if a['digest_matches'] else 'DOES NOT MATCH'}")
        for s in a["signers"]:
            who = s.get("signer_id") or s.get("identity")
            via = f", offered as {s['offered']}" if s.get("offered") else ""
            out.append(f"  signed by {s.get('kind')} {who} ({s.get('algorithm') or s.get('issuer')}, "
                       f"spki {str(s.get('spki_sha256') or '-')[:16]}{via})")
        if a.get("model_name"):
            out.append(f"  model     {a['model_name']} ({a.get('method')}, every file bound by sha256)")
        out.append(f"  issued    {a['issued_at']}  expires {a['expires_at']}")
        claims = a["claims"]
        if claims:
            out.append(f"  states    {json.dumps(claims, sort_keys=True)[:300]}")
    for r in doc["rejected_attestations"]:
        out.append(f"REJECTED    {r.get('source')}: [{r.get('code')}] {r.get('message')}")
    out.append(f"decision    {'ALLOW' if d['allow'] else 'DENY'} plane={d['plane']} "
               f"policy revision {d['policy_revision']} (decision {d['decision_id'] or '-'})")
    for r in d["reasons"]:
        label = "because" if r.get("severity") == "deny" else "note"
        out.append(f"  {label:<9} [{r.get('code')}] {r.get('message')}")
    lr = doc["load_requires"]
    out.append(f"a load needs plane {lr['plane']} with controls: {', '.join(lr['controls']) or 'none'}")
    out.append(f"  note      {lr['note']}")
    return out


def render_html(doc: dict[str, Any]) -> str:
    e = html.escape
    lines = "\n".join(e(line) for line in render_text(doc))
    verdict = "allow" if doc["decision"]["allow"] else "deny"
    colour = "#c8efc8" if verdict == "allow" else "#f6b8b8"
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>ckptgate verify report</title>"
            f"<style>body{{font:14px system-ui,sans-serif;margin:1.5em}}.v{{background:{colour};padding:4px 8px}}"
            "pre{background:#f6f6f6;padding:1em;white-space:pre-wrap}</style></head><body>"
            f"<h1>ckptgate verify report</h1><p class=\"v\" id=\"verdict\">{verdict}</p><pre>{lines}</pre>"
            f"<details><summary>JSON</summary><pre>{e(json.dumps(doc, indent=2, sort_keys=True))}</pre></details>"
            "</body></html>\n")


__all__ = ["build_report", "render_html", "render_text"]
