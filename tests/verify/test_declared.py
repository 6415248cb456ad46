"""The declared topology and step of training provenance: one validated model, that signing and
verification both apply (:mod:`ckptgate.verify.declared`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptgate.errors import UsageError, VerificationError
from ckptgate.inspect.topology import TOPOLOGY_FIELDS
from ckptgate.producer.attest import AttestRequest, attest_checkpoint, parse_topology
from ckptgate.verify.declared import MAX_DEGREE, MAX_STEP, DeclaredValueError, Topology, check_step
from ckptgate.verify.statement import check_statement, schema_errors

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
SCHEMA = Path(__file__).resolve().parents[2] / "src" / "ckptgate" / "verify" / "schemas" / (
    "training-provenance-v1.schema.json")
INTERNAL = "/predicate/buildDefinition/internalParameters"

ABSURD = [
    ({"world_size": 0}, "world_size"),
    ({"tp": -2}, "tp"),
    ({"world_size": 10**30}, "world_size"),
    ({"world_size": MAX_DEGREE + 1}, "world_size"),
    ({"tp": 2.0}, "tp"),
    ({"tp": True}, "tp"),
    ({"tp": "2"}, "tp"),
    ({"tp": 3, "world_size": 2}, "tp"),
    ({"ep": 4, "world_size": 2}, "ep"),
    ({"tp": 2, "pp": 2, "cp": 1, "dp": 2, "world_size": 2}, "world_size"),
    ({"tp": 2, "pp": 2, "world_size": 6}, "world_size"),
    ({"tp": 2, "pp": 3, "world_size": 12, "dp": 4}, "world_size"),
    ({"zero_stage": 4}, "zero_stage"),
    ({"fsdp_mode": "bogus"}, "fsdp_mode"),
    ({"num_layers": 2}, "num_layers"),
]


def _real_topologies() -> list[dict]:
    """The topology fields real producers' saves record (the fixtures' meta.json), each fixture's own."""
    found = []
    for meta in sorted(DATA.glob("*/meta.json")):
        topo = json.loads(meta.read_text()).get("topology") or {}
        found.append({k: v for k, v in topo.items() if k in TOPOLOGY_FIELDS})
    return found


def test_what_real_producers_record_is_accepted():
    real = _real_topologies()
    assert len(real) > 30 and {"tp": 2, "pp": 2, "dp": 1, "ep": 1, "world_size": 4} in real
    assert {"dp": 2, "ep": 2, "pp": 1, "tp": 1, "world_size": 2} in real  # Megatron MoE: ep within dp
    for topo in real:
        assert Topology.from_mapping(topo).to_json() == {k: topo[k] for k in TOPOLOGY_FIELDS if k in topo}
    for ok in ({"tp": 2, "pp": 2, "cp": 2, "dp": 2, "world_size": 16}, {"tp": 8, "world_size": 64},
               {"zero_stage": 0, "fsdp_mode": "sharded_state_dict"}, {"world_size": MAX_DEGREE}):
        assert Topology.from_mapping(ok).to_json() == ok
    assert check_step(None) is None and check_step(0) == 0 and check_step(MAX_STEP) == MAX_STEP


@pytest.mark.parametrize(("topology", "field"), ABSURD, ids=[str(t) for t, _ in ABSURD])
def test_an_absurd_topology_is_refused_naming_its_field(topology, field):
    with pytest.raises(DeclaredValueError) as e:
        Topology.from_mapping(topology)
    assert e.value.field == field


@pytest.mark.parametrize("step", [-1, MAX_STEP + 1, 10**30, 2.0, True, "3"])
def test_an_absurd_step_is_refused(step):
    with pytest.raises(DeclaredValueError) as e:
        check_step(step)
    assert e.value.field == "step"


def test_the_schema_states_the_models_ranges():
    schema = json.loads(SCHEMA.read_text())
    assert schema["definitions"]["degree"] == {"type": "integer", "minimum": 1, "maximum": MAX_DEGREE}
    internal = schema["properties"]["predicate"]["properties"]["buildDefinition"]["properties"]["internalParameters"]
    assert internal["properties"]["step"]["maximum"] == MAX_STEP
    assert set(internal["properties"]["topology"]["properties"]) == set(TOPOLOGY_FIELDS)


@pytest.mark.parametrize(("topology", "field"), [c for c in ABSURD if c[1] != "num_layers"],
                         ids=[str(t) for t, f in ABSURD if f != "num_layers"])
def test_signing_refuses_an_absurd_declared_topology_before_measuring(topology, field, tmp_path):
    with pytest.raises(UsageError) as e:
        attest_checkpoint(AttestRequest(src=tmp_path / "nothing-here", topology=topology, dry_run=True,
                                        environment=False))
    assert e.value.code == "usage.topology.value" and e.value.evidence["field"] == field
    assert field in e.value.message and "nothing was signed" in e.value.message


def test_signing_refuses_an_unknown_key_from_a_hook(tmp_path):
    with pytest.raises(UsageError) as e:
        attest_checkpoint(AttestRequest(src=tmp_path, topology={"world_size": 2, "num_layers": 2}, dry_run=True))
    assert e.value.code == "usage.topology.value" and e.value.evidence["field"] == "num_layers"


@pytest.mark.parametrize("step", [-1, MAX_STEP + 1, 2.5, True])
def test_signing_refuses_an_absurd_step(step, tmp_path):
    with pytest.raises(UsageError) as e:
        attest_checkpoint(AttestRequest(src=tmp_path, step=step, dry_run=True, environment=False))
    assert e.value.code == "usage.step.value" and repr(step) in e.value.message


@pytest.mark.parametrize("value", ["0", "99999999999999999999999", "3"])
def test_topology_flags_are_refused_as_a_whole(value):
    with pytest.raises(UsageError) as e:
        parse_topology({"tp": value, "world_size": "2"})
    assert e.value.code == "usage.topology.value" and "--topology" in e.value.message
    assert parse_topology({"tp": "2", "world_size": "4", "fsdp_mode": "full_state_dict"}) == {
        "tp": 2, "world_size": 4, "fsdp_mode": "full_state_dict"}


@pytest.fixture(scope="module")
def statement() -> dict:
    return attest_checkpoint(AttestRequest(src=DATA / "hf_sharded" / "checkpoint", dry_run=True,
                                           environment=False)).statement


@pytest.mark.parametrize(("topology", "step", "path"), [
    ({"tp": 3, "world_size": 2}, None, "topology/tp"),
    ({"tp": 2.0, "world_size": 2}, None, "topology/tp"),
    ({"tp": 2, "pp": 2, "cp": 1, "dp": 2, "world_size": 2}, None, "topology/world_size"),
    ({"world_size": 2**63}, None, "topology/world_size"),
    ({}, 2**60, "step"),
    ({}, 3.0, "step"),
])
def test_a_signed_statement_declaring_the_same_is_malformed(statement, topology, step, path):
    doc = json.loads(json.dumps(statement))
    doc["predicate"]["buildDefinition"]["internalParameters"].update(topology=topology, step=step)
    with pytest.raises(VerificationError) as e:
        check_statement(doc)
    assert e.value.code == "verify.statement.predicate_invalid"
    assert e.value.evidence["path"] == f"{INTERNAL}/{path}"
    assert [x["path"] for x in schema_errors(doc)] == [f"{INTERNAL}/{path}"]  # attest sign lists it
    doc["predicate"]["buildDefinition"]["internalParameters"].update(topology={"tp": 2, "world_size": 2}, step=7)
    assert check_statement(doc) is doc and schema_errors(doc) == []
