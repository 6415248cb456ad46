"""``attestations/``: one file per statement, named by subject digest, plus a deterministic index.

Layout::

    attestations/
      index.json                                   # regenerated, sorted, no timestamps
      sha256-<subject hex>/<slug>-<payload sha256[:16]>.dsse.json      # DSSE envelope (keys)
      sha256-<subject hex>/<slug>-<payload sha256[:16]>.sigstore.json  # Sigstore bundle

Storing is not trusting: :meth:`AttestationStore.add` checks structure only; verify at use.

Storing several is all or nothing (:meth:`AttestationStore.add_all`): every envelope, every conflict (with a
stored file or between two of them) and the new index are checked before the first file is written; each
file goes in whole (a temporary file beside it, linked into place), the index last, and a failure on the
way takes back what was written, so a refusal leaves the store as it was.

Every change of the store (:meth:`AttestationStore.add_all`, :meth:`~AttestationStore.add`,
:meth:`~AttestationStore.rebuild_index`, and a caller's own removals under
:meth:`~AttestationStore.locked`) holds an exclusive ``flock`` on ``.lock`` in the store root from the listing
it reads to the index it writes, so two processes storing at once never write an index without the other's
files.  The lock file lasts as long as the change (and is no attestation: :meth:`~AttestationStore.iter` never
lists it); a lock held elsewhere for longer than ``lock_timeout`` seconds is ``runtime.store.busy``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate._json import loads_strict, verify_error
from ckptgate.digest import Digest
from ckptgate.errors import RuntimeFailure, UsageError, VerificationError
from ckptgate.userfiles import replace_whole
from ckptgate.verify import dsse
from ckptgate.verify.facts import MAX_PAYLOAD_BYTES, read_envelope
from ckptgate.verify.statement import check_statement

INDEX_VERSION = 1
_DIR = re.compile(r"^sha256-[0-9a-f]{64}$")
_FILE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,80}-[0-9a-f]{16}\.(dsse|sigstore)\.json$")
LOCK_NAME = ".lock"
"""The store's lock file (in the root): neither a subject directory nor an attestation."""
LOCK_TIMEOUT_S = 30.0
"""How long a change of the store waits for another process's change to end."""
_LOCK_POLL_S = 0.05


def predicate_slug(predicate_type: str) -> str:
    """``https://ckptgate.dev/attestation/qualification/v1`` -> ``ckptgate.dev-attestation-qualification-v1``."""
    s = re.sub(r"^[a-z]+://", "", predicate_type.lower())
    s = re.sub(r"[^a-z0-9.]+", "-", s).strip("-.")
    return (s or "predicate")[:80].rstrip("-.")


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredAttestation:
    """One stored file, as listed in the index (unverified)."""

    path: str
    """Relative to the store root, with ``/`` separators."""
    subjects: tuple[str, ...]
    """``sha256:<hex>`` of every subject."""
    predicate_type: str
    format: str
    sha256: str
    """SHA-256 of the stored file."""

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "subjects": list(self.subjects),
            "predicate_type": self.predicate_type,
            "format": self.format,
            "sha256": self.sha256,
        }


def statement_of(raw: bytes) -> tuple[str, dict[str, Any], bytes]:
    env = read_envelope(raw)
    if env.format == "sigstore" and env.payload_type != dsse.IN_TOTO_PAYLOAD_TYPE:
        raise VerificationError("verify.dsse.payload_type", "bundle payloadType is not in-toto")
    stmt = loads_strict(env.payload, what="statement", max_bytes=MAX_PAYLOAD_BYTES, error=verify_error)
    return env.format, check_statement(stmt), env.payload


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, data, mode=0o600)


class AttestationStore:
    """A directory of attestations keyed by subject digest."""

    def __init__(self, root: Path | str, *, lock_timeout: float | None = None) -> None:
        """:param lock_timeout: seconds a change waits for another process's (default :data:`LOCK_TIMEOUT_S`)."""
        self.root = Path(root)
        self.lock_timeout = LOCK_TIMEOUT_S if lock_timeout is None else lock_timeout
        self._held = threading.local()  # this thread's depth of locked() on this store

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock (``flock`` on ``ROOT/.lock``, created with the root and its parents where
        missing): a read of the store and the change made from it, serialised with every other process's.

        Reentrant in one thread on one :class:`AttestationStore` (another instance for the same root waits).
        The lock file is removed while still held, at the end, and so are the root and parents this call made
        where they are empty then (nothing was stored): the store is left as it would be without the lock.
        A waiter that finds the file it locked removed locks the one there now.  ``runtime.store.busy`` after
        ``lock_timeout`` seconds of waiting."""
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        made: list[Path] = []  # the root and its parents, made here
        fd = -1
        try:
            fd = self._lock(made)
            self._held.depth = 1
            try:
                yield
            finally:
                self._held.depth = 0
        finally:
            if fd >= 0:
                # removed while held, never otherwise: a waiter on it then finds it gone and locks the next one
                with contextlib.suppress(OSError):
                    os.unlink(self.root / LOCK_NAME)
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()  # only when empty: nothing was stored
            if fd >= 0:
                os.close(fd)  # releases the lock

    def _lock(self, made: list[Path]) -> int:
        """The lock file's descriptor, flock-ed exclusively; the root and parents this call made in ``made``."""
        lock = self.root / LOCK_NAME
        deadline = time.monotonic() + self.lock_timeout
        while True:
            for d in reversed([d for d in (self.root, *self.root.parents) if not d.exists()]):
                try:
                    d.mkdir()
                except FileExistsError:  # made meanwhile by another process: not ours to take back
                    continue
                if d not in made:
                    made.append(d)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:  # the root another change made, and took back as it ended: make it again
                if time.monotonic() >= deadline:
                    raise self._busy(lock) from None
                time.sleep(_LOCK_POLL_S)
                continue
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise
                fd = -1
            try:
                held = os.fstat(fd) if fd >= 0 else None
                if held is None or not stat.S_ISREG(held.st_mode):
                    raise UsageError(
                        "usage.store",
                        f"{lock} in the store is a symbolic link or not a regular file; refusing to lock through it",
                        evidence={"path": str(lock)},
                        advice=f"Remove {lock} (the store's lock file; the next change of {self.root} creates it), "
                        "then run the command again.",
                    )
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise self._busy(lock) from None
                        time.sleep(_LOCK_POLL_S)
                with contextlib.suppress(FileNotFoundError):
                    now = os.lstat(lock)
                    if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                        return fd
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                raise
            os.close(fd)  # removed by its holder while this one waited: lock the one there now

    def _busy(self, lock: Path) -> RuntimeFailure:
        return RuntimeFailure(
            "runtime.store.busy",
            f"the attestation store {self.root} is busy: other processes have changed it for the "
            f"{self.lock_timeout:g} s this run waits for its lock {lock}",
            evidence={"path": str(self.root), "lock": str(lock), "timeout_s": self.lock_timeout},
            advice=f"Nothing was written to {self.root}. Let the other process storing there "
            f"(`fuser -v {lock}` names it) finish, then run the command again.",
        )

    def path_for(self, raw: bytes, *, name: str | None = None) -> Path:
        """Where ``raw`` belongs (first subject's digest, predicate slug, payload digest); refused where the
        subject's directory is a link or not a directory, or another file is already there
        (``verify.store.conflict``): checked for every envelope before any is stored.

        :param name: the file ``raw`` was read from, named in a refusal."""
        fmt, stmt, payload = statement_of(raw)
        sha = stmt["subject"][0]["digest"].get("sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
            raise VerificationError("verify.store.no_sha256_subject", "the first subject has no sha256 digest")
        stored_name = f"{predicate_slug(stmt['predicateType'])}-{hashlib.sha256(payload).hexdigest()[:16]}.{fmt}.json"
        dest = self.root / Digest.from_hex(sha.lower()).filename_stem() / stored_name
        subject_dir = dest.parent
        if subject_dir.is_symlink() or (subject_dir.exists() and not subject_dir.is_dir()):
            # a link would carry the write out of the store (and find() would never read it back)
            raise UsageError(
                "usage.store",
                f"{subject_dir} in the store is a symbolic link or not a directory; refusing to store through it",
                evidence={"path": str(subject_dir)},
                advice=f"Remove {subject_dir} (the store keeps one real directory per subject), or name another "
                "directory with --store.",
            )
        if dest.is_symlink() or (dest.exists() and not dest.is_file()):
            raise VerificationError(
                "verify.store.conflict",
                f"{dest} already exists and is not a regular file",
                evidence={"path": str(dest)},
            )
        if dest.exists() and dest.read_bytes() != raw:
            what = "the envelope" if name is None else name
            raise VerificationError(
                "verify.store.conflict",
                f"{dest} already holds a different envelope for the same statement as {what}",
                evidence={"path": str(dest), **({} if name is None else {"input": name})},
                advice=f"Keep one envelope per statement: leave {what} out, or move {dest} out of the store "
                f"first if {what} is to replace it.",
            )
        return dest

    def plan(self, raws: Sequence[bytes], *, names: Sequence[str] | None = None) -> list[Path]:
        """Where each of ``raws`` belongs (:meth:`path_for`), or ``verify.store.conflict`` where two of them
        are different envelopes for the same statement: nothing is written."""
        dests: list[Path] = []
        first: dict[Path, int] = {}
        for i, raw in enumerate(raws):
            dest = self.path_for(raw, name=None if names is None else names[i])
            j = first.setdefault(dest, i)
            if raws[j] != raw:
                a, b = (f"envelope {j + 1}", f"envelope {i + 1}") if names is None else (names[j], names[i])
                raise VerificationError(
                    "verify.store.conflict",
                    f"{a} and {b} are different envelopes for the same statement: both would be stored as {dest}",
                    evidence={"path": str(dest), "inputs": [a, b]},
                    advice=f"Keep one envelope per statement: store {a} or {b}, not both.",
                )
            dests.append(dest)
        return dests

    def add(self, raw: bytes, *, reindex: bool = True) -> Path:
        """Store ``raw`` (idempotent) and rebuild the index; a different file at the same name is an error."""
        if not reindex:
            with self.locked():
                dest = self.path_for(raw)  # refuses a link, a conflict
                if not dest.exists():
                    _atomic_write(dest, raw)
            return dest
        return self.add_all([raw])[0]

    def add_all(self, raws: Sequence[bytes], *, names: Sequence[str] | None = None) -> list[Path]:
        """Store every one of ``raws`` (idempotent) and rebuild the index, all or nothing.

        Every envelope is read, every conflict found (:meth:`plan`) and the new index made before anything is
        written; then each new file goes in whole and the index last.  An error on the way (``OSError``, an
        interrupt) takes back the files and directories this call made, so the store is as it was.  All of it
        holds the store's lock (:meth:`locked`): another process's files stored meanwhile are never left out
        of the index.
        """
        self.plan(raws, names=names)  # a refusal of the inputs themselves before the store is touched (or made)
        with self.locked():  # the root and parents made for the lock go again (locked) when nothing is stored
            dests = self.plan(raws, names=names)  # again, now that no other process changes the store
            new = {dest: raw for dest, raw in zip(dests, raws, strict=True) if not dest.exists()}
            index = self.index_bytes(extra=new)  # every stored file is valid, or no index could be made
            made: list[Path] = []  # directories and files this call created, in order
            try:
                for dest, raw in new.items():
                    missing = [d for d in (dest.parent, *dest.parent.parents) if not d.exists()]
                    for d in reversed(missing):
                        d.mkdir()
                        made.append(d)
                    replace_whole(dest, raw, mode=0o600, exclusive=True)  # never over a file that appeared since
                    made.append(dest)
                _atomic_write(self.root / "index.json", index)
            except BaseException:
                for p in reversed(made):
                    with contextlib.suppress(OSError):
                        if p.is_dir() and not p.is_symlink():
                            p.rmdir()
                        else:
                            p.unlink()
                raise
        return dests

    def iter(self) -> Iterator[Path]:
        """Stored attestation files, sorted; files that do not follow the layout are skipped."""
        if not self.root.is_dir():
            return
        for d in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.is_symlink() and _DIR.match(p.name)):
            for f in sorted(d.iterdir()):
                if f.is_file() and not f.is_symlink() and _FILE.match(f.name):
                    yield f

    def find(self, digest: Digest) -> list[Path]:
        """Stored files whose directory is the given subject digest."""
        d = self.root / digest.filename_stem()
        if not d.is_dir() or d.is_symlink():
            return []
        return [f for f in sorted(d.iterdir()) if f.is_file() and not f.is_symlink() and _FILE.match(f.name)]

    def entries(self, *, extra: Mapping[Path, bytes] | None = None) -> list[StoredAttestation]:
        """The stored files, with ``extra`` (files about to be stored: path in the store -> bytes) among them."""
        out = []
        pending = dict(extra or {})
        files = sorted(
            {*self.iter(), *pending},
            key=lambda p: p.relative_to(self.root).as_posix(),
        )
        for p in files:
            raw = pending[p] if p in pending else p.read_bytes()
            try:
                fmt, stmt, _ = statement_of(raw)
            except VerificationError as e:  # name the stored file, not only what is wrong with it
                raise VerificationError(
                    "verify.store.entry_invalid",
                    f"{p} in the store is not a valid attestation ({e.code}: {e.message})",
                    evidence={"path": str(p), "cause": e.code},
                    advice=f"Move {p} out of the store (or restore it from version control), then run the command "
                    "again.",
                ) from None
            out.append(
                StoredAttestation(
                    path=p.relative_to(self.root).as_posix(),
                    subjects=tuple(
                        sorted(
                            "sha256:" + s["digest"]["sha256"].lower()
                            for s in stmt["subject"]
                            if "sha256" in s["digest"]
                        )
                    ),
                    predicate_type=stmt["predicateType"],
                    format=fmt,
                    sha256=hashlib.sha256(raw).hexdigest(),
                )
            )
        return out

    def index_bytes(self, *, extra: Mapping[Path, bytes] | None = None) -> bytes:
        doc = {"version": INDEX_VERSION, "attestations": [e.to_json() for e in self.entries(extra=extra)]}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")

    def rebuild_index(self) -> Path:
        """Regenerate ``index.json`` (sorted, deterministic) under the store's lock (reentrant: a caller that
        removed files under :meth:`locked` rebuilds in the same hold)."""
        dest = self.root / "index.json"
        with self.locked():
            _atomic_write(dest, self.index_bytes())
        return dest
