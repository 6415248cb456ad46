"""``ckptgate decide``, ``ckptgate explain`` and ``ckptgate policy build``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ckptgate._cli._base import F, UserPath, emit_json, json_option, print_json_text, shown, stdout
from ckptgate._cli._options import checkpoint_option, engine_options, signature_options
from ckptgate._resources import default_policy_dir
from ckptgate.errors import UsageError

if TYPE_CHECKING:
    from ckptgate.decide.options import EngineOptions
    from ckptgate.pipeline import Evaluation


def _evaluate(
    src: Path,
    attestations: tuple[Path, ...],
    candidate_commit: str | None,
    options: EngineOptions,
    signatures: tuple[Path, ...] = (),
    key: Path | None = None,
    certificate_chains: tuple[Path, ...] = (),
) -> Evaluation:
    from ckptgate.decide.options import engine_for, load_trust  # noqa: PLC0415 - ~900 ms (the engine stack)
    from ckptgate.inspect import SafeTree  # noqa: PLC0415 - ~310 ms (the inspection stack)
    from ckptgate.pipeline import evaluate  # noqa: PLC0415 - ~1.8 s (every step)
    from ckptgate.verify.oms import load_verification_material  # noqa: PLC0415 - ~490 ms (cryptography, model_signing)

    trust = load_trust(options)
    offered, chain = load_verification_material(
        signatures,
        key,
        certificate_chains,  # before any work
        options.sigstore_trust_root,
    )
    with SafeTree.open(src) as tree, engine_for(options, trust) as engine:
        return evaluate(
            tree,
            attestations=list(attestations),
            engine=engine,
            trust=trust,
            action="decide",
            candidate_commit=candidate_commit,
            sigstore_trust_root=options.sigstore_trust_root,
            signatures=list(signatures),
            offered_key=offered,
            certificate_chain=chain,
        )


def _common(f: F) -> F:
    f = click.argument("src", type=UserPath(exists=True, file_okay=False, path_type=Path))(f)
    f = click.option(
        "--attestation",
        "attestations",
        multiple=True,
        type=UserPath(dir_okay=False, path_type=Path),
        help="Attestation about SRC (repeatable).",
    )(f)
    f = click.option("--candidate-commit", default=None, help="Require attestations bound to this 40-hex commit.")(f)
    return checkpoint_option("src")(signature_options(engine_options(json_option(f))))


_EVIDENCE_CUT = 160


def _cut(text: str) -> str:
    """``text`` up to :data:`_EVIDENCE_CUT` characters, ending in an ellipsis when it was cut."""
    return text if len(text) <= _EVIDENCE_CUT else text[: _EVIDENCE_CUT - 1] + "…"


def _evidence_line(evidence: dict[str, Any]) -> str:
    shown = {k: json.dumps(v, sort_keys=True) for k, v in sorted(evidence.items())}
    line = ", ".join(f"{k}={_cut(v)}" for k, v in shown.items())
    if any(len(v) > _EVIDENCE_CUT for v in shown.values()):
        line += f"  (… cut at {_EVIDENCE_CUT} characters; --json shows the evidence whole)"
    return line


def explain_lines(ev: Evaluation) -> list[str]:
    """The decision in plain words: what was looked at, what held, what failed and why."""
    facts = ev.policy_input.to_json()
    insp, d = facts["inspection"], ev.decision
    out = [
        f"checkpoint  {facts['fixture']['digest']}  format={insp['format']}  "
        f"files={facts['fixture']['file_count']}  bytes={facts['fixture']['total_bytes']}",
        f"inspection  {'clean' if insp['clean'] else 'NOT clean'}; loaders needed: "
        f"{', '.join(insp['loaders']) or 'none'}",
    ]
    for f in insp["findings"]:
        if f.get("severity") == "error":
            out.append(f"  finding   {f['code']} in {f['path']}: {f['message']}")
    for a in facts["attestations"]:
        who = ", ".join(s.get("signer_id") or s.get("identity") or s.get("spki_sha256", "?") for s in a["signers"])
        out.append(f"attestation {a['source']}: signature verified ({who})")
    for r in facts["rejected_attestations"]:
        out.append(f"attestation {r['source']}: REJECTED [{r['code']}] {r['message']}")
    if not facts["attestations"] and not facts["rejected_attestations"]:
        out.append("attestation none offered")
    if facts["containment"]:
        held = [k for k, v in facts["containment"]["controls"].items() if v]
        missing = [k for k, v in facts["containment"]["controls"].items() if not v]
        out.append(f"containment held: {', '.join(held) or 'none'}; missing: {', '.join(missing) or 'none'}")
    verdict = "ALLOW" if d.allow else "DENY"
    out.append(f"decision    {verdict} plane={d.plane} id={d.decision_id or '-'} policy={d.policy_revision}")
    for i in d.inputs:
        out.append(f"  decided with the {i.role.replace('_', ' ')} {i.path} ({i.origin}, {i.sha256})")
    if d.required_controls:
        out.append(f"  a load needs containment controls: {', '.join(d.required_controls)}")
    for r in d.reasons:
        out.append(f"  {r.severity:<5} [{r.code}] {r.message}")
        if r.evidence:
            out.append(f"        evidence: {_evidence_line(dict(r.evidence))}")
    return out


def _attestation_ref(evidence: dict[str, Any]) -> dict[str, Any] | None:
    """The attestation a reason concerns, as its evidence names it: source and index (either may be null)."""
    index = evidence.get("attestation")
    source = evidence.get("source")
    if not isinstance(index, int) or isinstance(index, bool):
        index = None
    if not isinstance(source, str):
        source = None
    if index is None and source is None:
        return None
    return {"source": source, "index": index}


def explain_doc(ev: Evaluation) -> dict[str, Any]:
    """The decision as records, for ``explain --json``: each reason with its code, message, severity,
    evidence and the attestation it concerns; what was looked at; no pre-formatted lines."""
    facts = ev.policy_input.to_json()
    insp, d = facts["inspection"], ev.decision
    attestations: list[dict[str, Any]] = [
        {
            "source": a["source"],
            "status": "verified",
            "signers": [s.get("signer_id") or s.get("identity") or s.get("spki_sha256") for s in a["signers"]],
        }
        for a in facts["attestations"]
    ]
    attestations += [
        {"source": r["source"], "status": "rejected", "code": r["code"], "message": r["message"]}
        for r in facts["rejected_attestations"]
    ]
    containment = None
    if facts["containment"]:
        controls = facts["containment"]["controls"]
        containment = {
            "held": sorted(k for k, v in controls.items() if v),
            "missing": sorted(k for k, v in controls.items() if not v),
        }
    return {
        "checkpoint": {
            "digest": facts["fixture"]["digest"],
            "format": insp["format"],
            "file_count": facts["fixture"]["file_count"],
            "total_bytes": facts["fixture"]["total_bytes"],
        },
        "inspection": {
            "clean": insp["clean"],
            "loaders": list(insp["loaders"]),
            "findings": [
                {"code": f["code"], "path": f["path"], "message": f["message"], "severity": f.get("severity")}
                for f in insp["findings"]
                if f.get("severity") == "error"
            ],
        },
        "attestations": attestations,
        "containment": containment,
        "decision": {
            **d.to_json(
                "allow",
                "plane",
                "decision_id",
                "policy_revision",
                "refusal",
                "required_controls",
                "inputs",
                "fixture_digest",
            ),
            "decision_id": d.decision_id or None,
            "exit_code": int(d.exit_code),
        },
        "reasons": [
            {
                "code": r.code,
                "message": r.message,
                "severity": r.severity,
                "evidence": dict(r.evidence),
                "attestation": _attestation_ref(dict(r.evidence)),
            }
            for r in d.reasons
        ],
    }


def register(cli: click.Group) -> None:
    @cli.command("decide")
    @_common
    def decide_command(
        src: Path,
        attestations: tuple[Path, ...],
        candidate_commit: str | None,
        signatures: tuple[Path, ...],
        key: Path | None,
        certificate_chains: tuple[Path, ...],
        engine: EngineOptions,
        as_json: bool,
    ) -> int:
        """Print the OPA input document for SRC and the policy's decision. Loads nothing.

        Exit 0 allow; a deny exits as its refusal class says: 4 the checkpoint itself, 5 only
        failed or untrusted signatures, 3 any other reason; 6 engine unavailable.
        """
        ev = _evaluate(src, attestations, candidate_commit, engine, signatures, key, certificate_chains)
        doc = {"input": ev.policy_input.to_json(), "decision": ev.decision.to_json()}
        if as_json:
            emit_json(doc)
        else:
            stdout.print("[bold]input[/]")
            print_json_text(doc["input"])
            stdout.print("[bold]decision[/]")
            print_json_text(doc["decision"])
        return ev.decision.exit_code

    @cli.command("explain")
    @_common
    def explain_command(
        src: Path,
        attestations: tuple[Path, ...],
        candidate_commit: str | None,
        signatures: tuple[Path, ...],
        key: Path | None,
        certificate_chains: tuple[Path, ...],
        engine: EngineOptions,
        as_json: bool,
    ) -> int:
        """Explain the decision for SRC in plain words, naming the evidence that failed.

        With --json: one record per reason (code, message, severity, evidence and the attestation
        it concerns, by source and index), and what was looked at.

        Exit 0 allow; a deny exits as its refusal class says: 4 the checkpoint itself, 5 only
        failed or untrusted signatures, 3 any other reason; 6 engine unavailable.
        """
        ev = _evaluate(src, attestations, candidate_commit, engine, signatures, key, certificate_chains)
        if as_json:
            emit_json(explain_doc(ev))
        else:
            for line in explain_lines(ev):
                stdout.print(shown(line))
        return ev.decision.exit_code

    @cli.group("policy")
    def policy_group() -> None:
        """Policy bundle tools."""

    @policy_group.command("build")
    @click.option(
        "--signing-key",
        required=True,
        type=UserPath(dir_okay=False, exists=True, path_type=Path),
        help="PEM ECDSA P-256 private key of the policy maintainer (ES256).",
    )
    @click.option(
        "--out",
        required=True,
        type=UserPath(dir_okay=False, path_type=Path),
        help="Where to write the signed bundle (.tar.gz).",
    )
    @click.option(
        "--policies",
        "policy_dir",
        type=UserPath(file_okay=False, exists=True, path_type=Path),
        default=None,
        help="Policy directory (default: the bundled policies/).",
    )
    @json_option
    def build_command(signing_key: Path, out: Path, policy_dir: Path | None, as_json: bool) -> int:
        """Build a signed policy bundle with `opa build`; use it with --policy-bundle/--policy-key."""
        from ckptgate.decide.bundle import build_signed, read_policy_files  # noqa: PLC0415 - ~450 ms (the engine stack)
        from ckptgate.decide.policy_tree import engine_overlays  # noqa: PLC0415 - as above

        policy_dir = policy_dir or default_policy_dir()
        if out.exists():
            raise UsageError(
                "usage.out_exists", f"{out} already exists", advice=f"Name a new file with --out, or move {out} away."
            )
        files = read_policy_files(policy_dir)  # read once: what is checked, hashed and built
        revision = build_signed(
            policy_dir, out, signing_key=signing_key, files=files, overlays=engine_overlays(policy_dir, files)
        )
        if as_json:
            emit_json({"bundle": str(out), "revision": revision})
        else:
            stdout.print(f"wrote {out} (revision {revision})")
        return 0
