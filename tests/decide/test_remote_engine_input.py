"""A remote OPA (``--opa-url``, ``$CKPTGATE_OPA_URL``) is named as an input of every decision it makes:
role ``remote_engine``, its URL without credentials, path or query, who named it, and the bundle
revision it reported; the receipt and the report say a remote engine decided, and which."""

from __future__ import annotations

import json
import textwrap

import pytest

from ckptgate.decide import Decision
from ckptgate.decide.decision import decision_from_json, parse_decision
from ckptgate.decide.engine import EmbeddedOpa, RemoteOpa, open_engine, remote_engine_name
from ckptgate.decide.inputs import DecisionInput, sha256_of
from ckptgate.decide.options import EngineOptions, decision_inputs, resolved
from ckptgate.errors import EngineUnavailable
from ckptgate.receipt import engine_of
from tests.opa_front import tcp_front

ALLOW = textwrap.dedent("""\
    package ckptgate.intake

    decision := {"allow": true, "plane": "pure_data", "permitted_loaders": ["safetensors"],
                 "required_controls": [], "reasons": [], "refusal": null, "echo": input.decision_inputs}
    """)
SECRET_URL = "https://alice:s3cret@opa.example:8443/some/path?token=t0ken#frag"


def test_the_remote_engine_is_a_decision_input_named_without_credentials(monkeypatch) -> None:
    monkeypatch.delenv("CKPTGATE_OPA_URL", raising=False)
    (named,) = [i for i in decision_inputs(EngineOptions(opa_url=SECRET_URL), None, {}) if i.role != "configuration"]
    assert named == DecisionInput(
        role="remote_engine",
        path="https://opa.example:8443",
        origin="explicit",
        sha256=sha256_of(b"https://opa.example:8443"),
    )
    shown = json.dumps(named.to_json())
    assert "s3cret" not in shown and "t0ken" not in shown and "alice" not in shown
    assert named.to_json()["revision"] is None  # asked for on every decision; none is known before one
    # no local policy tree is named beside it: the server's decided
    assert not any(i.role == "policy_tree" for i in decision_inputs(EngineOptions(opa_url=SECRET_URL), None, {}))


def test_a_remote_engine_from_the_environment_is_named_so(monkeypatch) -> None:
    monkeypatch.setenv("CKPTGATE_OPA_URL", "https://opa.example")
    options = resolved(EngineOptions())
    (named,) = decision_inputs(options, None, {})
    assert (named.role, named.path, named.origin) == ("remote_engine", "https://opa.example:443", "environment")


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://opa.example", "https://opa.example:443"),
        ("http://user:pw@127.0.0.1:8181/v1?x=1", "http://127.0.0.1:8181"),
        ("http://[::1]:8181", "http://[::1]:8181"),
        ("https://OPA.Example:9443/", "https://opa.example:9443"),
    ],
)
def test_the_name_of_a_remote_engine_is_scheme_host_and_port(url: str, name: str) -> None:
    assert remote_engine_name(url) == name


def test_a_bad_remote_url_is_refused_without_quoting_its_credentials() -> None:
    for url, code in (("ftp://bob:pw@opa.example/?token=t0ken", "engine.remote.bad_url"),
                      ("http://bob:pw@opa.example/?token=t0ken", "engine.remote.insecure")):
        with pytest.raises(EngineUnavailable) as e:
            remote_engine_name(url)
        assert e.value.code == code
        assert "pw" not in e.value.message and "t0ken" not in e.value.message
        assert "opa.example" in e.value.message


def test_a_remote_decision_names_the_engine_and_the_revision_it_reported(policy_dir, monkeypatch) -> None:
    monkeypatch.delenv("CKPTGATE_OPA_URL", raising=False)
    with EmbeddedOpa(policy_dir=policy_dir(ALLOW)) as server, tcp_front(server) as port:
        token = server._client.headers["Authorization"].split()[1]
        url = f"http://someone:pw@127.0.0.1:{port}/?q=1"
        options = EngineOptions(opa_url=url)
        remote = open_engine(opa_url=url, opa_token=token, inputs=decision_inputs(options, None, {}))
        try:
            raw = remote.evaluate("ckptgate/intake/decision", {})
        finally:
            remote.close()
        served_revision = server.evaluate("ckptgate/intake/decision", {}).policy_revision
    name = f"http://127.0.0.1:{port}"
    (named,) = raw.inputs
    assert (named.role, named.path, named.origin) == ("remote_engine", name, "explicit")
    assert named.revision == raw.policy_revision == served_revision  # what the server reported
    # the policies see it too (without the per-decision revision, which comes with the answer)
    assert raw.result["echo"] == [{**named.to_json(), "revision": None}]
    decision = parse_decision(raw)
    assert decision.remote and decision.remote_engine == named
    assert decision.engine_json("1.0.0") == {"kind": "remote", "url": name, "revision": served_revision}
    # a rank that receives the decision as JSON reads the same inputs back
    assert decision_from_json(decision.to_json()).inputs == decision.inputs


def test_a_remote_engine_opened_without_named_inputs_still_names_itself(policy_dir, monkeypatch) -> None:
    with EmbeddedOpa(policy_dir=policy_dir(ALLOW)) as server, tcp_front(server) as port:
        token = server._client.headers["Authorization"].split()[1]
        monkeypatch.setenv("CKPTGATE_OPA_URL", f"http://127.0.0.1:{port}")
        remote = open_engine(opa_token=token)
        try:
            assert isinstance(remote, RemoteOpa)
            raw = remote.evaluate("ckptgate/intake/decision", {})
        finally:
            remote.close()
    (named,) = raw.inputs
    assert (named.role, named.origin) == ("remote_engine", "environment")


def _decision(engine: str, inputs: tuple[DecisionInput, ...] = ()) -> Decision:
    return Decision(allow=True, plane="pure_data", permitted_loaders=("safetensors",), required_controls=(),
                    reasons=(), decision_id="d", policy_revision="r", engine=engine, inputs=inputs)


def test_a_receipt_reader_tells_a_remote_decision_from_an_embedded_one() -> None:
    remote_input = DecisionInput(role="remote_engine", path="https://opa.example:443", origin="explicit",
                                 sha256=sha256_of(b"https://opa.example:443"), revision="rev-7")
    remote = _decision("https://opa.example:443", (remote_input,))
    embedded = _decision("embedded OPA (pid 1, 127.0.0.1:8181)")
    assert remote.engine_json(None) == {"kind": "remote", "url": "https://opa.example:443", "revision": "rev-7"}
    assert embedded.engine_json("1.4.2") == {"kind": "embedded", "opa_version": "1.4.2"}
    # a receipt with its engine record, and one from before it (inputs, or the decision's engine alone)
    assert engine_of({"engine": remote.engine_json(None)})["kind"] == "remote"
    assert engine_of({"inputs": [remote_input.to_json()], "decision": {"engine": "x"}}) == {
        "kind": "remote", "url": "https://opa.example:443", "revision": "rev-7"}
    assert engine_of({"decision": {"engine": "https://opa.example:443"}})["kind"] == "remote"
    assert engine_of({"decision": {"engine": embedded.engine}, "opa_version": "1.4.2"}) == {
        "kind": "embedded", "opa_version": "1.4.2"}
    assert engine_of([]) is None


def test_only_a_remote_engine_reports_a_revision() -> None:
    with pytest.raises(ValueError, match="only a remote engine"):
        DecisionInput(role="trust", path="t.json", origin="explicit", sha256=sha256_of(b""), revision="r")
    assert "revision" not in DecisionInput(role="trust", path="t.json", origin="explicit",
                                           sha256=sha256_of(b"")).to_json()


def test_a_remote_decision_names_the_local_trust_python_verified_signatures_with(policy_dir, monkeypatch) -> None:
    """Python checks every signature against the local trust data, whichever engine decides: a key missing
    there leaves a signature unverified, so that file shapes a remote decision too and is named in it."""
    from ckptgate.decide.options import engine_for, load_trust

    monkeypatch.delenv("CKPTGATE_OPA_URL", raising=False)
    with EmbeddedOpa(policy_dir=policy_dir(ALLOW)) as server, tcp_front(server) as port:
        token = server._client.headers["Authorization"].split()[1]
        options = EngineOptions(opa_url=f"http://127.0.0.1:{port}", opa_token=token)
        trust = load_trust(options)
        with engine_for(options) as remote:
            raw = remote.evaluate("ckptgate/intake/decision", {})
    roles = {i.role: i for i in raw.inputs}
    assert set(roles) == {"remote_engine", "trust"}
    assert roles["trust"].sha256 == sha256_of(trust.raw) and roles["trust"].origin == "bundled"


@pytest.mark.parametrize(
    "url",
    [
        "//bob:s3cret@opa.example:8181",
        "bob:s3cret@opa.example:8181",
        "https:/bob:s3cret@opa.example",
        "https://bob:s3/cret@opa.example:8181",
        "https://bob:s3?cret@opa.example:8181",
        "https://bob:s3#cret@opa.example:8181",
    ],
)
def test_a_malformed_remote_url_is_refused_without_any_part_of_its_password(url: str) -> None:
    """A URL with no ``://`` (or a password holding ``/``, ``?``, ``#``) was quoted whole, or up to the
    ``?``, in the engine.remote.bad_url message and advice."""
    with pytest.raises(EngineUnavailable) as e:
        remote_engine_name(url)
    assert e.value.code == "engine.remote.bad_url"
    shown = e.value.diagnostics()
    assert "s3" not in shown and "cret" not in shown and "bob" not in shown
