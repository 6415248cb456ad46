"""The enforce step: each check once (allow, for these bytes, loaders permitted), one permit, the
worker only when files need a framework load."""

from __future__ import annotations

import dataclasses

import pytest

from ckptgate.decide.decision import parse_decision
from ckptgate.decide.engine import RawDecision
from ckptgate.digest import Digest, fixture_digest
from ckptgate.enforce import gate, permit
from ckptgate.enforce.gate import Enforcement, enforce
from ckptgate.enforce.load import LoadedTrees, WorkerOptions
from ckptgate.errors import ExitCode, PolicyDenied
from ckptgate.inspect import SafeTree, inspect_open_tree
from tests.fixtures.catalog import checkpoint_dir

OTHER = Digest.parse("sha256:" + "0" * 64)


def _decision(loaders=("safetensors", "json"), *, allow=True, refusal="policy", digest=None):
    result = {"allow": allow, "plane": ("framework" if "torch_load" in loaders else "pure_data") if allow else None,
              "permitted_loaders": list(loaders) if allow else [], "required_controls": [],
              "reasons": [{"code": "ok" if allow else "attestation_missing", "message": "no attestation",
                           "evidence": {}}],
              "refusal": None if allow else refusal}
    raw = RawDecision(result=result, decision_id="d", policy_revision="r", engine="t")
    return dataclasses.replace(parse_decision(raw), fixture_digest=digest)


@pytest.fixture
def hf():
    with SafeTree.open(checkpoint_dir("hf_sharded")) as tree:
        yield tree, inspect_open_tree(tree), fixture_digest(tree)


@pytest.fixture
def no_permit(monkeypatch):
    """Fails the test if a permit is minted."""
    minted = []
    monkeypatch.setattr(permit, "issue_permit", lambda *a, **k: minted.append(a) or pytest.fail("a permit was minted"))
    return minted


@pytest.fixture
def no_worker(monkeypatch):
    """Fails the test if the contained worker is asked to load anything."""
    monkeypatch.setattr(gate, "load_trees", lambda *a, **k: pytest.fail("the worker ran"))


@pytest.mark.parametrize("refusal,code,exit_code", [("policy", "policy.attestation_missing", ExitCode.DENIED),
                                                    ("input", "input.refused_by_policy", ExitCode.INPUT_REJECTED)])
def test_a_deny_is_refused_before_any_permit_or_load(hf, no_permit, refusal, code, exit_code):
    tree, ins, digest = hf
    with pytest.raises(Exception) as e:
        enforce(tree, ins, decision=_decision(allow=False, refusal=refusal, digest=digest.digest),
                fixture_digest=digest, framework_files=("model-00001-of-00002.safetensors",))
    assert (e.value.code, e.value.exit_code) == (code, exit_code)
    assert e.value.evidence["decision_id"] == "d" and e.value.evidence["before_digest"] is False
    assert not no_permit


@pytest.mark.parametrize("decided", [OTHER, None])
@pytest.mark.parametrize("framework", [(), ("x.pt",)])
def test_an_allow_for_other_bytes_permits_nothing(hf, no_permit, no_worker, decided, framework):
    """Found by an attacker: enforce minted a permit for whatever digest its caller passed, so an
    allow decided for checkpoint A, paired with checkpoint B's tree and digest, loaded (or, with no
    framework file, published) B.  A decision for another digest, or for none, is refused."""
    tree, ins, digest = hf
    with pytest.raises(PolicyDenied) as e:
        enforce(tree, ins, decision=_decision(("safetensors", "json", "torch_load"), digest=decided),
                fixture_digest=digest, framework_files=framework)
    assert (e.value.code, e.value.exit_code) == ("enforce.decision_digest_mismatch", ExitCode.DENIED)
    assert e.value.evidence == {"decision_id": "d", "decided": decided.prefixed() if decided else None,
                                "actual": digest.digest.prefixed()}
    assert digest.digest.prefixed() in e.value.diagnostics()
    assert not no_permit


def test_a_loader_the_decision_does_not_permit_is_refused(hf, no_permit):
    """An allow decision that omits a loader the checkpoint needs lets nothing through."""
    tree, ins, digest = hf
    with pytest.raises(PolicyDenied) as e:
        enforce(tree, ins, decision=_decision(("json",), digest=digest.digest), fixture_digest=digest)
    assert e.value.code == "enforce.loader_not_permitted"
    assert "safetensors" in e.value.message
    assert e.value.evidence["permitted"] == ["json"]


def test_pure_data_needs_no_permit_and_no_worker(hf, no_permit):
    tree, ins, digest = hf
    assert enforce(tree, ins, decision=_decision(digest=digest.digest), fixture_digest=digest) == Enforcement()


def test_a_framework_load_needs_a_worker_loader(hf, no_permit):
    tree, ins, digest = hf
    with pytest.raises(PolicyDenied) as e:
        enforce(tree, ins, decision=_decision(digest=digest.digest), fixture_digest=digest, framework_files=("x.pt",))
    assert e.value.code == "enforce.permit.loader_not_permitted"
    assert e.value.evidence["permitted_loaders"] == ["safetensors", "json"]


def test_one_permit_is_minted_for_the_load_and_returned_with_what_it_loaded(hf, monkeypatch):
    tree, ins, digest = hf
    calls = []
    loaded = LoadedTrees(trees={"x.pt": {}}, controls={"seccomp": True}, measured={}, job="torch_load",
                         wall_s=0.1)

    def fake_load(tree_, ins_, rels, *, permit, digest, options):
        calls.append((rels, permit, options))
        return loaded

    monkeypatch.setattr(gate, "load_trees", fake_load)
    options = WorkerOptions(timeout_s=3.0)
    got = enforce(tree, ins, decision=_decision(("safetensors", "json", "torch_load"), digest=digest.digest),
                  fixture_digest=digest, framework_files=("x.pt",), worker=options)
    [(rels, minted, opts)] = calls
    assert rels == ("x.pt",) and opts is options
    assert got == Enforcement(permit=minted, loaded=loaded, controls={"seccomp": True})
    assert (minted.loader, minted.fixture_digest, minted.decision_id) == ("torch_load", digest.digest, "d")
    minted.check(fixture_digest=digest.digest, loader="torch_load", controls={})
