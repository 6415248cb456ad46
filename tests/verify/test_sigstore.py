"""Sigstore bundles against the public sigstore-conformance vectors (read in place from ../shared).

Verdicts per case are listed in docs/attestations.md.  Cases that need the production root use the
root embedded in sigstore-python (``Verifier.production(offline=True)``; no network).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from verify_helpers import NOW, trust_for

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify import TrustData, verify_attestation
from ckptgate.verify.sigstore import PRODUCTION, verify_bundle_artifact, verify_bundle_dsse

ASSETS = Path(__file__).resolve().parents[3] / "shared" / "vectors" / "sigstore-conformance" / "test" / "assets"
VECTORS = ASSETS / "bundle-verify"
IDENTITY = ("https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/"
            "extremely-dangerous-oidc-beacon.yml@refs/heads/main")
ISSUER = "https://token.actions.githubusercontent.com"

# Happy-path cases that sigstore-python 4.5.1 itself cannot verify (library limits, documented):
LIBRARY_LIMITS = {
    "intoto-with-custom-trust-root": "intoto/0.0.2 log entries: 'Integrated time only supported for dsse/hashedrekord "
                                     "0.0.1 types'",
    "managed-key-happy-path": "public-key (managed key) bundles are not supported by sigstore-python",
    "managed-key-and-trusted-root": "public-key (managed key) bundles are not supported by sigstore-python",
    "trust-root-tsa-validity-end-inclusive": "sigstore-python treats the TSA validity end as exclusive",
}

pytestmark = pytest.mark.skipif(not VECTORS.is_dir(), reason="conformance vectors not present at ../shared")


def _cases() -> list[str]:
    return sorted(p.name for p in VECTORS.iterdir() if p.is_dir()) if VECTORS.is_dir() else []


def _is_dsse(case: Path) -> bool:
    try:
        return "dsseEnvelope" in json.loads((case / "bundle.sigstore.json").read_bytes())
    except ValueError:
        return False


def _root(case: Path) -> Path | str:
    return case / "trusted_root.json" if (case / "trusted_root.json").exists() else PRODUCTION


def _identity(case: Path) -> tuple[str, str]:
    if (case / "identity").exists():
        return (case / "identity").read_text().strip(), (case / "issuer").read_text().strip()
    return IDENTITY, ISSUER


def _artifact(case: Path) -> bytes:
    return (case / "artifact").read_bytes() if (case / "artifact").exists() else (ASSETS / "a.txt").read_bytes()


def _subject_digest(case: Path) -> Digest:
    return Digest.from_hex(hashlib.sha256(_artifact(case)).hexdigest())


def _verify_case(name: str):
    case = VECTORS / name
    raw = (case / "bundle.sigstore.json").read_bytes()
    if _is_dsse(case):
        return verify_attestation(raw, source=name, trust=trust_for(), measured_digest=_subject_digest(case),
                                  now=NOW, sigstore_trust_root=_root(case), expected_identity=_identity(case))
    return verify_bundle_artifact(raw, _artifact(case), trust_root=_root(case), identities=[_identity(case)])


@pytest.mark.parametrize("name", [n for n in _cases() if n.endswith("_fail")])
def test_fail_vectors_are_rejected(name: str) -> None:
    with pytest.raises(VerificationError) as ei:
        _verify_case(name)
    assert ei.value.code.startswith("verify.")


@pytest.mark.parametrize("name", [n for n in _cases() if not n.endswith("_fail") and n not in LIBRARY_LIMITS])
def test_happy_vectors_verify(name: str) -> None:
    res = _verify_case(name)
    if _is_dsse(VECTORS / name):
        f = res.to_facts()
        assert f["verification"]["method"] == "sigstore"
        assert f["signers"][0]["identity"] == IDENTITY and f["signers"][0]["issuer"] == ISSUER
        assert f["signers"][0]["extensions"]["issuer"] == ISSUER
        assert f["verification"]["subject_matches_fixture"] is True
    else:
        assert res.identity == IDENTITY and res.payload is None


@pytest.mark.parametrize("name", sorted(LIBRARY_LIMITS))
def test_library_limited_vectors_fail_closed(name: str) -> None:
    # sigstore-python cannot verify these; we must fail closed with a typed code, never pass them.
    with pytest.raises(VerificationError) as ei:
        _verify_case(name)
    assert ei.value.code in {"verify.sigstore.failed", "verify.sigstore.invalid_bundle"}


def test_dsse_bundle_subject_is_bound_by_us() -> None:
    case = VECTORS / "rekor2-dsse-happy-path"
    raw = (case / "bundle.sigstore.json").read_bytes()
    # sigstore's verify_dsse passes; our subject binding must still refuse another digest.
    res = verify_bundle_dsse(raw, trust_root=case / "trusted_root.json", identities=[(IDENTITY, ISSUER)])
    assert res.payload_type == "application/vnd.in-toto+json"
    with pytest.raises(VerificationError) as ei:
        verify_attestation(raw, source="b", trust=trust_for(), measured_digest=Digest.from_hex("00" * 32), now=NOW,
                           sigstore_trust_root=case / "trusted_root.json", expected_identity=(IDENTITY, ISSUER))
    assert ei.value.code == "verify.statement.subject_mismatch"


def test_identity_policy_from_trust_data_and_mismatch() -> None:
    case = VECTORS / "rekor2-dsse-happy-path"
    raw = (case / "bundle.sigstore.json").read_bytes()
    good = trust_for(sigstore=[{"id": "beacon", "kind": "sigstore", "identity": IDENTITY, "issuer": ISSUER,
                                "predicate_types": ["https://slsa.dev/provenance/v1"], "producers": ["*"],
                                "scopes": ["qualification"]}])
    va = verify_attestation(raw, source="b", trust=good, measured_digest=_subject_digest(case), now=NOW,
                            sigstore_trust_root=case / "trusted_root.json")
    assert va.signers[0].signer_id == "beacon"
    for ident, iss in [(IDENTITY, "https://accounts.google.com"), ("https://evil.example/wf@refs/heads/main", ISSUER)]:
        with pytest.raises(VerificationError) as ei:
            verify_attestation(raw, source="b", trust=TrustData(keys=(), sigstore=(), source="t"),
                               measured_digest=_subject_digest(case), now=NOW,
                               sigstore_trust_root=case / "trusted_root.json", expected_identity=(ident, iss))
        assert ei.value.code == "verify.sigstore.identity_mismatch"
    with pytest.raises(VerificationError) as ei:
        verify_attestation(raw, source="b", trust=trust_for(), measured_digest=_subject_digest(case), now=NOW,
                           sigstore_trust_root=case / "trusted_root.json")
    assert ei.value.code == "verify.sigstore.no_identity_policy"


def test_message_signature_bundle_is_not_an_attestation() -> None:
    case = VECTORS / "rekor2-happy-path"
    with pytest.raises(VerificationError) as ei:
        verify_attestation((case / "bundle.sigstore.json").read_bytes(), source="b", trust=trust_for(),
                           measured_digest=_subject_digest(case), now=NOW,
                           sigstore_trust_root=case / "trusted_root.json", expected_identity=(IDENTITY, ISSUER))
    assert ei.value.code == "verify.sigstore.not_dsse"


def test_dsse_bundle_against_the_wrong_root() -> None:
    case = VECTORS / "rekor2-dsse-happy-path"
    with pytest.raises(VerificationError) as ei:
        verify_attestation((case / "bundle.sigstore.json").read_bytes(), source="b", trust=trust_for(),
                           measured_digest=_subject_digest(case), now=NOW, sigstore_trust_root=PRODUCTION,
                           expected_identity=(IDENTITY, ISSUER))
    assert ei.value.code == "verify.sigstore.failed"


def test_unreadable_trust_root(tmp_path) -> None:
    case = VECTORS / "rekor2-dsse-happy-path"
    (tmp_path / "root.json").write_text("{}")
    for root in (tmp_path / "missing.json", tmp_path / "root.json"):
        with pytest.raises(VerificationError) as ei:
            verify_attestation((case / "bundle.sigstore.json").read_bytes(), source="b", trust=trust_for(),
                               measured_digest=_subject_digest(case), now=NOW, sigstore_trust_root=root,
                               expected_identity=(IDENTITY, ISSUER))
        assert ei.value.code == "verify.sigstore.trust_root"
