"""Format detectors: each returns a typed layout or ``None``; the first match wins, else ``unknown``.

Each detector module registers its detectors in :mod:`ckptgate.inspect.formats.registry` with
its place in the detection order; importing this package imports them all.
"""

from __future__ import annotations

from ckptgate.inspect.findings import warning
from ckptgate.inspect.formats import dcp, dcp_folders, deepspeed, fsdp, hf, megatron, peft  # registers each
from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.formats.registry import detectors
from ckptgate.inspect.zipcheck import CrcMode

__all__ = [
    "Context",
    "FormatResult",
    "dcp",
    "dcp_folders",
    "deepspeed",
    "detect_format",
    "fsdp",
    "hf",
    "megatron",
    "peft",
]


def detect_format(ctx: Context, *, verify_crc: CrcMode = True) -> FormatResult:
    """Run the registered detectors in their order; report ``unknown`` rather than guess."""
    for det in detectors():
        r = det(ctx, verify_crc=verify_crc)
        if r is not None:
            return r
    return FormatResult(
        format="unknown",
        layout={},
        loaders=(),
        consolidatable=False,
        findings=(warning("format.unknown", "", "no known checkpoint layout matched; nothing is guessed"),),
    )
