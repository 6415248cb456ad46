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
    store: AttestationStore, digest: Digest, adapter: str, *, keep: Path, runtime: str | None = None
) -> tuple[Path, ...]:
    """Remove the qualifications of the same adapter on the same fixture in the same environment kind
    (``runtime``: the farm runtime lock, None for ckptgate's own) other than ``keep``, the new one, already
    stored: their log is replaced.  A qualification in another runtime is another row and stays.  Call it
    inside ``store.locked()`` right after the :meth:`~AttestationStore.add` that stored ``keep``: a store
    that fails then leaves the old ones in place, never the fixture without a qualification.  The index is
    rebuilt without the removed ones in the same hold."""
    removed = []
    with store.locked():  # the caller stored the new one in the same hold
        for p in store.find(digest):
            if p == keep:
                continue
            try:
                _fmt, stmt, _ = statement_of(p.read_bytes())
            except VerificationError:
                continue
            same_adapter = field_at(stmt, "predicate", "adapter", "name") == adapter  # any shape, for unknown types
            if same_adapter and runtime_lock(field_at(stmt, "predicate", "environment")) == runtime:
                p.unlink()
                removed.append(p)
        if removed:
            store.rebuild_index()
    return tuple(removed)


__all__ = ["supersede_qualifications"]
