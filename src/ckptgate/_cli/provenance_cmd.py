"""``ckptgate attest provenance``: CI vouches for a committed fixture's bytes (fixture-provenance v1)."""

from __future__ import annotations

from pathlib import Path

import click

from ckptgate._cli._base import emit_json, json_option, stdout
from ckptgate._cli._options import engine_options, evidence_repo, qualification_key_option, repo_option
from ckptgate.errors import Error


@click.command("provenance")
@click.option(
    "--fixture",
    "fixture",
    required=True,
    help="Fixture name under the configured fixtures directory (default tests/fixtures/data), or its directory.",
)
@qualification_key_option
@repo_option
@engine_options
@json_option
def provenance(fixture: str, key: Path | None, repo: Path | None, engine, as_json: bool) -> int:  # type: ignore[no-untyped-def]
    """Sign and store a fixture-provenance statement for FIXTURE at the candidate commit.

    It states that the bytes under <fixtures>/<name>/checkpoint are the ones committed at the
    candidate commit, written by the generator and producer versions recorded in meta.json; the basis
    is the repository's review, not a regeneration, and it says nothing about safety to load.
    Exit 0 stored; 2 the bytes differ from the commit or from meta.json; 5 the key is not trusted.
    """
    from ckptgate.evidence.fixtures import find_fixture  # noqa: PLC0415 - the evidence machinery
    from ckptgate.evidence.provenance import attest_provenance  # noqa: PLC0415 - the evidence machinery

    root, options = evidence_repo(repo, engine)  # the configured layout
    result = attest_provenance(root, find_fixture(root, fixture), key=key, options=options)
    if as_json:
        emit_json(result.to_json())
    else:
        stdout.print(
            f"[bold green]stored[/] provenance for {result.fixture} "
            f"(fixture {result.fixture_digest}, candidate {result.candidate_commit[:12]})"
        )
        stdout.print(f"  attestation {result.attestation}")
        for p in result.superseded:
            stdout.print(f"  superseded  {p}")
    return 0


def register(cli: click.Group) -> None:
    attest = cli.commands.get("attest")
    if not isinstance(attest, click.Group):
        raise Error("internal.cli_order", "`attest provenance` needs the attest group registered first")
    attest.add_command(provenance)
