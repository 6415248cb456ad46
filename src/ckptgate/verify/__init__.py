"""Attestations: DSSE with keys and Sigstore bundles, verified strictly, handed to policy as facts.

Python checks the cryptography and raises :class:`~ckptgate.errors.VerificationError` (``verify.*``
codes); Rego decides what verified facts mean.  See ``docs/attestations.md``.
"""

from ckptgate.errors import VerificationError
from ckptgate.verify.dsse import (
    IN_TOTO_PAYLOAD_TYPE,
    Envelope,
    KeySigner,
    Signer,
    generate_keypair,
    pae,
    sign_payload,
    sign_statement,
    trust_entry,
    verify_envelope,
)
from ckptgate.verify.facts import SignerFacts, VerifiedAttestation, rejection_facts, verify_attestation
from ckptgate.verify.statement import (
    PROVENANCE_PREDICATE_TYPE,
    QUALIFICATION_PREDICATE_TYPE,
    STATEMENT_TYPE,
    check_statement,
)
from ckptgate.verify.store import AttestationStore
from ckptgate.verify.trust import TrustData, TrustDataError, TrustedIdentity, TrustedKey

__all__ = [
    "IN_TOTO_PAYLOAD_TYPE",
    "PROVENANCE_PREDICATE_TYPE",
    "QUALIFICATION_PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "AttestationStore",
    "Envelope",
    "KeySigner",
    "Signer",
    "SignerFacts",
    "TrustData",
    "TrustDataError",
    "TrustedIdentity",
    "TrustedKey",
    "VerificationError",
    "VerifiedAttestation",
    "check_statement",
    "generate_keypair",
    "pae",
    "rejection_facts",
    "sign_payload",
    "sign_statement",
    "trust_entry",
    "verify_attestation",
    "verify_envelope",
]
