"""Registers every sub-command module on the ``ckptgate`` group.

Each sub-command lives in its own module (``_cli/<name>_cmd.py``) and exposes ``register(cli)``.
"""

from __future__ import annotations

import importlib

from ckptgate._cli._base import cli

_MODULES = (
    "intake_cmd",
    "demo_cmd",
    "inspect_cmd",
    "attest_cmd",
    "attest_checkpoint_cmd",
    "attest_verify_cmd",
    "provenance_cmd",
    "decide_cmd",
    "qualify_cmd",
    "matrix_cmd",
    "check_cmd",
    "verify_cmd",
    "doctor_cmd",
    "receipt_cmd",
    "init_cmd",
    "engine_cmd",
)

for _name in _MODULES:
    importlib.import_module(f"ckptgate._cli.{_name}").register(cli)
