"""DCP ``.metadata`` read statically: a tensor geometry torch could not hold is refused at once."""

from __future__ import annotations

import pickle
import shutil
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

from ckptgate.inspect import inspect_tree

SRC = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "dcp_torch_save" / "checkpoint"


def _with_size(tmp_path: Path, dims: tuple[int, ...]) -> set[str]:
    root = tmp_path / "c"
    shutil.copytree(SRC, root)
    md = pickle.loads((root / ".metadata").read_bytes())  # noqa: S301 - the project's own fixture
    tm = next(v for v in md.state_dict_metadata.values() if hasattr(v, "chunks"))
    tm.size = torch.Size(dims)
    tm.chunks = [ChunkStorageMetadata(offsets=torch.Size((0,) * len(dims)), sizes=torch.Size(dims))]
    (root / ".metadata").write_bytes(pickle.dumps(md, protocol=2))
    return {f.code for f in inspect_tree(root).findings if f.severity == "error"}


def test_many_wide_dimensions_are_refused_at_once(tmp_path: Path) -> None:
    """40,000 dims of 2**62 took 20 s (quadratic: a million would take hours)."""
    t0 = time.monotonic()
    assert _with_size(tmp_path, (1 << 62,) * 40_000 + (0,)) == {"dcp.metadata_shape"}
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("dims", [(1 << 63, 0), (1,) * 65], ids=["wide", "ndim"])
def test_a_size_outside_int64_is_refused(tmp_path: Path, dims: tuple[int, ...]) -> None:
    assert _with_size(tmp_path, dims) == {"dcp.metadata_shape"}
