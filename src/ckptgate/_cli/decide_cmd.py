"""``ckptgate decide``, ``ckptgate explain`` and ``ckptgate policy build``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ckptgate._cli._base import emit_json, json_option, print_json_text, shown, stdout
from ckptgate._cli._options import engine_options
from ckptgate.errors import UsageError

if TYPE_CHECKING:
    from ckptgate.pipeline import EngineOptions, Evaluation


def _evaluate(src: Path, attestations: tuple[Path, ...], candidate_commit: str | None,
              options: EngineOptions) -> Evaluation:
    from ckptgate.inspect import SafeTree
    from ckptgate.pipeline import engine_for, evaluate, load_trust

    trust = load_trust(options)
    with SafeTree.open(src) as tree, engine_for(options, trust) as engine:
        return evaluate(tree, attestations=list(attestations), engine=engine, trust=trust,
                        action="decide", candidate_commit=candidate_commit,
                        sigstore_trust_root=options.sigstore_trust_root)


def _common(f):
    f = click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))(f)
    f = click.option("--attestation", "attestations", multiple=True,
                     type=click.Path(dir_okay=False, path_type=Path), help="Attestation about SRC (repeatable).")(f)
    f = click.option("--candidate-commit", default=None,
                     help="Require attestations bound to this 40-hex commit.")(f)
    return engine_options(json_option(f))


def _evidence_line(evidence: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v, sort_keys=True)[:160]}" for k, v in sorted(evidence.items()))


def explain_lines(ev: Evaluation) -> list[str]:
    """The decision in plain words: what was looked at, what held, what failed and why."""
    facts = ev.policy_input.to_json()
    insp, d = facts["inspection"], ev.decision
    out = [f"checkpoint  {facts['fixture']['digest']}  format={insp['format']}  "
           f"files={facts['fixture']['file_count']}  bytes={facts['fixture']['total_bytes']}",
           f"inspection  {'clean' if insp['clean'] else 'NOT clean'}; loaders needed: "
           f"{', '.join(insp['loaders']) or 'none'}"]
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
    if d.required_controls:
        out.append(f"  a load needs containment controls: {', '.join(d.required_controls)}")
    for r in d.reasons:
        out.append(f"  {r.severity:<5} [{r.code}] {r.message}")
        if r.evidence:
            out.append(f"        evidence: {_evidence_line(dict(r.evidence))}")
    return out


def register(cli: click.Group) -> None:
    @cli.command("decide")
    @_common
    def decide_command(src: Path, attestations: tuple[Path, ...], candidate_commit: str | None,
                       engine: EngineOptions, as_json: bool) -> int:
        """Print the OPA input document for SRC and the policy's decision. Loads nothing.

        Exit 0 allow; a deny exits as its refusal class says: 4 the checkpoint itself, 5 only
        failed or untrusted signatures, 3 any other reason; 6 engine unavailable.
        """
        ev = _evaluate(src, attestations, candidate_commit, engine)
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
    def explain_command(src: Path, attestations: tuple[Path, ...], candidate_commit: str | None,
                        engine: EngineOptions, as_json: bool) -> int:
        """Explain the decision for SRC in plain words, naming the evidence that failed.

        Exit 0 allow; a deny exits as its refusal class says: 4 the checkpoint itself, 5 only
        failed or untrusted signatures, 3 any other reason; 6 engine unavailable.
        """
        ev = _evaluate(src, attestations, candidate_commit, engine)
        lines = explain_lines(ev)
        if as_json:
            emit_json({"explanation": lines, "decision": ev.decision.to_json()})
        else:
            for line in lines:
                stdout.print(shown(line))
        return ev.decision.exit_code

    @cli.group("policy")
    def policy_group() -> None:
        """Policy bundle tools."""

    @policy_group.command("build")
    @click.option("--signing-key", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
                  help="PEM ECDSA P-256 private key of the policy maintainer (ES256).")
    @click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
                  help="Where to write the signed bundle (.tar.gz).")
    @click.option("--policies", "policy_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
                  default=None, help="Policy directory (default: the bundled policies/).")
    @json_option
    def build_command(signing_key: Path, out: Path, policy_dir: Path | None, as_json: bool) -> int:
        """Build a signed policy bundle with `opa build`; use it with --policy-bundle/--policy-key."""
        from ckptgate.decide.bundle import build_signed, default_policy_dir, policy_revision

        policy_dir = policy_dir or default_policy_dir()
        if out.exists():
            raise UsageError("usage.out_exists", f"{out} already exists")
        revision = policy_revision(policy_dir)
        build_signed(policy_dir, out, signing_key=signing_key, revision=revision)
        if as_json:
            emit_json({"bundle": str(out), "revision": revision})
        else:
            stdout.print(f"wrote {out} (revision {revision})")
        return 0
