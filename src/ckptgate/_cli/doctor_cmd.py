"""``ckptgate doctor [--clean] [--json]``: what killed runs left behind, and removing it."""

from __future__ import annotations

import click

from ckptgate._cli._base import emit_json, json_option, shown, stdout, table
from ckptgate.errors import ExitCode


def register(cli: click.Group) -> None:
    @cli.command("doctor")
    @click.option(
        "--clean",
        is_flag=True,
        help="Remove the leftovers whose owner is provably dead (and quiet legacy work directories).",
    )
    @json_option
    def doctor_command(clean: bool, as_json: bool) -> int:
        """List this user's ckptgate work directories, staging directories and registry entries.

        A directory is live while its owner holds its lock, stale once the owner is dead (killed,
        crashed).  --clean removes the stale ones; a live one is never touched.  Exit 0 when no
        removable leftover remains, 3 when one does (listed without --clean, or not removed).
        """
        from ckptgate import workdirs  # noqa: PLC0415 - ~17 ms

        found = workdirs.find_leftovers()
        removed = workdirs.clean(found) if clean else []
        gone = {item.path for item in removed}
        remaining = [item for item in found if item.removable and item.path not in gone]
        if as_json:
            emit_json(
                {
                    "leftovers": [dict(item.to_json(), removed=item.path in gone) for item in found],
                    "removed": len(removed),
                    "remaining": len(remaining),
                }
            )
        elif not found:
            stdout.print("no leftovers")
        else:
            table(
                "ckptgate leftovers",
                ("kind", "state", "bytes", "path", "note"),
                (
                    (
                        item.kind,
                        "removed" if item.path in gone else item.state,
                        str(item.size),
                        shown(item.path),
                        shown(item.detail),
                    )
                    for item in found
                ),
            )
            if remaining:
                stdout.print(
                    f"{len(remaining)} removable leftover(s)"
                    + ("; run `ckptgate doctor --clean`" if not clean else " could not be removed")
                )
        return int(ExitCode.DENIED) if remaining else 0
