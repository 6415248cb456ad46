"""Placement plans: every output tensor covered exactly once."""

from __future__ import annotations

import pytest

from ckptgate.digest import fixture_digest
from ckptgate.consolidate.plan import (ConsolidationPlan, OutputTensor, Placement, PlanError, ShardTask,
                                       shard_tensors)


def t(name, shape=(2, 3), dtype="F32", ranges=None):
    nbytes = 4 * shape[0] * shape[1]
    ranges = ranges or [(0, nbytes)]
    return OutputTensor(name=name, dtype=dtype, shape=shape,
                        placements=tuple(Placement(src="a", src_offset=100 + d, dst_offset=d, length=n)
                                         for d, n in ranges))


def test_two_placements_that_tile_the_tensor_are_accepted():
    assert t("w", ranges=[(0, 12), (12, 12)]).nbytes == 24


@pytest.mark.parametrize("ranges, code", [
    ([(0, 12)], "plan.tensor.gap"),
    ([(4, 20)], "plan.tensor.gap"),
    ([(0, 12), (8, 16)], "plan.tensor.overlap"),
    ([(0, 28)], "plan.tensor.overflow"),
])
def test_gaps_and_overlaps_are_errors(ranges, code):
    with pytest.raises(PlanError) as e:
        t("w", ranges=ranges)
    assert e.value.code == code


def test_unknown_dtype_is_an_error():
    with pytest.raises(PlanError) as e:
        OutputTensor(name="w", dtype="float32", shape=(1,), placements=())
    assert e.value.code == "plan.tensor.dtype"


def test_a_tensor_in_two_shards_is_an_error():
    with pytest.raises(PlanError) as e:
        ConsolidationPlan(shards=(ShardTask(filename="a.safetensors", tensors=(t("w"),)),
                                  ShardTask(filename="b.safetensors", tensors=(t("w"),))))
    assert e.value.code == "plan.tensor.duplicate"


@pytest.mark.parametrize("name", ["../x.safetensors", "/abs.safetensors", "a/b.safetensors", "x.bin"])
def test_shard_names_are_plain_basenames(name):
    with pytest.raises(PlanError) as e:
        ShardTask(filename=name, tensors=())
    assert e.value.code == "plan.shard.name"


def test_shard_tensors_respects_the_maximum_size():
    plan = shard_tensors([t(f"w{i}") for i in range(5)], max_shard_bytes=50)
    assert [s.filename for s in plan.shards] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert [len(s.tensors) for s in plan.shards] == [2, 2, 1]
    assert plan.total_size == 5 * 24
    assert plan.weight_map["w4"] == "model-00003-of-00003.safetensors"


def test_plan_for_refuses_a_loader_the_decision_does_not_permit():
    """Enforcement in Python: an allow decision that omits a needed loader plans nothing."""
    from ckptgate.consolidate import plan_for
    from ckptgate.decide.decision import parse_decision
    from ckptgate.decide.engine import RawDecision
    from ckptgate.errors import PolicyDenied
    from ckptgate.inspect import SafeTree, inspect_open_tree
    from tests.fixtures.catalog import checkpoint_dir

    decision = parse_decision(RawDecision(result={
        "allow": True, "plane": "pure_data", "permitted_loaders": ["json"], "required_controls": [],
        "reasons": [], "refusal": None}, decision_id="d", policy_revision="r", engine="t"))
    with SafeTree.open(checkpoint_dir("hf_sharded")) as tree:
        inspection = inspect_open_tree(tree)
        with pytest.raises(PolicyDenied) as e:
            plan_for(tree, inspection, decision=decision, fixture_digest=fixture_digest(tree), max_shard_bytes=1)
    assert e.value.code == "enforce.loader_not_permitted"
    assert "safetensors" in e.value.message


@pytest.mark.parametrize("index", [True, False])
def test_a_checkpoint_without_tensors_is_a_rejected_input_not_a_plan_bug(tmp_path, index):
    """An index with an empty weight map, or a safetensors file whose header is ``{}``: exit 4."""
    import json

    from ckptgate.consolidate import plan_for
    from ckptgate.consolidate.plan import EmptyCheckpoint
    from ckptgate.decide.decision import parse_decision
    from ckptgate.decide.engine import RawDecision
    from ckptgate.errors import ExitCode
    from ckptgate.inspect import SafeTree, inspect_open_tree

    (tmp_path / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    if index:
        (tmp_path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": {}}))
    decision = parse_decision(RawDecision(result={
        "allow": True, "plane": "pure_data", "permitted_loaders": ["json", "safetensors"], "required_controls": [],
        "reasons": [], "refusal": None}, decision_id="d", policy_revision="r", engine="t"))
    with SafeTree.open(tmp_path) as tree:
        inspection = inspect_open_tree(tree)
        with pytest.raises(EmptyCheckpoint) as e:
            plan_for(tree, inspection, decision=decision, fixture_digest=fixture_digest(tree), max_shard_bytes=1 << 20)
    assert e.value.code == "input.empty" and e.value.exit_code == ExitCode.INPUT_REJECTED


def test_a_cast_without_numpy_names_the_extra(monkeypatch):
    import importlib.util

    from ckptgate.consolidate.plan import check_cast
    from ckptgate.errors import UsageError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numpy" else real(name, *a))
    check_cast(None)  # no cast, no numpy needed
    with pytest.raises(UsageError) as e:
        check_cast("BF16")
    assert e.value.code == "usage.dtype.numpy_missing" and "ckptgate[dtype]" in e.value.diagnostics()
