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
