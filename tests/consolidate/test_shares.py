"""A rank's share of a group's write is the one writer run over the rank's outputs: at any world
size, with its sources checked against the chunk manifest, it writes the single process's bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptgate.consolidate import adapter_plan, chunks
from ckptgate.consolidate.plan import ConsolidationPlan, cast_plan
from ckptgate.consolidate.shares import assign_by_size, output_sizes, share_of
from ckptgate.consolidate.writer import INDEX_NAME, WrittenFile, write_plan
from ckptgate.errors import RuntimeFailure
from ckptgate.inspect import SafeTree, inspect_open_tree

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "megatron_torch_dist" / "checkpoint"


def _write(plan: ConsolidationPlan, out: Path, fds: dict[str, int], manifest: dict[str, list[str]] | None
           ) -> tuple[WrittenFile, ...]:
    out.mkdir()
    return write_plan(plan, out, fds, expected=None, chunks=manifest, chunk_size=4096, threads=3)


def _manifest(paths: tuple[str, ...]) -> dict[str, list[str]]:
    manifest = {}
    for p in paths:
        rec = chunks.ChunkRecorder()
        rec(0, memoryview((FIXTURE / p).read_bytes()))
        rec.done()
        manifest[p] = rec.hashes
    return manifest


@pytest.mark.parametrize("dtype", [None, "F16"])
def test_the_shares_of_worlds_2_and_3_are_the_one_process_bytes(tmp_path: Path, dtype: str | None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensor-parallel (strided) placements, and a cast: each rank's share (the plan's outputs split
    by bytes), read through 64-byte chunks checked against the manifest (so runs cross chunks and
    alternate between sources), is byte for byte what one process writes under its leases."""
    monkeypatch.setattr(chunks, "COPY_CHUNK", 64)
    with SafeTree.open(FIXTURE) as tree:
        plan = cast_plan(adapter_plan(inspect_open_tree(tree), max_shard_bytes=700), dtype, max_shard_bytes=700)
        assert any(p.count > 1 for s in plan.shards for t in s.tensors for p in t.placements)
        fds = {p: tree.open_file(p) for p in plan.source_paths}
        try:
            one = _write(plan, tmp_path / "one", fds, None)
            manifest = _manifest(plan.source_paths)
            for world in (2, 3):
                mine = assign_by_size(output_sizes(plan), world)
                assert all(mine) and sorted(n for m in mine for n in m) == sorted(n for n, _ in output_sizes(plan))
                shares = [_write(share_of(plan, m), tmp_path / f"w{world}r{r}", fds, manifest)
                          for r, m in enumerate(mine)]
                written = {w.filename: (r, w) for r, share in enumerate(shares) for w in share}
                assert sorted(written) == sorted(w.filename for w in one if w.filename != INDEX_NAME)
                for w in one:
                    if w.filename != INDEX_NAME:
                        r, got = written[w.filename]
                        assert got == w, (world, w.filename)
                        assert (tmp_path / f"w{world}r{r}" / w.filename).read_bytes() == \
                            (tmp_path / "one" / w.filename).read_bytes()
                assert all(not (tmp_path / f"w{world}r{r}" / INDEX_NAME).exists() for r in range(world))
        finally:
            for fd in fds.values():
                os.close(fd)


def test_a_share_refuses_a_source_missing_from_the_manifest_or_changed_since(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "COPY_CHUNK", 64)
    with SafeTree.open(FIXTURE) as tree:
        plan = adapter_plan(inspect_open_tree(tree), max_shard_bytes=700)
        fds = {p: tree.open_file(p) for p in plan.source_paths}
        try:
            share = share_of(plan, [plan.shards[0].filename])
            manifest = _manifest(plan.source_paths)
            with pytest.raises(RuntimeFailure) as e:
                _write(share, tmp_path / "missing", fds, {p: h for p, h in manifest.items() if p != share.source_paths[0]})
            assert e.value.code == "runtime.copy.source_missing"
            first = share.source_paths[0]
            changed = {**manifest, first: ["0" * 64] * len(manifest[first])}  # every chunk hashed otherwise
            with pytest.raises(RuntimeFailure) as e:
                _write(share, tmp_path / "changed", fds, changed)
            assert e.value.code == "runtime.copy.source_changed"
        finally:
            for fd in fds.values():
                os.close(fd)
