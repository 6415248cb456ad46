from __future__ import annotations

import json

import pytest
from verify_helpers import FIXTURE_HEX, STATEMENT, statement

from ckptgate.digest import Digest
from ckptgate.errors import RuntimeFailure, VerificationError
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


# ------------------------------------------------------------------------------------------- the store's lock
def _subject(n: int) -> dict:
    """A statement about its own subject (``sha256:<n as 64 hex digits>``)."""
    stmt = statement(candidate_commit=f"{n:040x}")
    stmt["subject"] = [{"name": "x", "digest": {"sha256": f"{n:064x}"}}]
    stmt["predicate"]["fixture"]["digest"] = f"sha256:{n:064x}"
    return stmt


# A second process storing ``argv[2]`` in the store ``argv[1]``; where it finds the lock held it says so
# (touches ``argv[3]``) before it waits.
_OTHER_PROCESS = """
import sys, time
from pathlib import Path
from ckptgate.verify import AttestationStore
real = time.sleep
def waiting(s):
    Path(sys.argv[3]).touch()
    real(s)
time.sleep = waiting
AttestationStore(sys.argv[1]).add_all([Path(sys.argv[2]).read_bytes()])
"""


def test_a_store_by_another_process_meanwhile_stays_in_the_index(tmp_path, ed_signer, monkeypatch) -> None:
    """Lost update: ``add_all`` made the index from the listing, then wrote it; another process storing in
    between had its file dropped from the index by the later write.  Now the other process waits for the
    lock (it says so) and its index lists both."""
    import os
    import subprocess
    import sys
    import time

    store = AttestationStore(tmp_path / "store")
    store.add(sign_statement(_subject(1), ed_signer))
    (tmp_path / "other.json").write_bytes(sign_statement(_subject(2), ed_signer))
    waiting = tmp_path / "waiting"
    real, children = store.index_bytes, []

    def index_then_the_other(**kw):
        index = real(**kw)
        if not children:  # between this index and its write, the other process stores
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
            children.append(subprocess.Popen(
                [sys.executable, "-c", _OTHER_PROCESS, str(store.root), str(tmp_path / "other.json"), str(waiting)],
                env=env, stderr=subprocess.PIPE, text=True))
            deadline = time.monotonic() + 60
            while children[0].poll() is None and not waiting.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return index

    monkeypatch.setattr(store, "index_bytes", index_then_the_other)
    [mine] = store.add_all([sign_statement(_subject(3), ed_signer)])
    assert children[0].wait(timeout=60) == 0, children[0].stderr.read() if children[0].stderr else ""
    monkeypatch.undo()
    index = json.loads((store.root / "index.json").read_text())
    listed = [e["path"] for e in index["attestations"]]
    assert listed == [p.relative_to(store.root).as_posix() for p in store.iter()]  # the lost update
    assert len(listed) == 3 and mine.relative_to(store.root).as_posix() in listed
    assert (store.root / "index.json").read_bytes() == store.index_bytes()
    assert waiting.exists()  # it waited for this one


# Stores ``argv[3:]`` one call at a time in the store ``argv[1]`` after ``argv[2]`` exists (all start at once).
_ADDER = """
import sys, time
from pathlib import Path
from ckptgate.verify import AttestationStore
while not Path(sys.argv[2]).exists():
    time.sleep(0.005)
for f in sys.argv[3:]:
    AttestationStore(sys.argv[1]).add(Path(f).read_bytes())
"""


def test_processes_storing_at_once_lose_nothing_from_the_index(tmp_path, ed_signer) -> None:
    import os
    import subprocess
    import sys

    envelopes = tmp_path / "in"
    envelopes.mkdir()
    batches = []
    for proc in range(4):
        batch = []
        for k in range(6):
            f = envelopes / f"{proc}-{k}.json"
            f.write_bytes(sign_statement(_subject(100 * proc + k + 1), ed_signer))
            batch.append(str(f))
        batches.append(batch)
    root, go = tmp_path / "deep" / "store", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _ADDER, str(root), str(go), *b], env=env,
                              stderr=subprocess.PIPE, text=True) for b in batches]
    go.touch()
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    store = AttestationStore(root)
    stored = [p.relative_to(root).as_posix() for p in store.iter()]
    assert len(stored) == 24
    assert [e["path"] for e in json.loads((root / "index.json").read_text())["attestations"]] == stored


def test_the_lock_file_is_no_attestation(tmp_path, ed_signer) -> None:
    """``.lock`` is there while a change holds it: never listed, indexed or read as an attestation; gone after."""
    import os
    import stat

    from ckptgate.verify.store import LOCK_NAME

    store = AttestationStore(tmp_path / "store")
    p = store.add(sign_statement(STATEMENT, ed_signer))
    lock = tmp_path / "store" / LOCK_NAME
    assert not lock.exists()
    with store.locked():
        assert lock.is_file() and stat.S_IMODE(os.stat(lock).st_mode) == 0o600
        assert list(store.iter()) == [p] and store.find(Digest.parse("sha256:" + FIXTURE_HEX)) == [p]
        assert [e.path for e in store.entries()] == [p.relative_to(store.root).as_posix()]
        store.add(sign_statement(statement(candidate_commit="f" * 40), ed_signer))  # reentrant
        assert LOCK_NAME not in (tmp_path / "store" / "index.json").read_text()
        assert len(json.loads((tmp_path / "store" / "index.json").read_text())["attestations"]) == 2
    assert not lock.exists() and len(list(store.iter())) == 2


def test_a_lock_file_that_is_a_link_is_refused_and_nothing_is_written(tmp_path, ed_signer) -> None:
    from ckptgate.errors import UsageError
    from ckptgate.verify.store import LOCK_NAME

    root, outside = tmp_path / "store", tmp_path / "outside"
    root.mkdir()
    (root / LOCK_NAME).symlink_to(outside)
    with pytest.raises(UsageError) as ei:
        AttestationStore(root).add(sign_statement(STATEMENT, ed_signer))
    assert ei.value.code == "usage.store" and str(root / LOCK_NAME) in ei.value.message
    assert not outside.exists() and sorted(p.name for p in root.iterdir()) == [LOCK_NAME]


def test_a_store_locked_elsewhere_past_the_timeout_is_busy_and_untouched(tmp_path, ed_signer) -> None:
    holder = AttestationStore(tmp_path / "store")
    holder.add(sign_statement(STATEMENT, ed_signer))
    before = _listing(tmp_path / "store")
    other = AttestationStore(tmp_path / "store", lock_timeout=0.2)  # its own open file: flock is per open file
    with holder.locked(), holder.locked():  # reentrant for the holder
        with pytest.raises(RuntimeFailure) as ei:
            other.add(sign_statement(statement(candidate_commit="f" * 40), ed_signer))
        holder.rebuild_index()  # the holder itself still changes the store
    assert ei.value.code == "runtime.store.busy"
    assert str(tmp_path / "store") in ei.value.message and ei.value.evidence["path"] == str(tmp_path / "store")
    assert _listing(tmp_path / "store") == before
    other.add(sign_statement(statement(candidate_commit="f" * 40), ed_signer))  # released
    assert len(list(other.iter())) == 2


def test_a_failed_first_store_takes_back_the_root_its_parents_and_the_lock_file(
    tmp_path, ed_signer, monkeypatch
) -> None:
    """The lock needs the root first: where the call made it (and its parents), a failure takes them back
    with the lock file, as if nothing had run."""
    import ckptgate.verify.store as store_module

    real = store_module.replace_whole

    def failing(path, data, **kw):
        if path.name == "index.json":
            raise OSError(28, "No space left on device")
        real(path, data, **kw)

    monkeypatch.setattr(store_module, "replace_whole", failing)
    store = AttestationStore(tmp_path / "a" / "b" / "store")
    with pytest.raises(OSError):
        store.add_all([sign_statement(STATEMENT, ed_signer), sign_statement(_subject(7), ed_signer)])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(VerificationError):  # refused on its inputs: the store is never made
        store.add(b"{oops")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    store.add(sign_statement(STATEMENT, ed_signer))
    assert len(list(store.iter())) == 1
