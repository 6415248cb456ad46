"""The streaming writer produces files the safetensors library reads back bit for bit."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os

import numpy as np
from safetensors.numpy import load_file, save_file

from ckptgate.consolidate import diskwrite, held, writer
from ckptgate.consolidate.plan import OutputTensor, Placement, shard_tensors
from ckptgate.consolidate.streamed import StreamedPlan
from ckptgate.consolidate.writer import INDEX_NAME, write_plan


import pytest


class DiskPath:
    """Records, per output inode, the ranges written with O_DIRECT and those handed to write-back."""

    def __init__(self, monkeypatch, *, fail_direct_with: int | None = None) -> None:
        self.direct: dict[int, list[tuple[int, int]]] = {}
        self.hinted: dict[int, list[tuple[int, int]]] = {}
        real_hint, real_pwrite = diskwrite._sync_file_range, diskwrite.pwrite_all

        def hint(fd, offset, length, flags):
            self.hinted.setdefault(os.fstat(fd).st_ino, []).append((offset, length))
            return real_hint(fd, offset, length, flags)

        def pwrite_all(fd, data, offset):
            if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
                if fail_direct_with is not None:
                    raise OSError(fail_direct_with, os.strerror(fail_direct_with))
                self.direct.setdefault(os.fstat(fd).st_ino, []).append((offset, len(data)))
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(diskwrite, "_sync_file_range", hint)
        monkeypatch.setattr(diskwrite, "pwrite_all", pwrite_all)

    def covered(self, path) -> list[tuple[int, int]]:
        """Merged ranges of ``path`` that went to the disk path, either way."""
        ino = path.stat().st_ino
        merged: list[tuple[int, int]] = []
        for a, n in sorted(self.direct.get(ino, []) + self.hinted.get(ino, [])):
            if merged and a < merged[-1][1]:
                raise AssertionError(f"{path.name}: byte {a} went to the disk path twice")
            if merged and a == merged[-1][1]:
                merged[-1] = (merged[-1][0], a + n)
            else:
                merged.append((a, a + n))
        return merged


def _plan_from(tmp_path, tensors, max_shard_bytes):
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
    return src, raw, shard_tensors(outs, max_shard_bytes=max_shard_bytes)


def _write_and_check(tmp_path, tensors, plan, src, raw, *, mode, chunk_size):
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        written = write_plan(plan, out, {"src.safetensors": fd}, chunk_size=chunk_size,
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
    return out


@pytest.mark.parametrize("mode", ["verified", "held"])
def test_resharded_copy_is_bit_identical(tmp_path, mode, monkeypatch):
    disk = DiskPath(monkeypatch)
    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((7, 5)).astype(np.float32),
               "b": rng.integers(-9, 9, (3,), dtype=np.int64),
               "c": rng.standard_normal((4, 4)).astype(np.float16)}
    src, raw, plan = _plan_from(tmp_path, tensors, max_shard_bytes=150)
    out = _write_and_check(tmp_path, tensors, plan, src, raw, mode=mode, chunk_size=16)
    for shard in plan.shards:  # every tensor byte went to the disk path, each byte once
        f = out / shard.filename
        data_start = 8 + int.from_bytes(f.read_bytes()[:8], "little")
        [(a, b)] = disk.covered(f)
        assert b == f.stat().st_size and a == (0 if mode == "held" else data_start)


@pytest.mark.parametrize("direct", ["taken", "refused_by_fcntl", "einval_on_write"])
def test_held_mode_writes_whole_blocks_directly_and_the_rest_buffered(tmp_path, monkeypatch, direct):
    """Windows of several blocks, an unaligned tail; and where O_DIRECT is refused, all buffered."""
    if direct == "refused_by_fcntl":
        monkeypatch.setattr(held, "_set_direct", lambda fd, on: not on)
    disk = DiskPath(monkeypatch, fail_direct_with=errno.EINVAL if direct == "einval_on_write" else None)
    rng = np.random.default_rng(1)
    tensors = {"a": rng.standard_normal((3001,)).astype(np.float32),
               "b": rng.standard_normal((123, 77)).astype(np.float16)}
    src, raw, plan = _plan_from(tmp_path, tensors, max_shard_bytes=1 << 20)
    out = _write_and_check(tmp_path, tensors, plan, src, raw, mode="held", chunk_size=3 * 4096 + 5)
    [shard] = plan.shards
    f = out / shard.filename
    assert disk.covered(f) == [(0, f.stat().st_size)] and f.stat().st_size % 4096
    ino = f.stat().st_ino
    if direct == "taken":
        assert disk.direct[ino] and all(a % 4096 == 0 and n % 4096 == 0 for a, n in disk.direct[ino])
        assert sum(n for _, n in disk.direct[ino]) == f.stat().st_size // 4096 * 4096
    else:
        assert not disk.direct.get(ino)


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


@pytest.mark.parametrize("mode", ["verified", "held"])
def test_outputs_are_created_relative_to_the_directory_descriptor_never_by_path(tmp_path, mode):
    """An intake passes its staging directory's descriptor: replacing the directory's path with a
    symlink elsewhere (issue #16, F7) changes nothing; every output lands in the directory opened."""
    tensors = {"w": np.arange(64, dtype=np.float32)}
    src, raw, plan = _plan_from(tmp_path, tensors, 1 << 20)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    dfd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    sfd = os.open(src, os.O_RDONLY)
    try:
        out.rename(tmp_path / "out.orig")
        out.symlink_to(elsewhere, target_is_directory=True)
        written = write_plan(plan, dfd, {"src.safetensors": sfd},
                             expected={"src.safetensors": hashlib.sha256(raw).hexdigest()} if mode == "verified"
                             else None)
    finally:
        os.close(sfd)
        os.close(dfd)
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "out.orig").iterdir()) == sorted(w.filename for w in written)


def test_a_written_file_lists_as_a_receipt_output():
    from ckptgate.consolidate.writer import WrittenFile

    assert WrittenFile(filename="model.safetensors", size=8, sha256="ab").to_json() == {
        "file": "model.safetensors", "size": 8, "sha256": "ab"}


def _column_split(tmp_path, full: np.ndarray, ranks: int):
    """``full`` (2-D) saved as ``ranks`` column chunks, each contiguous in one file, and its DCP HF
    layout: a tensor-parallel Shard(1) split, which plans to one strided placement per rank."""
    from ckptgate.consolidate.adapters import dcp

    rows, cols = full.shape
    width = cols // ranks
    chunks, raws = [], {}
    for r in range(ranks):
        part = np.ascontiguousarray(full[:, r * width:(r + 1) * width])
        name = f"rank{r}.bin"
        raw = b"\0" * 24 + part.tobytes()  # a header-like prefix, so offsets are not zero
        (tmp_path / name).write_bytes(raw)
        raws[name] = raw
        chunks.append({"path": name, "offsets": [0, r * width], "sizes": [rows, width],
                       "data_offsets": [24, 24 + part.nbytes]})
    layout = {"tensors": [{"fqn": "w", "dtype": str(full.dtype), "size": [rows, cols], "chunks": chunks}]}
    tensors = dcp.hf_storage_tensors(layout)
    return tensors, raws


@pytest.mark.parametrize("mode", ["verified", "held"])
@pytest.mark.parametrize("cast", [None, "BF16"])
def test_a_column_split_tensor_is_written_bit_identical_from_strided_placements(tmp_path, mode, cast):
    from ckptgate.consolidate.plan import cast_plan

    rng = np.random.default_rng(22)
    full = rng.standard_normal((37, 24)).astype(np.float32)
    tensors, raws = _column_split(tmp_path, full, ranks=4)
    assert [p.count for t in tensors for p in t.placements] == [37] * 4  # one record per rank, not per row
    plan = cast_plan(shard_tensors(tensors, max_shard_bytes=1 << 20), cast, max_shard_bytes=1 << 20)
    assert [p.count for p in plan.shards[0].tensors[0].placements] == [37] * 4  # the cast keeps them strided
    out = tmp_path / "out"
    out.mkdir()
    fds = {name: os.open(tmp_path / name, os.O_RDONLY) for name in raws}
    try:
        written = write_plan(plan, out, fds, chunk_size=64,  # windows and chunks far smaller than a row
                             expected={n: hashlib.sha256(r).hexdigest() for n, r in raws.items()}
                             if mode == "verified" else None)
    finally:
        for fd in fds.values():
            os.close(fd)
    [shard] = [w for w in written if w.filename != INDEX_NAME]
    if cast is None:
        got = load_file(str(out / shard.filename))["w"]
        assert got.dtype == full.dtype and got.tobytes() == full.tobytes()
    else:
        import torch
        from safetensors.torch import load_file as load_torch

        want = torch.from_numpy(full).to(torch.bfloat16)
        got = load_torch(str(out / shard.filename))["w"]
        assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert hashlib.sha256((out / shard.filename).read_bytes()).hexdigest() == shard.sha256


@pytest.mark.parametrize("pending_cap", [0, 64, 1 << 20])
def test_a_streamed_plan_writes_the_bytes_it_is_handed(tmp_path, pending_cap):
    """Issue #22: the digest hands each chunk it hashed to :class:`StreamedPlan`, which writes the
    placed parts from that buffer and hashes each output in order where it can (pieces ahead of
    the hashed prefix wait up to ``pending_cap`` bytes; past that, the rest is read back)."""
    rng = np.random.default_rng(2)
    tensors = {"z": rng.standard_normal((40, 3)).astype(np.float32),  # first in the source, last in the output
               "a": rng.standard_normal((17,)).astype(np.float64),
               "m": rng.integers(-9, 9, (33,), dtype=np.int16)}
    src, raw, plan = _plan_from(tmp_path, tensors, max_shard_bytes=1 << 20)
    out = tmp_path / "out"
    out.mkdir()
    out_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with StreamedPlan(plan, out_fd, chunk_size=64, pending_cap=pending_cap) as streamed:
            feed = streamed.feeder("src.safetensors")
            assert streamed.feeder("absent") is None
            buf = bytearray(raw)  # the caller's buffer, reused as the digest reuses its own
            for off in range(0, len(raw), 50):
                view = memoryview(buf)[off:off + 50]
                feed(off, view)
                view[:] = b"\0" * len(view)  # overwritten once handed over: the write already took it
            written = streamed.finish(threads=2)
            index = writer.write_index(plan, out_fd)
    finally:
        os.close(out_fd)
    assert index is not None and (out / INDEX_NAME).read_bytes()
    [shard] = plan.shards
    f = out / shard.filename
    assert load_file(str(f)).keys() == tensors.keys()
    for k, v in load_file(str(f)).items():
        assert v.tobytes() == tensors[k].tobytes()
    assert written[shard.filename].sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert written[shard.filename].size == f.stat().st_size


def test_a_streamed_plan_that_missed_bytes_is_a_short_read(tmp_path):
    from ckptgate.errors import RuntimeFailure

    tensors = {"a": np.arange(64, dtype=np.float32)}
    src, raw, plan = _plan_from(tmp_path, tensors, max_shard_bytes=1 << 20)
    out = tmp_path / "out"
    out.mkdir()
    out_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with StreamedPlan(plan, out_fd) as streamed:
            streamed.feeder("src.safetensors")(0, memoryview(raw)[:len(raw) - 8])  # the pass ended early
            with pytest.raises(RuntimeFailure) as e:
                streamed.finish()
    finally:
        os.close(out_fd)
    assert e.value.code == "runtime.copy.short_read"


@pytest.mark.parametrize("pending_cap", [0, 1 << 20])
def test_a_streamed_plan_expands_strided_placements(tmp_path, pending_cap):
    """A column-split tensor (one strided placement per rank) written in the digest's pass is the
    tensor, bit for bit: every run of every strided placement is written, not only the first."""
    rng = np.random.default_rng(23)
    full = rng.standard_normal((37, 24)).astype(np.float32)
    tensors, raws = _column_split(tmp_path, full, ranks=4)
    plan = shard_tensors(tensors, max_shard_bytes=1 << 20)
    assert [p.count for p in plan.shards[0].tensors[0].placements] == [37] * 4
    out = tmp_path / "out"
    out.mkdir()
    out_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with StreamedPlan(plan, out_fd, chunk_size=64, pending_cap=pending_cap) as streamed:
            for name, raw in raws.items():  # the digest hashes file by file, in chunks
                feed = streamed.feeder(name)
                assert feed is not None
                for off in range(0, len(raw), 40):
                    feed(off, memoryview(bytearray(raw[off:off + 40])))
            written = streamed.finish(threads=2)
    finally:
        os.close(out_fd)
    [shard] = plan.shards
    got = load_file(str(out / shard.filename))["w"]
    assert got.tobytes() == full.tobytes()
    assert written[shard.filename].sha256 == hashlib.sha256((out / shard.filename).read_bytes()).hexdigest()


def test_a_streamed_plan_refuses_bytes_handed_over_twice_or_out_of_order(tmp_path):
    from ckptgate.errors import RuntimeFailure

    """Found by an adversarial review: the one pass hands each source over once, contiguously and in
    order; a chunk handed over twice (so the byte count would still add up with a gap left unread),
    a chunk out of order, or a second feeder for the same source is refused."""
    rng = np.random.default_rng(24)
    full = rng.standard_normal((8, 4)).astype(np.float32)
    tensors, raws = _column_split(tmp_path, full, ranks=2)
    plan = shard_tensors(tensors, max_shard_bytes=1 << 20)
    out = tmp_path / "out"
    out.mkdir()
    out_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with StreamedPlan(plan, out_fd) as streamed:
            name, raw = next(iter(raws.items()))
            feed = streamed.feeder(name)
            assert feed is not None
            feed(0, memoryview(bytearray(raw[:16])))
            with pytest.raises(RuntimeFailure) as e:
                feed(0, memoryview(bytearray(raw[:16])))  # the same chunk again
            assert e.value.code == "runtime.copy.out_of_order"
            with pytest.raises(RuntimeFailure):
                feed(32, memoryview(bytearray(raw[32:48])))  # a gap
            with pytest.raises(ValueError):
                streamed.feeder(name)  # a second feeder
    finally:
        os.close(out_fd)


def _three_shards(tmp_path):
    rng = np.random.default_rng(36)
    tensors = {f"t{i}": rng.standard_normal((64, 96)).astype(np.float32) for i in range(6)}
    return tensors, *_plan_from(tmp_path, tensors, max_shard_bytes=2 * 64 * 96 * 4)


@pytest.mark.parametrize("mode", ["verified", "held"])
def test_the_output_bytes_do_not_depend_on_the_number_of_threads(tmp_path, mode):
    """Issue #36: ``--workers`` only spreads the outputs over threads; the bytes and their hashes stay."""
    tensors, src, raw, plan = _three_shards(tmp_path)
    assert len(plan.shards) == 3
    seen = []
    for threads in (1, 2, 5):
        out = tmp_path / f"out{threads}"
        out.mkdir()
        fd = os.open(src, os.O_RDONLY)
        try:
            written = write_plan(plan, out, {"src.safetensors": fd}, chunk_size=8192, threads=threads,
                                 expected={"src.safetensors": hashlib.sha256(raw).hexdigest()}
                                 if mode == "verified" else None)
        finally:
            os.close(fd)
        files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
        assert {w.filename: w.sha256 for w in written} == {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}
        seen.append(files)
    assert seen[0] == seen[1] == seen[2]


def test_without_the_index_the_plan_writes_only_its_outputs(tmp_path):
    tensors, src, raw, plan = _three_shards(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        written = write_plan(plan, out, {"src.safetensors": fd}, expected=None, chunk_size=8192, index=False)
    finally:
        os.close(fd)
    assert sorted(w.filename for w in written) == sorted(p.name for p in out.iterdir())
    assert INDEX_NAME not in {p.name for p in out.iterdir()} and len(written) == len(plan.shards)


def test_a_cancelled_held_copy_stops_at_its_next_window(tmp_path):
    """The one pass's held copy runs beside the digest; a refusal cancels it before it finishes."""
    import threading

    tensors, src, raw, plan = _three_shards(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    cancel = threading.Event()
    cancel.set()
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(held.CopyCancelled):
            write_plan(plan, out, {"src.safetensors": fd}, expected=None, chunk_size=4096, cancel=cancel)
    finally:
        os.close(fd)


def test_a_cancelled_two_pass_copy_stops_at_its_next_chunk(tmp_path):
    """Two passes (the framework plane, casts) stop as the held copy does: a set ``cancel`` (a
    signal, a failed output) ends each source's scatter at its next chunk."""
    import threading

    tensors, src, raw, plan = _three_shards(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    cancel = threading.Event()
    cancel.set()
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(held.CopyCancelled):
            write_plan(plan, out, {"src.safetensors": fd}, chunk_size=4096, cancel=cancel,
                       expected={"src.safetensors": hashlib.sha256(raw).hexdigest()})
    finally:
        os.close(fd)


def test_a_failed_read_back_in_two_passes_starts_no_other(tmp_path, monkeypatch):
    """The first failure of the two-pass read-back is raised at once, and the outputs not yet read
    back are never started (as ``Executor.map`` did before the waits took interrupts' step)."""
    import threading

    tensors, src, raw, plan = _three_shards(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    calls = []

    def failing(fd, chunk_size, *a, **k):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        threading.Event().wait(0.3)  # a read-back that takes a while: started only if not cancelled
        return "0" * 64

    monkeypatch.setattr(writer, "hash_back", failing)
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="Input/output"):
            write_plan(plan, out, {"src.safetensors": fd}, chunk_size=4096, threads=1,
                       expected={"src.safetensors": hashlib.sha256(raw).hexdigest()})
    finally:
        os.close(fd)
    assert len(plan.shards) == 3 and len(calls) < 3  # the one running may finish; the last never starts


def test_held_mode_holds_at_most_its_window_cap_whatever_the_threads(tmp_path, monkeypatch):
    """Issue #36: each output being written holds a ring of windows; the outputs written at once
    are capped so that the windows stay within ``HELD_WINDOWS_CAP`` at any ``--workers``."""
    import threading
    import time

    tensors, src, raw, plan = _three_shards(tmp_path)
    real, lock = writer.copy_in_order, threading.Lock()
    state = {"now": 0, "most": 0}

    def counted(*args, **kwargs):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.2)  # long enough for every thread the pool has to be inside at once
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(writer, "copy_in_order", counted)
    chunk = writer.HELD_WINDOWS_CAP // (held.RING * 2)  # room for two outputs' windows
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        written = write_plan(plan, out, {"src.safetensors": fd}, expected=None, chunk_size=chunk, threads=8)
    finally:
        os.close(fd)
    assert state["most"] == 2 and len(plan.shards) == 3
    assert all(hashlib.sha256((out / w.filename).read_bytes()).hexdigest() == w.sha256 for w in written)


def test_a_failed_output_stops_the_others_at_their_next_window(tmp_path, monkeypatch):
    """The held mode's outputs run side by side: when one fails (a source changed, a signal in the
    caller), the others are told to stop rather than copied to their end, and the first failure is raised."""
    import threading

    from ckptgate.errors import RuntimeFailure

    tensors, src, raw, plan = _three_shards(tmp_path)
    last, told = plan.shards[-1].filename, threading.Event()

    def copy(name, *args):
        stop = args[-1]
        if name == last:
            raise RuntimeFailure("runtime.copy.source_changed", "changed")
        if stop.wait(10):  # the others: until they are told to stop
            told.set()
        raise held.CopyCancelled(name)

    monkeypatch.setattr(writer, "copy_in_order", copy)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(RuntimeFailure) as e:
            write_plan(plan, out, {"src.safetensors": fd}, expected=None, chunk_size=8192, threads=3)
    finally:
        os.close(fd)
    assert e.value.code == "runtime.copy.source_changed" and told.is_set()


@pytest.mark.parametrize("checked", [False, True])
def test_a_source_that_ends_before_the_plan_is_a_short_read(tmp_path, checked):
    """Held mode, reading held sources directly or checked against a chunk manifest (one that
    records the shorter file): a source that ends before the bytes the plan places is refused."""
    from ckptgate.consolidate.chunks import ChunkRecorder
    from ckptgate.errors import RuntimeFailure

    tensors, src, raw, plan = _three_shards(tmp_path)
    with open(src, "r+b") as f:
        f.truncate(len(raw) - 100)
    rec = ChunkRecorder()
    rec(0, memoryview(raw[:-100]))
    rec.done()
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        with pytest.raises(RuntimeFailure) as e:
            write_plan(plan, out, {"src.safetensors": fd}, expected=None, chunk_size=8192,
                       chunks={"src.safetensors": rec.hashes} if checked else None)
    finally:
        os.close(fd)
    assert e.value.code == "runtime.copy.short_read"
