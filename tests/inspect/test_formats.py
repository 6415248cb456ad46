"""Format detectors: real fixtures (tests/fixtures/data) and synthetic layouts and attacks."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from ckptgate.evidence.fixtures import Fixture
from ckptgate.evidence.gates import fixture_format, gates_data
from ckptgate.inspect import inspect_tree

from ckpt_inspect_helpers import write

torch = pytest.importorskip("torch")
import safetensors.torch  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def _codes(insp) -> set[str]:  # noqa: ANN001
    return {f.code for f in insp.findings}


def _fixture(name: str) -> tuple[Path, dict]:
    d = FIXTURES / name
    if not (d / "meta.json").exists():
        pytest.fail(f"fixture {name} missing: run tests/fixtures/generate.py --only {name}")
    return d, json.loads((d / "meta.json").read_text())



def _from_range(raw: bytes, dtype: str, shape: list[int], stride: list[int], offset: int, rng: list[int]):  # noqa: ANN202
    dt = getattr(torch, dtype)
    storage = torch.frombuffer(bytearray(raw[rng[0]:rng[1]]), dtype=dt) if rng[1] > rng[0] else torch.empty(0, dtype=dt)
    return torch.as_strided(storage, shape, stride, offset)


# -- real fixtures ------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
#: What the selected checkpoint of a run producer holds, for the ``meta.json`` formats that name a
#: training run rather than a checkpoint format (the gates data does not list them): a Trainer's
#: ``checkpoint-N/`` holds ``model.safetensors`` (plus pickled optimizer, scheduler and RNG state),
#: a PEFT adapter, or DeepSpeed's ``global_stepN/`` at the run's ZeRO stage; ``save_state`` writes
#: ``model.safetensors`` beside the pickled state; a Trainer under FSDP with SHARDED_STATE_DICT writes
#: DCP folders of the model and the optimizer (one DCP training-state tree).
RUN_FORMATS = {"trainer-safetensors": "safetensors", "trainer-peft": "peft-lora",
               "trainer-deepspeed": "deepspeed-zero{zero_stage}", "accelerate-save-state": "safetensors",
               "trainer-fsdp": "dcp-torch-save"}
#: Producer formats whose files are another format's layout: ZeRO-1 writes ZeRO-2's file names, and
#: only ``zero_stage`` inside the optimizer states tells them apart (the row's topology carries it).
SAME_LAYOUT = {"deepspeed-zero1": "deepspeed-zero2"}


def _known_format(meta: dict) -> str:
    """The format the gates data knows the fixture by: ``meta.json``'s when the gates data lists
    it, else what its run producer's checkpoint holds (:data:`RUN_FORMATS`)."""
    formats = (gates_data(REPO) or {}).get("formats") or {}
    if meta["format"] in formats:
        return meta["format"]
    if meta["format"] in SAME_LAYOUT:
        return SAME_LAYOUT[meta["format"]]
    if meta["format"] not in RUN_FORMATS:
        pytest.fail(f"meta format {meta['format']!r} is neither in the gates data nor a known run producer's")
    want = RUN_FORMATS[meta["format"]].format(**meta["topology"])
    assert want in formats, f"{meta['format']} maps to {want!r}, which the gates data does not list"
    return want


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir()))
def test_real_fixture_format_matches_its_producer(name: str) -> None:
    d, meta = _fixture(name)
    fixture = Fixture.load(d)  # its checkpoint: the selected checkpoint-N/ of a run, as qualification reads it
    insp = inspect_tree(fixture.checkpoint)
    want = _known_format(meta)
    assert insp.format == want
    assert fixture_format(REPO, fixture, insp) == want  # what qualification attests it as
    facts = insp.to_facts()
    json.dumps(facts)  # serialisable
    on_disk = sorted(os.path.relpath(os.path.join(r, n), fixture.checkpoint)
                     for r, _dirs, names in os.walk(fixture.checkpoint) for n in names)
    assert [f["path"] for f in facts["files"]] == on_disk


@pytest.mark.parametrize("name", ["hf_sharded"])
def test_hf_sharded_layout_matches_expected(name: str) -> None:
    d, meta = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.clean and insp.loaders == ("safetensors", "json")
    got = {t["name"]: (t["dtype"], t["shape"]) for s in insp.layout["shards"] for t in s["tensors"]}
    assert got == {k: (v["dtype"], v["shape"]) for k, v in meta["expected"]["tensors"].items()}


#: The DCP torch_save fixtures: the project's and those farm environments wrote with other torch
#: releases (``dcp_torch_save_pt215``, ...), whose ``.metadata`` shapes differ (TensorProperties).
DCP_TORCH_SAVE = sorted(p.name for p in FIXTURES.iterdir()
                        if p.name in ("dcp_torch_save", "dcp_torch_save_bytes")
                        or p.name.startswith(("dcp_torch_save_pt", "dcp_torch_save_bytes_pt")))


@pytest.mark.parametrize("name", DCP_TORCH_SAVE)
def test_dcp_torch_save_byte_ranges_hold_the_expected_values(name: str) -> None:
    d, meta = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.clean and insp.loaders == ("static_pickle",)
    expected = safetensors.torch.load_file(str(d / "expected.safetensors"))
    lay = insp.layout
    assert {t["fqn"]: t["size"] for t in lay["tensors"]} == {k: list(v.shape) for k, v in expected.items()}
    assert {b.split(".")[0] for b in lay["bytes_items"]} == set(meta["non_tensor_items"])
    n = 0
    for item in lay["items"]:
        if item["kind"] != "tensor":
            continue
        t = item["tensor"]
        raw = (d / "checkpoint" / item["path"]).read_bytes()
        got = _from_range(raw, t["dtype"], t["shape"], t["stride"], t["storage_offset"], t["storage_range"])
        full = expected[item["fqn"]]
        sl = tuple(slice(o, o + s) for o, s in zip(item["chunk_offsets"], t["shape"]))
        assert torch.equal(got, full[sl]), item["fqn"]
        n += 1
    assert n >= len(expected)


@pytest.mark.parametrize("name", ["dcp_hf_safetensors"])
def test_dcp_hf_storage_layout(name: str) -> None:
    d, meta = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.clean
    shapes = {t["fqn"]: t["size"] for t in insp.layout["tensors"]}
    assert shapes == {k: v["shape"] for k, v in meta["expected"]["tensors"].items()}
    assert "dcp.hf_size_inferred" in _codes(insp)


@pytest.mark.parametrize("name", ["dcp_hf_safetensors_bytes"])
def test_dcp_hf_storage_with_byte_io_is_a_torch_zip_named_safetensors(name: str) -> None:
    d, _ = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert not insp.clean and not insp.consolidatable
    assert {"classify.extension_mismatch", "dcp.hf_not_safetensors"} <= _codes(insp)


@pytest.mark.parametrize("name", ["fsdp_full"])
def test_fsdp_full_layout_matches_expected(name: str) -> None:
    d, _ = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.clean and insp.loaders == ("static_pickle",)
    expected = safetensors.torch.load_file(str(d / "expected.safetensors"))
    raw = (d / "checkpoint" / insp.layout["file"]).read_bytes()
    got = {t["name"]: t for t in insp.layout["tensors"]}
    assert set(got) == set(expected)
    for k, v in expected.items():
        t = got[k]
        assert torch.equal(_from_range(raw, t["dtype"], t["shape"], t["stride"], t["storage_offset"],
                                       t["storage_range"]), v)


@pytest.mark.parametrize("name", ["fsdp_local"])
def test_fsdp_local_is_not_consolidatable(name: str) -> None:
    d, _ = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.format == "fsdp-local" and not insp.consolidatable
    assert "fsdp.local_not_consolidatable" in _codes(insp)


@pytest.mark.parametrize("name", ["peft_lora", "peft_lora_unpinned"])
def test_peft_fields(name: str) -> None:
    d, meta = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    a = insp.layout["adapters"][0]
    assert a["fields"]["base_model_name_or_path"] == meta["base_model"]["name"]
    assert a["fields"]["revision"] == meta["base_model"]["revision"]
    assert sorted(t["name"] for t in a["tensors"]) == meta["observed"]["adapter_keys"]
    assert ("peft.base_not_pinned" in _codes(insp)) == (meta["base_model"]["revision"] is None)


@pytest.mark.parametrize("revision", [None, "", "main", "v1.0", "0123456789abcdef", "0123456789ABCDEF" * 2 + "01234567", 5])
def test_a_peft_revision_that_is_not_a_commit_id_is_not_pinned(revision: object, tmp_path: Path) -> None:
    """A branch or tag moves: only a full commit id pins the base (the warning fired for null alone)."""
    d, _meta = _fixture("peft_lora")
    root = tmp_path / "adapter"
    shutil.copytree(d / "checkpoint", root)
    assert "peft.base_not_pinned" not in _codes(inspect_tree(root))
    config = json.loads((root / "adapter_config.json").read_text())
    (root / "adapter_config.json").write_text(json.dumps({**config, "revision": revision}))
    assert "peft.base_not_pinned" in _codes(inspect_tree(root))


@pytest.mark.parametrize(("field", "value", "extra"), [
    ("base_model_name_or_path", "A" * 5000, {}),
    ("base_model_name_or_path", "A" * 200_000, {"revision": None}),  # nor in the unpinned warning's evidence
    ("revision", "0" * 5000, {}),
    ("target_modules", [f"module_{i:06d}" for i in range(8000)], {})])
def test_an_implausibly_long_peft_field_is_refused_and_kept_out_of_the_facts(field: str, value: object, extra: dict,
                                                                            tmp_path: Path) -> None:
    d, _meta = _fixture("peft_lora")
    root = tmp_path / "adapter"
    root.mkdir()
    for f in (d / "checkpoint").iterdir():
        (root / f.name).write_bytes(f.read_bytes())
    config = json.loads((root / "adapter_config.json").read_text())
    (root / "adapter_config.json").write_text(json.dumps({**config, field: value, **extra}))
    insp = inspect_tree(root)
    assert "peft.field_too_long" in _codes(insp) and not insp.clean
    assert insp.layout["adapters"][0]["fields"][field] is None
    assert len(json.dumps(insp.to_facts())) < 100_000


# -- HF index attacks ---------------------------------------------------------------------------
def _hf(root: Path, weight_map: dict[str, str] | None = None, total: int | None = None, extra_shard: bool = False,
        index_text: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file({"a": np.zeros(2, np.float32)}, str(root / "model-00001-of-00002.safetensors"))
    safetensors.numpy.save_file({"b": np.zeros(3, np.float32)}, str(root / "model-00002-of-00002.safetensors"))
    if extra_shard:
        safetensors.numpy.save_file({"c": np.zeros(1, np.float32)}, str(root / "stray.safetensors"))
    wm = weight_map if weight_map is not None else {"a": "model-00001-of-00002.safetensors",
                                                    "b": "model-00002-of-00002.safetensors"}
    doc = {"metadata": {"total_size": 20 if total is None else total}, "weight_map": wm}
    (root / "model.safetensors.index.json").write_text(index_text or json.dumps(doc))
    return root


def test_hf_index_valid(tmp_path: Path) -> None:
    insp = inspect_tree(_hf(tmp_path))
    assert insp.format == "hf-sharded-safetensors" and insp.clean


@pytest.mark.parametrize("target", ["../x", "/etc/passwd", "C:model.safetensors", "\\\\host\\share", "sub\\x",
                                    "%2e%2e/x", "a\x00b", ".."])
def test_weight_map_escapes(target: str, tmp_path: Path) -> None:
    insp = inspect_tree(_hf(tmp_path, {"a": target, "b": "model-00002-of-00002.safetensors"}))
    assert "index.unsafe_target" in _codes(insp) and not insp.clean


@pytest.mark.parametrize(("name", "target", "codes"), [
    # a second safetensors index: which one a loader reads is the attacker's choice
    ("zzz.safetensors.index.json", "model-00001-of-00002.safetensors", {"index.ambiguous"}),
    ("aaa.safetensors.index.json", "../../etc/passwd", {"index.ambiguous", "index.unsafe_target"}),
    # what transformers reads with use_safetensors=False
    ("pytorch_model.bin.index.json", "/root/.ssh/id_rsa", {"index.unsafe_target", "index.not_consolidated"}),
])
def test_every_index_beside_the_consolidated_one_is_checked(name: str, target: str, codes: set[str],
                                                          tmp_path: Path) -> None:
    root = _hf(tmp_path)
    (root / name).write_text(json.dumps({"metadata": {}, "weight_map": {"a": target}}))
    insp = inspect_tree(root)
    assert insp.layout["index"] == ("aaa.safetensors.index.json" if name.startswith("aaa") else
                                    "model.safetensors.index.json")
    assert codes <= _codes(insp) and not insp.clean


@pytest.mark.parametrize("target", ["model-00001-of-00002.safetensors", "pytorch_model-00001-of-00002.bin"])
def test_a_bin_index_with_safe_targets_is_a_warning_even_when_its_shards_were_not_downloaded(
        target: str, tmp_path: Path) -> None:
    root = _hf(tmp_path)
    (root / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": target}}))
    insp = inspect_tree(root)
    assert insp.clean and "index.not_consolidated" in _codes(insp) and "index.missing_shard" not in _codes(insp)


def test_weight_map_names_missing_shard(tmp_path: Path) -> None:
    insp = inspect_tree(_hf(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "nope.safetensors"}))
    assert "index.missing_shard" in _codes(insp)


def test_tensor_missing_from_its_shard(tmp_path: Path) -> None:
    wm = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
          "ghost": "model-00001-of-00002.safetensors"}
    assert "index.tensor_missing" in _codes(inspect_tree(_hf(tmp_path, wm)))


def test_tensor_in_two_shards(tmp_path: Path) -> None:
    root = _hf(tmp_path)
    safetensors.numpy.save_file({"b": np.zeros(3, np.float32), "a": np.zeros(2, np.float32)},
                                str(root / "model-00002-of-00002.safetensors"))
    assert "index.duplicate_tensor" in _codes(inspect_tree(root))


def test_shard_the_index_never_names(tmp_path: Path) -> None:
    assert "index.unnamed_shard" in _codes(inspect_tree(_hf(tmp_path, extra_shard=True)))


def test_total_size_mismatch(tmp_path: Path) -> None:
    assert "index.total_size" in _codes(inspect_tree(_hf(tmp_path, total=999)))


def test_duplicate_keys_in_index(tmp_path: Path) -> None:
    text = ('{"metadata": {"total_size": 20}, "weight_map": {"a": "model-00001-of-00002.safetensors", '
            '"a": "model-00002-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}')
    assert "json.duplicate_key" in _codes(inspect_tree(_hf(tmp_path, index_text=text)))


def test_deeply_nested_json(tmp_path: Path) -> None:
    write(tmp_path, "config.json", "[" * 100_000 + "]" * 100_000)
    insp = inspect_tree(tmp_path)
    assert _codes(insp) >= {"json.too_deep"}


def test_config_auto_map_and_code_files(tmp_path: Path) -> None:
    write(tmp_path, "config.json", json.dumps({"auto_map": {"AutoModel": "modeling_x.Model"}}))
    write(tmp_path, "modeling_x.py", "import os\n\nclass Model:\n    pass\n")
    write(tmp_path, "kernel.so", b"\x7fELF\x02\x01\x01" + b"\0" * 64)
    insp = inspect_tree(tmp_path)
    assert {"config.auto_map", "classify.code"} <= _codes(insp)
    assert {f.path for f in insp.findings if f.code == "classify.code"} == {"modeling_x.py", "kernel.so"}


def test_torch_zip_named_safetensors(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2), "step": 3}, tmp_path / "shard-00001-model-00001-of-00001.safetensors")
    insp = inspect_tree(tmp_path)
    assert insp.files[0].kind == "torch_zip"
    assert "classify.extension_mismatch" in _codes(insp) and not insp.clean


# -- DCP, Megatron, DeepSpeed, unknown ----------------------------------------------------------
def _dcp(root: Path, sd: dict) -> Path:
    import torch.distributed.checkpoint as dcp

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=str(root), no_dist=True)
    return root


def test_dcp_single_process_layout(tmp_path: Path) -> None:
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    root = _dcp(tmp_path / "ck", {"w": w, "extra": {"lr": 0.1}})
    insp = inspect_tree(root)
    assert insp.format == "dcp-torch-save" and insp.clean
    (t,) = insp.layout["tensors"]
    assert (t["fqn"], t["size"], t["dtype"]) == ("w", [3, 4], "float32")
    assert insp.layout["bytes_items"] == ["extra.lr"]
    assert insp.layout["planner_data"]["extra.lr"] == ["extra", "lr"]


def _rewrite_metadata(root: Path, edit) -> None:  # noqa: ANN001
    md = pickle.loads((root / ".metadata").read_bytes())  # our own test file, written just above
    edit(md)
    (root / ".metadata").write_bytes(pickle.dumps(md, protocol=4))


def _props_state(monkeypatch: pytest.MonkeyPatch, state) -> None:
    """Make this torch pickle ``TensorProperties`` with ``state(props, original_state)``."""
    from torch.distributed.checkpoint.metadata import TensorProperties

    original = TensorProperties.__getstate__
    monkeypatch.setattr(TensorProperties, "__getstate__", lambda self: state(self, original(self)))


def _metadata_refusals(root: Path) -> list[str]:
    return [f.message for f in inspect_tree(root).findings if f.code == "dcp.metadata_shape"]


def test_dcp_tensor_properties_of_torch_2_15_with_strides_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.15 appends the full tensor's strides to TensorProperties (6 fields, version still
    "1.0.0"); the real ``dcp_torch_save_pt215`` fixture holds them.  Emulated here on the project's torch."""
    _props_state(monkeypatch, lambda self, st: (*st, (4, 1)))
    root = _dcp(tmp_path / "ck", {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)})
    insp = inspect_tree(root)
    assert insp.clean and insp.layout["tensors"][0]["dtype"] == "float32"


@pytest.mark.parametrize(("state", "why"), [
    (lambda self, st: st[:4], "4 fields"),
    (lambda self, st: (*st, (4, 1), "extra"), "7 fields"),
    (lambda self, st: (*st, (4,)), "strides [4] do not match its 2 dimensions"),
    (lambda self, st: (*st, ("4", 1)), "strides is not a tuple"),
    (lambda self, st: (st[0], torch.sparse_coo, *st[2:]), "layout is not torch.strided"),
])
def test_dcp_tensor_properties_of_an_unknown_shape_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state, why: str
) -> None:
    """A TensorProperties no torch release writes is refused, not read by position (issue #31 item 4)."""
    _props_state(monkeypatch, state)
    root = _dcp(tmp_path / "ck", {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)})
    msgs = _metadata_refusals(root)
    assert msgs and why in msgs[0], msgs
    assert not inspect_tree(root).consolidatable


def test_dcp_relative_path_escape(tmp_path: Path) -> None:
    root = _dcp(tmp_path / "ck", {"w": torch.ones(4)})

    def edit(md) -> None:  # noqa: ANN001
        for v in md.storage_data.values():
            v.relative_path = "../outside.distcp"

    _rewrite_metadata(root, edit)
    assert "dcp.unsafe_target" in _codes(inspect_tree(root))


def test_dcp_chunk_gap_is_detected(tmp_path: Path) -> None:
    root = _dcp(tmp_path / "ck", {"w": torch.ones(4, 2)})

    def edit(md) -> None:  # noqa: ANN001
        md.state_dict_metadata["w"].size = torch.Size([6, 2])

    _rewrite_metadata(root, edit)
    assert "dcp.chunks_incomplete" in _codes(inspect_tree(root))


def test_dcp_item_range_past_file(tmp_path: Path) -> None:
    root = _dcp(tmp_path / "ck", {"w": torch.ones(4)})

    def edit(md) -> None:  # noqa: ANN001
        for v in md.storage_data.values():
            v.length += 10_000

    _rewrite_metadata(root, edit)
    assert "dcp.item_out_of_range" in _codes(inspect_tree(root))


def test_megatron_torch_dist_layer_axis(tmp_path: Path) -> None:
    root = _dcp(tmp_path / "ck", {"decoder.layers.mlp.linear_fc1.weight": torch.ones(2, 8, 4),
                                  "embedding.word_embeddings.weight": torch.ones(5, 4)})
    write(root, "metadata.json", json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                             "common_backend": "torch", "common_backend_version": 1}))
    torch.save({"iteration": 3}, root / "common.pt")
    insp = inspect_tree(root)
    assert insp.format == "megatron-torch-dist" and insp.clean
    assert insp.layout["layer_stacked"] == ["decoder.layers.mlp.linear_fc1.weight"]


@pytest.mark.parametrize("tracker", ["\u00b2", "\u0663", "x1"])
def test_megatron_tracker_that_is_not_an_ascii_integer_is_a_finding(tmp_path: Path, tracker: str) -> None:
    root = _dcp(tmp_path / "ck", {"embedding.word_embeddings.weight": torch.ones(5, 4)})
    write(root, "metadata.json", json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                             "common_backend": "torch", "common_backend_version": 1}))
    torch.save({"iteration": 3}, root / "common.pt")
    write(root, "latest_checkpointed_iteration.txt", tracker)
    codes = _codes(inspect_tree(root))
    assert "megatron.bad_latest" in codes and "inspect.detector_failed" not in codes


def _dcp_hf(root: Path, sharding_info: list[str]) -> Path:
    root.mkdir(parents=True)
    for i, info in enumerate(sharding_info, start=1):
        safetensors.numpy.save_file({"w": np.ones((2, 3) if i == 1 else (2,), dtype=np.float32)},
                                    str(root / f"shard-{i:05d}-model-00001-of-00001.safetensors"),
                                    metadata={"DCP_SHARDING_INFO": info})
    return root


@pytest.mark.parametrize("info", ['{"w": {"saved_offsets": [0, 0]}, "w": {"saved_offsets": [0, 0]}}',
                                  "[" * 5000 + "]" * 5000])
def test_dcp_hf_sharding_info_is_parsed_strictly(tmp_path: Path, info: str) -> None:
    codes = _codes(inspect_tree(_dcp_hf(tmp_path / "ck", [info])))
    assert "dcp.hf_sharding_info" in codes and "inspect.detector_failed" not in codes


def test_dcp_hf_chunks_that_disagree_on_dimensions_are_a_finding(tmp_path: Path) -> None:
    root = _dcp_hf(tmp_path / "ck", ['{"w": {"saved_offsets": [0, 0]}}', '{"w": {"saved_offsets": [2]}}'])
    insp = inspect_tree(root)
    assert "dcp.hf_sharding_info" in _codes(insp) and "inspect.detector_failed" not in _codes(insp)
    assert not insp.consolidatable


def test_dcp_hf_unsigned_and_fp8_dtypes_map_to_torch_names(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    safetensors.numpy.save_file({"u": np.arange(4, dtype=np.uint16)},
                                str(root / "shard-00001-model-00001-of-00001.safetensors"),
                                metadata={"DCP_SHARDING_INFO": '{"u": {"saved_offsets": [0]}}'})
    insp = inspect_tree(root)
    assert [t["dtype"] for t in insp.layout["tensors"]] == ["uint16"]


def _deepspeed(root: Path, tag: str = "global_step2") -> Path:
    from collections import OrderedDict

    (root / tag).mkdir(parents=True)
    write(root, "latest", tag)
    write(root, "zero_to_fp32.py", "#!/usr/bin/env python\nimport torch\n")
    torch.save({"module": OrderedDict(w=torch.ones(2, 2)), "param_shapes": [OrderedDict(w=torch.Size([2, 2]))],
                "ds_version": "0.19.8"}, root / tag / "mp_rank_00_model_states.pt")
    for r in range(2):
        torch.save({"optimizer_state_dict": {"single_partition_of_fp32_groups": [torch.zeros(2)]}},
                   root / tag / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return root


def test_deepspeed_zero_layout(tmp_path: Path) -> None:
    insp = inspect_tree(_deepspeed(tmp_path))
    assert insp.format == "deepspeed-zero2"
    lay = insp.layout
    assert (lay["tag"], lay["world_size"], lay["code_files"]) == ("global_step2", 2, ["zero_to_fp32.py"])
    assert lay["model_states"][0]["param_shapes"] == [{"w": [2, 2]}]
    assert all(o["bf16"] for o in lay["optim_states"])
    assert "classify.code" in _codes(insp) and "deepspeed" in insp.loaders


@pytest.mark.parametrize("tag", ["../../etc", "/etc", "a/b"])
def test_deepspeed_latest_tag_used_as_path(tag: str, tmp_path: Path) -> None:
    root = _deepspeed(tmp_path / "ck")
    write(root, "latest", tag)
    assert "deepspeed.bad_latest_tag" in _codes(inspect_tree(root))


def test_deepspeed_universal(tmp_path: Path) -> None:
    for p in ("w", "b"):
        (tmp_path / "zero" / p).mkdir(parents=True)
        torch.save({"param": torch.ones(3)}, tmp_path / "zero" / p / "fp32.pt")
        torch.save({"param": torch.zeros(3)}, tmp_path / "zero" / p / "exp_avg.pt")
    insp = inspect_tree(tmp_path)
    assert insp.format == "deepspeed-universal" and insp.clean
    assert sorted(insp.layout["params"]) == ["b", "w"]
    assert insp.layout["params"]["w"]["files"]["fp32"]["tensors"][0]["shape"] == [3]


def test_unknown_layout_is_reported_not_guessed(tmp_path: Path) -> None:
    write(tmp_path, "notes.txt", "hello")
    insp = inspect_tree(tmp_path)
    assert insp.format == "unknown" and "format.unknown" in _codes(insp) and not insp.consolidatable


@pytest.mark.parametrize("name", ["megatron_torch_dist"])
def test_megatron_fixture_byte_ranges_hold_the_expected_values(name: str) -> None:
    d, _ = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.clean and insp.consolidatable
    expected = safetensors.torch.load_file(str(d / "expected.safetensors"))
    dcp = insp.layout["dcp"]
    assert {t["fqn"]: t["size"] for t in dcp["tensors"]} == {k: list(v.shape) for k, v in expected.items()}
    assert insp.layout["layer_stacked"]
    assert all(expected[k].shape[0] == 2 for k in insp.layout["layer_stacked"])
    for item in dcp["items"]:
        if item.get("kind") != "tensor":
            continue
        t = item["tensor"]
        raw = (d / "checkpoint" / item["path"]).read_bytes()
        got = _from_range(raw, t["dtype"], t["shape"], t["stride"], t["storage_offset"], t["storage_range"])
        sl = tuple(slice(o, o + s) for o, s in zip(item["chunk_offsets"], t["shape"]))
        assert torch.equal(got, expected[item["fqn"]][sl]), item["fqn"]


@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3"])
def test_deepspeed_fixture_param_shapes(name: str) -> None:
    d, meta = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.format == meta["format"] and insp.loaders == ("deepspeed",)
    assert {f.path for f in insp.findings if f.code == "classify.code"} == {"zero_to_fp32.py", "zero_to_torch.py"}
    shapes: dict[str, list[int]] = {}
    for m in insp.layout["model_states"]:
        for group in m["param_shapes"] or []:
            shapes.update(group)
    expected = safetensors.torch.load_file(str(d / "expected.safetensors"))
    # every output tensor but the head, which the fixture ties to the embedding (one storage in the
    # model states, as DeepSpeed's shared_params records it), has its shape in param_shapes
    assert set(expected) - set(shapes) == {"head.weight"} and set(shapes) <= set(expected)
    assert shapes == {k: list(v.shape) for k, v in expected.items() if k in shapes}
    assert all(o["inside_allowlist"] for o in insp.layout["optim_states"])


@pytest.mark.parametrize("name", ["deepspeed_universal"])
def test_deepspeed_universal_fixture_fp32_values(name: str) -> None:
    d, _ = _fixture(name)
    insp = inspect_tree(d / "checkpoint")
    assert insp.format == "deepspeed-universal"
    expected = safetensors.torch.load_file(str(d / "expected.safetensors"))
    params = insp.layout["params"]
    checked = 0
    for k, v in expected.items():
        if k not in params or "exp_avg" not in params[k]["files"]:
            continue  # a tied alias is injected from the bf16 model weights, not the fp32 master
        info = params[k]["files"]["fp32"]
        (t,) = [x for x in info["tensors"] if x["name"] == "param"]
        raw = (d / "checkpoint" / info["path"]).read_bytes()
        got = _from_range(raw, t["dtype"], t["shape"], t["stride"], t["storage_offset"], t["storage_range"])
        assert torch.equal(got.to(v.dtype), v), k
        checked += 1
    assert checked


DEEPSPEED_ZERO = sorted(p.name for p in FIXTURES.iterdir()
                        if p.name.startswith(("deepspeed_zero", "trainer_deepspeed")))


def _deepspeed_copy(name: str, tmp_path: Path) -> tuple[Path, Path]:
    """A real DeepSpeed save copied: its root (beside ``latest``) and its tag folder."""
    import shutil

    src, _ = _fixture(name)
    shutil.copytree(src / "checkpoint", tmp_path / "ck")
    root = next((tmp_path / "ck").rglob("latest")).parent
    return root, root / (root / "latest").read_text().strip()


@pytest.mark.parametrize("name", DEEPSPEED_ZERO)
def test_a_deepspeed_tag_missing_a_model_states_file_is_incomplete(name: str, tmp_path: Path) -> None:
    """Optimizer partitions without mp_rank_00_model_states.pt (ZeRO-3: one rank's zero_pp_rank_<r>_ model
    states) used to have no finding, and `attest checkpoint` signed the rest."""
    root, tag = _deepspeed_copy(name, tmp_path)
    assert not {"deepspeed.model_states_missing", "deepspeed.ranks_incomplete"} & _codes(inspect_tree(root))
    model = sorted(tag.glob("*model_states.pt"))[-1]
    model.unlink()
    insp = inspect_tree(root)
    found = [f for f in insp.findings if f.code == "deepspeed.model_states_missing"]
    assert len(found) == 1 and found[0].evidence["missing"] == [model.name], insp.findings
    assert "deepspeed.ranks_incomplete" not in _codes(insp)
    assert not insp.consolidatable and not insp.clean


@pytest.mark.parametrize("name", DEEPSPEED_ZERO)
def test_a_deepspeed_tag_missing_its_last_optimizer_partition_is_incomplete(name: str, tmp_path: Path) -> None:
    """The highest data-parallel rank's partition missing left ranks 0..N-2, which looked whole: the world size
    the model states record (dp_world_size; ZeRO-3: their zero_pp_rank_<r> names) says otherwise."""
    root, tag = _deepspeed_copy(name, tmp_path)
    optim = sorted(tag.glob("*optim_states.pt"))[-1]
    optim.unlink()
    insp = inspect_tree(root)
    found = [f for f in insp.findings if f.code == "deepspeed.ranks_incomplete"]
    assert len(found) == 1 and found[0].evidence["missing"] == [optim.name], insp.findings
    assert "deepspeed.model_states_missing" not in _codes(insp)
    assert not insp.consolidatable and not insp.clean


def _deepspeed_mp(root: Path, mp: int, dp: int, *, skip: tuple[str, ...] = (), huge_rank: bool = False) -> Path:
    """A synthetic tensor-parallel ZeRO-1/2 save: one model-states file per mp rank, dp partitions of each."""
    from collections import OrderedDict

    tag = root / "global_step2"
    tag.mkdir(parents=True)
    write(root, "latest", "global_step2")
    for m in range(mp):
        name = f"mp_rank_{m:02d}_model_states.pt"
        if name not in skip:
            torch.save({"module": OrderedDict(w=torch.ones(2)), "dp_world_size": dp, "mp_world_size": mp},
                       tag / name)
        for r in range(dp):
            name = f"zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt"
            if name not in skip:
                torch.save({"optimizer_state_dict": {}}, tag / name)
    if huge_rank:
        torch.save({"optimizer_state_dict": {}}, tag / "zero_pp_rank_4000000000_mp_rank_00_optim_states.pt")
    return root


def test_a_tensor_parallel_deepspeed_save_is_whole_and_a_missing_rank_is_named(tmp_path: Path) -> None:
    """Two mp ranks each with partitions 0..N-1 used to read as ranks [0, 0, 1, 1], "not 0..N-1"."""
    assert not {"deepspeed.ranks_incomplete", "deepspeed.model_states_missing"} & _codes(
        inspect_tree(_deepspeed_mp(tmp_path / "whole", 2, 2)))
    insp = inspect_tree(_deepspeed_mp(tmp_path / "gap", 2, 2, skip=("mp_rank_01_model_states.pt",
                                                                   "zero_pp_rank_1_mp_rank_01_optim_states.pt")))
    by_code = {f.code: f for f in insp.findings}
    assert by_code["deepspeed.model_states_missing"].evidence["missing"] == ["mp_rank_01_model_states.pt"]
    assert by_code["deepspeed.ranks_incomplete"].evidence["missing"] == ["zero_pp_rank_1_mp_rank_01_optim_states.pt"]


def test_a_rank_number_out_of_all_proportion_is_counted_not_listed(tmp_path: Path) -> None:
    insp = inspect_tree(_deepspeed_mp(tmp_path, 1, 2, huge_rank=True))
    f = next(f for f in insp.findings if f.code == "deepspeed.ranks_incomplete")
    assert len(f.evidence["missing"]) == 64 and "3999999998" in f.message


def test_a_deepspeed_rank_spelled_in_other_digits_is_not_that_rank(tmp_path: Path) -> None:
    """``mp_rank_\u0660\u0660_model_states.pt`` (Arabic-Indic digits; ``int()`` reads them as 00) is not the
    file DeepSpeed loads: the tag folder misses its model states, instead of counting the look-alike as rank 0."""
    root, tag = _deepspeed_copy("deepspeed_zero2", tmp_path)
    model = tag / "mp_rank_00_model_states.pt"
    model.rename(tag / "mp_rank_\u0660\u0660_model_states.pt")
    insp = inspect_tree(root)
    found = [f for f in insp.findings if f.code == "deepspeed.model_states_missing"]
    assert len(found) == 1 and found[0].evidence["missing"] == ["mp_rank_00_model_states.pt"], insp.findings
    assert not insp.consolidatable
