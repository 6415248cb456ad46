"""The repository's attestation store as evidence sees it: one qualification per adapter and fixture."""

from __future__ import annotations

from pathlib import Path

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify import AttestationStore
from ckptgate.verify.statement import field_at
from ckptgate.verify.store import statement_of


def supersede_qualifications(store: AttestationStore, digest: Digest, adapter: str) -> tuple[Path, ...]:
    """Remove earlier qualifications of the same adapter on the same fixture: their log is replaced."""
    removed = []
    for p in store.find(digest):
        try:
            _fmt, stmt, _ = statement_of(p.read_bytes())
        except VerificationError:
            continue
        if field_at(stmt, "predicate", "adapter", "name") == adapter:  # any shape, for unknown predicate types
            p.unlink()
            removed.append(p)
    return tuple(removed)


__all__ = ["supersede_qualifications"]
