"""The committed real-producer fixtures are intact, self-consistent and match their ground truth.

Fast checks (no torch): manifests, meta.json fields and versions, expected.safetensors headers,
and, per format, that the committed files hold exactly the ground truth where that can be read
as pure data (HF shards, PEFT adapter, DCP HF-storage shards).  The ``producers`` tests
re-read pickled fixtures with the producers' own readers (torch DCP, torch.load, DeepSpeed's
zero_to_fp32) and compare with the ground truth.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # until pyproject sets [tool.pytest.ini_options] pythonpath = ["."]
    sys.path.insert(0, str(REPO))

from tests.fixtures import catalog  # noqa: E402
from tests.fixtures.catalog import FIXTURES, checkpoint_dir, load_expected, load_expected_bytes, load_meta  # noqa: E402
from tests.fixtures.generate import SPECS  # noqa: E402

PINS = tomllib.loads((REPO / "pins.toml").read_text())["python"]
NAMES = sorted(FIXTURES)


def _load_farm():  # scripts/farm.py is a script, not a package
    spec = importlib.util.spec_from_file_location("ckptgate_farm_script", REPO / "scripts" / "farm.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


farm = _load_farm()
#: fixture name -> (its lock, its job) for every fixture a committed farm lock produces
FARM = {job.name: (lock, job) for lock in farm.load_locks() for job in lock.fixtures}


def _made_by(*specs: str) -> list[str]:
    """The committed fixtures generator ``specs`` made: in the project env, or in a farm env."""
    return sorted(n for n in NAMES if n in specs or (n in FARM and FARM[n][1].spec in specs))
MAX_FILE = 2 * 1024 * 1024
#: Every committed fixture together.  The farm (issue #31) commits one tiny fixture per producer
#: release, layout and topology (100-320 KB each, mostly file framing: a Megatron save is eight
#: .distcp files however small its model); about 100 fixtures fit, and the clone stays small.
MAX_TOTAL = 24 * 1024 * 1024


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_catalog_matches_the_generator() -> None:
    """Every generator spec has a fixture, from the project env or a committed farm lock (a spec
    only other releases write, such as Megatron's pipeline-parallel layouts); any other fixture is
    one a committed farm lock makes."""
    assert set(SPECS) <= set(FIXTURES) | {job.spec for _, job in FARM.values() if job.name in FIXTURES}
    assert set(FIXTURES) - set(SPECS) <= set(FARM)
    assert all(job.spec in SPECS for _, job in FARM.values())


def test_size_budget() -> None:
    files = [p for n in NAMES for p in _files(FIXTURES[n])]
    assert all(p.stat().st_size < MAX_FILE for p in files)
    assert sum(p.stat().st_size for p in files) < MAX_TOTAL


@pytest.mark.parametrize("name", NAMES)
def test_meta_records_producer_versions_and_provenance(name: str) -> None:
    meta = load_meta(name)
    assert meta["name"] == name
    assert meta["generator"] == "tests/fixtures/generate.py"
    assert (REPO / meta["producer_script"]).is_file()
    assert meta["producer_script"].rsplit("/", 1)[1] in meta["command"]
    versions = meta["versions"]
    if name in FARM:
        # Written in a farm environment: the versions are the lock's, and the lock is the committed one.
        lock, job = FARM[name]
        assert meta["farm"] == {"environment": lock.env, "lock": f"qualification/locks/{lock.env}.toml",
                                "lock_sha256": lock.digest, "spec": job.spec}
        assert meta["regenerate"] == f"python3 scripts/farm.py run --only {lock.env}"
        assert versions["python"] == lock.python
        for dist, got in versions.items():
            if dist != "python":
                assert got == lock.version(dist), dist
    else:
        assert "farm" not in meta
        assert meta["regenerate"].endswith(f"--only {name}")
        for dist in ("torch", "deepspeed", "megatron-core", "peft", "huggingface-hub", "safetensors", "numpy"):
            assert versions[dist.replace("huggingface-hub", "huggingface_hub")] == PINS[dist], dist
        assert versions["python"].count(".") == 2
    assert meta["launch_env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert meta["topology"]["world_size"] >= 1
    assert meta["producer"] and meta["format"] and meta["dtype"]
    assert isinstance(meta.get("notes", []), list)


#: (lock, job) of every farm job that writes the bytes of another committed fixture
SAME_BYTES = sorted(((lock, job) for lock, job in FARM.values() if job.same_bytes_as), key=lambda lj: lj[1].name)


@pytest.mark.parametrize(("lock", "job"), SAME_BYTES, ids=[job.name for _, job in SAME_BYTES])
def test_a_generation_record_is_its_locks_and_names_the_fixtures_bytes(lock, job) -> None:
    """``written_by/<job>.json`` is the meta.json the lock's environment wrote: that lock, those
    versions, and exactly the committed fixture's files and ground truth (so no second copy)."""
    record = json.loads(farm.record_path(job, catalog.DATA).read_text())
    meta = load_meta(job.same_bytes_as)
    assert record["name"] == job.name
    assert record["farm"] == {"environment": lock.env, "lock": f"qualification/locks/{lock.env}.toml",
                              "lock_sha256": lock.digest, "spec": job.spec}
    assert record["versions"]["python"] == lock.python
    assert all(got == lock.version(d) for d, got in record["versions"].items() if d != "python")
    assert record["checkpoint_files"] == meta["checkpoint_files"]
    assert record["expected"] == meta["expected"]
    assert record["versions"] != meta["versions"]  # another environment, or no record is needed


def test_every_generation_record_is_a_farm_job() -> None:
    records = {p.stem for p in catalog.DATA.glob(f"*/{farm.WRITTEN_BY}/*.json")}
    assert records == {job.name for _, job in SAME_BYTES}
    assert records  # the torch lines' fsdp_full


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_files_match_the_manifest(name: str) -> None:
    root = checkpoint_dir(name)
    manifest = load_meta(name)["checkpoint_files"]
    assert manifest, "empty checkpoint"
    assert not [p for p in root.rglob("*") if p.is_symlink()]
    on_disk = {p.relative_to(root).as_posix(): p for p in _files(root)}
    assert sorted(on_disk) == sorted(manifest)
    for rel, p in on_disk.items():
        assert p.stat().st_size == manifest[rel]["size"], rel
        assert _sha256(p) == manifest[rel]["sha256"], rel


@pytest.mark.parametrize("name", NAMES)
def test_expected_matches_its_meta_summary(name: str) -> None:
    meta = load_meta(name)["expected"]
    path = catalog.expected_path(name)
    assert _sha256(path) == meta["sha256"]
    assert path.stat().st_size == meta["size"]
    raw = load_expected_bytes(name)
    assert {k: {"dtype": d, "shape": list(s)} for k, (d, s, _) in raw.items()} == meta["tensors"]
    arrays = load_expected(name)
    assert arrays
    for key, arr in arrays.items():
        assert list(arr.shape) == meta["tensors"][key]["shape"]
        assert arr.nbytes == len(raw[key][2])


def _assert_same(got: dict[str, tuple[str, tuple[int, ...], bytes]], name: str) -> None:
    want = load_expected_bytes(name)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key


def test_hf_sharded_index_and_shards_hold_exactly_the_ground_truth() -> None:
    root = checkpoint_dir("hf_sharded")
    index = json.loads((root / "model.safetensors.index.json").read_text())
    shards = sorted({*index["weight_map"].values()})
    assert len(shards) >= 2
    got: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for shard in shards:
        assert "/" not in shard and (root / shard).is_file()
        assert catalog.read_safetensors_metadata(root / shard) == {"format": "pt"}
        tensors = catalog.read_safetensors(root / shard)
        assert {k for k, v in index["weight_map"].items() if v == shard} == set(tensors)
        got.update(tensors)
    assert index["metadata"]["total_size"] == sum(len(b) for _, _, b in got.values())
    # the tied alias was dropped and recorded as {removed: kept}
    assert index["metadata"]["model.embed_tokens.weight"] == "lm_head.weight"
    _assert_same(got, "hf_sharded")


PEFT_TYPES = {"peft_lora": "LORA", "peft_lora_unpinned": "LORA", "peft_ia3": "IA3",
              "peft_prompt_tuning": "PROMPT_TUNING"}


@pytest.mark.parametrize("name", _made_by(*PEFT_TYPES))
def test_peft_adapter_config_and_weights(name: str) -> None:
    root = checkpoint_dir(name)
    cfg = json.loads((root / "adapter_config.json").read_text())
    meta = load_meta(name)
    spec = FARM[name][1].spec if name in FARM else name
    assert cfg["peft_type"] == PEFT_TYPES[spec]
    if name not in FARM or "peft_version" in cfg:  # PEFT 0.17 does not write peft_version; later releases do
        assert cfg["peft_version"] == meta["versions"]["peft"]
    assert cfg["base_model_name_or_path"] == meta["base_model"]["name"]
    assert cfg["revision"] == meta["base_model"]["revision"]
    assert (cfg["revision"] is None) is (spec == "peft_lora_unpinned")
    _assert_same(catalog.read_safetensors(root / "adapter_model.safetensors"), name)


@pytest.mark.parametrize("name", _made_by("dcp_hf_safetensors", "dcp_hf_safetensors_bytes"))
def test_dcp_hf_storage_shards_assemble_to_the_ground_truth(name: str) -> None:
    root = checkpoint_dir(name)
    described = load_meta(name)["observed"]["safetensors_named_files"]
    assert not (root / ".metadata").exists()
    want = load_expected(name)
    full = {k: np.zeros_like(v) for k, v in want.items()}
    covered = {k: np.zeros(v.shape, dtype=np.int32) for k, v in want.items()}
    for fname, info in described.items():
        path = root / fname
        head = path.read_bytes()[:4]
        assert (head == b"PK\x03\x04") is (info["leading_torch_zips"] > 0)
        meta = catalog.read_safetensors_metadata(path, offset=info["safetensors_offset"])
        sharding = json.loads(meta["DCP_SHARDING_INFO"])
        for key, (dtype, shape, data) in catalog.read_safetensors(path, offset=info["safetensors_offset"]).items():
            idx = tuple(slice(o, o + s) for o, s in zip(sharding[key]["saved_offsets"], shape, strict=True))
            full[key][idx] = catalog.to_numpy(dtype, shape, data)
            covered[key][idx] += 1
    for key in want:
        assert (covered[key] == 1).all(), key
        assert np.array_equal(full[key], want[key]), key
    if name.endswith("_bytes"):
        assert any(i["leading_torch_zips"] > 0 for i in described.values())


#: Generator specs whose producer checks its output with the running torch's own reader
#: (``own_consolidation`` in ``observed``): ``dcp_to_torch_save``, ``consolidate_safetensors_files``
#: or ``torch.load``.  The project's fixtures predate that record; the ``producers`` tests below
#: read them with the project's torch instead.
OWN_CONSOLIDATION = ("dcp_torch_save", "dcp_torch_save_bytes", "dcp_hf_safetensors", "fsdp_full", "dcp_torchtitan")


@pytest.mark.parametrize("name", sorted(n for n in FARM if FARM[n][1].spec in OWN_CONSOLIDATION))
def test_farm_fixture_equals_its_own_torch_consolidation(name: str) -> None:
    """Each torch release's output equals that release's own consolidation, bit for bit (issue
    #31 item 4): the producer compared them in the farm environment and recorded the result."""
    lock, job = FARM[name]
    # a generation record (same bytes as a committed fixture) keeps its own environment's check
    meta = json.loads(farm.record_path(job, catalog.DATA).read_text()) if job.same_bytes_as else load_meta(name)
    own = meta["observed"]["own_consolidation"]
    assert own["equal"] is True and "error" not in own
    assert own["torch"].split("+", 1)[0] == lock.version("torch")
    want = meta["expected"]["tensors"]
    assert own["tensors"] + len(own.get("skipped", [])) == len(want)
    assert all(want[k]["dtype"] in ("I64", "I32", "I16", "I8", "U8", "BOOL") for k in own.get("skipped", []))


@pytest.mark.parametrize("name", _made_by("deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3"))
def test_deepspeed_layout(name: str) -> None:
    root = checkpoint_dir(name)
    meta = load_meta(name)
    tag = (root / "latest").read_text().strip()
    assert tag == meta["tag"] == "global_step2"
    assert (root / "zero_to_fp32.py").is_file()
    stage = meta["topology"]["zero_stage"]
    model_states = sorted(p.name for p in (root / tag).glob("*model_states.pt"))
    if stage in (1, 2):  # ZeRO-1 and ZeRO-2 write the same file layout; zero_stage inside tells them apart
        assert model_states == ["mp_rank_00_model_states.pt"]
    else:
        assert model_states == [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(2)]
    optim = sorted(p.name for p in (root / tag).glob("*optim_states.pt"))
    assert optim == [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)]
    assert meta["param_numel_total"] % 2 == 1  # odd: the last rank is padded


MEGATRON = _made_by("megatron_torch_dist", "megatron_pp2", "megatron_tp2pp2", "megatron_moe_ep2")


@pytest.mark.parametrize("name", MEGATRON)
def test_megatron_layout_and_stacked_layer_axis(name: str) -> None:
    root = checkpoint_dir(name)
    meta = load_meta(name)
    backend = json.loads((root / "metadata.json").read_text())
    assert backend["sharded_backend"] == "torch_dist" and backend["sharded_backend_version"] == 1
    assert (root / ".metadata").is_file()
    if backend.get("common_backend") is not None:  # until 0.18 a torch.save common.pt beside the .distcp files
        assert backend["common_backend"] == "torch" and (root / "common.pt").is_file()
    else:  # 0.19 writes the common state into the .distcp files, as a BYTE_IO item under common_state/
        assert not (root / "common.pt").exists() and b"common_state" in (root / ".metadata").read_bytes()
    topo = meta["topology"]
    # one writer per rank: __<rank>_<n>.distcp for every rank of the recorded world size
    ranks = {int(p.name.split("_")[2]) for p in root.glob("__*_*.distcp")}
    assert ranks == set(range(topo["world_size"]))
    assert topo["world_size"] == topo["tp"] * topo["pp"] * topo["dp"]
    num_layers = topo["num_layers"]
    expected = load_expected(name)
    stacked = [k for k in expected if k.startswith("decoder.layers.")]
    assert stacked and all(expected[k].shape[0] == num_layers for k in stacked)
    experts = [k for k in stacked if ".experts." in k]
    if "num_experts" in topo:
        assert topo["world_size"] % (topo["ep"] * topo["etp"] * topo["pp"]) == 0
        assert experts and all(expected[k].shape[1] == topo["num_experts"] for k in experts)
    else:
        assert not experts
    # the last stage's output layer is saved unless it is tied to the (first stage's) word embeddings
    tied = meta["model"]["share_embeddings_and_output_weights"]
    assert ("output_layer.weight" in expected) is (not tied)


@pytest.mark.parametrize("name", _made_by("deepspeed_universal", "deepspeed_universal_zero3"))
def test_universal_layout(name: str) -> None:
    root = checkpoint_dir(name)
    assert (root / "latest_universal").read_text().strip() == "global_step2_universal"
    zero = root / "global_step2_universal" / "zero"
    folders = {p.name for p in zero.iterdir() if p.is_dir()}
    aliases = {a for pair in load_meta(name)["tied_weights"] for a in pair[1:]}
    # a tied alias has a folder of its own in DeepSpeed 0.19.8 from ZeRO-2, none in 0.18.9 or from ZeRO-3
    assert folders <= set(load_expected(name)) and set(load_expected(name)) - folders <= aliases
    assert (zero / "optimizer_state.pt").is_file()
    spec = FARM[name][1].spec if name in FARM else name
    assert load_meta(name)["topology"]["zero_stage"] == (3 if spec == "deepspeed_universal_zero3" else 2)


# --- cross-checks with the producers' own readers (slower: torch / deepspeed imports) ---------


def _torch_equal(got: dict, name: str) -> None:  # noqa: ANN001
    import torch
    from safetensors.torch import load_file

    want = load_file(str(catalog.expected_path(name)))
    for key, t in want.items():
        assert got[key].dtype == t.dtype, key
        assert torch.equal(got[key], t), key


@pytest.mark.producers
@pytest.mark.parametrize("name", ["dcp_torch_save", "dcp_torch_save_bytes", *MEGATRON])
def test_dcp_readback_with_torch_equals_expected(name: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / "full.pt"
    dcp_to_torch_save(str(checkpoint_dir(name)), str(out))
    got = torch.load(out, weights_only=False)  # our own trusted, committed fixture
    _torch_equal(got, name)
    for key, value in load_meta(name).get("non_tensor_items", {}).items():
        assert got[key] == value


@pytest.mark.producers
def test_fsdp_full_readback_equals_expected() -> None:
    torch = pytest.importorskip("torch")
    got = torch.load(checkpoint_dir("fsdp_full") / "model.pt", weights_only=True)
    _torch_equal(got, "fsdp_full")


@pytest.mark.producers
@pytest.mark.parametrize("name", ["deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3"])
def test_zero_to_fp32_readback_equals_expected(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    _torch_equal(get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir(name))), name)


def test_every_farm_run_fixture_is_taken_in_by_the_run_tests() -> None:
    """tests/test_pipeline_run_fixtures.py finds each release's Trainer and Accelerate outputs by the
    generator spec in their meta.json; a fixture a lock makes with such a spec must be among them
    (a missing or misspelled ``farm.spec`` would otherwise drop it silently)."""
    from tests.test_pipeline_run_fixtures import FSDP_RUNS, RUN_SPECS, RUNS

    made = {job.name: job.spec for _, job in FARM.values() if job.same_bytes_as is None and job.name in NAMES}
    want = {n for n, spec in made.items() if spec in RUN_SPECS}
    assert want and want <= set(RUNS)
    assert {n for n, spec in made.items() if spec == "trainer_fsdp_sharded"} <= set(FSDP_RUNS)
