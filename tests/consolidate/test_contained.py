"""What a contained loader reads: a sealed copy of the measured bytes, never the live file."""

from __future__ import annotations

import fcntl
import os

import pytest

from ckptgate.consolidate.contained import open_verified
from ckptgate.digest import fixture_digest
from ckptgate.errors import RuntimeFailure
from ckptgate.inspect import SafeTree


def _ckpt(tmp_path, data: bytes):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "model_states.pt").write_bytes(data)
    return root


def test_the_worker_gets_a_sealed_read_only_copy_of_the_measured_bytes(tmp_path):
    data = os.urandom(5 << 20)
    root = _ckpt(tmp_path, data)
    with SafeTree.open(root) as tree:
        digest = fixture_digest(tree)
        [opened] = open_verified(tree, ["model_states.pt"], digest)
    try:
        (root / "model_states.pt").write_bytes(os.urandom(len(data)))  # in place, after the copy was made
        assert fcntl.fcntl(opened.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        seals = fcntl.fcntl(opened.fd, fcntl.F_GET_SEALS)
        for seal in (fcntl.F_SEAL_WRITE, fcntl.F_SEAL_SHRINK, fcntl.F_SEAL_GROW, fcntl.F_SEAL_SEAL):
            assert seals & seal
        assert os.pread(opened.fd, len(data) + 1, 0) == data
        with pytest.raises(OSError):
            os.ftruncate(opened.fd, 0)
    finally:
        os.close(opened.fd)


def test_a_file_rewritten_after_the_digest_is_never_handed_to_a_loader(tmp_path):
    data = os.urandom(1 << 20)
    root = _ckpt(tmp_path, data)
    with SafeTree.open(root) as tree:
        digest = fixture_digest(tree)
        (root / "model_states.pt").write_bytes(b"\x80\x02" + data[2:])  # same inode, same size
        with pytest.raises(RuntimeFailure) as e:
            open_verified(tree, ["model_states.pt"], digest)
    assert e.value.code == "runtime.worker.input_changed"
