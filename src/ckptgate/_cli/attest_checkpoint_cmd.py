"""``ckptgate attest checkpoint``: attest a training run's checkpoint at the source (in-toto training
provenance, an OpenSSF Model Signing bundle, or keyless Sigstore)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, shown, stdout
from ckptgate._cli._options import checkpoint_option
from ckptgate._cli.attest_cmd import _MAX_INPUT, _read, attest
from ckptgate._json import loads_strict, usage_error
from ckptgate.errors import UsageError

if TYPE_CHECKING:
    pass


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name or not value:
            raise UsageError(
                "usage.invalid", f"{option} {v!r}: expected NAME=VALUE", advice=f"Write it as {option} NAME=VALUE."
            )
        if name in out:
            raise UsageError(
                "usage.invalid", f"{option} names {name!r} twice", advice=f"Give {option} {name}=VALUE once."
            )
        out[name] = value
    return out


@click.command("checkpoint")
@click.argument("src", type=UserPath(exists=True, file_okay=False, path_type=Path))
@click.option("--key", "key_path", envvar="CKPTGATE_SIGNING_KEY", help="PEM private key (or $CKPTGATE_SIGNING_KEY).")
@click.option(
    "--out",
    "out_path",
    type=UserPath(dir_okay=False, path_type=Path),
    default=None,
    help="Where the DSSE envelope goes (default: SRC.intoto.dsse.json beside SRC; never inside it).",
)
@click.option(
    "--dry-run", is_flag=True, default=False, help="Print the statement and every schema error; sign nothing."
)
@click.option(
    "--builder-id", default=None, help="runDetails.builder.id (default: $CKPTGATE_BUILDER_ID, else local://HOST)."
)
@click.option(
    "--producer",
    "producers",
    multiple=True,
    metavar="NAME=VERSION",
    help="A producer library's exact version (repeatable); overrides the environment and the checkpoint's records.",
)
@click.option(
    "--topology",
    "topology",
    multiple=True,
    metavar="FIELD=VALUE",
    help="tp, pp, dp, ep, etp, cp, world_size, zero_stage or fsdp_mode (repeatable); refused where the layout "
    "records otherwise, or where the degrees cannot be (each from 1 to 1048576 and dividing world_size, "
    "tp*pp*cp*dp equal to it when all four are given).",
)
@click.option(
    "--no-environment",
    is_flag=True,
    default=False,
    help="Do not read producer versions from this environment (run outside the training job).",
)
@click.option("--dtype", default=None, help="Training dtype (default: the layout's most common tensor dtype).")
@click.option("--step", type=click.IntRange(min=0), default=None, help="Training step (default: from the folder name).")
@click.option(
    "--training-config",
    type=UserPath(dir_okay=False, path_type=Path),
    default=None,
    help="A JSON object: the training configuration the job declares (externalParameters).",
)
@click.option(
    "--base-model", default=None, metavar="REPO@REVISION", help="For an adapter: the base model it was trained on."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["intoto", "oms"]),
    default="intoto",
    show_default=True,
    help="intoto: training provenance in a DSSE envelope; oms: an OpenSSF Model Signing bundle (key method, "
    "ECDSA P-256) over the same files, SRC.sig, for intake --signature SRC.sig --key PUB.pem.",
)
@click.option(
    "--identity-token",
    default=None,
    metavar="TOKEN|@FILE",
    help="Sign keyless (Sigstore) with this OIDC identity token (or @FILE holding it; default: $SIGSTORE_ID_TOKEN "
    "when no --key is given): a Sigstore bundle, SRC.sigstore.json, for intake --sigstore-trust-root.",
)
@click.option(
    "--sigstore-trust-config",
    type=UserPath(dir_okay=False, path_type=Path),
    default=None,
    help="With --identity-token: a Sigstore ClientTrustConfig JSON naming the trust root, Fulcio and Rekor "
    "(default: the public-good instance, through TUF).",
)
@click.option(
    "--certificate",
    type=UserPath(dir_okay=False, path_type=Path),
    default=None,
    help="With --key: the key's X.509 signing certificate (PEM). The training provenance is written in a Sigstore "
    "bundle carrying it, SRC.sigstore.json (with --format oms: model_signing's certificate method); intake "
    "verifies either with --certificate-chain.",
)
@click.option(
    "--certificate-chain",
    "certificate_chain",
    multiple=True,
    type=UserPath(dir_okay=False, path_type=Path),
    help="With --certificate: the CA certificates it chains to (repeatable); checked before signing, and with "
    "--format oms (where it is required) carried in the bundle.",
)
@click.option(
    "--hf-config",
    type=UserPath(exists=True, path_type=Path),
    default=None,
    help="The Hugging Face config.json (or its directory) the job trained against: its manifest sha256, as intake "
    "--hf-config computes it, is recorded (internalParameters.hf_config_manifest_sha256).",
)
@checkpoint_option("src")
@json_option
def checkpoint(
    src: Path,
    key_path: str | None,
    out_path: Path | None,
    dry_run: bool,
    builder_id: str | None,
    producers: tuple[str, ...],
    topology: tuple[str, ...],
    no_environment: bool,
    dtype: str | None,
    step: int | None,
    training_config: Path | None,
    base_model: str | None,
    fmt: str,
    identity_token: str | None,
    sigstore_trust_config: Path | None,
    certificate: Path | None,
    certificate_chain: tuple[Path, ...],
    hf_config: Path | None,
    as_json: bool,
) -> None:
    """Measure SRC as intake does and sign its training provenance (in-toto + SLSA Provenance v1).

    Signed with --key (a DSSE envelope, SRC.intoto.dsse.json), with --key and --certificate (a Sigstore
    bundle carrying the X.509 certificate, SRC.sigstore.json) or keyless with --identity-token (a
    Sigstore bundle, SRC.sigstore.json); --format oms signs an OpenSSF Model Signing bundle instead.

    Exit 0 when written (or, with --dry-run, when the statement is valid); 2 on a bad flag, a declared
    topology that contradicts the layout, or a statement that fails its schema (every error listed); 4 on a
    checkpoint it cannot vouch for (a symlink, FIFO or hard link in it, a rank's files missing, a save still
    being written).
    """
    from ckptgate.producer.attest import AttestRequest, attest_checkpoint, parse_topology, statement_json  # noqa: PLC0415 - ~490 ms (inspection, cryptography)
    from ckptgate.producer.keyless import read_identity_token  # noqa: PLC0415 - ~490 ms (cryptography)
    from ckptgate.verify.training import BaseModel  # noqa: PLC0415 - ~490 ms (cryptography)

    if identity_token is None and not key_path and os.environ.get("SIGSTORE_ID_TOKEN"):
        identity_token = os.environ["SIGSTORE_ID_TOKEN"]
    token = read_identity_token(identity_token) if identity_token is not None else None
    source = click.get_current_context().get_parameter_source("key_path")
    if token is not None and source == click.core.ParameterSource.ENVIRONMENT:
        key_path = None  # an explicit --identity-token wins over $CKPTGATE_SIGNING_KEY
    config: dict[str, Any] | None = None
    if training_config is not None:
        doc = loads_strict(
            _read(str(training_config), "training config"),
            what="training config",
            max_bytes=_MAX_INPUT,
            error=usage_error,
        )
        if not isinstance(doc, dict):
            raise UsageError(
                "usage.invalid",
                f"--training-config {training_config} is not a JSON object",
                advice=f"Make {training_config} a JSON object of the job's declared settings.",
            )
        config = doc
    base = None
    if base_model is not None:
        repo, _, rev = base_model.partition("@")
        if not repo or not rev:
            raise UsageError(
                "usage.invalid",
                f"--base-model {base_model!r}: expected REPO@REVISION",
                advice="Write it as --base-model org/name@REVISION (a commit or tag of the base model).",
            )
        base = BaseModel(repo=repo, revision=rev)
    if not dry_run and token is None and not key_path:
        raise UsageError(
            "usage.signing_key_missing",
            "no signing key: pass --key, or --identity-token to sign keyless (or --dry-run to only print)",
            advice="Pass --key KEY.pem (`ckptgate attest keygen --out KEY` makes one), --identity-token TOKEN, "
            "or --dry-run.",
        )
    request = AttestRequest(
        src=src,
        key=Path(key_path) if key_path else None,
        out=out_path,
        builder_id=builder_id,
        producers=_pairs(producers, "--producer"),
        topology=parse_topology(_pairs(topology, "--topology")),
        environment=not no_environment,
        dtype=dtype,
        step=step,
        training_config=config,
        base_model=base,
        dry_run=dry_run,
        format=fmt,
        identity_token=token,
        sigstore_trust_config=sigstore_trust_config,
        certificate=certificate,
        certificate_chain=certificate_chain,
        hf_config=hf_config,
    )
    done = attest_checkpoint(request)
    if as_json:
        emit_json(
            {
                "statement": done.statement,
                "envelope": str(done.path) if done.path else None,
                "format": done.format,
                "fixture_digest": done.digest.digest.prefixed(),
                "measured_topology": done.measured_topology,
            }
        )
        return
    if dry_run:
        stdout.print(statement_json(done.statement), markup=False, highlight=False)
        stdout.print(
            f"dry run: the statement is valid; {len(done.statement['subject'])} file(s), nothing signed", markup=False
        )
        return
    what = (
        "an OpenSSF Model Signing bundle"
        if fmt == "oms"
        else "training provenance (Sigstore keyless)"
        if token is not None
        else "training provenance (under an X.509 certificate)"
        if certificate is not None
        else "training provenance"
    )
    stdout.print(f"signed [bold]{shown(str(done.path))}[/]: {what} of {shown(str(src))}")
    stdout.print(
        f"  format {done.format}, {len(done.statement['subject'])} file(s), fixture {done.digest.digest.prefixed()}"
    )
    if fmt != "oms":
        stdout.print(f"  builder {shown(done.statement['predicate']['runDetails']['builder']['id'])}")


def register(cli: click.Group) -> None:
    attest.add_command(checkpoint)
