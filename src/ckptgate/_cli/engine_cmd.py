"""``ckptgate engine install [--dir DIR] [--regal] [--json]``: the pinned OPA (and Regal) with ``go install``."""

from __future__ import annotations

from pathlib import Path

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, shown, stdout


def register(cli: click.Group) -> None:
    @cli.group("engine")
    def engine_group() -> None:
        """The policy engine ckptgate runs (OPA)."""

    @engine_group.command("install")
    @click.option(
        "--dir",
        "directory",
        type=UserPath(file_okay=False, path_type=Path),
        default=None,
        help="Install into DIR (default: $XDG_DATA_HOME/ckptgate/bin, else ~/.local/share/ckptgate/bin).",
    )
    @click.option("--regal", is_flag=True, help="Install the pinned Regal (the Rego linter `check` runs) too.")
    @json_option
    def install_command(directory: Path | None, regal: bool, as_json: bool) -> int:
        """Build the pinned OPA (and, with --regal, Regal) with `go install` into DIR.

        Needs Go on PATH: Go fetches the pinned sources from its module proxy; ckptgate downloads
        nothing itself.  A tool already in DIR at the pinned version is kept.  Prints how to point
        ckptgate at the binaries (CKPTGATE_OPA, CKPTGATE_REGAL).
        """
        from ckptgate.decide import install  # noqa: PLC0415

        target = (directory or install.default_install_dir()).absolute()
        done = install.install(target, regal=regal)
        env = {f"CKPTGATE_{t.name.upper()}": str(t.path) for t in done}
        if as_json:
            emit_json({"dir": str(target), "installed": [t.to_json() for t in done], "env": env})
        else:
            for t in done:
                stdout.print(f"{'installed' if t.built else 'already there'}: {t.spec} -> {shown(t.path)}")
            stdout.print("point ckptgate at it with:")
            for k, v in env.items():
                stdout.print(shown(f"  export {k}={v}"))
        return 0
