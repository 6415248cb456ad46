"""The streaming writer produces files the safetensors library reads back bit for bit."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
from safetensors.numpy import load_file, save_file

from ckptgate.consolidate.plan import OutputTensor, Placement, shard_tensors
from ckptgate.consolidate.writer import INDEX_NAME, write_plan


import pytest


@pytest.mark.parametrize("mode", ["verified", "held"])
def test_resharded_copy_is_bit_identical(tmp_path, mode, monkeypatch):
    from ckptgate.consolidate import writer

    hinted: dict[int, list[tuple[int, int]]] = {}  # inode -> ranges handed to write-back
    real = writer._sync_file_range

    def record(fd, offset, length, flags):
        hinted.setdefault(os.fstat(fd).st_ino, []).append((offset, length))
        return real(fd, offset, length, flags)

    monkeypatch.setattr(writer, "_sync_file_range", record)
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((7, 5)).astype(np.float32),
               "b": rng.integers(-9, 9, (3,), dtype=np.int64),
               "c": rng.standard_normal((4, 4)).astype(np.float16)}
    src = tmp_path / "src.safetensors"
    save_file(tensors, str(src))
    raw = src.read_bytes()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    outs = [OutputTensor(name=k, dtype=v["dtype"], shape=tuple(v["shape"]),
                         placements=(Placement(src="src.safetensors", src_offset=base + v["data_offsets"][0],
                                               dst_offset=0, length=v["data_offsets"][1] - v["data_offsets"][0]),))
            for k, v in header.items() if k != "__metadata__"]
    plan = shard_tensors(outs, max_shard_bytes=150)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        written = write_plan(plan, out, {"src.safetensors": fd}, chunk_size=16,
                             expected={"src.safetensors": hashlib.sha256(raw).hexdigest()} if mode == "verified"
                             else None)
    finally:
        os.close(fd)
    index = json.loads((out / INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in tensors.values())
    loaded = {}
    for shard in sorted(set(index["weight_map"].values())):
        loaded.update(load_file(str(out / shard)))
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and loaded[k].tobytes() == v.tobytes()
    assert len(written) == len(plan.shards) + 1
    for w in written:  # the receipt's hashes are the bytes on disk, in both modes
        assert hashlib.sha256((out / w.filename).read_bytes()).hexdigest() == w.sha256
        assert (out / w.filename).stat().st_size == w.size
    for shard in plan.shards:  # write-back was started for every tensor byte, each byte once
        f = out / shard.filename
        spans = sorted(hinted[f.stat().st_ino])
        data_start = 8 + int.from_bytes(f.read_bytes()[:8], "little")
        assert spans[0][0] == data_start and sum(n for _, n in spans) == shard.nbytes
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))


def test_held_mode_refuses_a_plan_that_does_not_tile_its_output(tmp_path):
    """The plan types already refuse gaps; the writer checks again, against the bytes it writes."""
    from ckptgate.errors import RuntimeFailure

    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(64)))
    plan = shard_tensors([OutputTensor(name="a", dtype="U8", shape=(16,), placements=(
        Placement(src="src.bin", src_offset=0, dst_offset=0, length=8),
        Placement(src="src.bin", src_offset=8, dst_offset=8, length=8)))], max_shard_bytes=1 << 20)
    tensor = plan.shards[0].tensors[0]
    object.__setattr__(tensor, "placements", tensor.placements[:1])  # bypass validation: a gap
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(RuntimeFailure) as e:
            write_plan(plan, out, {"src.bin": fd}, expected=None)
    finally:
        os.close(fd)
    assert e.value.code == "runtime.copy.not_tiled"


def test_a_source_rewritten_in_place_after_it_was_measured_is_not_published(tmp_path):
    """Same inode, same size, other bytes: the single verified pass refuses it."""
    from ckptgate.errors import RuntimeFailure

    tensors = {"a": np.arange(64, dtype=np.float32)}
    src = tmp_path / "src.safetensors"
    save_file(tensors, str(src))
    measured = hashlib.sha256(src.read_bytes()).hexdigest()
    raw = bytearray(src.read_bytes())
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    begin, end = header["a"]["data_offsets"]
    plan = shard_tensors([OutputTensor(name="a", dtype="F32", shape=(64,), placements=(
        Placement(src="src.safetensors", src_offset=8 + hlen + begin, dst_offset=0, length=end - begin),))],
        max_shard_bytes=1 << 20)
    raw[8 + hlen + begin] ^= 0xFF  # rewritten in place after the digest was measured
    with open(src, "r+b") as f:
        f.write(raw)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(RuntimeFailure) as e:
            write_plan(plan, out, {"src.safetensors": fd}, expected={"src.safetensors": measured})
    finally:
        os.close(fd)
    assert e.value.code == "runtime.copy.source_changed"
