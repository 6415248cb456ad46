"""``ckptgate demo``: a real checkpoint, freshly produced, through the whole gate."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, shown, stdout
from ckptgate._cli._options import engine_options
from ckptgate._cli.intake_cmd import published_files
from ckptgate.errors import UsageError

if TYPE_CHECKING:
    from ckptgate.decide.options import EngineOptions


def register(cli: click.Group) -> None:
    @cli.command("demo")
    @click.option(
        "--workdir",
        type=UserPath(file_okay=False, path_type=Path),
        default=None,
        help="Where to put the demo checkpoint, key, attestation and output (default: ./.ckptgate-demo/<time>).",
    )
    @engine_options
    @json_option
    def demo_command(workdir: Path | None, engine: EngineOptions, as_json: bool) -> int:
        """Build a small real checkpoint, sign an attestation with a throwaway key, and take it in.

        Runs offline on the embedded OPA (or --opa-url). The demo trusts only its own throwaway
        key, so --trust, --policy-bundle, --policy-key and --sigstore-trust-root are refused.
        """
        from ckptgate.demo import run_demo  # noqa: PLC0415 - ~1.5 s (every step)

        ignored = [
            flag
            for flag, value in (
                ("--trust", engine.trust_file),
                ("--policy-bundle", engine.policy_bundle),
                ("--policy-key", engine.policy_key),
                ("--sigstore-trust-root", engine.sigstore_trust_root),
            )
            if value
        ]
        if ignored:
            raise UsageError(
                "usage.demo_option",
                f"the demo trusts only its own throwaway key and would ignore {', '.join(ignored)}",
                advice="Run `ckptgate intake` to use your own trust data.",
            )

        workdir = workdir or Path(".ckptgate-demo") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        result = run_demo(workdir.absolute(), options=engine)
        d = result.intake.evaluation.decision
        if as_json:
            emit_json(
                {
                    "result": "published",
                    "source": str(result.source),
                    "attestation": str(result.attestation),
                    "destination": str(result.intake.destination),
                    "decision": d.to_json(),
                    "tensors_compared": result.tensors_compared,
                    "receipt": result.intake.receipt,
                }
            )
            return 0
        stdout.print(f"produced  {result.source}  (huggingface_hub.save_torch_state_dict)")
        stdout.print(f"signed    {result.attestation}  (throwaway Ed25519 key, trust data {result.trust_file})")
        stdout.print(f"decision  [bold green]allow[/] plane={d.plane} id={d.decision_id} by {d.engine}")
        for r in d.reasons:
            stdout.print(f"          - {shown('[' + r.code + ']')} {shown(r.message)}")
        stdout.print(
            f"published {result.intake.destination}  "
            f"({published_files(result.intake.destination, len(result.intake.outputs))})"
        )
        stdout.print(f"checked   {result.tensors_compared} tensors equal the input bit for bit")
        return 0
