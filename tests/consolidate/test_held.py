"""The held copy's reads, as another reader sees them: which sources it reads front to back, and
the ``tap`` that hands over each range read (issue #36: the one pass's digest hashes from them)."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from ckptgate.consolidate.held import read_front_to_back
from ckptgate.consolidate.plan import CopiedFile, OutputTensor, Placement, shard_tensors
from ckptgate.consolidate.writer import write_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_writer import _column_split, _plan_from, _three_shards  # noqa: E402


def _tensor(name: str, *placements: tuple[str, int, int]) -> OutputTensor:
    """A float32 tensor filled by ``(src, src_offset, length)`` placements, one after the other."""
    ps, dst = [], 0
    for src, off, n in placements:
        ps.append(Placement(src=src, src_offset=off, dst_offset=dst, length=n))
        dst += n
    return OutputTensor(name=name, dtype="F32", shape=(dst // 4,), placements=tuple(ps))


def test_a_source_read_in_its_own_order_into_one_output_is_front_to_back():
    plan = shard_tensors([_tensor("a", ("x", 0, 64), ("y", 0, 64)), _tensor("b", ("x", 100, 64), ("y", 64, 8))],
                         max_shard_bytes=1 << 20)
    assert read_front_to_back(plan) == {"x", "y"}


def test_a_source_read_backwards_or_into_two_outputs_is_not():
    backwards = shard_tensors([_tensor("a", ("x", 100, 64), ("y", 0, 64)), _tensor("b", ("x", 0, 64))],
                              max_shard_bytes=1 << 20)
    assert read_front_to_back(backwards) == {"y"}
    split = shard_tensors([_tensor("a", ("x", 0, 64)), _tensor("b", ("x", 64, 64))], max_shard_bytes=64)
    assert len(split.shards) == 2 and read_front_to_back(split) == frozenset()


def test_two_placements_of_one_source_that_interleave_are_not(tmp_path):
    """Rows of one source in two strided placements of one tensor: the output alternates between them."""
    tensors, _ = _column_split(tmp_path, np.zeros((8, 8), np.float32), ranks=2)
    (t,) = tensors
    a, b = t.placements
    same = OutputTensor(name="w", dtype=t.dtype, shape=t.shape,
                        placements=(a, Placement(src=a.src, src_offset=a.src_end, dst_offset=b.dst_offset,
                                                 length=b.length, count=b.count, src_stride=b.src_stride,
                                                 dst_stride=b.dst_stride)))
    assert read_front_to_back(shard_tensors([same], max_shard_bytes=1 << 20)) == frozenset()
    assert read_front_to_back(shard_tensors(tensors, max_shard_bytes=1 << 20)) == {"rank0.bin", "rank1.bin"}


def test_a_copied_file_is_front_to_back():
    plan = shard_tensors([_tensor("a", ("x", 0, 64))], max_shard_bytes=1 << 20)
    from dataclasses import replace

    plan = replace(plan, copies=(CopiedFile(src="config.json", filename="config.json", size=10),))
    assert read_front_to_back(plan) == {"x", "config.json"}


@pytest.mark.parametrize("threads", [1, 3])
def test_tap_sees_every_range_read_and_its_window_is_not_reused_before_it_is_done(tmp_path, threads):
    """Each handed view is checked against the source only after a delay: a window reused early
    would show other bytes by then."""
    tensors, src, raw, plan = _three_shards(tmp_path)
    seen: list[tuple[int, int]] = []
    bad: list[int] = []
    lock = threading.Lock()

    def tap(name: str, offset: int, view: memoryview) -> Future[None]:
        fut: Future[None] = Future()

        def later() -> None:
            with lock:
                if bytes(view) != raw[offset : offset + len(view)]:
                    bad.append(offset)
                seen.append((offset, len(view)))
            fut.set_result(None)

        threading.Timer(0.002, later).start()
        return fut

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    try:
        written = write_plan(plan, out, {"src.safetensors": fd}, expected=None, chunk_size=4096, threads=threads,
                             tap=tap)
    finally:
        os.close(fd)
    assert not bad
    placed = sorted((p.src_offset, p.length) for s in plan.shards for t in s.tensors for p in t.placements)
    covered = sorted(seen)
    assert sum(n for _, n in covered) == sum(n for _, n in placed)  # every placed byte, once
    assert all(a + n <= b for (a, n), (b, _) in zip(covered, covered[1:], strict=False))
    for w in written:
        assert hashlib.sha256((out / w.filename).read_bytes()).hexdigest() == w.sha256


def test_a_plan_from_safetensors_reads_its_source_front_to_back(tmp_path):
    """``save_file`` orders the tensors as the output does: one output, one source in order."""
    rng = np.random.default_rng(3)
    tensors = {f"t{i}": rng.standard_normal((16, 8)).astype(np.float32) for i in range(5)}
    _, _, plan = _plan_from(tmp_path, tensors, max_shard_bytes=1 << 20)
    assert read_front_to_back(plan) == {"src.safetensors"}
