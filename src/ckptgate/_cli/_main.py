"""``ckptgate``'s entry point: the signal handlers first (:func:`ckptgate._cli._base.launched`),
then the sub-commands (:mod:`ckptgate._cli.commands`, which imports :mod:`ckptgate._cli._base`;
``_base`` imports neither, so there is no circle), then the command line."""

from __future__ import annotations

import sys

from ckptgate._cli._base import cli, launched


def _commands_then_cli() -> int:
    # registers every sub-command on cli; after the handlers, so a signal during the imports is handled
    import ckptgate._cli.commands  # noqa: F401, PLC0415 - the commands' imports come after the handlers

    try:
        cli()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    return 0


def main() -> None:
    sys.exit(launched(_commands_then_cli))  # the handlers go in before the commands' imports


__all__ = ["main"]
