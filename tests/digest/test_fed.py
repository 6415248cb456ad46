"""FedDigest: a file's sha256 from the chunks a copy hands over, and what it reads itself (issue #36)."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from ckptgate.digest import DigestCancelled, fixture_digest
from ckptgate.digest.fed import FedDigest
from ckptgate.errors import InputRejected
from ckptgate.inspect.walk import SafeTree

SIZE = 1 << 20


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ck"
    r.mkdir()
    (r / "a.bin").write_bytes(random.Random(1).randbytes(SIZE))
    (r / "b.bin").write_bytes(random.Random(2).randbytes(SIZE // 3))
    (r / "small.json").write_text('{"x": 1}')
    return r


class _Reads:
    """Bytes read with ``preadv`` per file name, while the block runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bytes: dict[str, int] = {}
        real = os.preadv

        def preadv(fd: int, buffers, offset: int, *flags: int) -> int:
            n = real(fd, buffers, offset, *flags)
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
            self.bytes[name] = self.bytes.get(name, 0) + n
            return n

        monkeypatch.setattr(os, "preadv", preadv)


def _pieces(size: int, rng: random.Random) -> Iterator[tuple[int, int]]:
    """Ranges a copy might hand over: mostly forward with gaps, sometimes overlapping or behind."""
    off = 0
    while off < size:
        off += rng.choice([0, 0, 0, rng.randrange(1, 5000), -rng.randrange(1, 3000)])
        off = max(0, min(off, size - 1))
        n = rng.randrange(1, 40000)
        yield off, min(n, size - off)
        off += n


def _hand(fed: FedDigest, path: Path, rel: str, pieces: Iterator[tuple[int, int]]) -> list[Future[None]]:
    data = path.read_bytes()
    out = []
    for off, n in pieces:
        f = fed.tap(rel, off, memoryview(bytearray(data[off : off + n])))
        assert f is not None
        out.append(f)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_the_sha256_is_of_the_whole_file_whatever_is_handed_over(root: Path, seed: int) -> None:
    rng = random.Random(seed)
    with SafeTree.open(root) as tree, FedDigest(tree, workers=2, buffer_size=8192) as fed:
        fed.adopt(["a.bin", "b.bin"])
        assert fed.paths == {"a.bin", "b.bin"}
        futures = _hand(fed, root / "a.bin", "a.bin", _pieces(SIZE, rng))
        futures += _hand(fed, root / "b.bin", "b.bin", iter([]) if seed % 2 else _pieces(SIZE // 3, rng))
        fed.end()
        entries = fed.entries()
        assert all(f.done() and f.result() is None for f in futures)
    want = {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in ("a.bin", "b.bin")}
    assert {e.path: e.sha256 for e in entries} == want
    assert {e.path: e.size for e in entries} == {p: (root / p).stat().st_size for p in want}


def test_what_is_handed_over_is_not_read_again(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the bytes between the handed ranges, and after the last, are read."""
    reads = _Reads(monkeypatch)
    with SafeTree.open(root) as tree, FedDigest(tree, workers=1, buffer_size=8192) as fed:
        fed.adopt(["a.bin"])
        _hand(fed, root / "a.bin", "a.bin", iter([(100, 1000), (5000, 200_000), (205_000, 1000)]))
        fed.end()
        (entry,) = fed.entries()
    assert entry.sha256 == hashlib.sha256((root / "a.bin").read_bytes()).hexdigest()
    assert reads.bytes == {"a.bin": SIZE - 1000 - 200_000 - 1000}


def test_it_agrees_with_the_fixture_digest_and_counts_every_byte(root: Path) -> None:
    counted = []
    with SafeTree.open(root) as tree:
        want = {e.path: e.sha256 for e in fixture_digest(tree).manifest}
    with SafeTree.open(root) as tree, FedDigest(tree, workers=2, progress=counted.append) as fed:
        fed.adopt(["a.bin", "small.json"])
        _hand(fed, root / "a.bin", "a.bin", iter([(0, SIZE // 2)]))
        fed.end()
        got = {e.path: e.sha256 for e in fed.entries()}
    assert got == {p: want[p] for p in ("a.bin", "small.json")}
    assert sum(counted) == SIZE + (root / "small.json").stat().st_size


def test_a_byte_inspection_read_that_the_copy_hands_over_differently_is_a_changed_file(root: Path) -> None:
    """The read ledger's check runs on the handed chunks as on the digest's own reads."""
    with SafeTree.open(root) as tree:
        with tree.reader("a.bin") as r:
            r.pread(64, 0)  # what inspection decided on
        with FedDigest(tree, workers=1) as fed:
            fed.adopt(["a.bin"])
            bad = bytearray((root / "a.bin").read_bytes()[:4096])
            bad[10] ^= 0xFF
            fut = fed.tap("a.bin", 0, memoryview(bad))
            assert fut is not None and fut.result(timeout=10) is None  # the copy is never held up
            fed.end()
            with pytest.raises(InputRejected) as e:
                fed.entries()
    assert e.value.code == "input.walk.changed"


@pytest.mark.parametrize("how", ["grew", "shrank"])
def test_a_file_that_changes_size_is_a_changed_file(root: Path, how: str) -> None:
    with SafeTree.open(root) as tree, FedDigest(tree, workers=1) as fed:
        fed.adopt(["b.bin"])
        with open(root / "b.bin", "r+b") as f:
            if how == "grew":
                f.seek(0, 2)
                f.write(b"more")
            else:
                f.truncate(1000)
        fed.end()
        with pytest.raises(InputRejected) as e:
            fed.entries()
    assert e.value.code == "input.walk.changed"


def test_entries_waits_for_the_copy_and_a_cancel_ends_the_wait(root: Path) -> None:
    cancel = threading.Event()
    with SafeTree.open(root) as tree, FedDigest(tree, workers=1, cancel=cancel) as fed:
        fed.adopt(["a.bin"])
        threading.Timer(0.2, cancel.set).start()
        with pytest.raises(DigestCancelled):
            fed.entries()  # the copy never ends


def test_leaving_the_block_frees_every_chunk_still_waiting(root: Path) -> None:
    """A copy never waits on a digest that is gone; what is handed over after it is not taken."""
    gate = threading.Event()
    with SafeTree.open(root) as tree:
        fed = FedDigest(tree, workers=1, apart=lambda path: lambda off, view: gate.wait(), buffer_size=4096)
        with fed:
            fed.adopt(["a.bin"])
            futures = _hand(fed, root / "a.bin", "a.bin", iter([(i * 4096, 4096) for i in range(20)]))
            threading.Timer(0.2, gate.set).start()
        assert all(f.done() for f in futures)
        assert fed.tap("a.bin", 0, memoryview(b"x")) is None
        assert fed.tap("not-adopted", 0, memoryview(b"x")) is None


def test_the_crc_pass_sees_every_byte_in_order_on_its_own_thread(root: Path) -> None:
    seen: list[tuple[int, int, str]] = []
    crc = hashlib.sha256()

    def check(offset: int, view: memoryview) -> None:
        seen.append((offset, len(view), threading.current_thread().name))
        crc.update(view)

    with SafeTree.open(root) as tree, FedDigest(tree, workers=2, apart=lambda p: check, buffer_size=8192) as fed:
        fed.adopt(["a.bin"])
        _hand(fed, root / "a.bin", "a.bin", iter([(50_000, 10_000), (70_000, 300_000)]))
        fed.end()
        fed.entries()
    assert crc.hexdigest() == hashlib.sha256((root / "a.bin").read_bytes()).hexdigest()
    offsets = [o for o, _, _ in seen]
    assert offsets == sorted(offsets) and all(
        a + n == b for (a, n, _), (b, _, _) in zip(seen, seen[1:], strict=False)
    )
    assert {t for _, _, t in seen} == {t for _, _, t in seen if t.startswith("ckptgate-apart")}


def test_only_walked_files_are_adopted(root: Path) -> None:
    with SafeTree.open(root) as tree, FedDigest(tree, workers=1) as fed:
        with pytest.raises(ValueError):
            fed.adopt(["nope.bin"])
        assert fed.entries() == []  # nothing adopted: nothing to wait for
