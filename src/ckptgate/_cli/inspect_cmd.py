"""``ckptgate inspect PATH [--json] [--digest]``: facts about a checkpoint, nothing executed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from ckptgate._cli._base import emit_json, json_option, shown, stdout, table
from ckptgate._cli._options import checkpoint_option
from ckptgate.errors import InputRejected


def _digest(tree: Any, show_progress: bool) -> Any:
    from ckptgate.digest import fixture_digest  # noqa: PLC0415 - ~175 ms (the inspection stack)

    if not show_progress:
        return fixture_digest(tree)
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
    ) as bar:
        task = bar.add_task("hashing", total=tree.total_bytes)
        return fixture_digest(tree, progress=lambda n: bar.advance(task, n))


def _human(facts: dict[str, Any], digest: Any) -> None:
    ok = "[green]clean[/]" if facts["clean"] else "[red]not clean[/]"
    stdout.print(
        f"[bold]format[/] {facts['format']}   {ok}   loaders: {', '.join(facts['loaders']) or '-'}"
        f"   consolidatable: {facts['consolidatable']}"
    )
    if digest is not None:
        stdout.print(f"[bold]fixture digest[/] {digest.digest} ({digest.file_count} files, {digest.total_bytes} bytes)")
    table("files", ("path", "kind", "size"), ((shown(f["path"]), f["kind"], str(f["size"])) for f in facts["files"]))
    if facts["findings"]:
        colour = {"error": "red", "warning": "yellow", "info": "dim"}
        table(
            "findings",
            ("severity", "code", "path", "message"),
            (
                (
                    f"[{colour[x['severity']]}]{x['severity']}[/]",
                    shown(x["code"]),
                    shown(x["path"]),
                    shown(x["message"]),
                )
                for x in facts["findings"]
            ),
        )


def register(cli: click.Group) -> None:
    @cli.command("inspect")
    @click.argument("path", type=click.Path(path_type=Path, file_okay=False, exists=True))
    @click.option("--digest", "with_digest", is_flag=True, help="Also compute the fixture digest.")
    @checkpoint_option("path")
    @json_option
    def inspect_command(path: Path, with_digest: bool, as_json: bool) -> int:
        """Inspect the checkpoint directory PATH by content, without loading or running anything.

        Exits 0 when the inspection is clean, 4 when any error finding was made.
        """
        from ckptgate.inspect import SafeTree, inspect_open_tree  # noqa: PLC0415 - ~310 ms (the inspection stack)

        with SafeTree.open(path) as tree:
            insp = inspect_open_tree(tree)
            digest = _digest(tree, sys.stderr.isatty() and not as_json) if with_digest else None
        facts = insp.to_facts()
        if as_json:
            doc: dict[str, Any] = {"inspection": facts}
            if digest is not None:
                doc["fixture"] = digest.to_facts()
                doc["manifest"] = [e.to_json() for e in digest.manifest]
            emit_json(doc)
        else:
            _human(facts, digest)
        if not insp.clean:
            errors = [f["code"] for f in facts["findings"] if f["severity"] == "error"]
            if not as_json:
                first = errors[0] if errors else "a pickle outside its allowlist"
                raise InputRejected(
                    "input.inspection.not_clean",
                    f"{len(errors)} error finding(s); first: {first}",
                    evidence={"codes": sorted(set(errors))},
                )
            return int(InputRejected.exit_code)
        return 0
