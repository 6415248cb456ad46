from __future__ import annotations

import json

import pytest
from verify_helpers import UNSUPPORTED_CURVE_PUBLIC_PEM, public_pem, signer

from ckptgate.verify import TrustData, TrustDataError, trust_entry
from ckptgate.verify.trust import TRUST_ENV, default_trust_path


def _load(entries) -> TrustData:
    return TrustData.from_json(json.dumps({"signers": entries}).encode())


def _entry(**over):
    e = trust_entry(public_pem(signer()), signer_id="k", predicate_types=["t"])
    e.update(over)
    return e


def _code(entries) -> str:
    with pytest.raises(TrustDataError) as ei:
        _load(entries)
    return ei.value.code


def test_repo_trust_data_holds_the_ci_public_key_only() -> None:
    t = TrustData.from_file()
    assert [k.id for k in t.keys] == ["ci-qualification"]
    assert t.keys[0].algorithm == "ed25519"
    raw = default_trust_path().read_text()
    assert "PRIVATE" not in raw


def test_valid_entries_load() -> None:
    t = _load([_entry(), _entry(id="e", **{k: v for k, v in trust_entry(public_pem(signer("ecdsa-p256")),
                                                                       signer_id="e", predicate_types=["t"]).items()
                                           if k != "id"}),
               {"id": "s", "kind": "sigstore", "identity": "i", "issuer": "https://x", "predicate_types": ["t"],
                "producers": ["*"], "scopes": ["q"]}])
    assert [k.algorithm for k in t.keys] == ["ed25519", "ecdsa-p256"]
    assert t.sigstore[0].identity == "i"


@pytest.mark.parametrize("entries, code", [
    ([_entry(spki_sha256="00" * 32)], "verify.trust.spki_mismatch"),
    ([_entry(algorithm="ecdsa-p256")], "verify.trust.algorithm"),
    ([_entry(algorithm="rsa")], "verify.trust.algorithm"),
    ([_entry(public_key="not a pem")], "verify.trust.public_key"),
    # a curve cryptography knows by OID but does not support: UnsupportedAlgorithm, not an internal error
    ([_entry(public_key=UNSUPPORTED_CURVE_PUBLIC_PEM.decode())], "verify.trust.public_key"),
    ([_entry(kind="x509")], "verify.trust.kind"),
    ([_entry(), _entry()], "verify.trust.duplicate_id"),
    ([_entry(predicate_types=[])], "verify.trust.field"),
    ([_entry(id="")], "verify.trust.field"),
    ([_entry(id="   ")], "verify.trust.field"),  # what attest keygen --id refuses, the trust data refuses too
    ([_entry(id="ci\nsigner verified")], "verify.trust.field"),
    ([{"id": "s", "kind": "sigstore", "identity": "i", "predicate_types": ["t"], "producers": ["*"],
       "scopes": ["q"]}], "verify.trust.field"),
])
def test_bad_entries(entries, code) -> None:
    assert _code(entries) == code


def test_bad_documents(tmp_path) -> None:
    with pytest.raises(TrustDataError) as ei:
        TrustData.from_json(b'{"signers": [], "signers": []}')
    assert ei.value.code == "verify.trust.json"
    with pytest.raises(TrustDataError) as ei:
        TrustData.from_json(b'{"keys": []}')
    assert ei.value.code == "verify.trust.shape"
    with pytest.raises(TrustDataError) as ei:
        TrustData.from_file(tmp_path / "missing.json")
    assert ei.value.code == "verify.trust.unreadable"


def test_env_overrides_default_path(tmp_path, monkeypatch) -> None:
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"signers": []}))
    monkeypatch.setenv(TRUST_ENV, str(p))
    assert TrustData.from_file().keys == ()


def test_a_certificate_signer_needs_an_identity_and_a_root_fingerprint() -> None:
    entry = {"id": "release", "kind": "certificate", "identity": "ml@example.com", "root_sha256": "ab" * 32,
             "predicate_types": ["https://model_signing/signature/v1.0"], "producers": ["*"], "scopes": ["*"]}
    (c,) = TrustData.from_json(json.dumps({"signers": [entry]}).encode()).certificates
    assert (c.id, c.identity, c.root_sha256) == ("release", "ml@example.com", "ab" * 32)
    for bad in ({"root_sha256": "AB" * 32}, {"root_sha256": "ab"}, {"identity": ""}):
        with pytest.raises(TrustDataError) as e:
            TrustData.from_json(json.dumps({"signers": [{**entry, **bad}]}).encode())
        assert e.value.code == "verify.trust.field"


def test_builder_ids_is_an_optional_list_of_builder_ids() -> None:
    s = signer()
    entry = trust_entry(public_pem(s), signer_id="trainer", predicate_types=["https://slsa.dev/provenance/v1"],
                        scopes=["training_provenance"], builder_ids=["https://ci.example/trainer"])
    assert entry["builder_ids"] == ["https://ci.example/trainer"]
    (key,) = TrustData.from_json(json.dumps({"signers": [entry]}).encode()).keys
    assert key.builder_ids == ("https://ci.example/trainer",)
    without = {k: v for k, v in entry.items() if k != "builder_ids"}
    assert "builder_ids" not in trust_entry(public_pem(s), signer_id="t", predicate_types=["x"])
    (key,) = TrustData.from_json(json.dumps({"signers": [without]}).encode()).keys
    assert key.builder_ids == ()
    for bad in ([], "https://ci.example/trainer", [""]):
        with pytest.raises(TrustDataError) as e:
            TrustData.from_json(json.dumps({"signers": [{**entry, "builder_ids": bad}]}).encode())
        assert e.value.code == "verify.trust.field"
