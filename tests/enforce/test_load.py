"""What a contained loader reads: a sealed copy of the measured bytes, never the live file; and
the permit and manifest checks in front of the worker."""

from __future__ import annotations

import fcntl
import os
from dataclasses import replace
from pathlib import Path

import pytest

from ckptgate.decide.decision import Decision
from ckptgate.digest import Digest, FixtureDigest, ManifestEntry, fixture_digest
from ckptgate.enforce.load import WorkerOptions, load_trees, open_verified
from ckptgate.enforce.permit import issue_permit
from ckptgate.errors import PolicyDenied, RuntimeFailure
from ckptgate.inspect import SafeTree, inspect_open_tree

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "data"


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


OTHER = Digest.parse("sha256:" + "cd" * 32)


def _decision(digest: Digest) -> Decision:
    return Decision(allow=True, plane="framework", permitted_loaders=("deepspeed",), required_controls=(),
                    reasons=(), decision_id="test", policy_revision="test", engine="test", fixture_digest=digest)


@pytest.fixture
def zero3():
    """A ZeRO-3 checkpoint, its inspection, digest and state files; options whose preflight is
    never run (each check below refuses before the worker starts)."""
    from ckptgate.consolidate.adapters import deepspeed
    from ckptgate.enforce.containment import CONTROLS, ContainmentProfile

    with SafeTree.open(FIXTURES / "deepspeed_zero3" / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
        profile = ContainmentProfile(controls={c: True for c in CONTROLS}, kernel="test")
        yield tree, ins, fixture_digest(tree), deepspeed.zero_files(ins.layout), WorkerOptions(profile=profile)


def test_no_permit_no_load(zero3) -> None:
    tree, ins, digest, rels, options = zero3
    with pytest.raises(RuntimeFailure) as e:
        load_trees(tree, ins, rels, permit=None, digest=digest, options=options)
    assert e.value.code == "runtime.worker.permit_missing"


def test_permit_for_another_digest_is_refused(zero3) -> None:
    tree, ins, digest, rels, options = zero3
    other = issue_permit(_decision(OTHER), fixture_digest=OTHER, loader="deepspeed")
    with pytest.raises(PolicyDenied) as e:
        load_trees(tree, ins, rels, permit=other, digest=digest, options=options)
    assert e.value.code == "enforce.permit.wrong_digest"


def test_forged_permit_is_refused(zero3) -> None:
    tree, ins, digest, rels, options = zero3
    permit = replace(issue_permit(_decision(OTHER), fixture_digest=OTHER, loader="deepspeed"),
                     fixture_digest=digest.digest)
    with pytest.raises(PolicyDenied) as e:
        load_trees(tree, ins, rels, permit=permit, digest=digest, options=options)
    assert e.value.code == "enforce.permit.forged"


def test_file_that_differs_from_the_manifest_is_not_loaded(zero3) -> None:
    tree, ins, digest, rels, options = zero3
    forged = FixtureDigest.from_manifest([ManifestEntry(path=e.path, size=e.size,
                                                        sha256=("0" * 64 if e.path == rels[0] else e.sha256))
                                          for e in digest.manifest])
    permit = issue_permit(_decision(forged.digest), fixture_digest=forged.digest, loader="deepspeed")
    with pytest.raises(RuntimeFailure) as e:
        load_trees(tree, ins, rels, permit=permit, digest=forged, options=options)
    assert e.value.code == "runtime.worker.input_changed"
