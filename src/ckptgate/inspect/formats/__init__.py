"""Format detectors: each returns a typed layout or ``None``; the first match wins, else ``unknown``."""

from __future__ import annotations

from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.formats.dcp import detect_dcp, detect_dcp_hf
from ckptgate.inspect.formats.deepspeed import detect_deepspeed, detect_universal
from ckptgate.inspect.formats.fsdp import detect_fsdp
from ckptgate.inspect.formats.hf import detect_hf_sharded, detect_single_safetensors
from ckptgate.inspect.formats.megatron import detect_megatron
from ckptgate.inspect.formats.peft import detect_peft
from ckptgate.inspect.findings import warning
from ckptgate.inspect.zipcheck import CrcMode

__all__ = ["Context", "FormatResult", "detect_format"]


def detect_format(ctx: Context, *, verify_crc: CrcMode = True) -> FormatResult:
    """Run the detectors in a fixed order; report ``unknown`` rather than guess."""
    for det in (detect_hf_sharded, detect_peft):
        r = det(ctx)
        if r is not None:
            return r
    r = detect_megatron(ctx, verify_crc=verify_crc)
    if r is not None:
        return r
    r = detect_dcp(ctx, verify_crc=verify_crc)
    if r is not None:
        return r
    for det in (detect_dcp_hf, detect_universal, detect_deepspeed, detect_fsdp, detect_single_safetensors):
        r = det(ctx)
        if r is not None:
            return r
    return FormatResult(format="unknown", layout={}, loaders=(), consolidatable=False,
                        findings=(warning("format.unknown", "", "no known checkpoint layout matched; nothing "
                                          "is guessed"),))
