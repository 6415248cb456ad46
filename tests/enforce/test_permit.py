"""Permits: bound to digest, loader and controls; unforgeable (the gate that mints them: test_gate.py)."""

from __future__ import annotations

import dataclasses

import pytest

from ckptgate.decide.decision import parse_decision
from ckptgate.decide.engine import RawDecision
from ckptgate.digest import Digest
from ckptgate.enforce.permit import Permit, issue_permit
from ckptgate.errors import PolicyDenied

DIGEST = Digest.parse("sha256:" + "ab" * 32)
OTHER = Digest.parse("sha256:" + "cd" * 32)
CONTROLS = {"no_new_privs": True, "seccomp": True, "rlimits": True}


def decision(allow=True, loaders=("torch_load",), controls=("no_new_privs", "seccomp"), digest=DIGEST):
    result = {"allow": allow, "plane": "framework" if allow else None,
              "permitted_loaders": list(loaders) if allow else [],
              "required_controls": list(controls),
              "reasons": [{"code": "ok" if allow else "attestation_missing", "message": "m", "evidence": {}}],
              "refusal": None if allow else "policy"}
    raw = RawDecision(result=result, decision_id="d-7", policy_revision="sha256:r", engine="t")
    return dataclasses.replace(parse_decision(raw), fixture_digest=digest)


def test_permit_from_allow_checks_for_its_digest_and_loader():
    permit = issue_permit(decision(), fixture_digest=DIGEST, loader="torch_load")
    permit.check(fixture_digest=DIGEST, loader="torch_load", controls=CONTROLS)
    assert (permit.decision_id, permit.plane) == ("d-7", "framework")


def test_permit_for_another_digest_fails():
    permit = issue_permit(decision(), fixture_digest=DIGEST, loader="torch_load")
    with pytest.raises(PolicyDenied) as e:
        permit.check(fixture_digest=OTHER, loader="torch_load", controls=CONTROLS)
    assert e.value.code == "enforce.permit.wrong_digest"


def test_permit_for_another_loader_fails():
    permit = issue_permit(decision(loaders=("torch_load", "deepspeed")), fixture_digest=DIGEST, loader="torch_load")
    with pytest.raises(PolicyDenied) as e:
        permit.check(fixture_digest=DIGEST, loader="deepspeed", controls=CONTROLS)
    assert e.value.code == "enforce.permit.wrong_loader"


def test_missing_required_control_fails():
    permit = issue_permit(decision(), fixture_digest=DIGEST, loader="torch_load")
    with pytest.raises(PolicyDenied) as e:
        permit.check(fixture_digest=DIGEST, loader="torch_load", controls={"no_new_privs": True})
    assert e.value.code == "enforce.permit.control_missing"
    assert e.value.evidence["missing"] == ["seccomp"]


@pytest.mark.parametrize("forge", [
    lambda p: dataclasses.replace(p, fixture_digest=OTHER),
    lambda p: dataclasses.replace(p, required_controls=()),
    lambda p: Permit(fixture_digest=OTHER, loader="torch_load", plane="framework", required_controls=(),
                     decision_id="d-7", policy_revision="sha256:r", seal=p.seal),
])
def test_forged_permits_do_not_check(forge):
    forged = forge(issue_permit(decision(), fixture_digest=DIGEST, loader="torch_load"))
    with pytest.raises(PolicyDenied) as e:
        forged.check(fixture_digest=forged.fixture_digest, loader="torch_load", controls=CONTROLS)
    assert e.value.code == "enforce.permit.forged"


def test_a_deny_decision_mints_no_permit():
    """A deny names no plane; issue_permit refuses it rather than seal a permit with ``plane=None``
    (found by mypy --strict: Permit.plane is a str)."""
    with pytest.raises(ValueError, match="allow decision only"):
        issue_permit(decision(allow=False), fixture_digest=DIGEST, loader="torch_load")


def test_a_permit_is_minted_only_for_a_loader_the_decision_permits():
    """Found by an adversarial review: the mint itself refuses a loader the allow decision does
    not name, so no caller can seal a permit around the gate's loader check."""
    with pytest.raises(ValueError, match="for a loader it permits"):
        issue_permit(decision(loaders=("deepspeed",)), fixture_digest=DIGEST, loader="torch_load")


@pytest.mark.parametrize("decided", [OTHER, None])
def test_a_permit_is_minted_only_for_the_digest_its_decision_was_made_for(decided):
    """Found by an attacker: the mint sealed a permit for whatever digest its caller named, so an
    allow for one checkpoint became a permit for another's bytes."""
    with pytest.raises(ValueError, match="digest its decision was made for"):
        issue_permit(decision(digest=decided), fixture_digest=DIGEST, loader="torch_load")
