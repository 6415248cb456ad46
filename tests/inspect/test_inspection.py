"""inspect_open_tree: the whole-tree bounds the per-file readers cannot give."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptgate.errors import InputRejected
from ckptgate.inspect import inspect_tree
from ckptgate.inspect._threads import THREADED_MIN_BYTES
from ckptgate.inspect.walk import WalkLimits
from tests.inspect.ckpt_inspect_helpers import st_bytes, write


def _shard(n_tensors: int, pad_to: int = 0) -> bytes:
    header = {f"t{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n_tensors)}
    if pad_to:
        header["pad"] = {"dtype": "U8", "shape": [pad_to], "data_offsets": [n_tensors, n_tensors + pad_to]}
    return st_bytes(header, b"\0" * (n_tensors + pad_to))


@pytest.mark.parametrize("pad_to", [0, THREADED_MIN_BYTES], ids=["inline", "threaded"])
def test_tensors_across_files_are_capped(tmp_path: Path, pad_to: int) -> None:
    """Each file is under the per-file cap; together they are over the tree's."""
    for i in range(4):
        write(tmp_path, f"model-{i:05d}.safetensors", _shard(30, pad_to))
    with pytest.raises(InputRejected) as e:
        inspect_tree(tmp_path, limits=WalkLimits(max_tensors=100))
    assert e.value.code == "input.too_many_tensors"
    assert e.value.evidence["limit"] == 100


def test_tensors_at_the_cap_pass(tmp_path: Path) -> None:
    for i in range(4):
        write(tmp_path, f"model-{i:05d}.safetensors", _shard(25))
    ins = inspect_tree(tmp_path, limits=WalkLimits(max_tensors=100))
    assert sum(len(f.safetensors.tensors) for f in ins.files if f.safetensors) == 100


def test_the_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tensors"):
        WalkLimits(max_tensors=0)
