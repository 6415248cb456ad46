"""The torch zip layout: each tensor and value under one name."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch

from ckptgate.inspect import inspect_tree

from ckpt_inspect_helpers import p_int, p_str, p_tuple, torch_zip


def _tensor(offset: int) -> bytes:
    storage = b"(" + p_str("storage") + b"ctorch\nFloatStorage\n" + p_str("0") + p_str("cpu") + p_int(8) + b"tQ"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" + storage + p_int(offset) + p_tuple((4,)) + p_tuple((1,))
            + b"\x89ccollections\nOrderedDict\n)RtR")  # fmt: skip


_LONG_TUPLE = b"(" + b"K\x01" * 9 + b"t"


@pytest.mark.parametrize(
    ("k1", "k2", "torch_keeps"),
    [
        (_LONG_TUPLE, _LONG_TUPLE, 1),  # one key to torch, not compared by the reader
        (b"K\x01\x85\x85", b"K\x01\x85\x85", 1),  # ((1,),): a nested tuple, not compared either
        (b"K\x01", p_str("1"), 2),  # two keys, one name
    ],
    ids=["long_tuple", "nested_tuple", "int_and_str"],
)
def test_two_tensors_under_one_name_are_refused(k1: bytes, k2: bytes, torch_keeps: int, tmp_path: Path) -> None:
    """A torch zip {k: A, k: B} whose key the reader does not compare was clean static_pickle with
    two tensors of one name, where torch.load holds B alone; keys written alike named two tensors
    the same.  The layout names each value once."""
    (tmp_path / "ck").mkdir()
    pkl = b"\x80\x02}(" + k1 + _tensor(0) + k2 + _tensor(4) + b"u."
    f = torch_zip(tmp_path / "ck" / "pytorch_model.bin", pkl, {"0": struct.pack("<8f", *range(8))})
    assert len(torch.load(f, weights_only=True)) == torch_keeps
    insp = inspect_tree(tmp_path / "ck")
    assert "torch.name_repeats" in {x.code for x in insp.findings} and not insp.clean
    pkl_distinct = pkl.replace(k2 + _tensor(4), p_str("other") + _tensor(4))
    torch_zip(f, pkl_distinct, {"0": struct.pack("<8f", *range(8))})
    assert inspect_tree(tmp_path / "ck").clean
