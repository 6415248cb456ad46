"""Tiny builders shared by the inspect tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def st_bytes(header: dict | bytes | str, data: bytes = b"") -> bytes:
    """A safetensors file from a header (dict is JSON-encoded) and a data buffer."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    return struct.pack("<Q", len(header)) + header + data


def codes(inspection) -> set[str]:  # noqa: ANN001
    return {f.code for f in inspection.findings}


def write(root: Path, rel: str, data: bytes | str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    p.write_bytes(data)
    return p
