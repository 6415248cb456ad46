"""Registers every sub-command module on the ``ckptgate`` group.

Each sub-command lives in its own module (``_cli/<name>_cmd.py``) and exposes ``register(cli)``.
"""

from __future__ import annotations

import importlib

from ckptgate._cli._base import cli

_MODULES = ("intake_cmd", "demo_cmd", "inspect_cmd", "attest_cmd", "decide_cmd", "qualify_cmd", "matrix_cmd",
            "check_cmd", "verify_cmd", "provenance_cmd")

for _name in _MODULES:
    try:
        _mod = importlib.import_module(f"ckptgate._cli.{_name}")
    except ModuleNotFoundError as _e:  # a sub-command not written yet
        if _e.name != f"ckptgate._cli.{_name}":
            raise
        continue
    _mod.register(cli)
