"""``ckptgate inspect PATH [--json] [--digest]``: facts about a checkpoint, nothing executed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from ckptgate._cli._base import UserPath, emit_json, json_option, shown, stdout, table
from ckptgate._cli._excepted import Excepted, bundled_exceptions
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


def not_clean(path: Path, facts: dict[str, Any], excepted: list[Excepted]) -> InputRejected:
    """The refusal of an unclean inspection: each error finding by file, and the ones the bundled
    policy excepts by name, with its reason, kept apart from the rest."""
    errors = [f for f in facts["findings"] if f["severity"] == "error"]
    admitted = {(e.code, e.path) for e in excepted}
    rest = [f for f in errors if (f["code"], f["path"]) not in admitted]
    named = "; ".join(f"{f['path'] or 'the directory'}: {f['message']} ({f['code']})" for f in rest[:3])
    if len(rest) > 3:
        named += f"; and {len(rest) - 3} more"
    by_exception: dict[tuple[str, str, str], list[str]] = {}
    for e in excepted:
        by_exception.setdefault((e.exception, e.code, e.why), []).append(e.path)
    why = "; ".join(
        f"{', '.join(paths)} ({code}) by the exception {ex}: {reason}"
        for (ex, code, reason), paths in by_exception.items()
    )
    pickles = facts.get("pickles") or {}
    reports = pickles.values() if isinstance(pickles, dict) else pickles
    pickle_refused = any(not (r.get("complete") and r.get("inside_allowlist")) for r in reports)
    evidence = {"codes": sorted({f["code"] for f in errors}), "excepted": [e.to_json() for e in excepted]}
    if errors and not rest and not pickle_refused:
        return InputRejected(
            "input.inspection.not_clean",
            f"{len(errors)} error finding(s), each one the bundled policy excepts by name: {why}",
            evidence=evidence,
            advice=f"These findings alone do not refuse an intake: `ckptgate decide {path} --attestation FILE` "
            f"gives the policy's decision, and `ckptgate intake {path} --out DST --attestation FILE` takes it in.",
        )
    message = f"{len(errors)} error finding(s): {named}" if rest else "a pickle outside its allowlist or incomplete"
    if excepted:
        message += f" (the bundled policy excepts {why})"
    return InputRejected(
        "input.inspection.not_clean",
        message,
        evidence=evidence,
        advice=f"Nothing in {path} was loaded or run. `ckptgate inspect {path} --json` lists every finding with "
        "its evidence; a checkpoint its producer wrote should not have these: obtain it again from the producer.",
    )


def register(cli: click.Group) -> None:
    @cli.command("inspect")
    @click.argument("path", type=UserPath(path_type=Path, file_okay=False, exists=True))
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
        excepted = bundled_exceptions(facts["format"], facts["findings"])
        if as_json:
            doc: dict[str, Any] = {"inspection": facts, "excepted_by_bundled_policy": [e.to_json() for e in excepted]}
            if digest is not None:
                doc["fixture"] = digest.to_facts()
                doc["manifest"] = [e.to_json() for e in digest.manifest]
            emit_json(doc)
        else:
            _human(facts, digest)
        if not insp.clean:
            if not as_json:
                raise not_clean(path, facts, excepted)
            return int(InputRejected.exit_code)
        return 0
