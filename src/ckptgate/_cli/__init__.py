"""The private, thin command-line layer.  Only this package turns an error into an exit status (the
containment probe, a child process of its own, exits by itself)."""

from __future__ import annotations

from ckptgate._cli._main import main

__all__ = ["main"]
