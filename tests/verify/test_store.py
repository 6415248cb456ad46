from __future__ import annotations

import json

import pytest
from verify_helpers import FIXTURE_HEX, STATEMENT, statement

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify import AttestationStore, sign_statement
from ckptgate.verify.store import predicate_slug


def test_layout_index_and_find(tmp_path, ed_signer, ec_signer) -> None:
    store = AttestationStore(tmp_path)
    a = sign_statement(STATEMENT, ed_signer)
    b = sign_statement(statement(candidate_commit="f" * 40), ec_signer)
    pa, pb = store.add(a), store.add(b)
    assert pa.parent.name == f"sha256-{FIXTURE_HEX}" and pa.name.startswith(
        "ckptgate.dev-attestation-qualification-v1-") and pa.name.endswith(".dsse.json")
    assert pa != pb and pa.read_bytes() == a
    assert store.add(a) == pa  # idempotent
    assert sorted(store.find(Digest.parse("sha256:" + FIXTURE_HEX))) == sorted([pa, pb])
    assert store.find(Digest.from_hex("00" * 32)) == []
    index = json.loads((tmp_path / "index.json").read_text())
    assert [e["path"] for e in index["attestations"]] == sorted(e["path"] for e in index["attestations"])
    assert index["attestations"][0]["subjects"] == ["sha256:" + FIXTURE_HEX]
    before = (tmp_path / "index.json").read_bytes()
    store.rebuild_index()
    assert (tmp_path / "index.json").read_bytes() == before  # deterministic


def test_conflict_and_garbage(tmp_path, ed_signer) -> None:
    store = AttestationStore(tmp_path)
    a = sign_statement(STATEMENT, ed_signer)
    p = store.add(a)
    p.write_bytes(a.replace(b"\n", b"\n "))
    with pytest.raises(VerificationError) as ei:
        store.add(a)
    assert ei.value.code == "verify.store.conflict"
    with pytest.raises(VerificationError) as ei:
        store.add(b"{oops")
    assert ei.value.code == "verify.json.malformed"


def test_iter_ignores_foreign_files(tmp_path, ed_signer) -> None:
    store = AttestationStore(tmp_path)
    p = store.add(sign_statement(STATEMENT, ed_signer))
    (tmp_path / "README.md").write_text("x")
    (p.parent / "notes.txt").write_text("x")
    assert list(store.iter()) == [p]


def test_predicate_slug() -> None:
    assert predicate_slug("https://slsa.dev/provenance/v1") == "slsa.dev-provenance-v1"
    assert predicate_slug("") == "predicate"


def test_a_subject_directory_that_is_a_link_is_refused_and_nothing_leaves_the_store(tmp_path, ed_signer) -> None:
    """``sha256-<subject>`` as a symlink would carry the write out of the store (and ``find`` never reads
    through it): refused before anything is written, and the index never lists what is behind it."""
    from ckptgate.errors import UsageError

    store_dir, outside = tmp_path / "store", tmp_path / "outside"
    store_dir.mkdir()
    outside.mkdir()
    (store_dir / f"sha256-{FIXTURE_HEX}").symlink_to(outside)
    store = AttestationStore(store_dir)
    with pytest.raises(UsageError) as ei:
        store.add(sign_statement(STATEMENT, ed_signer))
    assert ei.value.code == "usage.store"
    assert list(outside.iterdir()) == [] and list(store.iter()) == []


def test_a_corrupt_stored_entry_is_named_and_a_conflict_is_found_before_writing(tmp_path, ed_signer) -> None:
    store = AttestationStore(tmp_path)
    a = sign_statement(STATEMENT, ed_signer)
    dest = store.path_for(a)
    dest.parent.mkdir()
    dest.write_bytes(b"{oops")
    with pytest.raises(VerificationError) as ei:  # a path_for that would store over it refuses
        store.path_for(a)
    assert ei.value.code == "verify.store.conflict"
    with pytest.raises(VerificationError) as ei:  # the index names the file that is wrong
        store.index_bytes()
    assert ei.value.code == "verify.store.entry_invalid" and str(dest) in ei.value.message


def _listing(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_envelopes_for_one_statement_in_one_call_store_nothing(tmp_path, ed_signer, ec_signer) -> None:
    """The same statement signed by two keys lands at one name: the second used to be refused only after the
    first (and every one before it) was written, with no index."""
    store = AttestationStore(tmp_path / "store")
    other = sign_statement(statement(candidate_commit="f" * 40), ed_signer)
    a, b = sign_statement(STATEMENT, ed_signer), sign_statement(STATEMENT, ec_signer)
    with pytest.raises(VerificationError) as ei:
        store.add_all([other, a, b], names=["other.json", "a.json", "b.json"])
    assert ei.value.code == "verify.store.conflict"
    assert "a.json" in ei.value.message and "b.json" in ei.value.message
    assert not (tmp_path / "store").exists()


def test_a_conflict_with_a_stored_envelope_leaves_the_store_as_it_was(tmp_path, ed_signer, ec_signer) -> None:
    store = AttestationStore(tmp_path)
    store.add(sign_statement(STATEMENT, ed_signer))
    before = _listing(tmp_path)
    with pytest.raises(VerificationError) as ei:
        store.add_all([sign_statement(statement(candidate_commit="f" * 40), ed_signer),
                       sign_statement(STATEMENT, ec_signer)], names=["new.json", "b.json"])
    assert ei.value.code == "verify.store.conflict" and "b.json" in ei.value.message
    assert _listing(tmp_path) == before


def test_the_same_envelope_twice_in_one_call_is_stored_once(tmp_path, ed_signer) -> None:
    store = AttestationStore(tmp_path)
    a = sign_statement(STATEMENT, ed_signer)
    pa, pb = store.add_all([a, a])
    assert pa == pb and [e.path for e in store.entries()] == [pa.relative_to(tmp_path).as_posix()]


@pytest.mark.parametrize("fail_at", [2, 3])  # the second envelope; the index, after both envelopes
def test_a_write_that_fails_part_way_takes_back_what_was_written(tmp_path, ed_signer, monkeypatch, fail_at) -> None:
    import ckptgate.verify.store as store_module

    store = AttestationStore(tmp_path / "store")
    store.add(sign_statement(statement(candidate_commit="e" * 40), ed_signer))
    before = _listing(tmp_path / "store")
    real, calls = store_module.replace_whole, []

    def failing(path, data, **kw):
        calls.append(path)
        if len(calls) == fail_at:
            raise OSError(28, "No space left on device")
        real(path, data, **kw)

    monkeypatch.setattr(store_module, "replace_whole", failing)
    other_subject = statement(candidate_commit="f" * 40)
    other_subject["subject"] = [{"name": "x", "digest": {"sha256": "cd" * 32}}]
    other_subject["predicate"]["fixture"]["digest"] = "sha256:" + "cd" * 32
    with pytest.raises(OSError):
        store.add_all([sign_statement(STATEMENT, ed_signer), sign_statement(other_subject, ed_signer)])
    assert len(calls) == fail_at
    assert _listing(tmp_path / "store") == before
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == sorted({k.split("/")[0] for k in before})


def test_a_store_on_a_file_system_without_hard_links_still_takes_envelopes(tmp_path, monkeypatch) -> None:
    """``link`` fails with EPERM on vfat and some FUSE mounts: the envelope is created exclusively in place
    instead, never over a file already there, and no temporary file is left."""
    import errno
    import os

    from ckptgate import userfiles

    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(userfiles.os, "link", no_links)
    dest = tmp_path / "x.json"
    userfiles.replace_whole(dest, b"one", exclusive=True)
    assert dest.read_bytes() == b"one"
    with pytest.raises(FileExistsError):
        userfiles.replace_whole(dest, b"two", exclusive=True)
    assert dest.read_bytes() == b"one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    assert os.stat(dest).st_mode & 0o777 == 0o644 & ~_umask()


def _umask() -> int:
    import os

    old = os.umask(0)
    os.umask(old)
    return old
