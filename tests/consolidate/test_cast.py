"""Casting on request (``--dtype``): torch's ``.to()`` bit for bit, in both writer modes."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

from ckptgate.consolidate.cast import convert
from ckptgate.consolidate.plan import CopiedFile, ConsolidationPlan, OutputTensor, PlanError, Placement, \
    ShardTask, cast_plan, shard_tensors
from ckptgate.consolidate.writer import INDEX_NAME, write_plan

TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _values() -> torch.Tensor:
    rng = np.random.default_rng(7)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 65504.0, 65520.0, 1e-8, 6e-8, 3e38, -3e38,
                        1.00390625, 1.01171875, 2.0 ** -133, 2.0 ** -149, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8],
                       np.float32)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFC00123], np.uint32).view(np.float32)
    bits = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)  # every pattern
    return torch.from_numpy(np.concatenate([special, nans, rng.standard_normal(4096).astype(np.float32) * 300, bits]))


SOURCES = {"F32": _values(), "F64": _values().to(torch.float64) * (1 + 2 ** -30)}
SOURCES["F16"] = SOURCES["F32"].to(torch.float16)
SOURCES["BF16"] = SOURCES["F32"].to(torch.bfloat16)


@pytest.mark.parametrize(("src", "dst"), [(a, b) for a in sorted(TORCH) for b in sorted(TORCH) if a != b])
def test_convert_matches_torch_and_keeps_nans(src, dst):
    t = SOURCES[src]
    want = t.to(TORCH[dst])
    got = torch.frombuffer(bytearray(convert(_raw(t), src, dst)), dtype=TORCH[dst])
    nan = torch.isnan(want)
    assert nan.sum() >= 4
    assert _raw(got[~nan]) == _raw(want[~nan])  # every number, infinities and signed zeros included
    assert torch.isnan(got[nan]).all()
    assert _signs(got)[nan.numpy()].tolist() == _signs(t)[nan.numpy()].tolist()  # from the bits: torch's
    # own F16-to-F32 conversion drops a NaN's sign


def _signs(t: torch.Tensor) -> np.ndarray:
    return np.frombuffer(_raw(t), np.uint8).reshape(-1, t.element_size())[:, -1] >> 7


def test_convert_refuses_partial_elements_and_other_dtypes():
    with pytest.raises(ValueError):
        convert(b"\x00" * 6, "F32", "BF16")
    with pytest.raises(ValueError):
        convert(b"\x00" * 4, "I32", "F32")


def _plan(tmp_path, tensors, max_shard_bytes=1 << 20):
    src = tmp_path / "src.safetensors"
    save_file(tensors, str(src))
    raw = src.read_bytes()
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    outs = [OutputTensor(name=k, dtype=v["dtype"], shape=tuple(v["shape"]),
                         placements=(Placement(src="src.safetensors", src_offset=8 + hlen + v["data_offsets"][0],
                                               dst_offset=0, length=v["data_offsets"][1] - v["data_offsets"][0]),))
            for k, v in header.items() if k != "__metadata__"]
    return src, raw, shard_tensors(outs, max_shard_bytes=max_shard_bytes)


def test_cast_plan_casts_floats_only_repacks_and_reports():
    outs = [OutputTensor(name="w", dtype="F32", shape=(4, 4), placements=(Placement(src="s", src_offset=0,
                                                                                    dst_offset=0, length=64),)),
            OutputTensor(name="ids", dtype="I64", shape=(2,), placements=(Placement(src="s", src_offset=64,
                                                                                    dst_offset=0, length=16),)),
            OutputTensor(name="x", dtype="BF16", shape=(8,), placements=(Placement(src="s", src_offset=80,
                                                                                   dst_offset=0, length=16),))]
    plan = shard_tensors(outs, max_shard_bytes=40)
    assert cast_plan(plan, None, max_shard_bytes=40) is plan
    cast = cast_plan(plan, "BF16", max_shard_bytes=40)
    by_name = {t.name: t for s in cast.shards for t in s.tensors}
    assert (by_name["w"].dtype, by_name["w"].source_dtype, by_name["w"].nbytes) == ("BF16", "F32", 32)
    assert (by_name["ids"].dtype, by_name["ids"].source_dtype) == ("I64", None)
    assert (by_name["x"].dtype, by_name["x"].source_dtype) == ("BF16", None)  # already the target
    assert cast.total_size == 32 + 16 + 16 and all(s.nbytes <= 40 for s in cast.shards)
    assert dict(cast.report)["cast"] == {"dtype": "BF16", "tensors": 1}
    with pytest.raises(PlanError) as e:
        cast_plan(plan, "I8", max_shard_bytes=40)
    assert e.value.code == "plan.cast.dtype"


def test_cast_plan_keeps_a_pass_through_output_in_its_files():
    t = OutputTensor(name="lora_A", dtype="F32", shape=(2,), placements=(Placement(src="a.safetensors", src_offset=8,
                                                                                     dst_offset=0, length=8),))
    plan = ConsolidationPlan(shards=(ShardTask(filename="adapter_model.safetensors", tensors=(t,)),),
                             copies=(CopiedFile(src="adapter_config.json", filename="adapter_config.json", size=2),),
                             write_index=False)
    cast = cast_plan(plan, "F16", max_shard_bytes=1)
    assert [s.filename for s in cast.shards] == ["adapter_model.safetensors"] and cast.copies == plan.copies
    assert cast.shards[0].tensors[0].dtype == "F16" and not cast.write_index


def test_a_placement_that_splits_an_element_cannot_be_cast():
    with pytest.raises(PlanError) as e:
        OutputTensor(name="w", dtype="BF16", shape=(2,), source_dtype="F32",
                     placements=(Placement(src="s", src_offset=0, dst_offset=0, length=6),
                                 Placement(src="s", src_offset=6, dst_offset=6, length=2)))
    assert e.value.code == "plan.tensor.cast"
    with pytest.raises(PlanError):
        OutputTensor(name="w", dtype="F32", shape=(2,), source_dtype="I32",
                     placements=(Placement(src="s", src_offset=0, dst_offset=0, length=8),))


@pytest.mark.parametrize("mode", ["verified", "held"])
@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32", "F64"])
def test_written_cast_equals_torch_in_both_modes(tmp_path, mode, dtype):
    """An odd-sized U8 tensor first puts the cast tensors at odd output offsets, and a window of
    4 KiB + change splits their elements across windows and source chunks."""
    rng = np.random.default_rng(3)
    tensors = {"a_bytes": rng.integers(0, 255, (4099,), dtype=np.uint8),
               "b_f32": rng.standard_normal((61, 67)).astype(np.float32) * 50,
               "c_f16": rng.standard_normal((1001,)).astype(np.float16),
               "d_f64": rng.standard_normal((523,)),
               "e_ids": rng.integers(-5, 5, (77,), dtype=np.int64)}
    src, raw, plan = _plan(tmp_path, tensors, max_shard_bytes=20_000)
    plan = cast_plan(plan, dtype, max_shard_bytes=20_000)
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(src, os.O_RDONLY)
    progress: list[int] = []
    try:
        written = write_plan(plan, out, {"src.safetensors": fd}, chunk_size=4096 + 13, on_bytes=progress.append,
                             expected={"src.safetensors": hashlib.sha256(raw).hexdigest()} if mode == "verified"
                             else None)
    finally:
        os.close(fd)
    index = json.loads((out / INDEX_NAME).read_text())
    loaded: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        loaded.update(load_file(str(out / shard)))
    for name, arr in tensors.items():
        original = torch.from_numpy(arr)
        want = original.to(TORCH[dtype]) if original.is_floating_point() else original
        assert loaded[name].dtype == want.dtype and _raw(loaded[name]) == _raw(want), name
    assert index["metadata"]["total_size"] == plan.total_size == sum(progress)
    for w in written:
        assert hashlib.sha256((out / w.filename).read_bytes()).hexdigest() == w.sha256


def test_numpy_is_imported_only_by_a_cast() -> None:
    """numpy costs every start about 0.1 s; an intake without ``--dtype`` never needs it."""
    import subprocess
    import sys

    probe = ("import sys, ckptgate._cli.commands, ckptgate.pipeline; print('numpy' in sys.modules); "
             "from ckptgate.consolidate.cast import convert; convert(b'\\0\\0\\0\\0', 'F32', 'F16'); "
             "print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
