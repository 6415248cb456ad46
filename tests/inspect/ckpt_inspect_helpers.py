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


# -- hand-assembled pickles (protocol 2 opcodes) ---------------------------------------------------
def p_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def p_int(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


def p_tuple(ints: list[int] | tuple[int, ...]) -> bytes:
    return b"(" + b"".join(p_int(i) for i in ints) + b"t"


def p_tensor(key: str, numel: int, shape: tuple[int, ...], stride: tuple[int, ...], offset: int = 0,
             storage: str = "FloatStorage") -> bytes:
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + b"(" + p_str("storage") + b"ctorch\n" + storage.encode()
            + b"\n" + p_str(key) + p_str("cpu") + p_int(numel) + b"tQ" + p_int(offset) + p_tuple(shape)
            + p_tuple(stride) + b"\x89ccollections\nOrderedDict\n)Rt" + b"R")


def p_state_dict(items: dict[str, bytes]) -> bytes:
    return b"\x80\x02}(" + b"".join(p_str(k) + v for k, v in items.items()) + b"u."


def torch_zip(path: Path, data_pkl: bytes, storages: dict[str, bytes], prefix: str = "archive",
              extra: dict[str, bytes] | None = None) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", data_pkl)
        z.writestr(f"{prefix}/byteorder", b"little")
        for k, v in storages.items():
            z.writestr(f"{prefix}/data/{k}", v)
        for k, v in (extra or {}).items():
            z.writestr(f"{prefix}/{k}", v)
        z.writestr(f"{prefix}/version", b"3\n")
    return path
