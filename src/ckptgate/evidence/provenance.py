"""Fixture provenance: CI vouches that a fixture's checkpoint bytes are the ones committed at the
candidate commit, written by the recorded generator with the recorded producer versions.

``ckptgate qualify`` on a framework-plane fixture (DeepSpeed ZeRO, Megatron ``torch_dist``) runs a
framework deserializer on the fixture bytes inside the contained worker, and the policy first
asks for a trusted ``provenance`` attestation of the exact fixture digest.  This module makes one.

What the statement asserts, and on what basis: the bytes under ``tests/fixtures/data/<name>/checkpoint``
equal the git tree committed at the candidate commit (every blob is hashed again here) and the
file manifest the generator wrote into ``meta.json``; ``meta.json`` itself is committed unchanged.
A fixture that other environments (other producer releases) also wrote byte for byte keeps each
one's ``meta.json`` as a generation record (``written_by/<name>.json``, from ``scripts/farm.py``);
each record gets its own statement about the same digest, naming that record as its manifest and
its release as the producer: the signed evidence that this release wrote these bytes.
The trust basis is the repository's review of that commit (``basis: repository-review``), not a
fresh regeneration.  A signature is integrity and origin under a separately trusted key [R27];
it is not evidence that deserializing the bytes is safe, so containment still applies [R28].
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckptgate._json import loads_or_none
from ckptgate.decide.decision import Decision
from ckptgate.decide.options import EngineOptions, load_trust
from ckptgate.digest import Digest, FixtureDigest, fixture_digest
from ckptgate.errors import VerificationError
from ckptgate.evidence.candidate import candidate_commit, git
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.fixtures import Fixture, repo_relative, resolve_key
from ckptgate.evidence.gates import fixture_adapter, gate_producer, validity
from ckptgate.evidence.layout import RepoLayout, as_layout
from ckptgate.inspect import SafeTree
from ckptgate.verify import AttestationStore, KeySigner, Signer, TrustData, sign_statement, verify_attestation
from ckptgate.verify.statement import PROVENANCE_PREDICATE_TYPE, STATEMENT_TYPE, iso_utc
from ckptgate.verify.store import statement_of

BASIS = "repository-review"
"""The one trust basis this predicate states: the review of the commit that holds the fixture."""
_READ = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedFixture:
    """A fixture whose measured bytes were checked equal to the tree at ``commit``."""

    location: str
    """Repository-relative path of the checkpoint directory."""
    manifest: str
    """Repository-relative path of ``meta.json``."""
    commit: str
    """The candidate commit (40 hex)."""
    git_tree: str
    """The git tree object of ``location`` at ``commit``."""
    digest: Digest
    """The ckptgate fixture digest of the checked bytes."""

    def __post_init__(self) -> None:
        if len(self.commit) != 40 or any(c not in "0123456789abcdef" for c in self.commit):
            raise ValueError(f"bad commit {self.commit!r}")
        if not isinstance(self.digest, Digest):
            raise TypeError(f"bad digest {self.digest!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProvenanceResult:
    """A stored provenance attestation for one fixture digest."""

    fixture: str
    fixture_digest: Digest
    candidate_commit: str
    attestation: Path
    superseded: tuple[Path, ...] = ()
    """Earlier provenance statements for the same digest and location, now removed."""

    def to_json(self) -> dict[str, Any]:
        return {
            "fixture": self.fixture,
            "fixture_digest": self.fixture_digest.prefixed(),
            "candidate_commit": self.candidate_commit,
            "attestation": str(self.attestation),
            "superseded": [str(p) for p in self.superseded],
        }


# --------------------------------------------------------------------------------------------- checks
def _object_format(repo: Path) -> str:
    fmt = git(repo, "rev-parse", "--show-object-format", check=False).strip() or "sha1"
    if fmt not in ("sha1", "sha256"):
        raise EvidenceError("evidence.provenance.object_format", f"unknown git object format {fmt!r}")
    return fmt


def _blob_id_fd(fd: int, size: int, fmt: str) -> str:
    h = hashlib.new(fmt)
    h.update(b"blob %d\0" % size)
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(_READ, size - pos), pos)
        if not chunk:
            raise EvidenceError("evidence.provenance.short_read", f"short read at offset {pos}")
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest()


def _committed_blobs(repo: Path, commit: str, location: str) -> dict[str, tuple[str, str, str]]:
    """path (relative to ``location``) -> (mode, type, object) of every entry under it at ``commit``."""
    out: dict[str, tuple[str, str, str]] = {}
    for rec in git(repo, "ls-tree", "-r", "-z", "--full-tree", commit, "--", location).split("\0"):
        if not rec:
            continue
        meta, _, path = rec.partition("\t")
        mode, kind, obj = meta.split(" ")
        out[path.removeprefix(location + "/")] = (mode, kind, obj)
    return out


def committed_fixture(
    repo: Path | RepoLayout, fixture: Fixture, tree: SafeTree, digest: FixtureDigest, commit: str
) -> CommittedFixture:
    """Check, in order, that the measured bytes are the committed, generator-recorded ones.

    ``tree`` is the open :class:`~ckptgate.inspect.SafeTree` of the checkpoint and ``digest`` its
    :class:`~ckptgate.digest.FixtureDigest`.  Codes: ``evidence.provenance.outside_repo``,
    ``.meta_uncommitted`` (meta.json differs from the commit), ``.meta_mismatch`` (the generator's
    ``checkpoint_files`` differ from the measured files), ``.expected_mismatch`` (the ground truth
    is not the one the generator recorded), ``.not_committed`` (no tree at the commit),
    ``.files_differ`` (file sets differ), ``.bytes_differ`` (a blob differs).  ``meta.json`` is
    the fixture's :attr:`~ckptgate.evidence.fixtures.Fixture.manifest`: a generation record's for
    its view (:meth:`~ckptgate.evidence.fixtures.Fixture.written_by`).
    """
    repo = as_layout(repo).root
    location, manifest = repo_relative(repo, fixture.checkpoint), repo_relative(repo, fixture.manifest)
    if Path(location).is_absolute() or Path(manifest).is_absolute():
        raise EvidenceError(
            "evidence.provenance.outside_repo",
            f"fixture {fixture.name} is not inside the repository {repo}",
            evidence={"fixture": str(fixture.root)},
        )
    fmt = _object_format(repo)
    want_meta = git(repo, "rev-parse", "--verify", "-q", f"{commit}:{manifest}", check=False).strip()
    meta_bytes = fixture.manifest.read_bytes()
    got_meta = hashlib.new(fmt, b"blob %d\0" % len(meta_bytes) + meta_bytes).hexdigest()
    if want_meta != got_meta or loads_or_none(meta_bytes) != fixture.meta:
        raise EvidenceError(
            "evidence.provenance.meta_uncommitted",
            f"{manifest} is not the file committed at {commit[:12]}",
            evidence={"manifest": manifest, "commit": commit},
            advice="Commit the fixture's meta.json (or restore it) before vouching for it.",
        )
    measured = {e.path: {"sha256": e.sha256, "size": e.size} for e in digest.manifest}
    sizes = {e.path: e.size for e in digest.manifest}
    recorded = fixture.recorded_files()
    if not isinstance(recorded, dict) or recorded != measured:
        rec = recorded if isinstance(recorded, dict) else {}
        differ = sorted(p for p in set(rec) | set(measured) if rec.get(p) != measured.get(p))
        raise EvidenceError(
            "evidence.provenance.meta_mismatch",
            f"fixture {fixture.name}: the files differ from the generator's checkpoint_files in meta.json",
            evidence={"paths": differ[:50], "recorded": isinstance(recorded, dict)},
            advice="Regenerate the fixture with tests/fixtures/generate.py and commit it.",
        )
    truth = hashlib.sha256(fixture.expected.read_bytes()).hexdigest()
    if (fixture.meta.get("expected") or {}).get("sha256") != truth:
        raise EvidenceError(
            "evidence.provenance.expected_mismatch",
            f"fixture {fixture.name}: expected.safetensors is not the ground truth {manifest} records",
            evidence={"manifest": manifest, "measured": truth},
            advice="Regenerate the fixture with tests/fixtures/generate.py (or scripts/farm.py) and commit it.",
        )
    git_tree = git(repo, "rev-parse", "--verify", "-q", f"{commit}:{location}", check=False).strip()
    blobs = _committed_blobs(repo, commit, location) if git_tree else {}
    if not git_tree or not blobs:
        raise EvidenceError(
            "evidence.provenance.not_committed",
            f"{location} holds no committed files at {commit[:12]}",
            evidence={"location": location, "commit": commit},
        )
    if set(blobs) != set(measured):
        raise EvidenceError(
            "evidence.provenance.files_differ",
            f"the files under {location} are not the committed ones",
            evidence={
                "uncommitted": sorted(set(measured) - set(blobs))[:50],
                "missing": sorted(set(blobs) - set(measured))[:50],
            },
        )
    for path in sorted(measured):
        mode, kind, obj = blobs[path]
        fd = tree.open_file(path)
        try:
            got = _blob_id_fd(fd, sizes[path], fmt)
        finally:
            os.close(fd)
        if kind != "blob" or mode not in ("100644", "100755") or got != obj:
            raise EvidenceError(
                "evidence.provenance.bytes_differ",
                f"{location}/{path} differs from the blob committed at {commit[:12]}",
                evidence={"path": path, "committed": obj, "measured": got, "mode": mode},
            )
    return CommittedFixture(
        location=location, manifest=manifest, commit=commit, git_tree=git_tree, digest=digest.digest
    )


# --------------------------------------------------------------------------------------------- statement
def _generator(fixture: Fixture) -> dict[str, str]:
    meta = fixture.meta
    out: dict[str, str] = {}
    for key, field_ in (
        ("script", "generator"),
        ("command", "regenerate"),
        ("producer_script", "producer_script"),
        ("producer_command", "command"),
    ):
        value = meta.get(field_)
        if isinstance(value, str) and value:
            out[key] = value
        elif key in ("script", "command"):
            raise EvidenceError(
                "evidence.fixture.meta_field",
                f"fixture {fixture.name}: meta.json has no {field_!r}",
                evidence={"fixture": fixture.name, "field": field_},
            )
    return out


def _producers(fixture: Fixture) -> dict[str, str]:
    versions = fixture.meta.get("versions")
    out = (
        {k: v for k, v in versions.items() if isinstance(k, str) and isinstance(v, str) and v}
        if isinstance(versions, dict)
        else {}
    )
    if not out:
        raise EvidenceError(
            "evidence.fixture.meta_field",
            f"fixture {fixture.name}: meta.json records no versions",
            evidence={"fixture": fixture.name, "field": "versions"},
        )
    return out


def provenance_statement(
    repo: Path | RepoLayout, fixture: Fixture, committed: CommittedFixture, *, now: datetime
) -> dict[str, Any]:
    """The in-toto Statement v1 (subject: the fixture digest) for a checked fixture."""
    adapter = fixture_adapter(repo, fixture)
    producer = fixture.producer(gate_producer(repo, adapter) if adapter else None)
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": fixture.name, "digest": committed.digest.dsse_subject()}],
        "predicateType": PROVENANCE_PREDICATE_TYPE,
        "predicate": {
            "basis": BASIS,
            "fixture": {
                "digest": committed.digest.prefixed(),
                "digest_algorithm": committed.digest.algorithm,
                "location": committed.location,
                "manifest": committed.manifest,
                "git_tree": committed.git_tree,
            },
            "producer": {**producer, "call": str(fixture.meta["producer"])},
            "producers": _producers(fixture),
            "generator": _generator(fixture),
            "topology": fixture.topology(),
            "candidate_commit": committed.commit,
            "validity": {"issued_at": iso_utc(now), "expires_at": iso_utc(now + validity(repo))},
        },
    }


# --------------------------------------------------------------------------------------------- store
def _provenance_files(store: AttestationStore, digest: Digest) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for p in store.find(digest):
        try:
            _fmt, stmt, _ = statement_of(p.read_bytes())
        except VerificationError:
            continue
        if stmt.get("predicateType") == PROVENANCE_PREDICATE_TYPE:
            out.append((p, stmt))
    return out


def usable_provenance(
    repo: Path | RepoLayout,
    digest: Digest,
    *,
    trust: TrustData,
    commit: str,
    now: datetime,
    manifest: str | None = None,
) -> list[Path]:
    """Stored provenance statements for ``digest`` that verify now, for ``commit``, under ``trust``
    (with ``manifest``: only those about that repository-relative ``meta.json`` or generation record).

    Only statements that verify are returned, so a stale one never reaches policy as a rejected
    attestation (which would deny).  Whether the signer is trusted *for provenance* is policy's call.
    """
    ok = []
    for p, stmt in _provenance_files(AttestationStore(as_layout(repo).attestations), digest):
        if manifest is not None and _fixture_field(stmt, "manifest") != manifest:
            continue
        try:
            verify_attestation(
                p.read_bytes(), source=str(p), trust=trust, measured_digest=digest, now=now, expected_commit=commit
            )
        except VerificationError:
            continue
        ok.append(p)
    return ok


def sign_provenance(
    repo: Path | RepoLayout,
    fixture: Fixture,
    tree: SafeTree,
    digest: FixtureDigest,
    *,
    signer: Signer,
    trust: TrustData,
    commit: str,
    now: datetime,
) -> bytes:
    """Check the committed bytes (:func:`committed_fixture`), sign the statement and verify the
    envelope under ``trust`` for ``digest`` and ``commit``; returns the DSSE envelope (not stored)."""
    repo = as_layout(repo)
    committed = committed_fixture(repo, fixture, tree, digest, commit)
    envelope = sign_statement(provenance_statement(repo, fixture, committed, now=now), signer)
    # Storing is only useful when the trust data accepts the key: verify before anyone stores it.
    verify_attestation(
        envelope, source="<new>", trust=trust, measured_digest=digest.digest, now=now, expected_commit=commit
    )
    return envelope


def store_provenance(repo: Path | RepoLayout, envelope: bytes) -> Path:
    """Store a provenance envelope in the layout's attestation store (idempotent) and rebuild the index."""
    return AttestationStore(as_layout(repo).attestations).add(envelope)


def discard_provenance(repo: Path | RepoLayout, path: Path) -> None:
    """Remove a just-stored provenance envelope that policy did not accept, and rebuild the index."""
    store = AttestationStore(as_layout(repo).attestations)
    with store.locked():
        path.unlink(missing_ok=True)
        store.rebuild_index()


def _fixture_field(stmt: dict[str, Any], name: str) -> Any:
    fixture = (stmt.get("predicate") or {}).get("fixture")
    return fixture.get(name) if isinstance(fixture, dict) else None


def supersede_provenance(repo: Path | RepoLayout, keep: Path, digest: Digest) -> tuple[Path, ...]:
    """Remove every other stored provenance statement for ``digest`` with the same fixture location
    and manifest (a generation record's statement never supersedes the fixture's own).  ``keep`` is read
    under the store's lock: where another run's supersede has removed it meanwhile, that run's statement
    is the one kept, and nothing is removed here (two runs never remove each other's)."""
    store = AttestationStore(as_layout(repo).attestations)
    removed = []
    with store.locked():  # keep read, the removals and the index without them: one change of the store
        try:
            kept = statement_of(keep.read_bytes())[1]  # a file this process stored
        except FileNotFoundError:
            return ()
        location, manifest = _fixture_field(kept, "location"), _fixture_field(kept, "manifest")
        for p, stmt in _provenance_files(store, digest):
            if (
                p != keep
                and _fixture_field(stmt, "location") == location
                and _fixture_field(stmt, "manifest") == manifest
            ):
                p.unlink()
                removed.append(p)
        if removed:
            store.rebuild_index()
    return tuple(removed)


def attest_provenance(
    repo: Path | RepoLayout,
    fixture: Fixture,
    *,
    key: Path | str | None = None,
    options: EngineOptions | None = None,
    now: datetime | None = None,
) -> ProvenanceResult:
    """``ckptgate attest provenance``: sign and store a fresh provenance statement for ``fixture``,
    superseding earlier ones for the same digest and location."""
    repo = as_layout(repo)
    options = options or EngineOptions(policy_dir=repo.policies)
    signer = KeySigner.from_pem(resolve_key(repo, key))
    now = (now or datetime.now(UTC)).replace(microsecond=0)
    commit = candidate_commit(repo.root, exclude=repo.evidence_paths)
    with SafeTree.open(fixture.checkpoint) as tree:
        digest = fixture_digest(tree)
        envelope = sign_provenance(
            repo, fixture, tree, digest, signer=signer, trust=load_trust(options), commit=commit, now=now
        )
    stored = store_provenance(repo, envelope)
    return ProvenanceResult(
        fixture=fixture.name,
        fixture_digest=digest.digest,
        candidate_commit=commit,
        attestation=stored,
        superseded=supersede_provenance(repo, stored, digest.digest),
    )


def provenance_needed(decision: Decision) -> bool:
    """True when the only deny reason is a missing attestation that a provenance statement can satisfy."""
    deny = list(decision.deny_reasons)
    if decision.allow or not deny or any(r.code != "attestation_missing" for r in deny):
        return False
    return any(PROVENANCE_PREDICATE_TYPE in (r.evidence.get("accepted_predicate_types") or []) for r in deny)


__all__ = [
    "BASIS",
    "CommittedFixture",
    "ProvenanceResult",
    "attest_provenance",
    "committed_fixture",
    "discard_provenance",
    "provenance_needed",
    "provenance_statement",
    "sign_provenance",
    "store_provenance",
    "supersede_provenance",
    "usable_provenance",
]
