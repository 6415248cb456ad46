"""Per-layer and per-expert keys (``singleton_local_shards``) read through their stacked view
(``consolidate/hf/stacking.py``).

Over the inspected layouts of the stacked fixtures (``megatron_hf_llama`` at tp2, whose
``linear_fc1`` is TP-strided; ``megatron_hf_qwen3_moe_ep2`` with stacked experts), the stacked
tensors are cut into the keys megatron-core's ``singleton_local_shards`` save writes
(``decoder.layers.<i>.``, ``...experts.experts.<e>.``, ``linear_fc1.weight_w`` / ``weight_v``, as
``apply_swiglu_sharded_factory`` and ``SequentialMLP.sharded_state_dict`` of 0.19.2 name them); the
mapped output must be byte for byte the stacked one's.  Each way the keys can fail to tile the
stacked shape is refused with its typed code.  The real saves with that option
(``megatron_hf_*_singleton_mc0192``) are checked against Megatron's logits in ``test_hf_releases.py``.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptgate.consolidate.adapters import dcp
from ckptgate.consolidate.adapters._common import slice_placements
from ckptgate.consolidate.hf.engine import map_tensors
from ckptgate.consolidate.hf.stacking import stack_per_layer
from ckptgate.consolidate.hf.table import MappingRefused, declare
from ckptgate.consolidate.plan import DTYPE_SIZES, OutputTensor, shard_tensors
from ckptgate.consolidate.writer import write_plan
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import open_sources

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pipeline_helpers import FIXTURES

_LAYOUTS: dict[str, Any] = {}


def _layout(name: str) -> Any:
    if name not in _LAYOUTS:
        with SafeTree.open(FIXTURES / name / "checkpoint") as tree:
            _LAYOUTS[name] = inspect_open_tree(tree).layout["dcp"]
    return _LAYOUTS[name]


def _config(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "hf_config" / "config.json").read_text())


def _items(name: str) -> list[dict[str, Any]]:
    return [i for i in _layout(name)["items"] if i.get("kind") == "bytes"]


def _cut(t: OutputTensor, start: int, shape: tuple[int, ...], name: str) -> OutputTensor:
    n = math.prod(shape) * DTYPE_SIZES[t.dtype]
    return OutputTensor(name=name, dtype=t.dtype, shape=shape, placements=slice_placements(t.placements, start, n))


def singleton_keys(tensors: list[OutputTensor]) -> list[OutputTensor]:
    """The stacked ``decoder.layers.*`` tensors as a singleton_local_shards save keys them."""
    out = []
    for t in tensors:
        if not t.name.startswith("decoder.layers."):
            out.append(t)
            continue
        rest = t.name.removeprefix("decoder.layers.")
        experts = rest.startswith("mlp.experts.experts.")
        lead = 2 if experts else 1
        inner = t.shape[lead:]
        member = math.prod(inner) * DTYPE_SIZES[t.dtype]
        for k in range(math.prod(t.shape[:lead])):
            i, e = divmod(k, t.shape[1]) if experts else (k, None)
            key = (f"decoder.layers.{i}.mlp.experts.experts.{e}.{rest.removeprefix('mlp.experts.experts.')}"
                   if experts else f"decoder.layers.{i}.{rest}")
            if key.endswith("linear_fc1.weight"):  # gated: [gate; up] -> weight_w, weight_v
                half = (inner[0] // 2, *inner[1:])
                out.append(_cut(t, k * member, half, key + "_w"))
                out.append(_cut(t, k * member + member // 2, half, key + "_v"))
            else:
                out.append(_cut(t, k * member, inner, key))
    return out


def _written(tensors: list[OutputTensor], fixture: str, out: Path) -> dict[str, bytes]:
    from safetensors.numpy import load_file

    mapped, _ = map_tensors(tensors, _items(fixture), declare(_config(fixture)))
    plan = shard_tensors(mapped, max_shard_bytes=1 << 30)
    out.mkdir()
    with SafeTree.open(FIXTURES / fixture / "checkpoint") as tree:
        tree.hold()
        with open_sources(tree, plan) as sources:
            write_plan(plan, out, sources, expected=None)
    got: dict[str, bytes] = {}
    for f in out.glob("*.safetensors"):
        got.update({k: v.tobytes() for k, v in load_file(str(f)).items()})
    return got


@pytest.mark.parametrize("fixture", ["megatron_hf_llama", "megatron_hf_qwen3_moe_ep2"])
def test_per_layer_keys_map_to_the_same_bytes_as_stacked_ones(fixture: str, tmp_path: Path) -> None:
    stacked = dcp.torch_save_tensors(_layout(fixture))
    keys = singleton_keys(stacked)
    assert any(t.name.endswith("linear_fc1.weight_w") for t in keys)
    assert not any(t.name.startswith("decoder.layers.") and not t.name[len("decoder.layers."):][0].isdigit()
                   for t in keys)
    want = _written(stacked, fixture, tmp_path / "stacked")
    got = _written(keys, fixture, tmp_path / "singleton")
    assert got.keys() == want.keys() and all(got[k] == want[k] for k in want)
    _, report = map_tensors(keys, _items(fixture), declare(_config(fixture)))
    per_layer = report["ledger"]["per_layer_keys"]
    layers = _config(fixture)["num_hidden_layers"]
    assert per_layer["decoder.layers.mlp.linear_fc1.weight" if "llama" in fixture
                     else "decoder.layers.mlp.experts.experts.linear_fc1.weight"] == layers * (
        2 if "llama" in fixture else 2 * 4)
    assert per_layer["decoder.layers.self_attention.linear_qkv.weight"] == layers


def _keys(fixture: str = "megatron_hf_llama") -> list[OutputTensor]:
    return singleton_keys(dcp.torch_save_tensors(_layout(fixture)))


def _refused(tensors: list[OutputTensor], fixture: str = "megatron_hf_llama") -> MappingRefused:
    with pytest.raises(MappingRefused) as e:
        map_tensors(tensors, _items(fixture), declare(_config(fixture)))
    return e.value


def test_a_missing_layer_is_refused() -> None:
    e = _refused([t for t in _keys() if t.name != "decoder.layers.1.self_attention.linear_qkv.weight"])
    assert e.code == "mapping.per_layer.incomplete"
    assert e.evidence["tensor"] == "decoder.layers.self_attention.linear_qkv.weight"
    assert e.evidence["missing"] == [[1, None, None]]


def test_a_layer_beyond_the_config_is_refused() -> None:
    keys = _keys()
    extra = next(t for t in keys if t.name == "decoder.layers.1.mlp.linear_fc2.weight")
    e = _refused([*keys, OutputTensor(name="decoder.layers.2.mlp.linear_fc2.weight", dtype=extra.dtype,
                                      shape=extra.shape, placements=extra.placements)])
    assert e.code == "mapping.per_layer.incomplete" and e.evidence["unexpected"] == [[2, None, None]]


def test_a_missing_gated_half_is_refused() -> None:
    e = _refused([t for t in _keys() if t.name != "decoder.layers.0.mlp.linear_fc1.weight_v"])
    assert e.code == "mapping.per_layer.incomplete"
    assert e.evidence["missing"] == [[0, None, "v"]]


def test_halves_mixed_with_a_whole_tensor_are_refused() -> None:
    import dataclasses

    keys = _keys()
    w, v = (next(t for t in keys if t.name == f"decoder.layers.1.mlp.linear_fc1.weight_{h}") for h in "wv")
    whole = OutputTensor(name="decoder.layers.1.mlp.linear_fc1.weight", dtype=w.dtype,
                         shape=(2 * w.shape[0], *w.shape[1:]),
                         placements=(*w.placements, *(dataclasses.replace(p, dst_offset=p.dst_offset + w.nbytes)
                                                      for p in v.placements)))
    assert _refused([*(t for t in keys if t not in (w, v)), whole]).code == "mapping.per_layer.halves"


def test_per_layer_keys_of_different_shapes_are_refused() -> None:
    keys = _keys()
    i = next(k for k, t in enumerate(keys) if t.name == "decoder.layers.1.mlp.linear_fc2.weight")
    t = keys[i]
    keys[i] = OutputTensor(name=t.name, dtype=t.dtype, shape=(t.shape[0] // 2, t.shape[1]),
                           placements=slice_placements(t.placements, 0, t.nbytes // 2))
    assert _refused(keys).code == "mapping.per_layer.shape"


def test_a_tensor_saved_both_stacked_and_per_layer_is_refused() -> None:
    stacked = dcp.torch_save_tensors(_layout("megatron_hf_llama"))
    qkv = next(t for t in stacked if t.name == "decoder.layers.self_attention.linear_qkv.weight")
    e = _refused([*_keys(), qkv])
    assert e.code == "mapping.source.ambiguous" and e.evidence["tensors"] == [qkv.name]


def test_per_expert_keys_need_every_expert() -> None:
    keys = [t for t in _keys("megatron_hf_qwen3_moe_ep2")
            if t.name != "decoder.layers.0.mlp.experts.experts.3.linear_fc2.weight"]
    e = _refused(keys, "megatron_hf_qwen3_moe_ep2")
    assert e.code == "mapping.per_layer.incomplete" and e.evidence["missing"] == [[0, 3, None]]


def test_stacked_tensors_pass_through_unchanged() -> None:
    stacked = dcp.torch_save_tensors(_layout("megatron_hf_llama"))
    out, gathered = stack_per_layer(stacked, declare(_config("megatron_hf_llama")))
    assert out == stacked and gathered == {}


@pytest.mark.parametrize("spelling", ["decoder.layers.01.mlp.linear_fc2.weight",
                                      "decoder.layers.00.mlp.experts.experts.03.linear_fc2.weight"])
def test_two_keys_for_one_layer_or_expert_are_refused_not_one_dropped(spelling: str) -> None:
    """``decoder.layers.1.`` and ``decoder.layers.01.`` (or experts ``3`` and ``03``) are two keys of the save
    that name one member of the stacked view: refused as ambiguous, never one of them silently published."""
    fixture = "megatron_hf_qwen3_moe_ep2" if "experts" in spelling else "megatron_hf_llama"
    keys = _keys(fixture)
    canonical = spelling.replace(".01.", ".1.").replace(".00.", ".0.").replace(".03.", ".3.")
    twin = next(t for t in keys if t.name == canonical)
    e = _refused([*keys, OutputTensor(name=spelling, dtype=twin.dtype, shape=twin.shape,
                                      placements=twin.placements)], fixture)
    assert e.code == "mapping.source.ambiguous" and sorted(e.evidence["tensors"]) == sorted([canonical, spelling])


@contextlib.contextmanager
def _address_space_grows_at_most(extra: int) -> Iterator[None]:
    """Lower the soft address-space limit to what the process maps now plus ``extra`` bytes, so an
    allocation that grows with a config's numbers fails with MemoryError instead of exhausting the host."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                  if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize(("fixture", "symbol", "first_missing"), [
    ("megatron_hf_llama", "num_hidden_layers", [2, None, None]),
    ("megatron_hf_qwen3_moe_ep2", "num_experts", [0, 4, "w"]),
])
def test_a_config_declaring_10e12_layers_or_experts_is_refused_without_listing_them(
    fixture: str, symbol: str, first_missing: list[Any]
) -> None:
    """The per-layer keys are checked against the config member by member and by count: a config that
    declares 10**12 layers (or experts) beside a save of 2 is refused at once, where listing every
    member the config declares took memory without bound."""
    config = _config(fixture)
    key = next(k for k in ("num_experts", "num_local_experts") if k in config) if symbol == "num_experts" else symbol
    config[key] = 10**12
    d = declare(config)
    with _address_space_grows_at_most(256 << 20), pytest.raises(MappingRefused) as e:
        map_tensors(_keys(fixture), _items(fixture), d)
    assert e.value.code == "mapping.per_layer.incomplete"
    assert e.value.evidence["missing"][0] == first_missing and e.value.evidence["unexpected"] == []


def test_a_layer_number_of_thousands_of_digits_is_a_tensor_no_rule_maps() -> None:
    """``decoder.layers.<5000 digits>.x`` is no per-layer key (Python refuses to read an int of over 4300
    digits: a ValueError and a traceback before): it stays a tensor of its own, refused as unmapped."""
    keys = _keys()
    t = keys[0]
    odd = OutputTensor(name="decoder.layers." + "1" * 5000 + ".mlp.linear_fc2.weight", dtype=t.dtype,
                       shape=t.shape, placements=t.placements)
    e = _refused([*keys, odd])
    assert e.code == "mapping.source.unmapped" and e.evidence["tensor"] == odd.name
