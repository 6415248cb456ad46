"""Compare a consolidation's output with a fixture's ground truth, tensor by tensor, bit for bit."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ckptgate.evidence.errors import EvidenceError
from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.safetensors import read_header


def _tensor_digests(path: Path) -> dict[str, dict[str, Any]]:
    """name -> {dtype, shape, sha256 of the raw bytes}, read through our strict header validator."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        with HashedFile.over(fd, path.name) as src:
            header = read_header(src, size, path=path.name)
        out: dict[str, dict[str, Any]] = {}
        for t in header.tensors:
            begin, end = t.data_offsets
            h = hashlib.sha256()
            pos, left = header.data_start + begin, end - begin
            while left > 0:
                chunk = os.pread(fd, min(left, 8 << 20), pos)
                if not chunk:
                    raise EvidenceError("evidence.compare.short_read", f"{path.name}: short read at {pos}")
                h.update(chunk)
                pos += len(chunk)
                left -= len(chunk)
            out[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "sha256": h.hexdigest(), "file": path.name}
        return out
    finally:
        os.close(fd)


def compare_outputs(out_dir: Path, expected: Path) -> dict[str, Any]:
    """Compare every tensor written to ``out_dir`` with ``expected`` (names, dtype, shape, bytes)."""
    got: dict[str, dict[str, Any]] = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        for name, info in _tensor_digests(f).items():
            if name in got:
                raise EvidenceError("evidence.compare.duplicate", f"tensor {name!r} written twice")
            got[name] = info
    want = _tensor_digests(expected)
    rows = []
    for name in sorted(set(got) | set(want)):
        g, w = got.get(name), want.get(name)
        rows.append(
            {
                "name": name,
                "expected": w,
                "actual": g,
                "names_equal": g is not None and w is not None,
                "dtype_shape_equal": bool(g and w and g["dtype"] == w["dtype"] and g["shape"] == w["shape"]),
                "bytes_equal": bool(g and w and g["sha256"] == w["sha256"]),
            }
        )
    return {
        "tensors": rows,
        "tensor_names": all(r["names_equal"] for r in rows),
        "dtype_shape": all(r["dtype_shape_equal"] for r in rows),
        "tensor_bytes_bit_exact": all(r["bytes_equal"] for r in rows),
    }


__all__ = ["compare_outputs"]
