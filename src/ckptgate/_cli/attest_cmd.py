"""``ckptgate attest``: keygen (development), sign, verify, show, add to the store (``attest checkpoint``:
:mod:`ckptgate._cli.attest_checkpoint_cmd`, ``attest verify`` in :mod:`ckptgate._cli.attest_verify_cmd`)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, shown, stdout
from ckptgate._cli._options import load_config
from ckptgate._json import loads_strict, usage_error, verify_error
from ckptgate.digestvalue import Digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import check_output_file, read_regular_file, write_output_file

_MAX_INPUT = 16 << 20  # a statement, predicate or envelope; larger ones are refused, never read whole


def _read(path: str, what: str) -> bytes:
    try:
        raw = read_regular_file(path, limit=_MAX_INPUT)
    except OSError as e:
        raise UsageError(
            "usage.unreadable",
            f"cannot read {what} {path}: {e.strerror}",
            advice=f"Check that {path} exists and is a readable regular file, or name another {what}.",
        ) from None
    if len(raw) > _MAX_INPUT:
        raise UsageError(
            "usage.too_large",
            f"{what} {path} is larger than {_MAX_INPUT >> 20} MiB",
            advice=f"Name the {what} itself, not {path}: a {what} is a small JSON document.",
        )
    return raw


def _digest_arg(value: str, option: str) -> Digest:
    """``value`` read once as a digest: a malformed digest on the command line is a usage error."""
    try:
        return Digest.from_user(value)
    except VerificationError as e:
        raise UsageError(
            "usage.digest", f"{option}: {e.message}", advice="Give the digest as sha256:<64 hex>."
        ) from None


def _now(value: str | None) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            "usage.invalid",
            f"--now is not an ISO 8601 time: {value!r}",
            advice="Give --now as an ISO 8601 UTC time, such as --now 2026-01-01T00:00:00Z.",
        ) from None
    if t.tzinfo is None:
        raise UsageError(
            "usage.invalid",
            "--now needs a UTC offset (e.g. 2026-01-01T00:00:00Z)",
            advice="End --now with Z or +00:00, such as --now 2026-01-01T00:00:00Z.",
        )
    from ckptgate.verify.statement import EARLIEST_TIME, LATEST_TIME, parse_time  # noqa: PLC0415 - fastjsonschema

    try:
        return parse_time(value)  # in UTC, and within the years policy can compare
    except ValueError as e:
        raise UsageError(
            "usage.invalid",
            f"--now {value!r}: {e}",
            advice=f"Give --now a time between {EARLIEST_TIME.year} and {LATEST_TIME.year - 1}, "
            f"such as --now 2026-01-01T00:00:00Z, not {value!r}.",
        ) from None


@click.group("attest")
def attest() -> None:
    """Write, sign, verify and show attestations (DSSE with keys, Sigstore bundles).

    A training job attests what it wrote with `attest checkpoint` (training provenance: SLSA
    Provenance v1 over every file); ckptgate's own qualification runs sign qualification
    statements with `attest sign`.  See docs/attestations.md.
    """


@attest.command("keygen")
@click.option("--out", "prefix", required=True, help="Writes PREFIX.pem (private, 0600) and PREFIX.pub.pem.")
@click.option("--algorithm", type=click.Choice(["ed25519", "ecdsa-p256"]), default="ed25519", show_default=True)
@click.option("--id", "signer_id", default="dev-key", show_default=True, help="Signer id for the trust entry.")
@click.option(
    "--trust-out",
    type=UserPath(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a trust file naming only this key, ready for --trust FILE.",
)
@click.option(
    "--builder-id",
    "builder_ids",
    multiple=True,
    help="A builder id (runDetails.builder.id) whose training provenance the key may vouch for (repeatable; "
    "default: any).",
)
@json_option
def keygen(
    prefix: str, algorithm: str, signer_id: str, trust_out: Path | None, builder_ids: tuple[str, ...], as_json: bool
) -> None:
    """Development helper: a new key pair and its trust-data entry (never use for production keys).

    The entry trusts the key for training provenance (`attest checkpoint`) from the --builder-id values
    (or any builder), and for ckptgate's own qualification and fixture-provenance statements.
    """
    from ckptgate.verify import PROVENANCE_PREDICATE_TYPE, QUALIFICATION_PREDICATE_TYPE, generate_keypair, trust_entry  # noqa: PLC0415 - ~490 ms (cryptography)
    from ckptgate.verify.statement import SLSA_PROVENANCE_V1  # noqa: PLC0415 - ~490 ms (cryptography)
    from ckptgate.verify.trust import printable_name  # noqa: PLC0415 - as above

    if not Path(prefix).name:
        raise UsageError(
            "usage.invalid",
            f"--out {prefix!r} names no file prefix (e.g. keys/dev)",
            advice="Name a prefix such as --out keys/dev; keygen writes keys/dev.pem and keys/dev.pub.pem.",
        )
    for flag, value in [("--id", signer_id), *(("--builder-id", b) for b in builder_ids)]:
        if not printable_name(value):
            raise UsageError(  # the trust data refuses a signer without an id: refused here, before any key is written
                "usage.keygen.id",
                f"{flag} {value!r} is empty or holds control characters",
                evidence={"option": flag, "value": value},
                advice=f"Give {flag} a printable name such as {'ci-release' if flag == '--id' else 'https://ci.example/builder'}"
                f" instead of {value!r}.",
            )
    priv_path, pub_path = Path(prefix + ".pem"), Path(prefix + ".pub.pem")
    targets = [(priv_path, "the private key", "--out prefix"), (pub_path, "the public key", "--out prefix")]
    if trust_out is not None:
        targets.append((trust_out, "the trust file", "--trust-out file"))
    for p, what, flag in targets:  # all checked before any is written: no key pair without its trust file
        if os.path.lexists(p):
            raise UsageError(
                "usage.exists",
                f"{p} exists; refusing to overwrite",
                advice=f"Remove {p}, or name another {flag}.",
            )
        check_output_file(p, what=what, exclusive=True)
    private, public = generate_keypair(algorithm)
    write_output_file(priv_path, private, what="the private key", mode=0o600, exclusive=True)
    try:
        write_output_file(pub_path, public, what="the public key", exclusive=True)
    except UsageError:
        priv_path.unlink()  # no half pair
        raise
    entry = trust_entry(
        public,
        signer_id=signer_id,
        predicate_types=[QUALIFICATION_PREDICATE_TYPE, PROVENANCE_PREDICATE_TYPE, SLSA_PROVENANCE_V1],
        scopes=["qualification", "provenance", "training_provenance"],
        builder_ids=list(dict.fromkeys(builder_ids)) or ["*"],
    )
    if trust_out is not None:
        try:
            write_output_file(
                trust_out,
                (json.dumps({"signers": [entry]}, indent=2) + "\n").encode(),
                what="the trust file",
                exclusive=True,
            )
        except BaseException:
            priv_path.unlink(missing_ok=True)  # no key pair left behind without the trust file asked for
            pub_path.unlink(missing_ok=True)
            raise
    if as_json:
        emit_json(
            {
                "private_key": str(priv_path),
                "public_key": str(pub_path),
                "trust_entry": entry,
                "trust_file": str(trust_out) if trust_out else None,
            }
        )
        return
    stdout.print(
        f"wrote [bold]{priv_path}[/] (private, keep secret): sign with it, "
        f"`ckptgate attest checkpoint DIR --key {priv_path}` in the training job"
    )
    stdout.print(f"wrote [bold]{pub_path}[/] (public): give it to whoever takes the checkpoints in")
    stdout.print(f"algorithm {algorithm}, spki_sha256 {entry['spki_sha256']}")
    builders = ", ".join(entry["builder_ids"])
    if trust_out is not None:
        stdout.print(
            f"wrote the trust file [bold]{trust_out}[/] (training provenance from builder(s) {builders}): "
            f"pass it as `ckptgate intake DIR --trust {trust_out}`"
        )
    else:
        stdout.print(
            'trust-data entry; put it in a trust file {"signers": [...]} of your own and pass it with '
            "--trust FILE (--trust-out FILE writes one), rather than editing ckptgate's bundled policy data:",
            markup=False,
        )
        stdout.print_json(json.dumps(entry))


@attest.command("sign")
@click.option("--key", "key_path", envvar="CKPTGATE_SIGNING_KEY", help="PEM private key (or $CKPTGATE_SIGNING_KEY).")
@click.option("--keyid", default=None, help="keyid hint to record (default: SPKI SHA-256).")
@click.option("--statement", "statement_path", type=UserPath(dir_okay=False), help="A full in-toto Statement v1.")
@click.option("--predicate", "predicate_path", type=UserPath(dir_okay=False), help="A predicate to wrap.")
@click.option("--subject-digest", default=None, help="sha256:<hex> of the fixture (with --predicate).")
@click.option("--subject-name", default="fixture", show_default=True)
@click.option("--predicate-type", default=None, help="Default: the ckptgate qualification v1 type.")
@click.option("--out", "out_path", required=True, type=UserPath(dir_okay=False))
@json_option
def sign(
    key_path: str | None,
    keyid: str | None,
    statement_path: str | None,
    predicate_path: str | None,
    subject_digest: str | None,
    subject_name: str,
    predicate_type: str | None,
    out_path: str,
    as_json: bool,
) -> None:
    """Sign a statement (checked against its schema first) into a DSSE envelope."""
    from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, STATEMENT_TYPE, KeySigner, sign_statement  # noqa: PLC0415 - ~490 ms (cryptography)
    from ckptgate.verify.statement import (  # noqa: PLC0415 - ~490 ms (cryptography)
        PREDICATE_SCHEMAS,
        schema_errors,
        statement_schema,
        validity_window,
    )

    if (statement_path is None) == (predicate_path is None):
        raise UsageError(
            "usage.invalid",
            "give exactly one of --statement or --predicate",
            advice="Pass --statement FILE (a whole in-toto statement) or --predicate FILE with --subject-digest.",
        )
    signer = KeySigner.from_pem(key_path, keyid=keyid)
    if statement_path is not None:
        statement = loads_strict(
            _read(statement_path, "statement"), what="statement", max_bytes=8 << 20, error=usage_error
        )
    else:
        if subject_digest is None or predicate_path is None:
            raise UsageError(
                "usage.invalid",
                "--predicate needs --subject-digest",
                advice="Add --subject-digest sha256:HEX (`ckptgate inspect SRC --json` prints the digest).",
            )
        subject = _digest_arg(subject_digest, "--subject-digest")
        predicate = loads_strict(
            _read(predicate_path, "predicate"), what="predicate", max_bytes=8 << 20, error=usage_error
        )
        statement = {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": subject_name, "digest": subject.dsse_subject()}],
            "predicateType": predicate_type or QUALIFICATION_PREDICATE_TYPE,
            "predicate": predicate,
        }
    if not isinstance(statement, dict):
        raise UsageError(
            "usage.statement_invalid",
            "the statement is not a JSON object; nothing was signed",
            advice=f"Make {statement_path} one JSON object (an in-toto statement), or pass --predicate FILE "
            "with --subject-digest instead.",
        )
    if statement_schema(statement) is None:  # every statement signed here is checked by a schema
        raise UsageError(
            "usage.predicate_type",
            f"ckptgate signs only statements it has a schema for: its own predicate types "
            f"{sorted(PREDICATE_SCHEMAS)}, and SLSA provenance of the training build type "
            f"(`attest checkpoint` writes one); not {statement.get('predicateType')!r}",
            evidence={"predicate_type": statement.get("predicateType")},
            advice=f"Set the statement's predicateType (or --predicate-type) to one of {sorted(PREDICATE_SCHEMAS)}, "
            "or write training provenance with `ckptgate attest checkpoint SRC --key KEY`.",
        )
    try:
        envelope = sign_statement(statement, signer)
        validity_window(statement)  # a window no verifier accepts (inverted, or past the years policy compares)
    except VerificationError as e:  # the statement is what is wrong: fix it, then sign
        errors = schema_errors(statement) or [{"path": "/predicate/validity", "message": e.message}]
        listed = "; ".join(f"{x['path']}: {x['message']}" for x in errors) or e.message
        raise UsageError(
            "usage.statement_invalid",
            f"the statement does not match its schema in {max(len(errors), 1)} place(s), so it was not signed: "
            f"{listed}",
            evidence={"check": e.code, **e.evidence, "errors": errors},
            advice="Fix the statement or predicate so that it matches the schema of its predicate "
            "type (docs/attestations.md), then sign it again.",
        ) from None
    write_output_file(out_path, envelope, what="the envelope", exclusive=True)
    if as_json:
        emit_json(
            {
                "envelope": out_path,
                "keyid": signer.keyid,
                "algorithm": signer.algorithm,
                "predicate_type": statement["predicateType"],
            }
        )
        return
    stdout.print(f"signed [bold]{out_path}[/] with {signer.algorithm} key {signer.keyid[:16]}…")


def _unverified(raw: bytes) -> dict[str, Any]:
    from ckptgate.verify.facts import MAX_PAYLOAD_BYTES, read_envelope  # noqa: PLC0415 - ~300 ms (cryptography)

    env = read_envelope(raw)
    stmt = loads_strict(env.payload, what="statement", max_bytes=MAX_PAYLOAD_BYTES, error=verify_error)
    return {
        "verified": False,
        "UNVERIFIED": "signatures, trust and subject were NOT checked",
        "format": env.format,
        "payload_type": env.payload_type,
        "signatures": [{"keyid": k} for k in env.keyids],
        "statement": stmt,
    }


@attest.command("show")
@click.argument("file", type=UserPath(dir_okay=False))
@json_option
def show(file: str, as_json: bool) -> None:
    """Print an attestation's content WITHOUT verifying it (clearly marked UNVERIFIED); training
    provenance in plain words (builder, code commit, producers, topology, base model)."""
    from ckptgate.verify.statement import check_statement, statement_schema  # noqa: PLC0415 - ~490 ms (cryptography)
    from ckptgate.verify.training import TrainingFacts, is_training  # noqa: PLC0415 - ~490 ms (cryptography)

    doc = _unverified(_read(file, "attestation"))
    if as_json:
        emit_json(doc)
        return
    stdout.print(
        "[bold yellow]UNVERIFIED[/] content: signatures, trust and subject were NOT checked; "
        "use `ckptgate attest verify`."
    )
    stdout.print(
        f"format {doc['format']}, payloadType {shown(doc['payload_type'])}, "
        f"{len(doc['signatures'])} signature(s), keyid hints {shown([s['keyid'] for s in doc['signatures']])}"
    )
    statement = doc["statement"]
    if is_training(statement) and statement_schema(statement) is not None:
        try:
            check_statement(statement)
        except VerificationError as e:
            stdout.print(f"training provenance that fails its schema ({shown(e.message)}):", markup=False)
        else:
            stdout.print("training provenance (UNVERIFIED):", markup=False)
            for label, text in TrainingFacts.from_statement(statement).lines():
                stdout.print(f"  {label:<11} {shown(text)}")
            stdout.print(f"  files       {len(statement['subject'])} (each named with its sha256)")
            return
    stdout.print_json(json.dumps(statement, sort_keys=True), ensure_ascii=True)  # untrusted: escaped


@attest.command("add")
@click.argument("files", nargs=-1, required=True, type=UserPath(dir_okay=False))
@click.option(
    "--store",
    "store_root",
    default=None,
    help="The store directory (default: the configuration's attestations, else ./attestations).",
)
@json_option
def add(files: tuple[str, ...], store_root: str | None, as_json: bool) -> None:
    """Store attestations under STORE/sha256-<subject>/ and regenerate STORE/index.json (not a trust decision)."""
    from ckptgate.verify import AttestationStore  # noqa: PLC0415 - ~490 ms (cryptography)

    if store_root is None:
        config = load_config()
        store_root = (
            str(config.attestations) if config is not None and config.attestations is not None else "attestations"
        )

    if os.path.exists(store_root) and not os.path.isdir(store_root):
        raise UsageError(
            "usage.store",
            f"--store {store_root} is not a directory",
            advice=f"Name a directory with --store; {store_root} is a file.",
        )
    store = AttestationStore(store_root)
    raws = [_read(f, "attestation") for f in files]
    try:  # all or nothing: every envelope and conflict (with the store, or between two of FILES) checked first
        paths = [str(p) for p in store.add_all(raws, names=list(files))]
    except OSError as e:
        raise UsageError(
            "usage.store",
            f"cannot write to the store {store_root}: {e.strerror}",
            advice=f"Make {store_root} writable, or name another directory with --store.",
        ) from None
    if as_json:
        emit_json({"stored": paths, "index": str(Path(store_root) / "index.json")})
        return
    for p in paths:
        stdout.print(f"stored {p}")


def register(cli: click.Group) -> None:
    cli.add_command(attest)
