"""Fixtures for evidence tests (see evidence_helpers)."""

from evidence_helpers import clone, qualified_repo  # noqa: F401  (pytest fixtures)
