"""``ckptgate init [--json]``: scaffold ``ckptgate.toml`` in the current git repository."""

from __future__ import annotations

from pathlib import Path

import click

from ckptgate._cli._base import emit_json, json_option, printable, stdout


def register(cli: click.Group) -> None:
    @cli.command("init")
    @json_option
    def init_command(as_json: bool) -> int:
        """Write ckptgate.toml with commented defaults at the top of the current git work tree.

        Never overwrites: when ckptgate.toml, or a pyproject.toml with a [tool.ckptgate] table, is
        already found from here, it exits 2 and names that file. Outside a git work tree it writes
        nothing and exits 2 (usage.init.no_work_tree): run it inside the repository, or `git init` first.
        """
        from ckptgate.config import load_file  # noqa: PLC0415 - ~22 ms
        from ckptgate.config.template import init  # noqa: PLC0415

        written = init(Path.cwd())
        config = load_file(written)  # what was written validates, or this is a bug
        if as_json:
            emit_json({"config": str(written), "created": True, "settings": config.to_json()})
        else:
            stdout.print(f"wrote {printable(written)}; edit it, then run `ckptgate check`", markup=False)
        return 0
