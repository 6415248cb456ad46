"""EngineOptions and the trust data the engine and the verifier share (``ckptgate.decide.options``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptgate.decide.options import TRUST_IN_BUNDLE, EngineOptions, engine_for, load_trust, resolved, trust_file_in
from ckptgate.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("kwargs", "code"), [
    ({"timeout_s": 0.0}, "usage.opa_timeout"),
    ({"timeout_s": float("nan")}, "usage.opa_timeout"),
    ({"opa_url": "http://127.0.0.1:1", "trust_file": Path("t.json")}, "usage.trust_with_remote_opa"),
    ({"policy_key": Path("k.pem")}, "usage.policy_bundle"),
    # a bundle decides with its own trust data: --trust beside it was refused only once the engine
    # opened, so load_trust alone (qualify's verification) verified with the --trust file
    ({"policy_bundle": Path("b.tar.gz")}, "usage.policy_bundle"),
    ({"policy_bundle": Path("b.tar.gz"), "policy_key": Path("k.pem"), "trust_file": Path("t.json")},
     "usage.policy_bundle"),
    # a remote engine decides with its own policies: the decision would name a bundle that did not decide
    ({"opa_url": "http://127.0.0.1:1", "policy_bundle": Path("b.tar.gz"), "policy_key": Path("k.pem")},
     "usage.policy_bundle"),
    # an empty URL is not "no URL": the embedded engine decided while the decision named no input
    ({"opa_url": ""}, "usage.opa_url"),
    ({"opa_url": "  "}, "usage.opa_url"),
])
def test_bad_options_are_usage_errors(kwargs: dict, code: str) -> None:
    with pytest.raises(UsageError) as e:
        EngineOptions(**kwargs)
    assert e.value.code == code


def test_trust_is_read_from_the_policy_directory_the_engine_loads(tmp_path: Path) -> None:
    policies = REPO / "policies"
    assert trust_file_in(policies) == policies / TRUST_IN_BUNDLE
    from_dir = load_trust(EngineOptions(policy_dir=policies))
    assert from_dir.raw == trust_file_in(policies).read_bytes()
    assert EngineOptions().in_repo(REPO).policy_dir == policies
    assert EngineOptions(policy_dir=policies).in_repo(tmp_path).policy_dir == policies


def test_a_policy_bundle_that_is_not_a_bundle_is_a_usage_error(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.tar.gz"
    bundle.write_bytes(b"not a tarball")
    with pytest.raises(UsageError) as e:
        load_trust(EngineOptions(policy_bundle=bundle, policy_key=tmp_path / "k.pem"))
    assert e.value.code == "usage.policy_bundle"


def test_a_remote_engine_named_by_the_environment_is_the_one_the_options_describe(monkeypatch, tmp_path: Path) -> None:
    """$CKPTGATE_OPA_URL once switched the engine behind engine_for's back: a library caller's
    --trust (or overlay) was read and named in the decision as local trust while a remote engine
    decided, past the check that refuses --trust beside a remote engine."""
    monkeypatch.setenv("CKPTGATE_OPA_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("CKPTGATE_OPA_TOKEN", "t0ken")
    trust = REPO / "policies" / TRUST_IN_BUNDLE
    for call in (load_trust, lambda o: engine_for(o).__enter__()):
        with pytest.raises(UsageError) as e:
            call(EngineOptions(trust_file=trust))
        assert e.value.code == "usage.trust_with_remote_opa"
    options = resolved(EngineOptions())
    assert (options.opa_url, options.opa_token) == ("http://127.0.0.1:1", "t0ken")
    assert resolved(EngineOptions(opa_url="https://opa.example")).opa_url == "https://opa.example"
    monkeypatch.delenv("CKPTGATE_OPA_URL")
    assert resolved(EngineOptions()).opa_url is None


def test_the_policy_tree_is_read_once_and_the_bytes_that_decide_are_the_bytes_named(monkeypatch, policy_dir) -> None:
    """The policy tree was read three times (its input's digest, the bundle's revision, the staged
    copy): a file swapped between them decided while the decision and the receipt named the bytes
    before the swap.  Here the swap lands right after the one read, and changes nothing."""
    from ckptgate.decide import options as options_module
    from ckptgate.decide.bundle import policy_revision, read_policy_files

    root = policy_dir('package ckptgate.intake\n\ndecision := {"allow": false}\n')
    rego = root / "ckptgate" / "intake" / "intake.rego"
    before = policy_revision(root)

    def read_then_swap(tree: Path) -> dict[str, bytes]:
        files = read_policy_files(tree)
        rego.write_text('package ckptgate.intake\n\ndecision := {"allow": true}\n')
        return files

    monkeypatch.delenv("CKPTGATE_OPA_URL", raising=False)
    monkeypatch.setattr(options_module, "read_policy_files", read_then_swap)
    with engine_for(EngineOptions(policy_dir=root, trust_file=REPO / "policies" / TRUST_IN_BUNDLE)) as engine:
        raw = engine.evaluate("ckptgate/intake/decision", {})
    assert raw.result["allow"] is False
    (tree,) = [i for i in raw.inputs if i.role == "policy_tree"]
    assert tree.sha256 == before != policy_revision(root)


def test_the_engine_commands_ignore_ckptgate_trust_as_the_docs_say(monkeypatch, tmp_path: Path) -> None:
    """$CKPTGATE_TRUST is the default of `attest verify --trust` only: the engine's trust data is
    --trust, the configuration's, or the policy tree's (docs/user-guide.md#precedence)."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"signers": [{"kind": "key"}]}')
    monkeypatch.setenv("CKPTGATE_TRUST", str(bad))
    monkeypatch.delenv("CKPTGATE_OPA_URL", raising=False)
    monkeypatch.delenv("CKPTGATE_POLICIES", raising=False)
    policies = REPO / "policies"
    assert load_trust(EngineOptions(policy_dir=policies)).raw == trust_file_in(policies).read_bytes()
