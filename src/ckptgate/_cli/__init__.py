"""The private, thin command-line layer.  Only this package calls ``sys.exit``."""

from __future__ import annotations

from ckptgate._cli._base import main

__all__ = ["main"]
