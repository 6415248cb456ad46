"""Tensor records of a torch zip: a geometry torch could not hold is refused before any arithmetic."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from ckptgate.inspect import inspect_tree

from ckpt_inspect_helpers import p_int, p_str, p_tuple, torch_zip

_WIDE = b"\x8a\x08" + struct.pack("<q", 1 << 62)  # LONG1, memoized once and fetched by BINGET


def _tensor(shape: bytes, stride: bytes, off: bytes = p_int(0), numel: bytes = p_int(1)) -> bytes:
    return (
        b"ctorch._utils\n_rebuild_tensor_v2\n((" + p_str("storage") + b"ctorch\nFloatStorage\n" + p_str("0")
        + p_str("cpu") + numel + b"tQ" + off + shape + stride + b"\x89ccollections\nOrderedDict\n)RtR"
    )  # fmt: skip


def _inspect(tmp_path: Path, t: bytes, proto: int = 2) -> set[str]:
    (tmp_path / "ck").mkdir(parents=True)
    torch_zip(tmp_path / "ck" / "pytorch_model.bin", bytes([0x80, proto]) + b"}(" + p_str("w") + t + b"u.",
              {"0": b"\0" * 4})  # fmt: skip
    insp = inspect_tree(tmp_path / "ck")
    json.dumps(insp.to_facts())
    return {f.code for f in insp.findings if f.severity == "error"}


def test_a_shape_of_many_wide_dimensions_is_refused_at_once(tmp_path: Path) -> None:
    """100,000 dims of 2**62 (a 400 KB data.pkl) took 25 s of CPU in the numel product, a million
    hours: the product of n wide ints is quadratic in n."""
    n = 100_000
    dims = b"(" + _WIDE + b"\x94" + b"h\x00" * (n - 1) + b"t"
    t0 = time.monotonic()
    assert _inspect(tmp_path, _tensor(dims, dims), proto=4) == {"torch.tensor_geometry"}
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    ("shape", "stride", "off", "numel"),
    [
        (p_tuple([0, 1]), b"(" + p_int(1) + b"\x8a\x09" + b"\0" * 8 + b"\x01t", p_int(0), p_int(1)),  # stride 2**64
        (p_tuple([1]), p_tuple([1]), b"\x8a\x08" + b"\0" * 7 + b"\x80", p_int(1)),  # offset -2**63: refused already
        (p_tuple([1]), p_tuple([1]), b"\x8a\x09" + b"\0" * 8 + b"\x01", p_int(1)),  # offset 2**64
        (p_tuple([1]), p_tuple([1]), p_int(0), b"\x8a\x09" + b"\0" * 8 + b"\x01"),  # storage numel 2**64
        (p_tuple([1] * 65), p_tuple([1] * 65), p_int(0), p_int(1)),  # 65 dims
    ],
    ids=["stride", "negative_offset", "offset", "numel", "ndim"],
)
def test_a_geometry_outside_int64_is_refused(tmp_path: Path, shape: bytes, stride: bytes, off: bytes,
                                             numel: bytes) -> None:  # fmt: skip
    got = _inspect(tmp_path, _tensor(shape, stride, off, numel))
    assert got & {"torch.tensor_geometry", "torch.unrecognised_tensor"}
    assert got <= {"torch.tensor_geometry", "torch.unrecognised_tensor"}


def test_a_geometry_at_the_bounds_is_read(tmp_path: Path) -> None:
    big = b"\x8a\x08" + struct.pack("<q", (1 << 63) - 1)
    shape = b"(" + p_int(0) + big + b"t"  # numel 0: no byte of the storage is read
    assert _inspect(tmp_path, _tensor(shape, b"(" + big + p_int(1) + b"t")) == set()
    assert _inspect(tmp_path / "b", _tensor(p_tuple([1] * 64), p_tuple([1] * 64))) == set()
