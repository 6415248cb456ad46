"""``ckptgate intake``: take a checkpoint in through the gate and publish HF sharded safetensors."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, report_error, shown, stdout
from ckptgate._cli._options import ByteSize, checkpoint_option, engine_options, quiet_option, signature_options
from ckptgate._cli._progress import phase_bars
from ckptgate.errors import Error, UsageError

if TYPE_CHECKING:
    from ckptgate.decide.options import EngineOptions
    from ckptgate.pipeline import IntakeResult
    from ckptgate.verify.dsse import Signer


def run_intake(
    src: Path,
    out: Path,
    attestations: tuple[Path, ...],
    *,
    options: EngineOptions,
    max_shard_size: int,
    show_progress: bool,
    dtype: str | None = None,
    signatures: tuple[Path, ...] = (),
    key: Path | None = None,
    receipt_signer: Signer | None = None,
    select: str | None = None,
    certificate_chains: tuple[Path, ...] = (),
    hf_config: Path | None = None,
    workers: int | None = None,
) -> IntakeResult:
    """Intake, with a labelled bar for hashing and then one for consolidating when ``show_progress``."""
    from ckptgate.pipeline import intake  # noqa: PLC0415 - ~1.8 s (every step)

    with phase_bars(show_progress, "hashing", "consolidating") as bars:
        return intake(
            src,
            out,
            attestations=list(attestations),
            options=options,
            max_shard_bytes=max_shard_size,
            on_hash_plan=bars["hashing"].plan,
            on_hash_bytes=bars["hashing"].advance,
            on_plan=bars["consolidating"].plan,
            on_bytes=bars["consolidating"].advance,
            dtype=dtype,
            signatures=list(signatures),
            key=key,
            receipt_signer=receipt_signer,
            select=select,
            certificate_chain=list(certificate_chains),
            hf_config=hf_config,
            workers=workers,
        )


def published_files(destination: Path, outputs: int) -> str:
    """``5 files (4 outputs, ckptgate-receipt.json)``: every file DST holds, counted there, the
    receipt (and its signature) named beside the outputs the receipt lists."""
    from ckptgate.publish import RECEIPT_NAME, RECEIPT_SIGNATURE_NAME  # noqa: PLC0415 - loaded by then (the pipeline imports it)

    names = set(os.listdir(destination))
    extra = [n for n in (RECEIPT_NAME, RECEIPT_SIGNATURE_NAME) if n in names]
    return f"{len(names)} files ({outputs} output{'s' if outputs != 1 else ''}, {', '.join(extra)})"


def print_result(result: IntakeResult) -> None:
    d = result.evaluation.decision
    stdout.print(
        f"[bold green]allowed[/] plane={d.plane} decision={d.decision_id or '-'} policy={d.policy_revision[:19]}"
    )
    for r in d.reasons:
        stdout.print(f"  - {shown('[' + r.code + ']')} {shown(r.message)}")
    stdout.print(
        f"published {published_files(result.destination, len(result.outputs))} to [bold]{result.destination}[/]"
    )
    stdout.print(f"fixture digest {result.evaluation.digest.digest}")


def register(cli: click.Group) -> None:
    @cli.command("intake")
    @click.argument("src", type=UserPath(exists=True, file_okay=False, path_type=Path))
    @click.option(
        "--out",
        "out",
        required=True,
        type=UserPath(path_type=Path),
        help="Destination directory; must not exist. Published atomically.",
    )
    @click.option(
        "--attestation",
        "attestations",
        multiple=True,
        type=UserPath(dir_okay=False, path_type=Path),
        help="A DSSE envelope or Sigstore bundle about SRC (repeatable).",
    )
    @click.option(
        "--max-shard-size",
        type=ByteSize(),
        default="2GiB",
        show_default=True,
        help="Maximum output shard size: bytes, or 5GB, 500MB (powers of 1000) or 2GiB (of 1024).",
    )
    @click.option(
        "--workers",
        type=click.IntRange(min=1),
        default=None,
        help="Threads that hash the input and hash and write the output (one output file per thread). "
        "Default: the cores this process may run on. Memory grows by about 20 MiB per worker; the "
        "published bytes are the same for any value.",
    )
    @click.option(
        "--dtype",
        type=click.Choice(["F32", "BF16", "F16", "F64"], case_sensitive=False),
        default=None,
        help="Cast every floating-point tensor (F64, F32, F16, BF16) to this dtype, rounding to nearest "
        "even; other dtypes are never changed.  Default: every dtype is preserved.",
    )
    @click.option(
        "--receipt-key",
        type=UserPath(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="PEM private key (Ed25519 or ECDSA P-256) to sign the receipt with, as a DSSE envelope "
        "published beside it; check it later with `ckptgate receipt verify --key`.",
    )
    @click.option(
        "--select",
        "select",
        default=None,
        metavar="PREFIX",
        help="In a DCP training-state tree, write only the entries under PREFIX (such as 'model'), "
        "named without it. Default: the model subtree of a layout the policy data describes, "
        "else the whole tree.",
    )
    @click.option(
        "--hf-config",
        "hf_config",
        type=UserPath(exists=True, path_type=Path),
        default=None,
        help="Map a Megatron Core torch_dist checkpoint to the Hugging Face model this config.json declares "
        "(or a directory of config.json, generation_config.json and tokenizer files, published with it), "
        "through the declared family table; see docs/consolidation.md.",
    )
    @click.option(
        "--distributed",
        is_flag=True,
        default=False,
        help="Run as one rank of a torch.distributed job (under torchrun): the ranks split the hashing "
        "and the writing by bytes, rank 0 decides once and publishes once.  Needs a per-job "
        "secret in $CKPTGATE_DIST_SECRET; see docs/scale-out.md.",
    )
    @click.option(
        "--dist-timeout",
        type=float,
        default=600.0,
        show_default=True,
        help="With --distributed: seconds any rank may wait for the others in one exchange.",
    )
    @signature_options
    @checkpoint_option("src")
    @engine_options
    @quiet_option
    @json_option
    def intake_command(
        src: Path,
        out: Path,
        attestations: tuple[Path, ...],
        max_shard_size: int,
        workers: int | None,
        dtype: str | None,
        receipt_key: Path | None,
        select: str | None,
        hf_config: Path | None,
        distributed: bool,
        dist_timeout: float,
        signatures: tuple[Path, ...],
        key: Path | None,
        certificate_chains: tuple[Path, ...],
        engine: EngineOptions,
        quiet: bool,
        as_json: bool,
    ) -> int:
        """Inspect, verify, decide, enforce, consolidate and publish SRC at --out.

        Exit 0 when allowed and published; 3 denied; 4 input rejected; 5 verification failed;
        6 policy engine unavailable; 7 contained runtime failed.
        """
        from ckptgate.verify.dsse import KeySigner  # noqa: PLC0415 - ~490 ms (cryptography)

        signer = KeySigner.from_pem(receipt_key) if receipt_key is not None else None  # before any work
        if hf_config is not None and (select is not None or distributed):
            raise UsageError(
                "usage.hf_config.combination",
                f"--hf-config does not combine with {'--select' if select is not None else '--distributed'}",
                advice=f"Leave {'--select' if select is not None else '--distributed'} out: a mapped intake "
                "(--hf-config) takes the whole model and runs as one process.",
            )
        if distributed:
            return _run_distributed(
                src,
                out,
                attestations,
                options=engine,
                max_shard_size=max_shard_size,
                dtype=dtype,
                select=select,
                signatures=signatures,
                key=key,
                receipt_signer=signer,
                certificate_chains=certificate_chains,
                timeout_s=dist_timeout,
                as_json=as_json,
            )
        result = run_intake(
            src,
            out,
            attestations,
            options=engine,
            max_shard_size=max_shard_size,
            show_progress=not (as_json or quiet) and sys.stderr.isatty(),
            receipt_signer=signer,
            dtype=dtype,
            signatures=signatures,
            key=key,  # click gives the choice as listed
            select=select,
            certificate_chains=certificate_chains,
            hf_config=hf_config,
            workers=workers,
        )
        if as_json:
            emit_json({"result": "published", "destination": str(result.destination), "receipt": result.receipt})
        else:
            print_result(result)
        return 0


def _run_distributed(
    src: Path,
    out: Path,
    attestations: tuple[Path, ...],
    *,
    options: EngineOptions,
    max_shard_size: int,
    dtype: str | None,
    select: str | None,
    signatures: tuple[Path, ...],
    key: Path | None,
    receipt_signer: Signer | None,
    certificate_chains: tuple[Path, ...],
    timeout_s: float,
    as_json: bool,
) -> int:
    """One rank of a distributed intake: rank 0 prints the result; another rank prints only its own
    error, and exits with the first failure's exit code when another rank failed."""
    from ckptgate.distributed import DistributedOptions, Relayed, distributed_intake, silent_rank  # noqa: PLC0415 - ~600 ms (every step), only for --distributed

    try:
        result = distributed_intake(
            src,
            out,
            attestations=list(attestations),
            options=options,
            max_shard_bytes=max_shard_size,
            dtype=dtype,
            select=select,
            signatures=list(signatures),
            key=key,
            certificate_chain=list(certificate_chains),
            receipt_signer=receipt_signer,
            dist_options=DistributedOptions(timeout_s=timeout_s),
        )
    except Error as e:
        if "torch" not in sys.modules:  # refused before the process group: nothing to tear down
            if not silent_rank():  # rank 0, or a process whose RANK is no rank of the job
                raise
            raise SystemExit(int(e.exit_code)) from None
        if os.environ.get("RANK", "0") == "0":
            report_error(e, as_json)
        elif not isinstance(e, Relayed):  # rank 0 reports a relayed failure; this rank only its own, on stderr
            report_error(e, as_json=False)
        exit_now(int(e.exit_code))
    if result is not None and as_json:
        emit_json({"result": "published", "destination": str(result.destination), "receipt": result.receipt})
    elif result is not None:
        print_result(result)
    exit_now(0)


def exit_now(code: int) -> NoReturn:
    """End this rank with ``code`` without the interpreter's teardown of torch (measured here: about
    1.2 s alone, 2.8 s for two ranks on 2 cores).  Everything this process opened was closed by
    its own context manager before this point: the process group, the staging directory, the
    embedded OPA, every worker and every file; only the output streams are flushed here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
