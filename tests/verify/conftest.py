"""Fixtures for attestation tests (helpers live in verify_helpers.py)."""

from __future__ import annotations

import pytest
from verify_helpers import signer

from ckptgate.verify import KeySigner


@pytest.fixture
def ed_signer() -> KeySigner:
    return signer("ed25519")


@pytest.fixture
def ec_signer() -> KeySigner:
    return signer("ecdsa-p256")
