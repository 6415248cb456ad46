"""Issue #22 item 1: intake reads the input once for the planes that run no loader (pure data and
static pickle).  The output is staged from the digest's own buffer before the decision; a deny
removes it and publishes nothing; an allow publishes the same bytes and receipt as two passes."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ckptgate import grouped, measure, pipeline
from ckptgate.digest import YIELD_NICENESS
from ckptgate.errors import PolicyDenied
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import intake
from ckptgate.publish import RECEIPT_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import FIXTURES, Signer, attest, make_signer, renice_permitted  # noqa: E402

pytestmark = pytest.mark.opa

#: one fixture per plane that runs no loader
ONE_PASS = ["hf_sharded", "dcp_torch_save"]


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _src(name: str) -> Path:
    return FIXTURES / name / "checkpoint"


def _attestation(name: str, signer: Signer, tmp: Path) -> Path:
    with SafeTree.open(_src(name)) as tree:
        fmt = str(inspect_open_tree(tree).format)
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    return attest(signer, _src(name), tmp / f"att-{name}.json", fmt=fmt, meta=meta)


def _staged(parent: Path) -> dict[str, list[tuple[str, int]]]:
    return {p.name: sorted((f.name, f.stat().st_size) for f in p.iterdir())
            for p in parent.iterdir() if ".ckptgate-staging-" in p.name}


@pytest.mark.parametrize("name", ONE_PASS)
def test_a_deny_removes_what_was_staged_and_publishes_nothing(name, signer, tmp_path, monkeypatch):
    """The output is written beside DST while the digest hashes; the decision then denies (no
    attestation): the staging directory goes and DST never appears."""
    seen: list[dict[str, list[tuple[str, int]]]] = []
    real = grouped.judge

    def judge(*args: Any, **kwargs: Any) -> Any:  # called once the digest is complete
        seen.append(_staged(tmp_path))
        return real(*args, **kwargs)

    monkeypatch.setattr(grouped, "judge", judge)
    dst = tmp_path / "out"
    with pytest.raises(PolicyDenied) as e:
        intake(_src(name), dst, attestations=[], options=signer.options)
    assert e.value.code == "policy.attestation_missing"
    assert len(seen) == 1 and len(seen[0]) == 1  # one staging directory existed when the decision was asked
    (files,) = seen[0].values()
    assert any(n.endswith(".safetensors") and size > 0 for n, size in files)  # with the output written
    assert not dst.exists()
    assert _staged(tmp_path) == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


class _Reads:
    """Bytes read with ``preadv`` (the bulk reads: the digest's pass and the writer's) per file of
    the checkpoint, counted on the descriptors and split by reader: the digest's pass (``_hash_fd``)
    or a copy; inspection's header reads use ``pread``."""

    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve()) + "/"
        self.bytes: dict[str, int] = {}
        self.copied: dict[str, int] = {}
        self.niceness: dict[str, set[int]] = {"digest": set(), "copy": set()}  # of the reading threads
        self._real = os.preadv

    def preadv(self, fd: int, buffers: Any, offset: int, *flags: int) -> int:
        n = self._real(fd, buffers, offset, *flags)
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.startswith(self.root):
            rel = target[len(self.root):]
            digest = sys._getframe(1).f_code.co_name == "_hash_fd"
            count = self.bytes if digest else self.copied
            count[rel] = count.get(rel, 0) + max(n, 0)
            self.niceness["digest" if digest else "copy"].add(_niceness())
        return n


@pytest.mark.parametrize("name", ONE_PASS)
def test_every_input_byte_is_read_once_where_the_sources_are_not_held(name, signer, tmp_path, monkeypatch):
    """Without read leases the output is written from the digest's own buffer: one read in all."""
    att = _attestation(name, signer, tmp_path)
    reads = _Reads(_src(name))
    monkeypatch.setattr(os, "preadv", reads.preadv)
    monkeypatch.setattr(SafeTree, "hold", lambda self: False)
    result = intake(_src(name), tmp_path / "out", attestations=[att], options=signer.options)
    sizes = {e.path: e.size for e in result.evaluation.digest.manifest}
    assert reads.bytes == {p: s for p, s in sizes.items() if s}  # each file once, in full: no second pass
    assert reads.copied == {}
    assert reads.niceness["digest"] == {_niceness()}  # no copy beside it to yield to
    assert (tmp_path / "out" / RECEIPT_NAME).is_file()


@pytest.mark.parametrize("name", ONE_PASS)
def test_held_sources_are_hashed_once_and_copied_beside_the_digest(name, signer, tmp_path, monkeypatch):
    """Issue #36: with every source held, the digest hashes each file once, and the held copy reads
    each placed byte once (no header, nothing twice), beside the digest and before the decision."""
    att = _attestation(name, signer, tmp_path)
    reads = _Reads(_src(name))
    monkeypatch.setattr(os, "preadv", reads.preadv)
    copied_before_decision: list[dict[str, int]] = []
    real = grouped.judge

    def judge(*args: Any, **kwargs: Any) -> Any:
        copied_before_decision.append(dict(reads.copied))
        return real(*args, **kwargs)

    monkeypatch.setattr(grouped, "judge", judge)
    result = intake(_src(name), tmp_path / "out", attestations=[att], options=signer.options)
    with SafeTree.open(_src(name)) as tree:
        if not tree.hold():
            pytest.skip("this file system grants no read lease")
    sizes = {e.path: e.size for e in result.evaluation.digest.manifest}
    assert reads.bytes == {p: s for p, s in sizes.items() if s}
    assert reads.copied and all(0 < n <= sizes[p] for p, n in reads.copied.items())
    placed = sum(o["size"] for o in result.receipt["outputs"] if o["file"].endswith(".safetensors"))
    assert sum(reads.copied.values()) < placed  # the tensors' bytes, not the output headers
    assert copied_before_decision and copied_before_decision[0]  # the copy ran beside the digest
    # the digest's threads yield to the copy's serial chain; the caller's thread keeps its priority
    nicer = min(19, _niceness() + YIELD_NICENESS) if renice_permitted() else _niceness()
    assert reads.niceness == {"digest": {nicer}, "copy": {_niceness()}}
    for o in result.receipt["outputs"]:  # the receipt's hashes are the bytes on disk
        data = (tmp_path / "out" / o["file"]).read_bytes()
        assert len(data) == o["size"] and hashlib.sha256(data).hexdigest() == o["sha256"]


def test_the_digest_yields_only_to_a_copy_beside_it(signer, tmp_path, monkeypatch):
    """Issue #36: the digest's threads run nicer only while the held copy runs beside them; where
    the digest writes the output itself (no read leases) or nothing is staged before the decision
    (a cast: two passes), it keeps the caller's priority."""
    name = ONE_PASS[0]
    att = _attestation(name, signer, tmp_path)
    with SafeTree.open(_src(name)) as tree:
        if not tree.hold():
            pytest.skip("this file system grants no read lease: no copy runs beside the digest")
    asked: list[bool] = []
    real = measure.hash_files

    def hash_files(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs["yielding"])
        return real(*args, **kwargs)

    monkeypatch.setattr(measure, "hash_files", hash_files)
    intake(_src(name), tmp_path / "held", attestations=[att], options=signer.options)
    intake(_src(name), tmp_path / "cast", attestations=[att], options=signer.options, dtype="F16")
    monkeypatch.setattr(SafeTree, "hold", lambda self: False)
    intake(_src(name), tmp_path / "streamed", attestations=[att], options=signer.options)
    assert asked == [True, False, False]


def _published(dst: Path) -> dict[str, Any]:
    files = {p.name: p.read_bytes() for p in dst.iterdir() if p.name != RECEIPT_NAME}
    receipt = json.loads((dst / RECEIPT_NAME).read_text())
    receipt.pop("published_at")
    return {"files": files, "receipt": receipt}


@pytest.mark.parametrize("name", ONE_PASS)
def test_one_pass_publishes_what_two_passes_publish(name, signer, tmp_path, monkeypatch):
    """Same files, same bytes, same receipt (but the time it was published and the decision id)."""
    att = _attestation(name, signer, tmp_path)
    intake(_src(name), tmp_path / "one", attestations=[att], options=signer.options)
    staged: list[bool] = []
    real = pipeline.OnePass.begin

    def two_passes(self: Any, inspection: Any) -> None:
        staged.append(real(self, inspection) is not None)  # it would have staged ...
        self.stage, self._writer = None, None  # ... but takes the two-pass path (its stage is cleaned up)
        return None

    monkeypatch.setattr(pipeline.OnePass, "begin", two_passes)
    intake(_src(name), tmp_path / "two", attestations=[att], options=signer.options)
    assert staged == [True]
    one, two = _published(tmp_path / "one"), _published(tmp_path / "two")
    for r in (one["receipt"], two["receipt"]):
        r["decision"].pop("id"), r["decision"].pop("engine")  # a fresh engine each run
    assert one["files"].keys() == two["files"].keys() and one["files"] == two["files"]
    assert one["receipt"] == two["receipt"]


@pytest.mark.parametrize("name", ONE_PASS)
def test_an_engine_that_fails_to_start_beside_the_pass_publishes_nothing(name, signer, tmp_path, monkeypatch):
    """Issue #22: the embedded OPA starts beside the walk, the digest and the staged write (the
    first query waits for it).  When it cannot start (a policy that does not compile), the intake
    still fails closed with the engine's typed error, and what the pass staged is removed."""
    import shutil

    from ckptgate._resources import default_policy_dir
    from ckptgate.decide.options import EngineOptions
    from ckptgate.errors import EngineUnavailable, ExitCode

    policies = tmp_path / "policies"
    shutil.copytree(default_policy_dir(), policies)
    rego = next(p for p in sorted(policies.rglob("*.rego")) if not p.name.endswith("_test.rego"))
    # parses (a tree that does not is refused before the pass, usage.policies) but does not compile
    rego.write_text(rego.read_text() + "\n_broken := undefined_function(1)\n")
    staged: list[dict[str, list[tuple[str, int]]]] = []
    real = measure.hash_files

    def digest(*args: Any, **kwargs: Any) -> Any:  # the pass runs, and stages, while OPA starts
        try:
            return real(*args, **kwargs)
        finally:
            staged.append(_staged(tmp_path))

    monkeypatch.setattr(measure, "hash_files", digest)
    dst = tmp_path / "out"
    with pytest.raises(EngineUnavailable) as e:
        intake(_src(name), dst, attestations=[_attestation(name, signer, tmp_path)],
               options=EngineOptions(policy_dir=policies, trust_file=signer.trust_file))
    assert e.value.code == "engine.opa.start_failed" and e.value.exit_code == ExitCode.ENGINE_UNAVAILABLE
    assert len(staged) == 1 and len(staged[0]) == 1  # the pass was staging the output meanwhile
    assert not dst.exists() and _staged(tmp_path) == {}


@pytest.mark.parametrize("held", [True, False], ids=["held", "streamed"])
@pytest.mark.parametrize("name", ONE_PASS)
def test_the_number_of_workers_does_not_change_what_is_published(name, held, signer, tmp_path, monkeypatch):
    """``workers`` (``--workers``) spreads hashing and writing over threads; the published bytes and
    the receipt are the same for 1, 2 and 3 workers, on the held copy and on the streamed writer."""
    att = _attestation(name, signer, tmp_path)
    if not held:
        monkeypatch.setattr(SafeTree, "hold", lambda self: False)
    seen = []
    for workers in (1, 2, 3):
        intake(_src(name), tmp_path / f"w{workers}", attestations=[att], options=signer.options, workers=workers)
        got = _published(tmp_path / f"w{workers}")
        got["receipt"]["decision"].pop("id"), got["receipt"]["decision"].pop("engine")
        for o in got["receipt"]["outputs"]:
            assert hashlib.sha256(got["files"][o["file"]]).hexdigest() == o["sha256"]
        seen.append(got)
    assert seen[0] == seen[1] == seen[2]


def test_workers_below_one_is_a_usage_error(signer, tmp_path):
    from ckptgate.errors import UsageError

    with pytest.raises(UsageError) as e:
        intake(_src("hf_sharded"), tmp_path / "out", attestations=[], options=signer.options, workers=0)
    assert e.value.code == "usage.workers" and "--workers" in e.value.diagnostics()
    assert not (tmp_path / "out").exists()
