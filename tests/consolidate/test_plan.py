"""Placement plans: every output tensor covered exactly once."""

from __future__ import annotations

import pytest

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
            plan_for(inspection, decision=decision, max_shard_bytes=1 << 20)
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


# --- strided placements -------------------------------------------------------------------------

from ckptgate.consolidate.plan import strided  # noqa: E402


def _runs(placements):
    return sorted((d, n) for p in placements for _, d, n in p.runs())


def _tiles_by_expansion(placements, nbytes):
    """Reference: the old run-by-run check on the expanded runs."""
    covered = 0
    for d, n in _runs(placements):
        if d != covered:
            return "gap" if d > covered else "overlap"
        covered = d + n
    return None if covered == nbytes else ("gap" if covered < nbytes else "overflow")


def _strided_tensor(placements, shape=(8, 8)):
    return OutputTensor(name="w", dtype="U8", shape=shape, placements=tuple(placements))


def test_column_chunks_as_strided_placements_tile_the_tensor():
    # an 8 x 8 byte matrix split 4 ways on dim 1: each rank's chunk is 8 runs of 2 bytes, stride 8
    ps = [strided(src=f"r{k}", src_offset=0, dst_offset=2 * k, length=2, count=8, src_stride=2, dst_stride=8)
          for k in range(4)]
    t = _strided_tensor(ps)
    assert len(t.placements) == 4 and all(p.count == 8 for p in t.placements)
    assert _tiles_by_expansion(ps, 64) is None


def test_strided_joins_runs_that_continue_each_other_into_a_plain_placement():
    p = strided(src="a", src_offset=10, dst_offset=4, length=3, count=5, src_stride=3, dst_stride=3)
    assert (p.count, p.length, p.src_stride, p.dst_stride) == (1, 15, 0, 0)
    assert strided(src="a", src_offset=0, dst_offset=0, length=3, count=1, src_stride=7, dst_stride=9).count == 1


@pytest.mark.parametrize("fields", [
    {"count": 0},                                          # no runs
    {"count": 3, "src_stride": -4, "dst_stride": 8},       # negative stride
    {"count": 3, "src_stride": 4, "dst_stride": -8},
    {"count": 3, "src_stride": 4, "dst_stride": 2},        # its own runs overlap in the tensor
    {"count": 3, "src_stride": 1, "dst_stride": 8},        # ... or in the source
    {"count": 1, "src_stride": 4, "dst_stride": 8},        # strides on a single run
])
def test_a_malformed_strided_placement_is_a_typed_plan_error(fields):
    with pytest.raises(PlanError) as e:
        Placement(src="a", src_offset=0, dst_offset=0, length=4, **fields)
    assert e.value.code == "plan.placement.stride" and e.value.exit_code == 4


@pytest.mark.parametrize("placements, code", [
    # a strided placement whose last run lies past the end of the tensor
    ([dict(dst_offset=0, length=4, count=9, src_stride=4, dst_stride=8),
      dict(dst_offset=4, length=4, count=8, src_stride=4, dst_stride=8)], "plan.tensor.overflow"),
    # two ranks' runs overlap (column chunks of 5 and 4 bytes in rows of 8)
    ([dict(dst_offset=0, length=5, count=8, src_stride=5, dst_stride=8),
      dict(dst_offset=4, length=4, count=8, src_stride=4, dst_stride=8)], "plan.tensor.overlap"),
    # a column missing in every row
    ([dict(dst_offset=0, length=3, count=8, src_stride=3, dst_stride=8),
      dict(dst_offset=4, length=4, count=8, src_stride=4, dst_stride=8)], "plan.tensor.gap"),
    # the rows of the second rank stop one short
    ([dict(dst_offset=0, length=4, count=8, src_stride=4, dst_stride=8),
      dict(dst_offset=4, length=4, count=7, src_stride=4, dst_stride=8)], "plan.tensor.gap"),
])
def test_gaps_overlaps_and_out_of_bounds_strided_runs_are_errors(placements, code):
    ps = [Placement(src="a", src_offset=0, **f) for f in placements]
    with pytest.raises(PlanError) as e:
        _strided_tensor(ps)
    assert e.value.code == code
    assert _tiles_by_expansion(ps, 64) == code.rsplit(".", 1)[1]


def _random_layout(rng):
    """A random mix of column-split row blocks, plain ranges and (sometimes) defects."""
    import random

    rows, width = rng.randint(1, 6), rng.choice([2, 4, 6, 8])
    placements, pos = [], 0
    while pos < rows * width * 3:
        kind = rng.random()
        block = rng.randint(1, 3)
        if kind < 0.5:  # a block of `block` rows split into columns
            cuts = sorted(rng.sample(range(1, width), rng.randint(0, width - 1)))
            edges = [0, *cuts, width]
            for a, b in zip(edges, edges[1:], strict=False):
                placements.append(strided(src="a", src_offset=0, dst_offset=pos + a, length=b - a, count=block,
                                          src_stride=b - a, dst_stride=width))
            pos += block * width
        else:
            n = rng.randint(1, 7)
            placements.append(Placement(src="a", src_offset=0, dst_offset=pos, length=n))
            pos += n
    if rng.random() < 0.5 and placements:  # a defect: drop, shift or repeat one placement
        i = rng.randrange(len(placements))
        p = placements[i]
        how = rng.choice(["drop", "shift", "repeat", "shorten", "extend"])
        if how == "extend":
            placements.append(Placement(src="a", src_offset=0, dst_offset=pos, length=rng.randint(1, 9)))
        elif how == "drop":
            del placements[i]
        elif how == "repeat":
            placements.append(p)
        elif how == "shift":
            placements[i] = Placement(src=p.src, src_offset=0, dst_offset=p.dst_offset + 1, length=p.length,
                                      count=p.count, src_stride=p.src_stride, dst_stride=p.dst_stride)
        elif p.count > 1:
            placements[i] = strided(src=p.src, src_offset=0, dst_offset=p.dst_offset, length=p.length,
                                    count=p.count - 1, src_stride=p.src_stride, dst_stride=p.dst_stride)
    random.Random(rng.random()).shuffle(placements)
    return placements, pos


def test_the_grouped_check_agrees_with_expanding_every_run():
    import random

    rng = random.Random(22)
    seen = set()
    for _ in range(3000):
        ps, nbytes = _random_layout(rng)
        want = _tiles_by_expansion(ps, nbytes)
        try:
            OutputTensor(name="w", dtype="U8", shape=(nbytes,), placements=tuple(ps))
            got = None
        except PlanError as e:
            got = e.code.rsplit(".", 1)[1]
        assert got == want, ps
        seen.add(want)
    assert seen == {None, "gap", "overlap", "overflow"}


def test_a_cast_refuses_a_stride_that_splits_an_element():
    p = Placement(src="a", src_offset=0, dst_offset=0, length=4, count=2, src_stride=4, dst_stride=5)
    with pytest.raises(PlanError) as e:
        OutputTensor(name="w", dtype="F32", shape=(3,), placements=(p,), source_dtype="F16")
    assert e.value.code == "plan.tensor.cast"


def test_runs_that_interleave_irregularly_are_checked_by_merging_them_lazily():
    # rows 0 and 1 of a 2 x 8 matrix: a 2-byte column strided over both rows, the rest plain
    ps = [Placement(src="a", src_offset=0, dst_offset=0, length=2, count=2, src_stride=2, dst_stride=8),
          Placement(src="a", src_offset=4, dst_offset=2, length=6), Placement(src="a", src_offset=10, dst_offset=10,
                                                                              length=6)]
    assert OutputTensor(name="w", dtype="U8", shape=(2, 8), placements=tuple(ps)).nbytes == 16
    with pytest.raises(PlanError) as e:
        OutputTensor(name="w", dtype="U8", shape=(2, 8), placements=tuple(ps[:2]) + (
            Placement(src="a", src_offset=10, dst_offset=9, length=7),))
    assert e.value.code == "plan.tensor.overlap"


@pytest.mark.parametrize("name", ["", "__metadata__", "a\x00b", "w\n", "w\x7f", "w\ud800"])
def test_a_name_a_safetensors_header_cannot_carry_as_its_own_tensor_is_refused(name):
    with pytest.raises(PlanError) as e:
        t(name)
    assert e.value.code == "plan.tensor.name"
    assert repr(name) in e.value.message


@pytest.mark.parametrize("name", ["model.layers.0.weight", "embed\u00e9", "w w", "__metadata", "_"])
def test_ordinary_names_are_accepted(name):
    assert t(name).name == name


def test_a_dcp_checkpoint_naming_a_tensor_metadata_or_with_a_nul_is_refused_by_its_plan(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    from ckptgate.consolidate import plan_for
    from ckptgate.decide.decision import Decision
    from ckptgate.inspect import SafeTree, inspect_open_tree

    for bad in ("__metadata__", "a\x00b"):
        ck = tmp_path / f"dcp{len(bad)}"
        dcp.save({bad: torch.ones(2), "ok.weight": torch.ones(2, 2)}, checkpoint_id=str(ck), no_dist=True)
        with SafeTree.open(ck) as tree:
            ins = inspect_open_tree(tree)
        decision = Decision(allow=True, plane="static_pickle", permitted_loaders=(), required_controls=(), reasons=(),
                            decision_id="test", policy_revision="test", engine="test")
        with pytest.raises(PlanError) as e:
            plan_for(ins, decision=decision, max_shard_bytes=1 << 30)
        assert e.value.code == "plan.tensor.name"
