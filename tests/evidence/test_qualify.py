"""Qualification on the real hf_sharded fixture: round trip, signed statement, retained log."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from ckptgate.digest import Digest
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.fixtures import find_fixture
from ckptgate.evidence.qualify import qualify
from ckptgate.verify import AttestationStore, TrustData, verify_attestation
from ckptgate.verify.store import statement_of
from evidence_helpers import FIXTURE, EvidenceRepo


def _only_attestation(repo: Path) -> Path:
    files = list(AttestationStore(repo / "attestations").iter())
    assert len(files) == 1
    return files[0]


def test_qualified_statement_verifies_and_names_exact_facts(qualified_repo: EvidenceRepo) -> None:
    repo = qualified_repo.path
    att = _only_attestation(repo)
    trust = TrustData.from_file(repo / "policies" / "ckptgate" / "config" / "trust" / "data.json")
    digest = Digest.from_filename_stem(att.parent.name)
    va = verify_attestation(att.read_bytes(), source=str(att), trust=trust, measured_digest=digest,
                            now=datetime.now(timezone.utc))
    pred = va.statement["predicate"]
    meta = json.loads((repo / "tests/fixtures/data" / FIXTURE / "meta.json").read_text())
    assert pred["producer"] == {"name": "huggingface_hub", "version": meta["versions"]["huggingface_hub"]}
    assert pred["adapter"]["name"] == "hf-safetensors"
    assert pred["candidate_commit"] == qualified_repo.code_commit
    assert pred["topology"]["world_size"] == 1 and pred["topology"]["tp"] == 1
    assert pred["fixture"]["digest"] == digest.prefixed()
    assert pred["result"]["status"] == "passed"
    assert "tensor_bytes_bit_exact" in pred["result"]["checks_run"]
    log = repo / pred["result"]["evidence"]["location"]
    assert log.is_relative_to(repo / "attestations" / "evidence")
    assert pred["result"]["evidence"]["digest"] == "sha256:" + hashlib.sha256(log.read_bytes()).hexdigest()
    doc = json.loads(log.read_text())
    assert doc["status"] == "passed" and doc["tree_dirty"] is False
    names = {t["name"] for t in doc["comparison"]}
    assert names == set(meta["expected"]["tensors"])
    assert all(t["bytes_equal"] for t in doc["comparison"])


def test_dirty_tree_is_refused(clone: Path, qualified_repo: EvidenceRepo) -> None:
    (clone / "stray.txt").write_text("uncommitted\n")
    with pytest.raises(EvidenceError) as e:
        qualify(clone, find_fixture(clone, FIXTURE), "hf-safetensors", key=qualified_repo.key)
    assert e.value.code == "evidence.qualify.dirty_tree"
    assert e.value.evidence["paths"] == ["stray.txt"]


def test_adapter_must_match_the_fixture_format(clone: Path, qualified_repo: EvidenceRepo) -> None:
    with pytest.raises(EvidenceError) as e:
        qualify(clone, find_fixture(clone, FIXTURE), "dcp", key=qualified_repo.key)
    assert e.value.code == "evidence.qualify.adapter_mismatch"


def test_unknown_fixture(clone: Path) -> None:
    with pytest.raises(EvidenceError) as e:
        find_fixture(clone, "no_such_fixture")
    assert e.value.code == "evidence.fixture.unknown"
    assert FIXTURE in e.value.evidence["known"]


def test_requalifying_supersedes_the_previous_statement(clone: Path, qualified_repo: EvidenceRepo) -> None:
    before = _only_attestation(clone)
    result = qualify(clone, find_fixture(clone, FIXTURE), "hf-safetensors", key=qualified_repo.key,
                     now=datetime(2031, 1, 1, tzinfo=timezone.utc))
    after = _only_attestation(clone)
    assert result.superseded == (before,)
    assert after == result.attestation and after != before
    _, stmt, _ = statement_of(after.read_bytes())
    assert stmt["predicate"]["validity"]["issued_at"] == "2031-01-01T00:00:00Z"


def test_a_failure_storing_the_new_statement_leaves_the_previous_one(
    clone: Path, qualified_repo: EvidenceRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous qualification was removed before the new one was stored: a store that failed then
    (a full disk) left the fixture with none.  Now the new one is stored first."""
    before = _only_attestation(clone)
    index = (clone / "attestations" / "index.json").read_bytes()

    def full_disk(self: AttestationStore, raw: bytes, **kw: object) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(AttestationStore, "add", full_disk)
    with pytest.raises(OSError, match="No space left"):
        qualify(clone, find_fixture(clone, FIXTURE), "hf-safetensors", key=qualified_repo.key,
                now=datetime(2031, 1, 1, tzinfo=timezone.utc))
    assert _only_attestation(clone) == before and before.is_file()
    assert (clone / "attestations" / "index.json").read_bytes() == index


def test_requalifying_beside_a_stored_statement_of_any_shape(clone: Path, qualified_repo: EvidenceRepo) -> None:
    """A stored statement of a predicate type without a schema may name its adapter as a string;
    requalifying used to stop on it with an AttributeError.  It is not this adapter's: it stays."""
    import base64

    before = _only_attestation(clone)
    odd = {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "x", "digest": {
        "sha256": before.parent.name.removeprefix("sha256-")}}], "predicateType": "https://example.com/other/v1",
        "predicate": {"adapter": "hf-safetensors"}}
    other = before.parent / "example.com-other-v1-eeeeeeeeeeeeeeee.dsse.json"
    other.write_text(json.dumps({"payloadType": "application/vnd.in-toto+json", "signatures": [{"sig": "AAAA"}],
                                 "payload": base64.b64encode(json.dumps(odd).encode()).decode()}))
    result = qualify(clone, find_fixture(clone, FIXTURE), "hf-safetensors", key=qualified_repo.key,
                     now=datetime(2031, 1, 1, tzinfo=timezone.utc))
    assert result.superseded == (before,)
    assert other.exists()


def test_a_trainer_output_fixture_is_qualified_on_its_selected_checkpoint_only() -> None:
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree

    repo = Path(__file__).resolve().parents[2]
    fx = find_fixture(repo, "trainer_llama")
    assert fx.meta["selected_checkpoint"] == "checkpoint-2"
    assert fx.checkpoint == fx.root / "checkpoint" / "checkpoint-2"
    with SafeTree.open(fx.checkpoint) as tree:
        measured = {e.path: {"sha256": e.sha256, "size": e.size} for e in fixture_digest(tree).manifest}
    assert fx.recorded_files() == measured  # checkpoint-1/ is neither measured nor compared
    plain = find_fixture(repo, "hf_sharded")
    assert plain.checkpoint == plain.root / "checkpoint"
    assert plain.recorded_files() == plain.meta["checkpoint_files"]


def test_a_runtime_qualification_is_its_own_statement_and_log_beside_the_projects(
    clone: Path, qualified_repo: EvidenceRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ckptgate run from a farm runtime link (issue #31 item 2): the statement names the runtime
    lock, the log has its own name, and only that runtime's earlier statement is superseded."""
    import sys

    from ckptgate.evidence.environment import RUNTIME_RECORD

    own = _only_attestation(clone)
    prefix = tmp_path / "link"
    prefix.mkdir()
    (prefix / RUNTIME_RECORD).write_text(json.dumps({"lock": "runtime-torch-2.10.0", "lock_sha256": "ab" * 32}))
    monkeypatch.setattr(sys, "prefix", str(prefix))
    first = qualify(clone, find_fixture(clone, FIXTURE), "hf-safetensors", key=qualified_repo.key,
                    allow_dirty=False, now=datetime(2031, 1, 1, tzinfo=timezone.utc))
    assert first.superseded == () and own.exists()
    assert first.log.name == "hf-safetensors@runtime-torch-2.10.0.log.json"
    _, stmt, _ = statement_of(first.attestation.read_bytes())  # type: ignore[union-attr]
    assert stmt["predicate"]["environment"]["runtime"] == {"lock": "runtime-torch-2.10.0", "lock_sha256": "ab" * 32}
    again = qualify(clone, find_fixture(clone, FIXTURE), "hf-safetensors", key=qualified_repo.key,
                    now=datetime(2031, 1, 2, tzinfo=timezone.utc))
    assert again.superseded == (first.attestation,) and own.exists()
    assert len(list(AttestationStore(clone / "attestations").iter())) == 2
