"""``ckptgate verify PATH``: the reviewer report (what, digest, who signed, which policy decided, controls)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, printable, stdout
from ckptgate._cli._options import engine_options, quiet_option, signature_options
from ckptgate._cli._progress import phase_bars
from ckptgate.userfiles import check_output_file, write_output_file

if TYPE_CHECKING:
    from ckptgate.decide.options import EngineOptions


def register(cli: click.Group) -> None:
    @cli.command("verify")
    @click.argument("path", type=UserPath(exists=True, file_okay=False, path_type=Path))
    @click.option(
        "--attestation",
        "attestations",
        multiple=True,
        type=UserPath(dir_okay=False, path_type=Path),
        help="A DSSE envelope or Sigstore bundle about PATH (repeatable).",
    )
    @click.option(
        "--html",
        "html_out",
        type=UserPath(dir_okay=False, path_type=Path),
        default=None,
        help="Also write the report as a self-contained HTML file.",
    )
    @signature_options
    @engine_options
    @quiet_option
    @json_option
    def verify_command(
        path: Path,
        attestations: tuple[Path, ...],
        html_out: Path | None,
        signatures: tuple[Path, ...],
        key: Path | None,
        certificate_chains: tuple[Path, ...],
        engine: EngineOptions,
        quiet: bool,
        as_json: bool,
    ) -> int:
        """Report on PATH without loading it. Exit 0 when the policy allows; a deny exits as its
        refusal class says: 4 the checkpoint itself, 5 only failed or untrusted signatures, 3 any
        other reason; 6 policy engine unavailable."""
        from ckptgate.decide.decision import REFUSAL_EXIT  # noqa: PLC0415 - ~550 ms (the engine stack)
        from ckptgate.evidence.report import build_report, render_html, render_text  # noqa: PLC0415 - the evidence machinery

        if html_out is not None:
            check_output_file(html_out, what="the HTML report", not_inside=[path])
        with phase_bars(not (as_json or quiet) and sys.stderr.isatty(), "hashing") as bars:
            doc = build_report(
                path,
                attestations,
                options=engine,
                signatures=signatures,
                key=key,
                certificate_chain=certificate_chains,
                on_hash_plan=bars["hashing"].plan,
                on_hash_bytes=bars["hashing"].advance,
            )
        if html_out is not None:
            write_output_file(html_out, render_html(doc).encode(), what="the HTML report", not_inside=[path])
        if as_json:
            emit_json(doc)
        else:
            for line in render_text(doc):
                stdout.print(printable(line), markup=False, highlight=False)
        return 0 if doc["decision"]["allow"] else int(REFUSAL_EXIT[doc["decision"]["refusal"]])
