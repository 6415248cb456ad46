"""Adapters on layouts: DCP chunk placement (N-d runs, gaps), FSDP/PEFT refusals, Megatron
layer unstacking and reported semantics, Universal aliases."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckptgate.consolidate import plan_for
from ckptgate.consolidate.adapters import dcp, fsdp, megatron
from ckptgate.consolidate.plan import (MAX_PLAN_RUNS, NotConsolidatable, PlanError, chunk_run_count, chunk_runs,
                                       numel)
from ckptgate.decide.decision import Decision
from ckptgate.inspect import SafeTree, inspect_open_tree

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "data"
ALLOW = Decision(allow=True, plane="pure_data", permitted_loaders=("safetensors", "json", "static_pickle"),
                 required_controls=(), reasons=(), decision_id="t", policy_revision="t", engine="t")


def _expand(full, offsets, sizes):
    """Reference: element indices of the full tensor that a chunk covers, in chunk order."""
    import itertools

    strides = [1] * len(full)
    for d in range(len(full) - 2, -1, -1):
        strides[d] = strides[d + 1] * full[d + 1]
    return [sum((o + i) * s for o, i, s in zip(offsets, idx, strides)) for idx in
            itertools.product(*[range(n) for n in sizes])]


@pytest.mark.parametrize("full, offsets, sizes, runs", [
    ((8, 4), (4, 0), (4, 4), 1),          # Shard(0): one contiguous range
    ((8, 4), (0, 2), (8, 2), 8),          # Shard(1): one run per row
    ((2, 3, 4), (1, 1, 0), (1, 2, 4), 1),  # trailing full dims merge
    ((2, 3, 4), (0, 0, 1), (2, 3, 2), 6),
    ((5,), (2,), (3,), 1),
])
def test_chunk_runs_cover_exactly_the_chunk_elements(full, offsets, sizes, runs) -> None:
    got = list(chunk_runs(full, offsets, sizes))
    assert len(got) == runs
    flat = [(s + k, d + k) for s, d, n in got for k in range(n)]
    assert [s for s, _ in flat] == list(range(len(flat)))  # the chunk is read in order, once
    assert [d for _, d in flat] == _expand(full, offsets, sizes)


def test_chunk_outside_the_tensor_is_an_error() -> None:
    with pytest.raises(PlanError) as e:
        list(chunk_runs((4, 4), (3, 0), (2, 4)))
    assert e.value.code == "plan.chunk.bounds"


def _hf_layout(chunks):
    return {"tensors": [{"fqn": "w", "dtype": "float32", "size": [4, 2],
                         "chunks": [{"path": p, "offsets": o, "sizes": s, "data_offsets": [b, b + 4 * s[0] * s[1]]}
                                    for p, o, s, b in chunks]}]}


def test_dcp_hf_column_shards_are_one_strided_placement_each_interleaving_per_row() -> None:
    [t] = dcp.hf_storage_tensors(_hf_layout([("a", [0, 0], [4, 1], 100), ("b", [0, 1], [4, 1], 200)]))
    assert [(p.src, p.src_offset, p.dst_offset, p.length, p.count, p.src_stride, p.dst_stride)
            for p in t.placements] == [("a", 100, 0, 4, 4, 4, 8), ("b", 200, 4, 4, 4, 4, 8)]
    runs = sorted((d, p.src, s, n) for p in t.placements for s, d, n in p.runs())
    assert runs == [(0, "a", 100, 4), (4, "b", 200, 4), (8, "a", 104, 4), (12, "b", 204, 4),
                    (16, "a", 108, 4), (20, "b", 208, 4), (24, "a", 112, 4), (28, "b", 212, 4)]


@pytest.mark.parametrize("chunks, code", [
    ([("a", [0, 0], [1, 2], 0), ("b", [2, 0], [2, 2], 0)], "plan.tensor.gap"),        # row 1 missing
    ([("a", [0, 0], [3, 2], 0), ("b", [2, 0], [2, 2], 0)], "plan.tensor.overlap"),    # row 2 twice
])
def test_dcp_hf_gap_or_overlap_is_refused(chunks, code) -> None:
    with pytest.raises(PlanError) as e:
        dcp.hf_storage_tensors(_hf_layout(chunks))
    assert e.value.code == code


def test_chunk_run_count_is_what_chunk_runs_yields() -> None:
    for full, offsets, sizes in [((8, 4), (4, 0), (4, 4)), ((8, 4), (0, 2), (8, 2)), ((2, 3, 4), (0, 0, 1), (2, 3, 2)),
                                 ((5,), (2,), (3,)), ((), (), ()), ((4, 0), (0, 0), (4, 0))]:
        assert chunk_run_count(full, offsets, sizes) == len(list(chunk_runs(full, offsets, sizes)))


def test_a_tall_column_split_tensor_is_two_strided_placements_not_a_run_per_row() -> None:
    """A tall, narrow tensor split by columns: 2 x 10^8 rows of runs (tens of GB as plain
    placements) behind a sparse file are two strided records, checked without expanding them."""
    rows = 10**8
    layout = _hf_layout([("a", [0, 0], [rows, 1], 0), ("b", [0, 1], [rows, 1], 0)])
    layout["tensors"][0]["size"] = [rows, 2]
    layout["tensors"][0]["chunks"][0]["data_offsets"] = [0, 4 * rows]
    layout["tensors"][0]["chunks"][1]["data_offsets"] = [0, 4 * rows]
    [t] = dcp.hf_storage_tensors(layout)
    assert [(p.count, p.length, p.src_stride, p.dst_stride) for p in t.placements] == [(rows, 4, 4, 8)] * 2


def test_a_layout_of_too_many_placements_is_refused_before_any_is_built(monkeypatch) -> None:
    """A chunk split on two leading dims needs a record per index of the first: 10^8 of them here.
    They are counted first, and the plan refuses them."""
    def build(*args, **kwargs):
        raise AssertionError("placements were built")

    monkeypatch.setattr(dcp, "_chunk_placements", build)
    rows = 10**8
    layout = {"tensors": [{"fqn": "w", "dtype": "float32", "size": [rows, 2, 2], "chunks": [
        {"path": p, "offsets": o, "sizes": [rows, 1, 1], "data_offsets": [0, 4 * rows]}
        for p, o in (("a", [0, 0, 0]), ("b", [0, 0, 1]), ("c", [0, 1, 0]), ("d", [0, 1, 1]))]}]}
    with pytest.raises(PlanError) as e:
        dcp.hf_storage_tensors(layout)
    assert e.value.code == "plan.too_many_runs" and e.value.evidence["limit"] == MAX_PLAN_RUNS


def test_dcp_hf_byte_range_that_disagrees_with_the_shape_is_refused() -> None:
    layout = _hf_layout([("a", [0, 0], [4, 2], 0)])
    layout["tensors"][0]["chunks"][0]["data_offsets"] = [0, 16]
    with pytest.raises(PlanError) as e:
        dcp.hf_storage_tensors(layout)
    assert e.value.code == "plan.dcp.item_mismatch"


def test_dcp_torch_save_chunk_without_item_is_refused() -> None:
    layout = {"tensors": [{"fqn": "w", "dtype": "float32", "size": [2], "chunks": [{"offsets": [0], "sizes": [2]}]}],
              "items": []}
    with pytest.raises(PlanError) as e:
        dcp.torch_save_tensors(layout)
    assert e.value.code == "plan.dcp.chunk_without_item"


def test_dcp_torch_save_bytes_items_are_reported_not_loaded() -> None:
    with SafeTree.open(FIXTURES / "dcp_torch_save_bytes" / "checkpoint") as tree:
        plan = plan_for(inspect_open_tree(tree), decision=ALLOW, max_shard_bytes=1 << 20)
    assert plan.report["skipped_bytes_items"] == ["run_name", "step", "train_state.epoch", "train_state.lr"]
    assert "step" not in plan.weight_map and "token_ids" in plan.weight_map


def test_fsdp_local_is_not_consolidatable() -> None:
    with pytest.raises(NotConsolidatable) as e:
        fsdp.plan("fsdp-local", {"files": ["model_rank0.pt"]}, max_shard_bytes=1)
    assert e.value.code == "plan.format.not_consolidatable" and e.value.exit_code == 4


def test_fsdp_non_contiguous_view_is_refused() -> None:
    rec = {"name": "w", "dtype": "float32", "shape": [2, 2], "stride": [1, 2], "storage_offset": 0,
           "storage_key": "0", "storage_dtype": "float32", "storage_nbytes": 16, "storage_range": [64, 80]}
    with pytest.raises(PlanError) as e:
        fsdp.full_tensors({"file": "model.pt", "tensors": [rec]})
    assert e.value.code == "plan.tensor.not_contiguous"


def test_peft_without_base_revision_is_refused() -> None:
    with SafeTree.open(FIXTURES / "peft_lora_unpinned" / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
        with pytest.raises(NotConsolidatable) as e:
            plan_for(ins, decision=ALLOW, max_shard_bytes=1 << 20)
    assert e.value.code == "plan.peft.base_revision_missing"


@pytest.mark.parametrize("revision", ["main", "v1.0", " ", "0123456789abcdef"])
def test_peft_with_a_branch_or_tag_as_base_revision_is_refused(revision: str, tmp_path: Path) -> None:
    """A branch or tag moves: 'main' was published as a pinned base (only blank was refused)."""
    root = tmp_path / "adapter"
    shutil.copytree(FIXTURES / "peft_lora" / "checkpoint", root)
    config = json.loads((root / "adapter_config.json").read_text())
    (root / "adapter_config.json").write_text(json.dumps({**config, "revision": revision}))
    with SafeTree.open(root) as tree:
        ins = inspect_open_tree(tree)
        with pytest.raises(NotConsolidatable) as e:
            plan_for(ins, decision=ALLOW, max_shard_bytes=1 << 20)
    assert e.value.code == "plan.peft.base_revision_missing"
    with SafeTree.open(FIXTURES / "peft_lora" / "checkpoint") as tree:
        assert plan_for(inspect_open_tree(tree), decision=ALLOW, max_shard_bytes=1 << 20).shards


def _megatron_layout() -> dict:
    # decoder.layers.mlp.linear_fc1.weight: [2 layers, 4, 3] float32, saved as two TP chunks on dim 1.
    items, chunks = [], []
    for k, off in enumerate((0, 2)):
        chunks.append({"offsets": [0, off, 0], "sizes": [2, 2, 3]})
        items.append({"fqn": "decoder.layers.mlp.linear_fc1.weight", "path": f"__{k}_0.distcp", "kind": "tensor",
                      "chunk_offsets": [0, off, 0],
                      "tensor": {"dtype": "float32", "shape": [2, 2, 3], "stride": [6, 3, 1], "storage_offset": 0,
                                 "storage_key": "0", "storage_dtype": "float32", "storage_nbytes": 48,
                                 "storage_range": [1000, 1048]}})
    return {"layer_stacked": ["decoder.layers.mlp.linear_fc1.weight"],
            "dcp": {"tensors": [{"fqn": "decoder.layers.mlp.linear_fc1.weight", "dtype": "float32",
                                 "size": [2, 4, 3], "chunks": chunks}], "items": items, "bytes_items": []}}


def test_megatron_keeps_the_layer_axis_and_reports_semantics_by_default() -> None:
    plan = megatron.plan(_megatron_layout(), max_shard_bytes=1 << 20)
    [t] = plan.shards[0].tensors
    assert (t.name, t.shape) == ("decoder.layers.mlp.linear_fc1.weight", (2, 4, 3))
    assert plan.report["layer_axis"].startswith("kept")
    assert [s["kind"] for s in plan.report["model_family_semantics"]] == ["fc1_may_be_gated"]


def test_megatron_unstacks_layers_only_when_the_mapping_is_declared() -> None:
    plan = megatron.plan(_megatron_layout(), max_shard_bytes=1 << 20, mapping=megatron.UNSTACK_LAYERS)
    ts = {t.name: t for t in plan.shards[0].tensors}
    assert sorted(ts) == ["decoder.layers.0.mlp.linear_fc1.weight", "decoder.layers.1.mlp.linear_fc1.weight"]
    # layer 1 = rows 0..1 from rank 0's second half (bytes 24..48), rows 2..3 from rank 1's
    assert [(p.src, p.src_offset, p.dst_offset, p.length) for p in ts["decoder.layers.1.mlp.linear_fc1.weight"]
            .placements] == [("__0_0.distcp", 1024, 0, 24), ("__1_0.distcp", 1024, 24, 24)]
    with pytest.raises(PlanError) as e:
        megatron.plan(_megatron_layout(), max_shard_bytes=1, mapping="guess-qkv")
    assert e.value.code == "plan.mapping.unknown"


@pytest.mark.parametrize("name, alias_folder", [
    ("deepspeed_universal", True),         # DeepSpeed 0.19.8 writes zero/head.weight/fp32.pt (bf16 values up-cast)
    ("deepspeed_universal_ds0189", False),  # DeepSpeed 0.18.9 writes no folder for the tied alias
    ("deepspeed_universal_ds0176", False),  # nor does 0.17.6
])
def test_universal_alias_takes_the_target_fp32(name: str, alias_folder: bool) -> None:
    if not (FIXTURES / name).exists():
        pytest.skip(f"no {name} fixture in this checkout")
    root = FIXTURES / name / "checkpoint"
    assert (root / "global_step2_universal" / "zero" / "head.weight").is_dir() is alias_folder
    with SafeTree.open(root) as tree:
        plan = plan_for(inspect_open_tree(tree), decision=ALLOW, max_shard_bytes=1 << 20)
    ts = {t.name: t for s in plan.shards for t in s.tensors}
    assert plan.report["shared_params"] == [["head.weight", "embed.weight"]]
    assert ts["head.weight"].placements == ts["embed.weight"].placements
    assert ts["embed.weight"].placements[0].src.endswith("zero/embed.weight/fp32.pt")


def test_slicing_a_strided_placement_keeps_its_whole_runs_strided_and_cuts_the_rest() -> None:
    import random

    from ckptgate.consolidate.adapters._common import slice_placements
    from ckptgate.consolidate.plan import Placement

    def bytes_of(placements, start=0, length=None):
        """Reference: destination byte -> (src, source byte), from every run expanded."""
        out = {}
        for p in placements:
            for s, d, n in p.runs():
                for i in range(n):
                    if length is None or start <= d + i < start + length:
                        out[d + i - start] = (p.src, s + i)
        return out

    rng = random.Random(4)
    for _ in range(500):
        n, extra = rng.randint(1, 5), rng.randint(0, 4)
        p = Placement(src="a", src_offset=rng.randint(0, 9), dst_offset=rng.randint(0, 9), length=n,
                      count=rng.randint(2, 6), src_stride=n + rng.randint(0, 3), dst_stride=n + extra)
        start, length = rng.randint(0, 30), rng.randint(1, 30)
        got = slice_placements([p], start, length)
        assert bytes_of(got) == bytes_of([p], start, length)
        assert len(got) <= 3  # the cut first and last runs, and one record for the whole ones


def test_megatron_unstacks_a_column_split_stacked_tensor_into_strided_layers() -> None:
    layout = _megatron_layout()
    # split on dim 2 instead (columns): each rank's chunk [2, 4, 1] at column offsets 0, 1, 2
    items, chunks = [], []
    for k in range(3):
        chunks.append({"offsets": [0, 0, k], "sizes": [2, 4, 1]})
        items.append({"fqn": "decoder.layers.mlp.linear_fc1.weight", "path": f"__{k}_0.distcp", "kind": "tensor",
                      "chunk_offsets": [0, 0, k],
                      "tensor": {"dtype": "float32", "shape": [2, 4, 1], "stride": [4, 1, 1], "storage_offset": 0,
                                 "storage_key": "0", "storage_dtype": "float32", "storage_nbytes": 32,
                                 "storage_range": [1000, 1032]}})
    layout["dcp"]["tensors"][0]["chunks"], layout["dcp"]["items"] = chunks, items
    plan = megatron.plan(layout, max_shard_bytes=1 << 20, mapping=megatron.UNSTACK_LAYERS)
    ts = {t.name: t for t in plan.shards[0].tensors}
    layer1 = ts["decoder.layers.1.mlp.linear_fc1.weight"].placements
    assert [(p.src, p.src_offset, p.dst_offset, p.count, p.dst_stride) for p in layer1] == [
        ("__0_0.distcp", 1016, 0, 4, 12), ("__1_0.distcp", 1016, 4, 4, 12), ("__2_0.distcp", 1016, 8, 4, 12)]


def test_a_70b_row_parallel_layout_plans_to_a_placement_per_tensor_and_rank_not_per_row() -> None:
    """Llama-3-70B's 723 tensors (bf16, 141 GB) saved by 8 ranks with every matrix split on dim 1:
    metadata only, no data. The plan holds O(tensors x ranks) records; as a placement per row it
    held 55.8M (about 9 GB)."""
    hidden, mlp, kv, vocab, ranks = 8192, 28672, 1024, 128256, 8
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden),
              "model.norm.weight": (hidden,)}
    for i in range(80):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                       p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (mlp, hidden), p + "mlp.up_proj.weight": (mlp, hidden),
                       p + "mlp.down_proj.weight": (hidden, mlp), p + "input_layernorm.weight": (hidden,),
                       p + "post_attention_layernorm.weight": (hidden,)})
    ends = [0] * ranks
    tensors = []
    for fqn, full in shapes.items():
        dim = len(full) - 1 if len(full) == 2 else 0
        chunks = []
        for r in range(ranks):
            offsets, sizes = [0] * len(full), list(full)
            offsets[dim], sizes[dim] = r * (full[dim] // ranks), full[dim] // ranks
            n = 2 * sizes[0] * (sizes[1] if len(sizes) == 2 else 1)
            chunks.append({"path": f"shard-{r:05d}-model-00001-of-00001.safetensors", "offsets": offsets,
                           "sizes": sizes, "data_offsets": [ends[r], ends[r] + n]})
            ends[r] += n
        tensors.append({"fqn": fqn, "dtype": "bfloat16", "size": list(full), "chunks": chunks})
    plan = dcp.plan("dcp-hf-safetensors", {"tensors": tensors}, max_shard_bytes=2 << 30)
    placed = [p for s in plan.shards for t in s.tensors for p in t.placements]
    assert len(shapes) == 723 and len(placed) <= len(shapes) * ranks
    per_row = sum(full[0] * ranks if len(full) == 2 else ranks for full in shapes.values())
    assert per_row > 55_000_000  # the per-row plan: a placement per row and rank of every matrix
    assert sum(p.count for p in placed) == per_row  # the same runs, held as strided records
    assert plan.total_size == 2 * sum(numel(full) for full in shapes.values()) > 140 * 10**9


@pytest.mark.parametrize("name", ["deepspeed_universal_zero3", "deepspeed_universal_zero3_ds0189",
                                  "deepspeed_universal_zero3_ds0176"])
def test_universal_from_zero3_takes_the_model_states_shapes(name: str) -> None:
    """ds_to_universal of a ZeRO-3 run (DeepSpeed 0.17.6, 0.18.9, 0.19.8) saves each fp32.pt as a bare
    flat tensor; the output takes the shape the folder's model states record, and the tied alias its
    target's bytes."""
    if not (FIXTURES / name).exists():
        pytest.skip(f"no {name} fixture in this checkout")
    import json

    with SafeTree.open(FIXTURES / name / "checkpoint") as tree:
        plan = plan_for(inspect_open_tree(tree), decision=ALLOW, max_shard_bytes=1 << 20)
    ts = {t.name: t for s in plan.shards for t in s.tensors}
    raw = (FIXTURES / name / "expected.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    header.pop("__metadata__", None)
    assert {k: tuple(ts[k].shape) for k in ts} == {k: tuple(v["shape"]) for k, v in header.items()}
    assert ts["embed.weight"].shape == (7, 6)  # flat [42] in fp32.pt
    assert ts["head.weight"].placements == ts["embed.weight"].placements


def _universal_mutated(tmp_path: Path, name: str, mutate: Any) -> Any:
    import shutil

    if not (FIXTURES / name).exists():
        pytest.skip(f"no {name} fixture in this checkout")
    root = tmp_path / "c"
    shutil.copytree(FIXTURES / name / "checkpoint", root)
    mutate(root / "global_step2_universal" / "zero")
    with SafeTree.open(root) as tree:
        return inspect_open_tree(tree)


def _flat(n: int) -> Any:
    def mutate(zero: Path) -> None:
        import torch

        torch.save(torch.zeros(n), zero / "embed.weight" / "fp32.pt")

    return mutate


def _transposed(zero: Path) -> None:
    import torch

    torch.save(torch.zeros(6, 7), zero / "embed.weight" / "fp32.pt")  # param_shapes: (7, 6)


def _removed(zero: Path) -> None:
    import shutil

    shutil.rmtree(zero / "fc2.weight")


def _no_model_states(zero: Path) -> None:
    for p in zero.parent.glob("*model_states.pt"):
        p.unlink()


@pytest.mark.parametrize("name", ["deepspeed_universal", "deepspeed_universal_zero3"])
@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (_flat(43), "plan.universal.shape_mismatch"),  # 43 elements where param_shapes records 7 x 6
        (_transposed, "plan.universal.shape_mismatch"),
        (_removed, "plan.universal.param_missing"),
        (_no_model_states, "plan.universal.no_param_shapes"),  # flat ZeRO-3 tensors had no shape to take
    ],
)
def test_universal_fp32_that_disagrees_with_param_shapes_is_refused(
    tmp_path: Path, name: str, mutate: Any, code: str
) -> None:
    """A fp32.pt is published in the shape the model states record or not at all: another element
    count was published flat, another 2-D shape as written, and a param with no folder was left out
    (review2 A2)."""
    insp = _universal_mutated(tmp_path, name, mutate)
    with pytest.raises(PlanError) as e:
        plan_for(insp, decision=ALLOW, max_shard_bytes=1 << 20)
    assert e.value.code == code


def test_universal_flat_fp32_with_the_recorded_count_still_takes_the_recorded_shape(tmp_path: Path) -> None:
    insp = _universal_mutated(tmp_path, "deepspeed_universal_zero3", _flat(42))
    plan = plan_for(insp, decision=ALLOW, max_shard_bytes=1 << 20)
    assert {t.name: t.shape for s in plan.shards for t in s.tensors}["embed.weight"] == (7, 6)
