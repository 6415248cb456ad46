"""``ckptgate attest verify``: verify one attestation (a DSSE envelope, a Sigstore bundle, or a Sigstore
bundle signed under an X.509 certificate) for a measured fixture digest, and say who signed it."""

from __future__ import annotations

from pathlib import Path

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, shown, stdout
from ckptgate._cli.attest_cmd import _digest_arg, _now, _read, attest
from ckptgate.errors import InputRejected, UsageError


@click.command("verify")
@click.argument("file", type=UserPath(dir_okay=False))
@click.option("--digest", default=None, help="sha256:<hex> of the fixture actually measured (or --checkpoint).")
@click.option(
    "--checkpoint",
    "checkpoint",
    default=None,
    type=UserPath(exists=True, file_okay=False, path_type=Path),
    help="Measure this checkpoint as intake does instead of --digest: a statement with a subject per file "
    "(training provenance, SLSA) binds file by file.",
)
@click.option(
    "--trust",
    "trust_path",
    default=None,
    help="Trust data (default: $CKPTGATE_TRUST, else the bundled policies' trust data).",
)
@click.option(
    "--sigstore-trust-root", default=None, help="trusted_root.json for Sigstore bundles ('production': embedded)."
)
@click.option("--identity", default=None, help="Expected Sigstore certificate identity (with --issuer).")
@click.option("--issuer", default=None, help="Expected Sigstore OIDC issuer (with --identity).")
@click.option(
    "--certificate-chain",
    "certificate_chains",
    multiple=True,
    type=UserPath(dir_okay=False, path_type=Path),
    help="PEM CA certificates that an attestation signed under an X.509 certificate (no log entry) must chain "
    "to (repeatable); the trust data's certificate signers say which identity is trusted.",
)
@click.option("--commit", "expected_commit", default=None, help="Require this candidate commit (40 hex).")
@click.option("--now", "now_s", default=None, help="Evaluate validity at this time (ISO 8601, default: now).")
@json_option
def verify(
    file: str,
    digest: str | None,
    checkpoint: Path | None,
    trust_path: str | None,
    sigstore_trust_root: str | None,
    identity: str | None,
    issuer: str | None,
    certificate_chains: tuple[Path, ...],
    expected_commit: str | None,
    now_s: str | None,
    as_json: bool,
) -> None:
    """Verify an attestation for a measured fixture digest (or a checkpoint measured here); exit 5 when it does
    not verify."""
    from ckptgate.decide.input import check_commit  # noqa: PLC0415 - ~550 ms (the engine stack)
    from ckptgate.verify import TrustData, verify_attestation  # noqa: PLC0415 - ~490 ms (cryptography)
    from ckptgate.verify.sigstore import check_trust_root  # noqa: PLC0415 - ~490 ms (cryptography, sigstore)
    from ckptgate.verify.x509chain import CertificateChain  # noqa: PLC0415 - ~490 ms (cryptography)

    if (identity is None) != (issuer is None):
        raise UsageError(
            "usage.invalid",
            "--identity and --issuer go together",
            advice="Pass both --identity EMAIL-OR-URI and --issuer URL, or neither.",
        )
    if (digest is None) == (checkpoint is None):
        raise UsageError(
            "usage.invalid",
            "name what was measured with exactly one of --digest and --checkpoint",
            advice="Pass --digest sha256:<hex> (from `ckptgate inspect --json`), or --checkpoint DIR to measure "
            "it here; a statement with a subject per file needs --checkpoint.",
        )
    manifest = None
    if checkpoint is not None:
        from ckptgate.digest import fixture_digest  # noqa: PLC0415 - the hashing stack
        from ckptgate.inspect import SafeTree  # noqa: PLC0415 - the walk

        with SafeTree.open(checkpoint) as tree:
            walk_errors = [f for f in tree.findings if f.severity == "error"]
            if walk_errors:  # intake refuses such a tree: say so rather than verify the files it skipped
                raise InputRejected(
                    "input.walk.not_clean",
                    f"{checkpoint}: the walk found what intake refuses: "
                    + "; ".join(f"{f.path or '.'}: {f.message} ({f.code})" for f in walk_errors[:3])
                    + (f"; and {len(walk_errors) - 3} more" if len(walk_errors) > 3 else ""),
                    evidence={"findings": [f.to_json() for f in walk_errors]},
                    advice="Run `ckptgate inspect DIR` to see every finding; remove what is not a regular file "
                    "(a symlink, FIFO or device) or obtain the checkpoint again from its producer.",
                )
            fixture = fixture_digest(tree)
        measured, manifest = fixture.digest, fixture.file_hashes()
    else:
        measured = _digest_arg(str(digest), "--digest")
    if expected_commit is not None:
        check_commit(expected_commit, "--commit")
    if sigstore_trust_root is not None:
        check_trust_root(sigstore_trust_root)
    chain = CertificateChain.from_files(list(certificate_chains)) if certificate_chains else None
    raw = _read(file, "attestation")
    trust = TrustData.from_file(trust_path)
    va = verify_attestation(
        raw,
        source=file,
        trust=trust,
        measured_digest=measured,
        now=_now(now_s),
        sigstore_trust_root=sigstore_trust_root,
        expected_identity=(identity, issuer) if identity and issuer else None,
        expected_commit=expected_commit,
        certificate_chain=chain,
        manifest=manifest,
    )
    facts = va.to_facts()
    if as_json:
        emit_json({"verified": True, "attestation": facts})
        return
    stdout.print(f"[bold green]VERIFIED[/] {shown(file)}")
    stdout.print(f"  predicate  {shown(va.predicate_type)}")
    stdout.print(f"  subject    {shown(va.subject_name)} = {va.measured_digest}")
    for s in facts["signers"]:
        who = (
            f"{s['signer_id']} ({s['algorithm']}, spki {s['spki_sha256'][:16]}…)"
            if s["kind"] == "key"
            else f"{s['identity']} (X.509, root sha256 {s['root_sha256'][:16]}…, "
            f"{'trust-data signer ' + s['signer_id'] if s['signer_id'] else 'no trust-data signer names it'})"
            if s["kind"] == "certificate"
            else f"{s['identity']} via {s['issuer']}"
        )
        stdout.print(f"  signer     {s['kind']}: {shown(who)}")
    stdout.print(f"  checks     {', '.join(va.checks)}")
    if va.validity is not None:
        stdout.print(
            f"  valid      {facts['verification']['validity']['issued_at']} .. "
            f"{facts['verification']['validity']['expires_at']}"
        )
    pred = va.statement.get("predicate") or {}
    if isinstance(pred, dict) and "candidate_commit" in pred:
        stdout.print(f"  commit     {shown(pred['candidate_commit'])} (policy decides whether it is the candidate)")


def register(cli: click.Group) -> None:
    attest.add_command(verify)
