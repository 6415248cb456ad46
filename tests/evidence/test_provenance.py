"""Fixture provenance on the real DeepSpeed ZeRO fixtures: sign, verify, what policy accepts it for,
the committed-bytes checks, and the automatic step in ``ckptgate qualify``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from ckptgate.errors import VerificationError
from ckptgate.evidence.candidate import candidate_commit
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.provenance import (BASIS, attest_provenance, provenance_needed, usable_provenance)
from ckptgate.evidence.fixtures import find_fixture
from ckptgate.evidence.gates import fixture_adapter, qualifiable
from ckptgate.evidence.qualify import qualify
from ckptgate.inspect import SafeTree
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.pipeline import evaluate
from ckptgate.verify import (QUALIFICATION_PREDICATE_TYPE, AttestationStore, TrustData, generate_keypair,
                             trust_entry, verify_attestation)
from ckptgate.verify.statement import PROVENANCE_PREDICATE_TYPE
from ckptgate.verify.store import statement_of
from evidence_helpers import REPO, commit_all, git

ZERO2, ZERO3 = "deepspeed_zero2", "deepspeed_zero3"
CONTROLS = ("no_new_privs", "seccomp", "rlimits", "cgroup_v2", "user_ns", "net_ns", "ipc_ns", "pid_ns", "openat2")


class _Host:
    """A preflighted containment profile with every control, so policy tests do not depend on the host."""

    def to_facts(self) -> dict[str, Any]:
        return {"preflighted": True, "controls": {c: True for c in CONTROLS}}


def _trust_doc(public: bytes, *, types: list[str], scopes: list[str]) -> str:
    entry = trust_entry(public, signer_id="ci-qualification", predicate_types=types, scopes=scopes)
    return json.dumps({"signers": [entry]}, indent=2) + "\n"


@pytest.fixture(scope="module")
def prov_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, bytes]:
    """A committed repository with the policies, both ZeRO fixtures and a throwaway key trusted for
    qualification and provenance: (repo, private key path, public PEM).  Never modify: clone it."""
    root = tmp_path_factory.mktemp("provenance")
    repo = root / "repo"
    repo.mkdir()
    shutil.copytree(REPO / "policies", repo / "policies", ignore=shutil.ignore_patterns(".opa*", "__pycache__"))
    for name in (ZERO2, ZERO3):
        shutil.copytree(REPO / "tests/fixtures/data" / name, repo / "tests/fixtures/data" / name)
    private, public = generate_keypair("ed25519")
    key = root / "ci.pem"
    key.write_bytes(private)
    key.chmod(0o600)
    (repo / "policies/ckptgate/config/trust/data.json").write_text(
        _trust_doc(public, types=[QUALIFICATION_PREDICATE_TYPE, PROVENANCE_PREDICATE_TYPE],
                   scopes=["qualification", "provenance"]))
    git(repo, "init", "-q", "-b", "main")
    commit_all(repo, "code and fixtures")
    return repo, key, public


@pytest.fixture()
def repo(prov_repo: tuple[Path, Path, bytes], tmp_path: Path) -> Path:
    dest = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(prov_repo[0]), str(dest)], check=True)
    return dest


@pytest.fixture()
def key(prov_repo: tuple[Path, Path, bytes]) -> Path:
    return prov_repo[1]


@pytest.fixture(scope="module")
def engine(prov_repo: tuple[Path, Path, bytes]) -> Iterator[Any]:
    with engine_for(EngineOptions(policy_dir=prov_repo[0] / "policies")) as e:
        yield e


def _trust(repo: Path) -> TrustData:
    return load_trust(EngineOptions(policy_dir=repo / "policies"))


def _decide(repo: Path, engine: Any, fixture: str, attestations: list[Path], *, action: str) -> Any:
    with SafeTree.open(find_fixture(repo, fixture).checkpoint) as tree:
        return evaluate(tree, attestations=attestations, engine=engine, trust=_trust(repo), action=action,
                        candidate_commit=candidate_commit(repo), containment=_Host()).decision


def _codes(decision: Any) -> set[str]:
    return {r.code for r in decision.deny_reasons}


def _provenance_files(repo: Path) -> list[Path]:
    return [p for p in AttestationStore(repo / "attestations").iter() if "fixture-provenance" in p.name]


# --------------------------------------------------------------------------------------------- round trip
def test_signed_provenance_verifies_and_names_the_committed_bytes(repo: Path, key: Path) -> None:
    result = attest_provenance(repo, find_fixture(repo, ZERO2), key=key)
    commit = candidate_commit(repo)
    assert result.candidate_commit == commit and result.superseded == ()
    va = verify_attestation(result.attestation.read_bytes(), source="t", trust=_trust(repo),
                            measured_digest=result.fixture_digest, now=datetime.now(timezone.utc),
                            expected_commit=commit)
    assert va.predicate_type == PROVENANCE_PREDICATE_TYPE
    pred = va.statement["predicate"]
    meta = json.loads((repo / "tests/fixtures/data" / ZERO2 / "meta.json").read_text())
    location = f"tests/fixtures/data/{ZERO2}/checkpoint"
    assert pred["basis"] == BASIS
    assert pred["fixture"] == {"digest": result.fixture_digest.prefixed(), "digest_algorithm": "sha256", "location": location,
                               "manifest": f"tests/fixtures/data/{ZERO2}/meta.json",
                               "git_tree": git(repo, "rev-parse", f"{commit}:{location}")}
    assert pred["producer"] == {"name": "deepspeed", "version": meta["versions"]["deepspeed"],
                                "call": meta["producer"]}
    assert pred["producers"] == meta["versions"]
    assert pred["generator"] == {"script": meta["generator"], "command": meta["regenerate"],
                                 "producer_script": meta["producer_script"], "producer_command": meta["command"]}
    assert pred["topology"]["world_size"] == 2 and pred["topology"]["zero_stage"] == 2
    assert va.statement["subject"] == [{"name": ZERO2, "digest": {"sha256": result.fixture_digest.hex}}]
    # the store indexes it under the fixture digest
    index = json.loads((repo / "attestations/index.json").read_text())
    assert [e["predicate_type"] for e in index["attestations"]] == [PROVENANCE_PREDICATE_TYPE]


def test_policy_accepts_provenance_for_qualify_of_a_framework_fixture(repo: Path, key: Path, engine: Any) -> None:
    without = _decide(repo, engine, ZERO2, [], action="qualify")
    assert without.allow is False and _codes(without) == {"attestation_missing"}
    assert provenance_needed(without)
    att = attest_provenance(repo, find_fixture(repo, ZERO2), key=key).attestation
    d = _decide(repo, engine, ZERO2, [att], action="qualify")
    assert d.allow is True and d.plane == "framework"
    assert "deepspeed" in d.permitted_loaders
    assert any(r.code == "attestation_trusted" for r in d.reasons)
    assert not provenance_needed(d)


def test_provenance_for_another_digest_is_refused(repo: Path, key: Path, engine: Any) -> None:
    att = attest_provenance(repo, find_fixture(repo, ZERO2), key=key)
    with SafeTree.open(find_fixture(repo, ZERO3).checkpoint) as tree:
        from ckptgate.digest import fixture_digest

        other = fixture_digest(tree).digest
    assert other != att.fixture_digest
    with pytest.raises(VerificationError) as e:
        verify_attestation(att.attestation.read_bytes(), source="t", trust=_trust(repo), measured_digest=other,
                           now=datetime.now(timezone.utc))
    assert e.value.code == "verify.statement.subject_mismatch"
    d = _decide(repo, engine, ZERO3, [att.attestation], action="qualify")
    assert d.allow is False
    assert {"attestation_rejected", "attestation_missing"} <= _codes(d)
    assert usable_provenance(repo, other, trust=_trust(repo), commit=att.candidate_commit,
                             now=datetime.now(timezone.utc)) == []


def test_provenance_alone_does_not_satisfy_intake_of_a_framework_fixture(repo: Path, key: Path,
                                                                       engine: Any) -> None:
    att = attest_provenance(repo, find_fixture(repo, ZERO2), key=key).attestation
    for action in ("intake", "decide", "verify"):
        d = _decide(repo, engine, ZERO2, [att], action=action)
        assert d.allow is False, action
        assert {"attestation_missing", "attestation_wrong_predicate_type"} <= _codes(d), action
        assert not provenance_needed(d)


# --------------------------------------------------------------------------------------------- committed bytes
def _first_file(repo: Path) -> Path:
    return repo / "tests/fixtures/data" / ZERO2 / "checkpoint" / "latest"


def _commit_meta_only(repo: Path, meta_change: Any) -> None:
    meta_path = repo / "tests/fixtures/data" / ZERO2 / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_change(meta)
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    git(repo, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-q", "-m", "meta", "--",
        str(meta_path.relative_to(repo)))


def _entry(path: Path) -> dict[str, Any]:
    import hashlib

    raw = path.read_bytes()
    return {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}


def test_changed_bytes_are_not_vouched_for(repo: Path, key: Path) -> None:
    _first_file(repo).write_bytes(b"global_step9")
    with pytest.raises(EvidenceError) as e:
        attest_provenance(repo, find_fixture(repo, ZERO2), key=key)
    assert e.value.code == "evidence.provenance.meta_mismatch"
    assert e.value.evidence["paths"] == ["latest"]
    # meta.json updated and committed, the bytes not: the committed blob differs
    _commit_meta_only(repo, lambda m: m["checkpoint_files"].update({"latest": _entry(_first_file(repo))}))
    with pytest.raises(EvidenceError) as e:
        attest_provenance(repo, find_fixture(repo, ZERO2), key=key)
    assert e.value.code == "evidence.provenance.bytes_differ"
    assert e.value.evidence["path"] == "latest"
    assert _provenance_files(repo) == []


def test_uncommitted_file_and_meta_are_not_vouched_for(repo: Path, key: Path) -> None:
    extra = repo / "tests/fixtures/data" / ZERO2 / "checkpoint" / "notes.txt"
    extra.write_text("added later\n")
    _commit_meta_only(repo, lambda m: m["checkpoint_files"].update({"notes.txt": _entry(extra)}))
    with pytest.raises(EvidenceError) as e:
        attest_provenance(repo, find_fixture(repo, ZERO2), key=key)
    assert e.value.code == "evidence.provenance.files_differ"
    assert e.value.evidence["uncommitted"] == ["notes.txt"]
    extra.unlink()
    meta_path = repo / "tests/fixtures/data" / ZERO2 / "meta.json"
    meta_path.write_text(meta_path.read_text().replace('"deepspeed": "0.19.8"', '"deepspeed": "0.19.9"'))
    with pytest.raises(EvidenceError) as e:
        attest_provenance(repo, find_fixture(repo, ZERO2), key=key)
    assert e.value.code == "evidence.provenance.meta_uncommitted"


def test_fixture_never_committed_is_not_vouched_for(repo: Path, key: Path) -> None:
    src, dst = repo / "tests/fixtures/data" / ZERO2, repo / "tests/fixtures/data" / "zero2_copy"
    shutil.copytree(src, dst)
    git(repo, "add", "tests/fixtures/data/zero2_copy/meta.json")
    git(repo, "-c", "user.email=t@example.invalid", "-c", "user.name=t", "commit", "-q", "-m", "meta only")
    with pytest.raises(EvidenceError) as e:
        attest_provenance(repo, find_fixture(repo, "zero2_copy"), key=key)
    assert e.value.code == "evidence.provenance.not_committed"


# --------------------------------------------------------------------------------------------- qualify
def test_zero_fixtures_are_qualifiable_through_their_inspected_format(repo: Path) -> None:
    assert fixture_adapter(repo, find_fixture(repo, ZERO2)) == "deepspeed-zero"
    assert [(f.name, a) for f, a in qualifiable(repo)] == [(ZERO2, "deepspeed-zero"), (ZERO3, "deepspeed-zero")]


def test_qualify_signs_provenance_once_and_then_reuses_it(repo: Path, key: Path) -> None:
    result = qualify(repo, find_fixture(repo, ZERO2), "deepspeed-zero", key=key)
    assert result.status == "passed"
    stored = _provenance_files(repo)
    assert len(stored) == 1 and result.provenance == (stored[0].relative_to(repo).as_posix(),)
    log = json.loads(result.log.read_text())
    assert log["provenance"]["signed_now"] is True and log["decision"]["plane"] == "framework"
    again = qualify(repo, find_fixture(repo, ZERO2), "deepspeed-zero", key=key)
    assert again.status == "passed" and _provenance_files(repo) == stored
    assert json.loads(again.log.read_text())["provenance"]["signed_now"] is False


def test_expired_provenance_is_replaced(repo: Path, key: Path) -> None:
    fixture = find_fixture(repo, ZERO2)
    old = attest_provenance(repo, fixture, key=key, now=datetime(2026, 1, 1, tzinfo=timezone.utc))
    later = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(days=400)
    assert usable_provenance(repo, old.fixture_digest, trust=_trust(repo), commit=old.candidate_commit,
                             now=later) == []
    new = attest_provenance(repo, fixture, key=key, now=later)
    assert new.superseded == (old.attestation,) and _provenance_files(repo) == [new.attestation]
    _, stmt, _ = statement_of(new.attestation.read_bytes())
    assert stmt["predicate"]["validity"]["issued_at"] == "2027-02-05T00:00:00Z"


def test_signer_not_trusted_for_provenance_stores_nothing(repo: Path, key: Path, prov_repo: Any,
                                                          tmp_path: Path) -> None:
    trust_file = tmp_path / "trust.json"
    trust_file.write_text(_trust_doc(prov_repo[2], types=[QUALIFICATION_PREDICATE_TYPE], scopes=["qualification"]))
    options = EngineOptions(policy_dir=repo / "policies", trust_file=trust_file)
    with pytest.raises(VerificationError) as e:  # an untrusted signer alone explains the deny
        qualify(repo, find_fixture(repo, ZERO2), "deepspeed-zero", key=key, options=options)
    assert "attestation_untrusted_signer" in {r["code"] for r in e.value.reasons}
    assert _provenance_files(repo) == []
    assert json.loads((repo / "attestations/index.json").read_text())["attestations"] == []


def test_cli_attest_provenance(repo: Path, key: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ckptgate", "attest", "provenance", "--fixture", ZERO3, "--key",
                        str(key), "--repo", str(repo), "--json"], capture_output=True, text=True, timeout=120,
                       env={**os.environ})
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["fixture"] == ZERO3 and Path(out["attestation"]) == _provenance_files(repo)[0]
    r = subprocess.run([sys.executable, "-m", "ckptgate", "attest", "provenance", "--fixture", "nope", "--key",
                        str(key), "--repo", str(repo), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "evidence.fixture.unknown"


# ------------------------------------------------------------------------------------ two runs at once
def _two_stored(repo: Path, key: Path) -> tuple[Path, Path, Any]:
    """The store as two runs for one fixture leave it after each stored its statement, before either
    superseded: B's run superseded first, then A's store landed."""
    fixture = find_fixture(repo, ZERO2)
    t1 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    a = attest_provenance(repo, fixture, key=key, now=t1)
    env_a = a.attestation.read_bytes()
    b = attest_provenance(repo, fixture, key=key, now=t1 + timedelta(days=1))  # supersedes A's
    AttestationStore(repo / "attestations").add(env_a)
    assert sorted(_provenance_files(repo)) == sorted([a.attestation, b.attestation])
    return a.attestation, b.attestation, a.fixture_digest


def test_the_later_of_two_supersedes_keeps_the_statement_the_earlier_one_kept(repo: Path, key: Path) -> None:
    """Review (session 49): A's supersede read the statement it keeps, which B's supersede had removed:
    a bare FileNotFoundError (internal.unexpected).  It is read under the lock now, and a statement
    another run removed means that run's is kept."""
    from ckptgate.evidence.provenance import supersede_provenance

    pa, pb, digest = _two_stored(repo, key)
    assert supersede_provenance(repo, pb, digest) == (pa,)
    assert supersede_provenance(repo, pa, digest) == ()
    assert _provenance_files(repo) == [pb]


def test_two_concurrent_supersedes_leave_one_statement(repo: Path, key: Path) -> None:
    """Review (session 49): each run read the statement it keeps before taking the lock, then removed the
    other's: both reported success and the store held no provenance at all."""
    import threading
    import time

    from ckptgate.evidence.provenance import supersede_provenance

    pa, pb, digest = _two_stored(repo, key)
    errors: list[BaseException] = []

    def run(keep: Path) -> None:
        try:
            supersede_provenance(repo, keep, digest)
        except BaseException as e:  # recorded, asserted below
            errors.append(e)

    with AttestationStore(repo / "attestations").locked():  # a third change holds the store a moment
        threads = [threading.Thread(target=run, args=(p,)) for p in (pa, pb)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # both wait for the lock
    for t in threads:
        t.join(60)
    assert errors == [] and len(_provenance_files(repo)) == 1
