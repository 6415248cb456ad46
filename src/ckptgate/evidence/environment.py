"""Where a qualification ran: interpreter, torch, operating system and architecture."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any


def environment() -> dict[str, Any]:
    """Where the run happened (no accelerator is used: consolidation moves bytes on the CPU)."""
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {
        "python": platform.python_version(),
        "torch": torch_version,
        "os": f"{platform.system()} {platform.release()}"[:256],
        "arch": platform.machine() or "unknown",
        "accelerator": "none (cpu)",
    }


__all__ = ["environment"]
