"""The repository's attestation store as evidence sees it: one qualification per adapter, fixture and
environment kind (ckptgate's own, or one farm runtime lock)."""

from __future__ import annotations

from pathlib import Path

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.evidence.environment import runtime_lock
from ckptgate.verify import AttestationStore
from ckptgate.verify.statement import field_at
from ckptgate.verify.store import statement_of


def supersede_qualifications(
    store: AttestationStore, digest: Digest, adapter: str, *, runtime: str | None = None
) -> tuple[Path, ...]:
    """Remove earlier qualifications of the same adapter on the same fixture in the same environment
    kind (``runtime``: the farm runtime lock, None for ckptgate's own): their log is replaced.  A
    qualification in another runtime is another row and stays.  Call it inside ``store.locked()`` with the
    :meth:`~AttestationStore.add` that stores the new one, so the index is rebuilt in the same hold."""
    removed = []
    with store.locked():  # the caller stores the new one (and the index) in the same hold
        for p in store.find(digest):
            try:
                _fmt, stmt, _ = statement_of(p.read_bytes())
            except VerificationError:
                continue
            same_adapter = field_at(stmt, "predicate", "adapter", "name") == adapter  # any shape, for unknown types
            if same_adapter and runtime_lock(field_at(stmt, "predicate", "environment")) == runtime:
                p.unlink()
                removed.append(p)
    return tuple(removed)


__all__ = ["supersede_qualifications"]
