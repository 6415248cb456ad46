"""The one strict JSON parser (``ckptgate._json``): every refusal, its order, and the typed adapters."""

from __future__ import annotations

import pytest

from ckptgate._json import MAX_DEPTH, JSONRejected, depth, loads_strict, verify_error
from ckptgate.errors import VerificationError


def _kind(raw: bytes | str, **kw: object) -> str:
    with pytest.raises(JSONRejected) as ei:
        loads_strict(raw, what="t", **kw)  # type: ignore[arg-type]
    return ei.value.kind


def test_accepts_a_plain_document_from_bytes_and_text() -> None:
    assert loads_strict(b'{"a": [1, 2.5, "x", null, true]}', what="t") == {"a": [1, 2.5, "x", None, True]}
    assert loads_strict('{"\u00e9": 1}', what="t", max_bytes=9) == {"\u00e9": 1}


@pytest.mark.parametrize(("raw", "kind"), [
    (b'{"a": 1, "a": 2}', "duplicate_key"),
    (b'[{"b": {"c": 1, "c": 1}}]', "duplicate_key"),
    (b'[NaN]', "malformed"), (b'[Infinity]', "malformed"), (b'[-Infinity]', "malformed"),
    (b'[1e400]', "malformed"), (b'{"a": -1.5e309}', "malformed"),  # overflow to +-inf: Infinity by another name
    (b'{"a": 1', "malformed"), (b'{"a": 1} x', "malformed"), (b'\xef\xbb\xbf{}', "malformed"),
    (b'{"a": "\xff"}', "not_utf8"),
    (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
])
def test_refusals(raw: bytes, kind: str) -> None:
    assert _kind(raw) == kind


def test_finite_numbers_and_big_integers_are_kept_exactly() -> None:
    assert loads_strict(b"[1e308, -2.5e-400, 1.0]", what="t") == [1e308, -0.0, 1.0]
    assert loads_strict(b"[" + b"9" * 400 + b"]", what="t") == [int("9" * 400)]  # an int never overflows


def test_size_is_checked_first_and_counts_bytes_of_text_too() -> None:
    assert _kind(b'{"a": 1, "a": 2}', max_bytes=4) == "too_large"
    assert _kind(b"\xff" * 10, max_bytes=4) == "too_large"
    assert _kind('"\u00e9\u00e9"', max_bytes=5) == "too_large"  # 4 characters, 6 bytes
    assert loads_strict('"\u00e9\u00e9"', what="t", max_bytes=6) == "\u00e9\u00e9"


def test_depth_cap_boundary_and_none() -> None:
    ok = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    assert loads_strict(ok, what="t") is not None
    assert _kind(deep) == "too_deep"
    assert loads_strict(deep, what="t", max_depth=None) is not None
    assert _kind(b"[[[]]]", max_depth=2) == "too_deep"
    assert depth([[[]]]) == 3 and depth(1) == 0 and depth({"a": [{}]}) == 3
    assert depth([[[[[]]]]], cap=2) == 3


def test_verify_error_keeps_the_verify_codes_and_evidence() -> None:
    def code(raw: bytes, **kw: object) -> VerificationError:
        with pytest.raises(VerificationError) as ei:
            loads_strict(raw, what="statement", max_bytes=1 << 20, error=verify_error, **kw)  # type: ignore[arg-type]
        return ei.value

    e = code(b'{"k": 1, "k": 2}')
    assert e.code == "verify.json.duplicate_key" and e.evidence == {"what": "statement", "key": "k"}
    assert code(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)).code == "verify.json.too_deep"
    assert code(b"[NaN]").code == "verify.json.malformed"
    assert code(b"\xff").evidence == {"what": "statement", "offset": 0}
    with pytest.raises(VerificationError) as ei:
        loads_strict(b"[1]", what="t", max_bytes=2, error=verify_error)
    assert ei.value.code == "verify.json.too_large" and ei.value.evidence == {"what": "t", "size": 3, "cap": 2}


@pytest.mark.parametrize("raw", [
    rb'{"a": "\ud800"}',  # a high surrogate alone
    rb'{"a": "\uDBFF"}',  # upper case, the last high
    rb'{"a": "\udc00"}',  # a low surrogate alone
    rb'{"a": "x\ud800y"}',  # inside a string
    rb'{"a": "\ud800\ud800"}',  # high then high
    rb'{"a": "\udc00\ud800"}',  # low then high: the wrong order is no pair
    rb'{"a": "\ud800\u0041"}',  # high then a non-surrogate
    rb'{"\ud800": 1}',  # in a key
    rb'[1, {"b": [{"c": "\udfff"}]}]',  # nested in arrays and objects
    rb'"\ud800"',  # the whole document
])
def test_a_lone_surrogate_is_malformed(raw: bytes) -> None:
    with pytest.raises(JSONRejected) as ei:
        loads_strict(raw, what="config.json")
    assert ei.value.kind == "malformed" and "lone surrogate" in ei.value.message
    assert _kind(raw.decode()) == "malformed"  # text the caller decoded too


def test_a_surrogate_pair_and_escaped_backslashes_are_accepted() -> None:
    assert loads_strict(rb'{"a": "\ud83d\ude00"}', what="t") == {"a": "\U0001f600"}  # a pair: one character
    assert loads_strict(rb'{"a": "\\ud800"}', what="t") == {"a": "\\ud800"}  # a backslash, then text
    assert loads_strict(rb'{"\ud83d\ude00": "\uD83D\uDE00"}', what="t") == {"\U0001f600": "\U0001f600"}


def test_a_lone_surrogate_in_text_the_caller_decoded_is_malformed() -> None:
    assert _kind('{"a": "\ud800"}') == "malformed"  # the character itself, not an escape
    assert code_of('{"a": "\udc00"}') == "verify.json.malformed"


def code_of(raw: str) -> str:
    with pytest.raises(VerificationError) as ei:
        loads_strict(raw, what="statement", error=verify_error)
    return ei.value.code


def test_intake_refuses_a_checkpoint_whose_config_json_holds_a_lone_surrogate(tmp_path) -> None:
    """End to end: exit 4 (input rejected), an ``input.*`` code, nothing published."""
    import json
    import shutil
    from pathlib import Path

    from ckptgate.errors import ExitCode
    from tests.pipeline_helpers import ckptgate_json, demo_attested

    src = tmp_path / "ckpt"
    shutil.copytree(Path(__file__).parent / "fixtures" / "data" / "hf_sharded" / "checkpoint", src)
    (src / "config.json").write_bytes(rb'{"model_type": "llama", "name": "\ud800"}')
    att = demo_attested(src, tmp_path)
    out = tmp_path / "out"
    proc = ckptgate_json("intake", src, "--out", out, "--attestation", att.attestation, "--trust", att.trust)
    assert proc.returncode == ExitCode.INPUT_REJECTED, proc.stdout + proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert err["code"].startswith("input.") and err["exit_code"] == 4
    assert '"code": "json.invalid", "path": "config.json"' in json.dumps(err, sort_keys=True)
    assert not out.exists()
