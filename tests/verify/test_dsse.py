from __future__ import annotations

import base64
import json

import pytest

from ckptgate.errors import UsageError, VerificationError
from ckptgate.verify import dsse
from ckptgate.verify.dsse import Envelope, KeySigner, generate_keypair, pae, sign_statement, verify_envelope

from verify_helpers import STATEMENT, UNSUPPORTED_CURVE_PRIVATE_PEM, public_pem, signer, trust_for


def test_pae_matches_the_dsse_spec_example() -> None:
    # Example from the DSSE protocol spec.
    assert pae("http://example.com/HelloWorld", b"hello world") == \
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"


def test_pae_counts_bytes_not_characters() -> None:
    assert pae("t\u00e9", "\u00e9".encode()) == b"DSSEv1 3 t\xc3\xa9 2 \xc3\xa9"


@pytest.mark.parametrize("alg", ["ed25519", "ecdsa-p256"])
def test_round_trip(alg: str) -> None:
    s = signer(alg)
    env = Envelope.parse(sign_statement(STATEMENT, s))
    verified = verify_envelope(env, trust_for(s).keys)
    assert [v.key.algorithm for v in verified] == [alg]
    assert json.loads(env.payload) == STATEMENT


def test_key_signer_from_pem_and_env(tmp_path, monkeypatch) -> None:
    priv, pub = generate_keypair("ecdsa-p256")
    p = tmp_path / "k.pem"
    p.write_bytes(priv)
    s = KeySigner.from_pem(p)
    assert s.algorithm == "ecdsa-p256" and len(s.keyid) == 64
    monkeypatch.setenv(dsse.SIGNING_KEY_ENV, str(p))
    assert KeySigner.from_pem().keyid == s.keyid
    p.write_bytes(b"junk")
    with pytest.raises(UsageError) as ei:
        KeySigner.from_pem(p)
    assert ei.value.code == "usage.signing_key_invalid"
    p.write_bytes(UNSUPPORTED_CURVE_PRIVATE_PEM)  # UnsupportedAlgorithm from cryptography, not ValueError
    with pytest.raises(UsageError) as ei:
        KeySigner.from_pem(p)
    assert ei.value.code == "usage.signing_key_invalid"


def test_signer_protocol_is_open() -> None:
    class Remote:  # a KMS/PKCS#11 stand-in
        keyid = "kms://k1"
        algorithm = "ed25519"

        def __init__(self) -> None:
            self.inner = signer()

        def sign(self, data: bytes) -> bytes:
            return self.inner.sign(data)

    r = Remote()
    assert isinstance(r, dsse.Signer)
    env = Envelope.parse(sign_statement(STATEMENT, r))
    assert env.signatures[0].keyid == "kms://k1"
    assert verify_envelope(env, trust_for(r.inner).keys)[0].keyid_hint == "kms://k1"


def _doc(raw: bytes) -> dict:
    return json.loads(raw)


def _raw(doc: dict) -> bytes:
    return json.dumps(doc).encode()


def _code(fn) -> str:
    with pytest.raises(VerificationError) as ei:
        fn()
    return ei.value.code


def test_tampered_payload_is_bad_signature(ed_signer) -> None:
    d = _doc(sign_statement(STATEMENT, ed_signer))
    payload = base64.b64decode(d["payload"]).replace(b"passed", b"failed")
    d["payload"] = base64.b64encode(payload).decode()
    assert _code(lambda: verify_envelope(Envelope.parse(_raw(d)), trust_for(ed_signer).keys)) == \
        "verify.dsse.bad_signature"


def test_wrong_key_is_untrusted(ed_signer) -> None:
    other = signer()
    env = Envelope.parse(sign_statement(STATEMENT, other))
    assert _code(lambda: verify_envelope(env, trust_for(ed_signer).keys)) == "verify.key.untrusted"


def test_untrusted_key_with_trusted_keyid_is_refused(ed_signer) -> None:
    trusted = trust_for(ed_signer)
    impostor = signer(keyid=trusted.keys[0].spki_sha256)
    env = Envelope.parse(sign_statement(STATEMENT, impostor))
    with pytest.raises(VerificationError) as ei:
        verify_envelope(env, trusted.keys)
    assert ei.value.code == "verify.dsse.bad_signature"
    assert ei.value.evidence["keyid_hint_trusted"] == ["key-0"]


def test_keyid_is_only_a_hint(ed_signer) -> None:
    # A trusted key signing under a misleading keyid still verifies, as that key.
    other = signer()
    s = KeySigner.from_key(ed_signer.private_key, keyid="not-a-real-keyid")
    env = Envelope.parse(sign_statement(STATEMENT, s))
    assert [v.key.id for v in verify_envelope(env, trust_for(other, ed_signer).keys)] == ["key-1"]


def test_algorithm_swap_ed25519_sig_against_ecdsa_key(ec_signer, ed_signer) -> None:
    env = Envelope.parse(sign_statement(STATEMENT, KeySigner.from_key(ed_signer.private_key,
                                                                     keyid=ec_signer.keyid)))
    assert _code(lambda: verify_envelope(env, trust_for(ec_signer).keys)) == "verify.dsse.bad_signature"


def test_payload_type_confusion(ed_signer) -> None:
    payload = dsse.canonical_payload(STATEMENT)
    raw = dsse.sign_payload(payload, [ed_signer], payload_type="application/json")
    assert _code(lambda: Envelope.parse(raw)) == "verify.dsse.payload_type"
    # and a valid in-toto signature relabelled to another type no longer matches PAE either way
    d = _doc(sign_statement(STATEMENT, ed_signer))
    d["payloadType"] = "application/vnd.in-toto+json; charset=x"
    assert _code(lambda: Envelope.parse(_raw(d))) == "verify.dsse.payload_type"


def test_signature_over_payload_instead_of_pae(ed_signer) -> None:
    payload = dsse.canonical_payload(STATEMENT)
    d = {"payloadType": dsse.IN_TOTO_PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
         "signatures": [{"keyid": ed_signer.keyid, "sig": base64.b64encode(ed_signer.sign(payload)).decode()}]}
    assert _code(lambda: verify_envelope(Envelope.parse(_raw(d)), trust_for(ed_signer).keys)) == \
        "verify.dsse.signature_over_payload"


@pytest.mark.parametrize("sigs", [[], None, [{"sig": ""}], [{"keyid": "x", "sig": ""}]])
def test_unsigned_envelope_downgrade(ed_signer, sigs) -> None:
    d = _doc(sign_statement(STATEMENT, ed_signer))
    if sigs is None:
        del d["signatures"]
    else:
        d["signatures"] = sigs
    assert _code(lambda: Envelope.parse(_raw(d))) == "verify.dsse.unsigned"


def test_one_key_counts_once(ed_signer, ec_signer) -> None:
    payload = dsse.canonical_payload(STATEMENT)
    twice = Envelope.parse(dsse.sign_payload(payload, [ed_signer, ed_signer, ed_signer]))
    assert len(twice.signatures) == 3
    assert [v.key.id for v in verify_envelope(twice, trust_for(ed_signer).keys)] == ["key-0"]
    both = Envelope.parse(dsse.sign_payload(payload, [ed_signer, ec_signer, ed_signer]))
    assert [v.key.id for v in verify_envelope(both, trust_for(ed_signer, ec_signer).keys)] == ["key-0", "key-1"]


def test_one_trusted_signature_among_unknown_ones_verifies(ed_signer) -> None:
    payload = dsse.canonical_payload(STATEMENT)
    env = Envelope.parse(dsse.sign_payload(payload, [signer(), ed_signer]))
    assert [v.key.id for v in verify_envelope(env, trust_for(ed_signer).keys)] == ["key-0"]


def test_no_trusted_keys_at_all(ed_signer) -> None:
    env = Envelope.parse(sign_statement(STATEMENT, ed_signer))
    assert _code(lambda: verify_envelope(env, ())) == "verify.key.untrusted"


@pytest.mark.parametrize("raw, code", [
    (b"", "verify.json.malformed"),
    (b"\x00\xff garbage", "verify.json.not_utf8"),
    (b"[]", "verify.dsse.shape"),
    (b'{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": [], "x": 1}',
     "verify.dsse.shape"),
    (b'{"payloadType": "application/vnd.in-toto+json", "payload": 5, "signatures": []}', "verify.dsse.shape"),
    (b'{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": [{"sig": 1}]}',
     "verify.dsse.shape"),
    (b'{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": {"sig": "AA=="}}',
     "verify.dsse.shape"),
    (b'{"payloadType": "application/vnd.in-toto+json", "payload": "e30=", "signatures": [{"sig": "!!!"}]}',
     "verify.dsse.bad_base64"),
    (b'{"payloadType": "application/vnd.in-toto+json", "payload": "%%", "signatures": [{"sig": "AAAA"}]}',
     "verify.dsse.bad_base64"),
    (b'{"payloadType": "a", "payloadType": "application/vnd.in-toto+json", "payload": "", "signatures": []}',
     "verify.json.duplicate_key"),
    (b'{"payloadType": NaN}', "verify.json.malformed"),
])
def test_garbage_envelopes(raw: bytes, code: str) -> None:
    assert _code(lambda: Envelope.parse(raw)) == code


def test_truncated_envelope(ed_signer) -> None:
    raw = sign_statement(STATEMENT, ed_signer)
    for cut in (1, len(raw) // 3, len(raw) // 2, len(raw) - 3):
        assert _code(lambda: Envelope.parse(raw[:cut])) == "verify.json.malformed"


def test_very_large_envelope_refused_before_parsing() -> None:
    raw = b"{" + b" " * (dsse.MAX_ENVELOPE_BYTES + 1)
    assert _code(lambda: Envelope.parse(raw)) == "verify.dsse.too_large"


def test_too_many_signatures(ed_signer) -> None:
    d = _doc(sign_statement(STATEMENT, ed_signer))
    d["signatures"] = d["signatures"] * (dsse.MAX_SIGNATURES + 1)
    assert _code(lambda: Envelope.parse(_raw(d))) == "verify.dsse.too_many_signatures"


def test_url_safe_base64_accepted(ed_signer) -> None:
    d = _doc(sign_statement(STATEMENT, ed_signer))
    d["signatures"][0]["sig"] = base64.urlsafe_b64encode(base64.b64decode(d["signatures"][0]["sig"])).decode()
    assert verify_envelope(Envelope.parse(_raw(d)), trust_for(ed_signer).keys)


def test_sign_statement_refuses_invalid_statement(ed_signer) -> None:
    bad = json.loads(json.dumps(STATEMENT))
    bad["predicate"]["candidate_commit"] = "HEAD"
    assert _code(lambda: sign_statement(bad, ed_signer)) == "verify.statement.predicate_invalid"


def test_generate_keypair_rejects_unknown_algorithm() -> None:
    with pytest.raises(UsageError):
        generate_keypair("rsa")
    priv, pub = generate_keypair("ed25519")
    assert priv.startswith(b"-----BEGIN PRIVATE KEY-----") and pub.startswith(b"-----BEGIN PUBLIC KEY-----")
    assert public_pem(KeySigner.from_key(
        __import__("cryptography.hazmat.primitives.serialization", fromlist=["x"]).load_pem_private_key(
            priv, None))) == pub
