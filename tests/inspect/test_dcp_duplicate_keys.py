"""A DCP ``.metadata`` whose dicts hold keys torch's unpickler deems equal: ``storage_data`` keys that
differ in ``MetadataIndex.index`` alone (it compares and hashes by fqn and offset), or one fqn twice in
``state_dict_metadata``.  torch keeps one value of each; no save writes them; the static reader saw
both and read them as two items (review2 A1c).  Refused as ``dcp.metadata_shape`` (the index
keys) and ``pickle.duplicate_key`` (an fqn, like any dict key that repeats)."""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex

from ckptgate.inspect import inspect_tree

SRC = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "dcp_torch_save" / "checkpoint"


def _codes(root: Path) -> list[str]:
    return [f.code for f in inspect_tree(root).findings if f.severity == "error"]


def _copy(tmp_path: Path) -> tuple[Path, Any]:
    root = tmp_path / "c"
    shutil.copytree(SRC, root)
    return root, pickle.loads((root / ".metadata").read_bytes())  # noqa: S301 - the project's own fixture


def test_storage_keys_that_differ_in_index_alone_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, md = _copy(tmp_path)
    key, info = next((k, v) for k, v in md.storage_data.items() if k.offset is not None)
    chunk = next(c for c in md.state_dict_metadata[key.fqn].chunks if tuple(c.offsets) == tuple(key.offset))
    buf = io.BytesIO()
    torch.save(torch.full(tuple(chunk.sizes), 7, dtype=md.state_dict_metadata[key.fqn].properties.dtype), buf)
    target = root / info.relative_path
    offset = target.stat().st_size
    with target.open("ab") as f:
        f.write(buf.getvalue())
    with monkeypatch.context() as m:  # two keys as a hand-written pickle can hold them
        m.setattr(MetadataIndex, "__eq__", lambda a, b: (a.fqn, a.offset, a.index) == (b.fqn, b.offset, b.index))
        m.setattr(MetadataIndex, "__hash__", lambda a: hash((a.fqn, a.offset, a.index)))
        sd = dict(md.storage_data)
        sd[MetadataIndex(fqn=key.fqn, offset=key.offset, index=(key.index or 0) + 9)] = _StorageInfo(
            relative_path=info.relative_path, offset=offset, length=len(buf.getvalue()))
        md.storage_data = sd
        raw = pickle.dumps(md, protocol=2)
    assert len([k for k in pickle.loads(raw).storage_data if k.fqn == key.fqn and k.offset == key.offset]) == 1  # noqa: S301
    (root / ".metadata").write_bytes(raw)
    assert "dcp.metadata_shape" in _codes(root)


def test_one_fqn_twice_in_state_dict_metadata_is_refused(tmp_path: Path) -> None:
    root, md = _copy(tmp_path)
    fqn = next(iter(md.state_dict_metadata))
    twin = "#" * len(fqn)
    md.state_dict_metadata = {**md.state_dict_metadata, twin: md.state_dict_metadata[fqn]}
    raw = pickle.dumps(md, protocol=2)
    assert raw.count(twin.encode()) == 1
    (root / ".metadata").write_bytes(raw.replace(twin.encode(), fqn.encode()))
    assert "pickle.duplicate_key" in _codes(root)  # the reader refuses any dict's repeated key


def test_the_fixture_itself_is_clean() -> None:
    assert _codes(SRC) == []
