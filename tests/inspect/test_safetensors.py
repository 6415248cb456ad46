"""Strict safetensors validator: one code per check, cross-checked with the safetensors library."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import safetensors
import safetensors.numpy
import numpy as np

from ckptgate.inspect.hashed import HashedFile
from ckptgate.errors import InputRejected
from ckptgate.inspect.safetensors import parse_header_bytes, read_header

from ckpt_inspect_helpers import st_bytes


def _t(dtype: str, shape: list[int], b: int, e: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def _check(blob: bytes) -> str:
    with pytest.raises(InputRejected) as e:
        parse_header_bytes(blob, len(blob), path="x.safetensors")
    return e.value.code


def _lib_rejects(tmp_path: Path, blob: bytes) -> bool:
    p = tmp_path / "lib.safetensors"
    p.write_bytes(blob)
    try:
        with safetensors.safe_open(str(p), "np") as f:
            for k in f.keys():
                f.get_tensor(k)
    except Exception:  # noqa: BLE001 - the library flattens its errors
        return True
    return False


GOOD = {"a": _t("F32", [2], 0, 8), "b": _t("BF16", [1, 2], 8, 12)}

CASES = {
    "too_small": b"\x01\x00\x00",
    "header_too_large": struct.pack("<Q", 200_000_000) + b"{}",
    "header_beyond_file": struct.pack("<Q", 1000) + b'{"a":1}',
    "header_nul": st_bytes(b'{"a":' + json.dumps(_t("U8", [1], 0, 1)).encode() + b"}\x00\x00", b"\x01"),
    "bom": st_bytes(b"\xef\xbb\xbf{}"),
    "not_utf8": st_bytes(b'{"\xff":1}'),
    "not_object_start": st_bytes(b' {"__metadata__":{}}'),
    "json_too_deep": st_bytes(b'{"__metadata__":' + b"[" * 200 + b"]" * 200 + b"}"),
    "duplicate_key": st_bytes(b'{"a":' + json.dumps(_t("U8", [1], 0, 1)).encode() + b',"a":'
                              + json.dumps(_t("U8", [1], 1, 2)).encode() + b"}", b"\x01\x02"),
    "duplicate_metadata": st_bytes(b'{"__metadata__":{},"__metadata__":{}}'),
    "invalid_json": st_bytes(b'{"a":}'),
    "metadata_not_str_map": st_bytes({"__metadata__": {"k": 1}}),
    "tensor_fields": st_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}, b"\0" * 4),
    "unknown_dtype": st_bytes({"a": _t("f32", [1], 0, 4)}, b"\0" * 4),
    "bad_shape": st_bytes({"a": _t("F32", [-1], 0, 4)}, b"\0" * 4),
    "bad_offsets_float": st_bytes({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]}}, b"\0" * 4),
    "bad_offsets_huge": st_bytes({"a": _t("U8", [1], 0, 2**60)}, b"\0"),
    "bad_offsets_negative": st_bytes({"a": _t("U8", [1], -1, 0)}, b"\0"),
    "offsets_reversed": st_bytes({"a": _t("U8", [0], 4, 0)}, b"\0" * 4),
    "offsets_gap": st_bytes({"a": _t("U8", [4], 0, 4), "b": _t("U8", [4], 8, 12)}, b"\0" * 12),
    "offsets_gap_not_from_zero": st_bytes({"a": _t("U8", [4], 4, 8)}, b"\0" * 8),
    "offsets_overlap": st_bytes({"a": _t("U8", [4], 0, 4), "b": _t("U8", [4], 2, 6)}, b"\0" * 6),
    "shape_overflow": st_bytes({"a": _t("F32", [2**32, 2**32, 2], 0, 0)}),
    "shape_overflow_behind_zero": st_bytes({"a": _t("F32", [0, 2**64], 0, 0)}),
    "shape_overflow_behind_zero_many": st_bytes({"a": _t("F32", [0] + [2**62] * 100_000, 0, 0)}),
    "shape_overflow_huge_behind_zero": st_bytes({"a": _t("F32", [0, 10**4000], 0, 0)}),
    "size_mismatch": st_bytes({"a": _t("F32", [3], 0, 8)}, b"\0" * 8),
    "trailing_bytes": st_bytes(dict(GOOD), b"\0" * 12 + b"PK\x03\x04polyglot"),
    "offsets_beyond_file": st_bytes(dict(GOOD), b"\0" * 10),
}
EXPECTED = {"bad_offsets_float": "bad_offsets", "bad_offsets_huge": "bad_offsets",
            "bad_offsets_negative": "bad_offsets", "offsets_gap_not_from_zero": "offsets_gap",
            "duplicate_metadata": "duplicate_key", "shape_overflow_behind_zero": "shape_overflow",
            "shape_overflow_behind_zero_many": "shape_overflow", "shape_overflow_huge_behind_zero": "shape_overflow"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_invalid_case_has_its_own_code(case: str, tmp_path: Path) -> None:
    """Capability: safetensors header validation (each invalid header is refused with its own code)."""
    blob = CASES[case]
    assert _check(blob) == f"input.safetensors.{EXPECTED.get(case, case)}"


@pytest.mark.parametrize("case", sorted(set(CASES) - {
    # the library reads these leniently; we are stricter on purpose
    "header_nul", "json_too_deep", "bad_offsets_huge", "shape_overflow", "not_object_start", "tensor_fields"}))
def test_library_also_rejects(case: str, tmp_path: Path) -> None:
    assert _lib_rejects(tmp_path, CASES[case])


def test_valid_files_round_trip_like_the_library(tmp_path: Path) -> None:
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(3, dtype=np.int64),
              "e": np.zeros((0, 5), dtype=np.float16), "z": np.array(True)}
    p = tmp_path / "m.safetensors"
    safetensors.numpy.save_file(arrays, str(p), metadata={"format": "np"})
    fd = os.open(p, os.O_RDONLY)
    try:
        h = read_header(HashedFile.over(fd), os.fstat(fd).st_size, path="m.safetensors")
    finally:
        os.close(fd)
    assert h.metadata == {"format": "np"}
    with safetensors.safe_open(str(p), "np") as f:
        assert sorted(t.name for t in h.tensors) == sorted(f.keys())
        for t in h.tensors:
            arr = f.get_tensor(t.name)
            assert tuple(arr.shape) == t.shape
            raw = p.read_bytes()[h.data_start + t.data_offsets[0]:h.data_start + t.data_offsets[1]]
            assert raw == arr.tobytes()


def test_space_padding_is_accepted() -> None:
    body = json.dumps({"a": _t("U8", [1], 0, 1)}).encode() + b"    "
    h = parse_header_bytes(st_bytes(body, b"\x07"), len(st_bytes(body, b"\x07")))
    assert [t.name for t in h.tensors] == ["a"]


def test_million_tensor_header_is_bounded() -> None:
    # a header with very many entries is parsed in one linear pass (the 100 MB cap bounds it)
    n = 50_000
    hdr = {f"t{i}": _t("U8", [1], i, i + 1) for i in range(n)}
    blob = st_bytes(hdr, b"\0" * n)
    h = parse_header_bytes(blob, len(blob))
    assert len(h.tensors) == n


def test_more_tensors_than_the_cap_are_refused_before_the_json_is_parsed() -> None:
    from ckptgate.inspect.safetensors import MAX_TENSORS

    n = MAX_TENSORS + 1
    blob = st_bytes({f"t{i}": _t("U8", [1], i, i + 1) for i in range(n)}, b"\0" * n)
    assert _check(blob) == "input.safetensors.too_many_tensors"
    # the names may hide the key from the text count (JSON escapes); the parsed count catches them
    hidden = b"{" + b",".join(b'"t%d":{"dtype":"U8","shape":[1],"data_\\u006fffsets":[%d,%d]}' % (i, i, i + 1)
                             for i in range(n)) + b"}"
    assert _check(st_bytes(hidden, b"\0" * n)) == "input.safetensors.too_many_tensors"


def test_sparse_terabyte_behind_a_tiny_header_is_checked_without_reading_it(tmp_path: Path) -> None:
    from ckptgate.inspect import inspect_tree

    p = tmp_path / "model.safetensors"
    p.write_bytes(st_bytes({"a": _t("U8", [4], 0, 4)}, b"\0" * 4))
    with open(p, "r+b") as f:
        f.truncate(1 << 40)
    insp = inspect_tree(tmp_path)
    assert [f.code for f in insp.findings if f.severity == "error"] == ["input.safetensors.trailing_bytes"]
