"""The CRC-32 pass left to the digest's read finds what the immediate pass finds, and never
reads a skipped check as a passed one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ckptgate.inspect.hashed import HashedFile
from ckptgate.digest import fixture_digest
from ckptgate.inspect import DeferredCrcs, SafeTree, inspect_open_tree
from ckptgate.inspect.zipcheck import check_zip

torch = pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
ZIPPED = ["dcp_torch_save", "dcp_torch_save_bytes", "deepspeed_zero2", "deepspeed_zero3", "deepspeed_universal",
          "fsdp_full", "megatron_torch_dist"]


def _both_ways(root: Path) -> tuple[dict, dict]:
    """(immediate inspection facts, deferred inspection facts after the digest's read)."""
    with SafeTree.open(root) as tree:
        now = inspect_open_tree(tree).to_facts()
        crcs = DeferredCrcs()
        later = inspect_open_tree(tree, verify_crc=crcs)
        fixture_digest(tree, apart=crcs.reader, buffer_size=4096)  # small chunks: entries span many
        return now, later.with_findings(crcs.findings()).to_facts()


def _first_stored_entry(path: Path) -> tuple[int, str] | None:
    """(offset of the first byte of the first non-empty tensor storage, its entry name) in a torch zip."""
    fd = os.open(path, os.O_RDONLY)
    try:
        entries = check_zip(HashedFile.over(fd), os.fstat(fd).st_size, path=path.name, verify_crc=False).entries
    finally:
        os.close(fd)
    e = next((x for x in entries if "/data/" in x.name and x.compressed_size), None)
    return (e.data_offset, e.name) if e else None


@pytest.mark.parametrize("name", ZIPPED)
def test_deferred_and_immediate_crc_agree_on_every_zipped_fixture(name: str) -> None:
    now, later = _both_ways(FIXTURES / name / "checkpoint")
    assert later == now
    assert not {f["code"] for f in later["findings"]} & {"zip.bad_crc", "zip.truncated", "zip.crc_not_checked"}


@pytest.mark.parametrize("name", ["deepspeed_zero3", "fsdp_full", "deepspeed_universal"])
def test_a_flipped_tensor_byte_is_a_bad_crc_either_way(name: str, tmp_path: Path) -> None:
    root = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / name / "checkpoint", root)
    victim, (at, entry) = next((p, hit) for p in sorted(root.rglob("*.pt"), key=lambda p: -p.stat().st_size)
                               if (hit := _first_stored_entry(p)))
    raw = bytearray(victim.read_bytes())
    raw[at] ^= 0xFF
    victim.write_bytes(bytes(raw))
    now, later = _both_ways(root)
    assert later == now
    bad = [f for f in later["findings"] if f["code"] == "zip.bad_crc"]
    assert bad and bad[0]["path"] == victim.relative_to(root).as_posix() and later["clean"] is False
    assert bad[0]["evidence"]["name"] == entry


def _one_zip(tmp_path: Path) -> tuple[Path, DeferredCrcs]:
    p = tmp_path / "m.pt"
    torch.save({"w": torch.arange(5000, dtype=torch.float32)}, p)
    fd = os.open(p, os.O_RDONLY)
    try:
        entries = check_zip(HashedFile.over(fd), os.fstat(fd).st_size, path="m.pt", verify_crc=False).entries
    finally:
        os.close(fd)
    crcs = DeferredCrcs()
    crcs.add("m.pt", 0, entries)
    return p, crcs


def test_a_file_never_streamed_is_not_checked_not_clean(tmp_path: Path) -> None:
    _, crcs = _one_zip(tmp_path)
    assert [f.code for f in crcs.findings()] == ["zip.crc_not_checked"]


def test_a_stream_that_stops_early_leaves_entries_truncated(tmp_path: Path) -> None:
    p, crcs = _one_zip(tmp_path)
    feed = crcs.reader("m.pt")
    assert feed is not None
    feed(0, memoryview(p.read_bytes()[:100]))
    codes = {f.code for f in crcs.findings()}
    assert "zip.truncated" in codes and "zip.bad_crc" not in codes


def test_a_stream_out_of_order_is_not_checked(tmp_path: Path) -> None:
    p, crcs = _one_zip(tmp_path)
    feed = crcs.reader("m.pt")
    raw = p.read_bytes()
    feed(0, memoryview(raw[:4096]))
    feed(8192, memoryview(raw[8192:]))
    assert [f.code for f in crcs.findings()] == ["zip.crc_not_checked"]


def test_a_whole_stream_in_odd_chunks_passes(tmp_path: Path) -> None:
    p, crcs = _one_zip(tmp_path)
    feed = crcs.reader("m.pt")
    raw = p.read_bytes()
    for off in range(0, len(raw), 777):
        feed(off, memoryview(raw[off:off + 777]))
    assert crcs.findings() == [] and crcs.reader("other.pt") is None
