"""The chunk manifest: recorded as the digest streams a file, checked by the writer chunk by chunk."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ckptgate.consolidate.chunks import COPY_CHUNK, ChunkChecked, ChunkRecorder
from ckptgate.errors import RuntimeFailure


def _read(check: ChunkChecked, src: str, offset: int, length: int) -> bytes:
    into = memoryview(bytearray(length))
    check(src, into, offset)
    return bytes(into)


def test_bytes_another_rank_hashed_are_checked_chunk_by_chunk(tmp_path: Path) -> None:
    data = os.urandom(COPY_CHUNK + 1000)
    rec = ChunkRecorder()
    for off in range(0, len(data), 3 << 20):  # pieces that do not line up with the chunks
        rec(off, memoryview(data)[off:off + (3 << 20)])
    rec.done()
    assert rec.hashes == [hashlib.sha256(data[:COPY_CHUNK]).hexdigest(), hashlib.sha256(data[COPY_CHUNK:]).hexdigest()]
    f = tmp_path / "src"
    f.write_bytes(data)
    fd = os.open(f, os.O_RDONLY)
    try:
        check = ChunkChecked({"src": fd}, {"src": rec.hashes})
        assert _read(check, "src", 10, COPY_CHUNK) == data[10:COPY_CHUNK + 10]  # across a chunk boundary
        assert _read(check, "src", len(data) - 5, 5) == data[-5:]
        with open(f, "r+b") as w:  # the second chunk changes after it was hashed
            w.seek(COPY_CHUNK + 5)
            w.write(bytes([data[COPY_CHUNK + 5] ^ 0xFF]))
        assert _read(check, "src", COPY_CHUNK + 1, 10) == data[COPY_CHUNK + 1:COPY_CHUNK + 11]  # kept, as checked
        with pytest.raises(RuntimeFailure) as e:
            _read(ChunkChecked({"src": fd}, {"src": rec.hashes}), "src", COPY_CHUNK + 1, 10)
        assert e.value.code == "runtime.copy.source_changed"
        assert _read(ChunkChecked({"src": fd}, {"src": rec.hashes}), "src", 0, 10) == data[:10]  # the first is intact
        for offset in (len(data) - 5, len(data), len(data) + COPY_CHUNK):  # past what was hashed
            with pytest.raises(RuntimeFailure) as e:
                _read(check, "src", offset, 10)
            assert e.value.code == "runtime.copy.short_read"
    finally:
        os.close(fd)


def test_a_source_that_grew_after_it_was_hashed_is_refused_in_its_last_chunk(tmp_path: Path) -> None:
    data = os.urandom(1000)
    rec = ChunkRecorder()
    rec(0, memoryview(data))
    rec.done()
    f = tmp_path / "src"
    f.write_bytes(data + b"appended")
    fd = os.open(f, os.O_RDONLY)
    try:
        with pytest.raises(RuntimeFailure) as e:
            _read(ChunkChecked({"src": fd}, {"src": rec.hashes}), "src", 0, 10)
        assert e.value.code == "runtime.copy.source_changed"
    finally:
        os.close(fd)


def test_an_output_keeps_no_more_source_chunks_than_it_was_allowed(tmp_path: Path) -> None:
    """Each output's reader keeps the last checked chunk of at most ``kept`` sources, which the
    writer counts in its memory cap (held_outputs_at_once)."""
    fds, hashes = {}, {}
    for n in range(5):
        data = os.urandom(100)
        (tmp_path / f"s{n}").write_bytes(data)
        fds[f"s{n}"] = os.open(tmp_path / f"s{n}", os.O_RDONLY)
        hashes[f"s{n}"] = [hashlib.sha256(data).hexdigest()]
    try:
        check = ChunkChecked(fds, hashes, kept=2)
        for n in range(5):
            _read(check, f"s{n}", 0, 10)
            assert len(check._kept) == min(n + 1, 2)
        assert list(check._kept) == ["s3", "s4"]  # the most recent sources
    finally:
        for fd in fds.values():
            os.close(fd)


def test_outputs_written_at_once_stay_within_the_windows_cap() -> None:
    from ckptgate.consolidate.chunks import MAX_KEPT
    from ckptgate.consolidate.held import RING
    from ckptgate.consolidate.writer import DEFAULT_CHUNK, HELD_WINDOWS_CAP, held_outputs_at_once

    for threads in (1, 2, 8, 16, 64):
        for kept in (0, 1, 2, 8, MAX_KEPT, 100):
            n = held_outputs_at_once(threads, DEFAULT_CHUNK, kept)
            assert 1 <= n <= threads
            per_output = RING * DEFAULT_CHUNK + min(kept, MAX_KEPT) * COPY_CHUNK
            assert n == 1 or n * per_output <= HELD_WINDOWS_CAP
    assert held_outputs_at_once(16, DEFAULT_CHUNK) == HELD_WINDOWS_CAP // (RING * DEFAULT_CHUNK)
    assert held_outputs_at_once(16, DEFAULT_CHUNK, 2) < held_outputs_at_once(16, DEFAULT_CHUNK)
