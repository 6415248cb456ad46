"""Signed qualification statements, changed by seeded hostile mutations (``tests/mutations.py``)
and signed again by a trusted key, through verification and the real intake policy.

A trusted signer can still sign nonsense (a buggy or compromised producer): every case must end
in a typed verification error or a decision, never in another exception or an engine error, and
an allow must only ever rest on a statement that really qualifies these bytes."""

from __future__ import annotations

import copy
import json
import random
import re
from datetime import datetime
from typing import Any

import pytest
from mutations import mutate_json, single_changes
from pipeline_helpers import FIXTURES, make_signer, qualification

from ckptgate.decide import decide, now_utc
from ckptgate.decide.engine import EmbeddedOpa
from ckptgate.decide.input import PolicyInputBuilder, Request
from ckptgate.digest import fixture_digest
from ckptgate.errors import VerificationError
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.decide.options import TRUST_IN_BUNDLE
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, KeySigner, TrustData
from ckptgate.verify.dsse import canonical_payload, sign_payload
from ckptgate.verify.facts import verify_attestation

pytestmark = pytest.mark.opa

SEEDS = 150
CODE = re.compile(r"verify(\.[a-z0-9_]+)+")


@pytest.fixture(scope="module", params=[("hf_sharded", "hf-sharded-safetensors"),  # pure data
                                        ("deepspeed_zero3", "deepspeed-zero3")])  # producer-gated pickles
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    fixture, fmt = request.param
    work = tmp_path_factory.mktemp("statements")
    signer = make_signer(work)
    src = FIXTURES / fixture / "checkpoint"
    with SafeTree.open(src) as tree:
        inspection, digest = inspect_open_tree(tree), fixture_digest(tree)
    now = now_utc()
    statement = qualification(src, digest.digest, fmt=fmt, issued_at=now,
                              meta=json.loads((FIXTURES / fixture / "meta.json").read_text()))
    adapter = statement["predicate"]["adapter"]["name"]
    containment = None
    if fixture == "deepspeed_zero3":  # the framework plane: the policy requires the preflight's controls
        from ckptgate.enforce.containment import preflight

        containment = preflight()
        missing = [c for c in ("no_new_privs", "seccomp", "rlimits", "user_ns", "net_ns", "ipc_ns", "openat2")
                   if not containment.controls[c]]
        if missing:
            pytest.skip(f"this host lacks containment controls {missing}")
    with EmbeddedOpa(overlays={TRUST_IN_BUNDLE: signer.trust_file.read_bytes()}) as engine:
        yield {"engine": engine, "trust": TrustData.from_file(signer.trust_file), "adapter": adapter,
               "containment": containment, "gated": fixture == "deepspeed_zero3",
               "key": KeySigner.from_pem(signer.key_path), "inspection": inspection, "digest": digest,
               "statement": statement, "now": now}


def _judge(world: Any, statement: dict[str, Any]) -> str:
    raw = sign_payload(canonical_payload(statement), [world["key"]])
    try:
        verified = verify_attestation(raw, source="mutated", trust=world["trust"],
                                      measured_digest=world["digest"].digest, now=world["now"])
    except VerificationError as e:
        assert CODE.fullmatch(e.code), e.code
        return "verify"
    builder = (PolicyInputBuilder(Request(action="intake", now=world["now"], candidate_commit=None))
               .fixture(world["digest"]).inspection(world["inspection"]))
    decision = decide(world["engine"], builder.attestation(verified).containment(world["containment"]).build())
    return "allow" if decision.allow else "deny"


def _qualifies(world: Any, s: dict[str, Any]) -> None:
    """What an allow rests on: a passing qualification of this adapter for these bytes, valid now."""
    p = s["predicate"]
    assert s["predicateType"] == QUALIFICATION_PREDICATE_TYPE
    assert p["result"]["status"] == "passed"
    assert p["adapter"]["name"] == world["adapter"]
    if world["gated"]:  # DeepSpeed's gate is one exact version: no other value passes it
        assert p["producer"] == world["statement"]["predicate"]["producer"]
    assert world["digest"].digest.hex in [x["digest"]["sha256"] for x in s["subject"]]
    valid = p["validity"]
    issued, expires = (datetime.fromisoformat(valid[k].replace("Z", "+00:00")) for k in ("issued_at", "expires_at"))
    assert issued <= world["now"] <= expires


def test_the_unchanged_statement_is_allowed(world: Any) -> None:
    assert _judge(world, copy.deepcopy(world["statement"])) == "allow"


def _check(world: Any, statement: dict[str, Any], case: str, seen: dict[str, int]) -> None:
    try:
        got = _judge(world, statement)
        if got == "allow":
            _qualifies(world, statement)
    except Exception as e:  # noqa: BLE001 - the point: name the case that escaped
        pytest.fail(f"{case}: {type(e).__name__}: {e}")
    seen[got] = seen.get(got, 0) + 1


def test_every_one_field_change_ends_in_a_typed_error_or_a_sound_decision(world: Any) -> None:
    seen: dict[str, int] = {}
    for statement, how in single_changes(world["statement"]):
        _check(world, statement, how, seen)
    assert set(seen) == {"verify", "deny", "allow"}, seen  # every stage was reached


def test_random_changes_end_in_a_typed_error_or_a_sound_decision(world: Any) -> None:
    seen: dict[str, int] = {}
    for seed in range(SEEDS):
        rng = random.Random(seed)
        statement, hows = copy.deepcopy(world["statement"]), []
        for _ in range(rng.choice([1, 2, 3])):
            statement, how = mutate_json(statement, rng)
            hows.append(how)
        _check(world, statement, f"seed {seed} ({'; '.join(hows)})", seen)
    assert "verify" in seen and "allow" in seen, seen
