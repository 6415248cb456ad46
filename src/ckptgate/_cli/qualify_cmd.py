"""``ckptgate qualify``: run an adapter on a real fixture, compare bit for bit, sign and store the result."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ckptgate._cli._base import emit_json, json_option, stdout
from ckptgate._cli._options import engine_options, evidence_repo, qualification_key_option, repo_option
from ckptgate.errors import UsageError

if TYPE_CHECKING:
    from ckptgate.decide.options import EngineOptions


def register(cli: click.Group) -> None:
    @cli.command("qualify")
    @click.option("--adapter", default=None, help="Adapter name (as in policies/ckptgate/config/gates/data.json).")
    @click.option(
        "--fixture",
        default=None,
        help="Fixture name under the configured fixtures directory (default tests/fixtures/data), or its directory.",
    )
    @click.option("--all", "all_", is_flag=True, help="Qualify every fixture whose format has an adapter.")
    @click.option("--allow-dirty", is_flag=True, help="Run on a work tree with uncommitted changes (recorded).")
    @qualification_key_option
    @repo_option
    @engine_options
    @json_option
    def qualify_command(
        adapter: str | None,
        fixture: str | None,
        all_: bool,
        allow_dirty: bool,
        key: Path | None,
        repo: Path | None,
        engine: EngineOptions,
        as_json: bool,
    ) -> int:
        """Qualify ADAPTER on FIXTURE; store the signed statement and result log in the attestation store.

        A framework-plane fixture (DeepSpeed ZeRO-2/3, Megatron Core torch_dist) is loaded only after a trusted
        fixture-provenance attestation for its digest: a stored one that verifies, else one signed
        with the same key once the fixture's bytes are checked equal to the candidate commit.

        Exit 0 passed; 2 dirty tree, fixture bytes not committed, or bad usage; 3 policy denied; 4
        inspection refused the fixture; 5 the signature does not verify under the trust data; 7 the
        output differs from expected.safetensors (a signed failed result is stored).
        """
        from ckptgate.evidence.fixtures import find_fixture  # noqa: PLC0415 - the evidence machinery
        from ckptgate.evidence.qualify import qualify, qualify_all  # noqa: PLC0415 - the evidence machinery

        root, options = evidence_repo(repo, engine)  # the configured layout
        if all_:
            if adapter or fixture:
                raise UsageError(
                    "usage.invalid",
                    "--all takes no --adapter or --fixture",
                    advice="Run `ckptgate qualify --all` alone, or name one pair: "
                    "`ckptgate qualify --adapter ADAPTER --fixture FIXTURE`.",
                )
            results = qualify_all(root, key=key, options=options, allow_dirty=allow_dirty)
            if as_json:
                emit_json({"results": results})
            else:
                for r in results:
                    stdout.print(
                        f"{r['status']:8} {r['adapter']:20} {r['fixture']:28} "
                        f"{r.get('attestation') or r.get('reason') or ''}"
                    )
            return 0 if all(r["status"] in ("passed", "skipped") for r in results) else 7
        if not adapter or not fixture:
            raise UsageError(
                "usage.invalid",
                "give --adapter and --fixture, or --all",
                advice="Run `ckptgate qualify --adapter ADAPTER --fixture FIXTURE` for one pair, "
                "or `ckptgate qualify --all` for every one.",
            )
        result = qualify(root, find_fixture(root, fixture), adapter, key=key, options=options, allow_dirty=allow_dirty)
        if as_json:
            emit_json(result.to_json())
        else:
            stdout.print(
                f"[bold green]{result.status}[/] {adapter} on {result.fixture} "
                f"(fixture {result.fixture_digest}, candidate {result.candidate_commit[:12]})"
            )
            stdout.print(f"  attestation {result.attestation}")
            stdout.print(f"  result log  {result.log} ({result.log_sha256.prefixed()})")
            for prov in result.provenance:
                stdout.print(f"  provenance  {prov} (the fixture's committed bytes, vouched for before loading)")
        return 0
