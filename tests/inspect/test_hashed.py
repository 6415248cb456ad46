"""The read ledger: what inspection decides on is, chunk by chunk, what the digest hashes."""

from __future__ import annotations

import ast
import hashlib
import os
from pathlib import Path

import pytest

from ckptgate.digest import fixture_digest
from ckptgate.errors import Error, InputRejected
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.inspect.hashed import LEDGER_CHUNK, ReadLedger

SRC = Path(__file__).resolve().parents[2] / "src" / "ckptgate" / "inspect"


def _tree(tmp_path: Path, data: bytes) -> tuple[SafeTree, Path]:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "f.bin").write_bytes(data)
    return SafeTree.open(root), root / "f.bin"


def test_reads_across_chunk_boundaries_return_the_file_bytes(tmp_path):
    data = os.urandom(3 * LEDGER_CHUNK + 123)
    tree, _ = _tree(tmp_path, data)
    with tree, tree.reader("f.bin") as src:
        for off, n in [(0, 8), (LEDGER_CHUNK - 3, 10), (5, 2 * LEDGER_CHUNK + 7), (len(data) - 4, 100),
                       (len(data), 5), (0, len(data))]:
            assert src.pread(n, off) == data[off:off + n]
        assert tree.ledger("f.bin").chunk_count == 4


def test_a_chunk_read_twice_with_other_bytes_is_a_changed_file(tmp_path):
    data = os.urandom(LEDGER_CHUNK * 20)
    tree, path = _tree(tmp_path, data)
    with tree, tree.reader("f.bin") as src:
        src.pread(4, 0)
        for i in range(1, 12):  # push chunk 0 out of the reader's small cache
            src.pread(4, i * LEDGER_CHUNK)
        with path.open("r+b") as f:
            f.write(b"XXXX")
        with pytest.raises(InputRejected) as e:
            src.pread(4, 0)
    assert e.value.code == "input.walk.changed"


def test_the_digest_refuses_a_file_rewritten_in_place_after_inspection(tmp_path):
    data = bytearray(os.urandom(5 * LEDGER_CHUNK))
    tree, path = _tree(tmp_path, bytes(data))
    with tree:
        with tree.reader("f.bin") as src:
            src.pread(16, 2 * LEDGER_CHUNK + 100)  # what inspection decided on
        data[2 * LEDGER_CHUNK + LEDGER_CHUNK - 1] ^= 0xFF  # same inode, same size, last byte of that chunk
        with path.open("r+b") as f:
            f.write(data)
        with pytest.raises(InputRejected) as e:
            fixture_digest(tree, buffer_size=4096 * 3)  # pieces that straddle the chunk's edges
    assert e.value.code == "input.walk.changed"
    assert e.value.evidence["chunk"] == 2


def test_a_rewrite_outside_what_inspection_read_changes_only_the_digest(tmp_path):
    data = bytearray(os.urandom(3 * LEDGER_CHUNK))
    tree, path = _tree(tmp_path, bytes(data))
    with tree:
        with tree.reader("f.bin") as src:
            src.pread(16, 0)
        data[-1] ^= 0xFF
        path.write_bytes(data)  # same inode: write_bytes truncates and rewrites
        got = fixture_digest(tree)
    assert got.manifest[0].sha256 == hashlib.sha256(data).hexdigest()  # what was hashed is what is bound


def test_a_read_after_the_digest_sealed_the_ledger_fails_closed(tmp_path):
    tree, _ = _tree(tmp_path, os.urandom(2 * LEDGER_CHUNK))
    with tree:
        with tree.reader("f.bin") as src:
            src.pread(8, 0)
        fixture_digest(tree)
        with tree.reader("f.bin") as src:
            assert src.pread(8, 0)  # recorded and checked: fine
            with pytest.raises(Error) as e:
                src.pread(8, LEDGER_CHUNK)
    assert e.value.code == "internal.read_after_digest"


def test_a_file_shorter_than_walked_is_changed(tmp_path):
    tree, path = _tree(tmp_path, os.urandom(LEDGER_CHUNK + 10))
    with tree:
        src = tree.reader("f.bin")
        os.truncate(path, 10)
        with pytest.raises(InputRejected) as e:
            src.pread(20, LEDGER_CHUNK - 5)
        src.close()
    assert e.value.code == "input.walk.changed"


def test_the_ledger_compares_a_second_digest_of_a_chunk():
    ledger = ReadLedger("x", 10)
    ledger.record(0, b"a" * 32)
    ledger.record(0, b"a" * 32)
    with pytest.raises(InputRejected):
        ledger.record(0, b"b" * 32)


def test_every_real_fixture_inspects_and_digests_with_its_ledger():
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "data"
    for d in sorted(fixtures.iterdir()):
        if not (d / "checkpoint").is_dir():
            continue
        with SafeTree.open(d / "checkpoint") as tree:
            inspect_open_tree(tree)
            assert any(tree.ledger(e.path).chunk_count for e in tree.entries), d.name
            fixture_digest(tree)  # every recorded chunk agrees with the digest's pass


def _calls(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            name = f"{base.id}.{node.func.attr}" if isinstance(base, ast.Name) else f"?.{node.func.attr}"
            out.add(name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out.add(node.func.id)
    return out


def test_inspection_reads_checkpoint_bytes_only_through_the_ledger():
    """No reader in ``ckptgate.inspect`` reads a descriptor directly: only the walk (names and
    stats) and the hashed reader touch file contents."""
    forbidden = {"os.pread", "os.preadv", "os.read", "os.readv", "mmap.mmap", "?.open_file", "os.fdopen",
                 "io.FileIO", "io.open", "open"}
    for p in sorted(SRC.rglob("*.py")):
        if p.name in ("hashed.py", "walk.py"):
            continue
        found = _calls(ast.parse(p.read_text())) & forbidden
        assert not found, f"{p.relative_to(SRC)} reads around the ledger: {sorted(found)}"
