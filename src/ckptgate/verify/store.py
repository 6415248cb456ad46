"""``attestations/``: one file per statement, named by subject digest, plus a deterministic index.

Layout::

    attestations/
      index.json                                   # regenerated, sorted, no timestamps
      sha256-<subject hex>/<slug>-<payload sha256[:16]>.dsse.json      # DSSE envelope (keys)
      sha256-<subject hex>/<slug>-<payload sha256[:16]>.sigstore.json  # Sigstore bundle

Storing is not trusting: :meth:`AttestationStore.add` checks structure only; verify at use.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate._json import loads_strict, verify_error
from ckptgate.digest import Digest
from ckptgate.errors import UsageError, VerificationError
from ckptgate.userfiles import replace_whole
from ckptgate.verify import dsse
from ckptgate.verify.facts import MAX_PAYLOAD_BYTES, read_envelope
from ckptgate.verify.statement import check_statement

INDEX_VERSION = 1
_DIR = re.compile(r"^sha256-[0-9a-f]{64}$")
_FILE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,80}-[0-9a-f]{16}\.(dsse|sigstore)\.json$")


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

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path_for(self, raw: bytes) -> Path:
        """Where ``raw`` belongs (first subject's digest, predicate slug, payload digest); refused where the
        subject's directory is a link or not a directory, or another file is already there
        (``verify.store.conflict``): checked for every envelope before any is stored."""
        fmt, stmt, payload = statement_of(raw)
        sha = stmt["subject"][0]["digest"].get("sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
            raise VerificationError("verify.store.no_sha256_subject", "the first subject has no sha256 digest")
        name = f"{predicate_slug(stmt['predicateType'])}-{hashlib.sha256(payload).hexdigest()[:16]}.{fmt}.json"
        dest = self.root / Digest.from_hex(sha.lower()).filename_stem() / name
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
            raise VerificationError(
                "verify.store.conflict",
                f"{dest} already holds a different envelope for the same statement",
                evidence={"path": str(dest)},
            )
        return dest

    def add(self, raw: bytes, *, reindex: bool = True) -> Path:
        """Store ``raw`` (idempotent) and rebuild the index; a different file at the same name is an error."""
        dest = self.path_for(raw)  # refuses a link, a conflict
        if not dest.exists():
            _atomic_write(dest, raw)
        if reindex:
            self.rebuild_index()
        return dest

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

    def entries(self) -> list[StoredAttestation]:
        out = []
        for p in self.iter():
            raw = p.read_bytes()
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

    def index_bytes(self) -> bytes:
        doc = {"version": INDEX_VERSION, "attestations": [e.to_json() for e in self.entries()]}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")

    def rebuild_index(self) -> Path:
        """Regenerate ``index.json`` (sorted, deterministic)."""
        dest = self.root / "index.json"
        _atomic_write(dest, self.index_bytes())
        return dest
