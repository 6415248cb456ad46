"""``ckptgate.inspect.topology``: the topology each format's layout records, measured from the committed
fixtures (their ``meta.json`` says how they were produced), and the contradictions of a declared one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptgate.api import inspect
from ckptgate.inspect.topology import contradictions, measured_topology

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dcp_torchtitan", {"world_size": [2]}),
        ("deepspeed_zero2", {"zero_stage": [1, 2], "dp": [2], "world_size": [2]}),
        ("deepspeed_zero3", {"zero_stage": [3], "dp": [2], "world_size": [2]}),
        ("fsdp_full", {"fsdp_mode": ["full_state_dict"]}),
        ("hf_sharded", {}),
    ],
)
def test_the_layout_records_the_topology_it_was_written_with(name: str, expected: dict) -> None:
    ins = inspect(DATA / name / "checkpoint")
    assert measured_topology(ins.format, ins.layout) == expected
    assert ins.to_facts()["topology"] == expected


def test_megatron_records_world_size_and_tensor_parallel_degree() -> None:
    meta = json.loads((DATA / "megatron_torch_dist" / "meta.json").read_text())["topology"]
    ins = inspect(DATA / "megatron_torch_dist" / "checkpoint")
    assert measured_topology(ins.format, ins.layout) == {"world_size": [meta["world_size"]], "tp": [meta["tp"]]}


def test_contradictions_name_each_field_the_layout_refutes() -> None:
    measured = {"zero_stage": [1, 2], "dp": [2]}
    assert contradictions({"zero_stage": 2, "dp": 2, "tp": 4}, measured) == {}
    assert contradictions({"zero_stage": 3, "dp": 4, "world_size": None}, measured) == {
        "dp": {"declared": 4, "measured": [2]},
        "zero_stage": {"declared": 3, "measured": [1, 2]},
    }
