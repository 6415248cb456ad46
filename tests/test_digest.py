"""Fixture digest: canonical manifest, descriptors from SafeTree, parallel and sequential agree."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptgate.digest import (
    YIELD_NICENESS,
    Digest,
    FixtureDigest,
    MalformedDigest,
    ManifestEntry,
    canonical_manifest,
    fixture_digest,
    hash_files,
)
from ckptgate.errors import InputRejected, VerificationError
from ckptgate.inspect.walk import SafeTree

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import renice_permitted  # noqa: E402


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "b.bin").write_bytes(os.urandom(3 << 20) + b"tail")
    (root / "a.json").write_text('{"x": 1}')
    (root / "sub" / "c").write_bytes(b"")
    (root / "sub" / "\u00e9t\u00e9.txt").write_text("unicode name")
    return root


def test_digest_matches_an_independent_computation(tmp_path: Path) -> None:
    root = _tree(tmp_path / "ck")
    with SafeTree.open(root) as t:
        d = fixture_digest(t, buffer_size=1 << 16)
    files = []
    for rel in sorted(["a.json", "b.bin", "sub/c", "sub/\u00e9t\u00e9.txt"]):
        data = (root / rel).read_bytes()
        files.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
    doc = json.dumps({"algorithm": "sha256", "files": files}, sort_keys=True, separators=(",", ":"),
                     ensure_ascii=False).encode("utf-8")
    assert d.digest.prefixed() == "sha256:" + hashlib.sha256(doc).hexdigest()
    assert [e.path for e in d.manifest] == [f["path"] for f in files]
    assert d.to_facts() == {"digest": "sha256:" + hashlib.sha256(doc).hexdigest(), "algorithm": "sha256", "file_count": 4,
                            "total_bytes": sum(f["size"] for f in files)}


def test_parallel_equals_sequential_and_progress_counts_bytes(tmp_path: Path) -> None:
    root = _tree(tmp_path / "ck")
    seen = []
    with SafeTree.open(root) as t:
        one = fixture_digest(t, workers=1)
        many = fixture_digest(t, workers=4, progress=seen.append)
        assert sum(seen) == t.total_bytes
    assert one == many


@pytest.mark.parametrize("workers", [1, 3])
def test_a_yielding_digest_hashes_on_nicer_threads_of_its_own(tmp_path: Path, workers: int) -> None:
    """Issue #36: ``yielding`` lowers the priority of the digest's own threads (even at one worker,
    where the digest otherwise runs on the caller's thread) and of their companions (``apart``),
    by one step (a companion inherits its hashing thread's), and never the caller's."""

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    if not renice_permitted():
        pytest.skip("this sandbox refuses setpriority: yielding is advisory here")
    root = _tree(tmp_path / "ck")
    caller = niceness()
    seen: dict[bool, set[tuple[int, int]]] = {True: set(), False: set()}
    with SafeTree.open(root) as t:
        for yielding in (True, False):

            def also(path: str, yielding: bool = yielding) -> Callable[[int, memoryview], None]:
                return lambda off, view: seen[yielding].add((threading.get_native_id(), niceness()))

            got = hash_files(t, [e.path for e in t.entries], workers=workers, also=also, apart=also,
                             yielding=yielding)
            assert sorted(got, key=lambda e: e.path) == list(fixture_digest(t, workers=1).manifest)
    assert {n for _, n in seen[True]} == {min(19, caller + YIELD_NICENESS)}
    assert threading.get_native_id() not in {tid for tid, _ in seen[True]}
    assert {n for _, n in seen[False]} == {caller}
    assert niceness() == caller


@pytest.mark.parametrize("workers", [1, 2])
def test_a_check_apart_sees_every_chunk_in_order_on_another_thread(tmp_path: Path, workers: int) -> None:
    """Issue #36: ``apart`` (the CRC-32 pass) runs beside the hashing thread, never on it, and each
    chunk it is handed still holds the file's bytes while it runs: the hashing thread reads the
    next chunk into the other buffer, never into the one the check holds."""
    root = _tree(tmp_path / "ck")
    hashing: set[int] = set()
    apart_threads: set[int] = set()
    got: dict[str, list[tuple[int, bytes]]] = {}
    lock = threading.Lock()

    def also(path: str) -> Callable[[int, memoryview], None]:
        return lambda off, view: hashing.add(threading.get_native_id())

    def apart(path: str) -> Callable[[int, memoryview], None]:
        def check(off: int, view: memoryview) -> None:
            first = bytes(view)
            threading.Event().wait(0.002)  # held long enough for the hashing thread to read on
            with lock:
                apart_threads.add(threading.get_native_id())
                got.setdefault(path, []).append((off, first))
            assert bytes(view) == first  # nobody wrote into the buffer while the check held it

        return check

    with SafeTree.open(root) as t:
        entries = hash_files(t, [e.path for e in t.entries], workers=workers, buffer_size=1 << 16,
                             also=also, apart=apart)
        assert sorted(entries, key=lambda e: e.path) == list(fixture_digest(t, workers=1).manifest)
    assert hashing and apart_threads and not hashing & apart_threads
    for path, chunks in got.items():
        assert [off for off, _ in chunks] == sorted(off for off, _ in chunks)
        assert b"".join(data for _, data in chunks) == (root / path).read_bytes()
    assert set(got) == {"a.json", "b.bin", "sub/\u00e9t\u00e9.txt"}  # the empty file has no chunk


def test_an_error_in_a_check_apart_is_raised_and_nothing_runs_after(tmp_path: Path) -> None:
    root = _tree(tmp_path / "ck")
    calls: list[int] = []

    def apart(path: str) -> Callable[[int, memoryview], None] | None:
        def check(off: int, view: memoryview) -> None:
            calls.append(off)
            if off >= 1 << 20:
                raise InputRejected("input.test.bad", "a bad chunk")

        return check if path == "b.bin" else None

    with SafeTree.open(root) as t, pytest.raises(InputRejected) as err:
        hash_files(t, [e.path for e in t.entries], workers=2, buffer_size=1 << 16, apart=apart)
    assert err.value.code == "input.test.bad"
    seen = len(calls)
    threading.Event().wait(0.05)
    assert len(calls) == seen  # every hand-off was waited for or cancelled before the raise


def test_a_failed_file_stops_the_others_at_their_next_chunk(tmp_path: Path) -> None:
    """The first file's failure is raised, and the files being hashed beside it stop at their next
    chunk rather than being read to their end first."""
    root = tmp_path / "ck"
    root.mkdir()
    (root / "x.bin").write_bytes(os.urandom(2 << 20))  # hashed second (largest first): its failure
    (root / "y.bin").write_bytes(os.urandom(3 << 20))  # is not the future the caller waits on first
    chunks = {"x.bin": 0, "y.bin": 0}

    def also(path: str) -> Callable[[int, memoryview], None]:
        def check(off: int, view: memoryview) -> None:
            chunks[path] += 1
            if path == "x.bin" and off >= 4 << 16:
                raise InputRejected("input.test.bad", "a bad chunk") from KeyError("why")
            threading.Event().wait(0.005)

        return check

    with SafeTree.open(root) as t, pytest.raises(InputRejected) as err:
        hash_files(t, ["x.bin", "y.bin"], workers=2, buffer_size=1 << 16, also=also)
    assert err.value.code == "input.test.bad"
    assert isinstance(err.value.__cause__, KeyError)  # raised as its thread raised it
    assert chunks["y.bin"] < 48 // 2  # 48 chunks of 64 KiB: stopped well before its end


def test_any_change_changes_the_digest(tmp_path: Path) -> None:
    """Capability: digest binding (any change to the tree changes the fixture digest)."""
    root = _tree(tmp_path / "ck")
    with SafeTree.open(root) as t:
        before = fixture_digest(t).digest
    (root / "a.json").write_text('{"x": 2}')
    with SafeTree.open(root) as t:
        assert fixture_digest(t).digest != before
    os.rename(root / "a.json", root / "z.json")
    with SafeTree.open(root) as t:
        assert fixture_digest(t).digest != before


def test_file_growing_after_the_walk_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "ck")
    with SafeTree.open(root) as t:
        with open(root / "a.json", "ab") as f:
            f.write(b" ")
        with pytest.raises(InputRejected) as e:
            fixture_digest(t)
    assert e.value.code == "input.walk.changed"


def test_records_are_validated() -> None:
    with pytest.raises(ValueError):
        ManifestEntry(path="../x", size=1, sha256="0" * 64)
    e = ManifestEntry(path="a", size=1, sha256="0" * 64)
    with pytest.raises(ValueError):
        FixtureDigest(algorithm="sha256", digest=Digest.from_hex("0" * 64), manifest=(e,))
    with pytest.raises(TypeError):  # the string form is printed, never held
        FixtureDigest(algorithm="sha256", digest="sha256:" + hashlib.sha256(canonical_manifest([e])).hexdigest(),
                      manifest=(e,))
    ok = FixtureDigest.from_manifest([e])
    assert ok.digest.prefixed() == "sha256:" + hashlib.sha256(canonical_manifest([e])).hexdigest()


HEX = "ab" * 32


def test_digest_prints_each_wire_form_from_one_value() -> None:
    d = Digest.parse("sha256:" + HEX)
    assert (d.algorithm, d.hex) == ("sha256", HEX)
    assert d.prefixed() == str(d) == "sha256:" + HEX
    assert d.filename_stem() == "sha256-" + HEX
    assert d.dsse_subject() == {"sha256": HEX}
    assert Digest.from_hex(HEX) == Digest.from_filename_stem("sha256-" + HEX) == d
    assert json.dumps(d.dsse_subject()) == '{"sha256": "%s"}' % HEX


def test_each_reader_takes_only_its_own_form() -> None:
    bad = {Digest.parse: ["sha256-" + HEX, HEX, "SHA256:" + HEX, "sha256:" + HEX.upper(), "sha256:" + HEX[:-1],
                          " sha256:" + HEX, "md5:" + HEX],
           Digest.from_hex: ["sha256:" + HEX, HEX.upper(), HEX + "0", ""],
           Digest.from_filename_stem: ["sha256:" + HEX, HEX, "sha256-" + HEX + "/x", "sha256-" + HEX.upper()],
           Digest.from_user: ["md5:" + HEX, "sha256:" + HEX[:-1], "sha256-" + HEX, ""]}
    for reader, values in bad.items():
        for value in values:
            with pytest.raises(MalformedDigest) as e:
                reader(value)
            assert isinstance(e.value, VerificationError)
            assert e.value.code == "verify.digest.malformed", (reader, value)
            assert e.value.evidence == {"digest": value}
    with pytest.raises(MalformedDigest):
        Digest("md5", HEX)
    with pytest.raises(MalformedDigest):
        Digest("sha256", HEX.upper())


def test_what_a_person_types_is_forgiven_space_case_and_prefix() -> None:
    d = Digest.from_hex(HEX)
    assert Digest.from_user(f"  SHA256:{HEX.upper()}\n") == Digest.from_user(HEX) == d


def test_digest_is_a_frozen_hashable_value() -> None:
    d = Digest.from_hex(HEX)
    with pytest.raises(AttributeError):
        d.hex = "00" * 32  # type: ignore[misc]
    assert {d: 1}[Digest.parse("sha256:" + HEX)] == 1
    assert d != "sha256:" + HEX  # never equal to a string: compare printed forms explicitly


def test_a_file_rewritten_in_place_while_it_is_hashed_is_refused(tmp_path: Path) -> None:
    """Same size, other bytes, written during the pass (a preallocated file still being filled): the digest
    would mix bytes from before and after the write, so the file is refused, not hashed."""
    root = tmp_path / "ck"
    root.mkdir()
    (root / "big.bin").write_bytes(b"a" * (1 << 16))
    written = []

    def write_during(path: str) -> Callable[[int, memoryview], None] | None:
        def check(off: int, chunk: memoryview) -> None:
            if not written:
                with open(root / path, "r+b") as f:
                    f.seek(1 << 15)
                    f.write(b"b" * 16)
                    f.flush()
                    os.fsync(f.fileno())
                written.append(off)

        return check

    with SafeTree.open(root) as t:
        with pytest.raises(InputRejected) as e:
            fixture_digest(t, buffer_size=4096, also=write_during)
    assert e.value.code == "input.walk.changed" and e.value.evidence["path"] == "big.bin"
