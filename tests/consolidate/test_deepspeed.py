"""DeepSpeed ZeRO-2/3 to fp32, bit for bit against DeepSpeed's own zero_to_fp32 result, both from
the static reader and from the trees the enforce step's contained worker loaded under a permit.
(The permit and manifest checks in front of the worker are tested in tests/enforce/.)

The real fixtures' pickles stay inside the static reader's DeepSpeed allowlist, so
``framework_files`` is empty and ``plan_for`` builds their plans without the worker; the worker
path is exercised by marking one state file as outside that allowlist (what inspection reports
for, say, a non-allowlisted ``client_state``)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ckptgate.consolidate import framework_files, plan_for  # noqa: E402
from ckptgate.consolidate.adapters import deepspeed  # noqa: E402
from ckptgate.consolidate.writer import write_plan  # noqa: E402
from ckptgate.decide.decision import Decision  # noqa: E402
from ckptgate.digest import Digest, fixture_digest  # noqa: E402
from ckptgate.enforce.containment import preflight  # noqa: E402
from ckptgate.enforce.gate import enforce  # noqa: E402
from ckptgate.enforce.load import WorkerOptions, load_trees  # noqa: E402
from ckptgate.enforce.permit import issue_permit  # noqa: E402
from ckptgate.consolidate.plan import PlanError  # noqa: E402
from ckptgate.errors import RuntimeFailure  # noqa: E402
from ckptgate.inspect import SafeTree, inspect_open_tree  # noqa: E402

pytestmark = pytest.mark.producers

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "data"
CONTROLS = ("no_new_privs", "seccomp", "rlimits", "user_ns", "net_ns", "ipc_ns", "openat2")


def _decision(loaders: tuple[str, ...] = ("deepspeed",), digest: Digest | None = None) -> Decision:
    # The policy names DeepSpeed checkpoints' loader `deepspeed`; the worker runs it as a plan-only job.
    return Decision(allow=True, plane="framework", permitted_loaders=loaders, required_controls=CONTROLS,
                    reasons=(), decision_id="test", policy_revision="test", engine="test", fixture_digest=digest)


def _framework(ins):
    """The inspection with its first model_states file outside the static allowlist."""
    assert ins.loaders == ("deepspeed",)
    rel = deepspeed.zero_files(ins.layout)[0]
    files = tuple(replace(f, pickle=replace(f.pickle, inside_allowlist=False)) if f.path == rel else f
                  for f in ins.files)
    return replace(ins, files=files)


@pytest.fixture(scope="module")
def options() -> WorkerOptions:
    p = preflight()
    missing = [c for c in CONTROLS if not p.controls[c]]
    if missing:
        pytest.skip(f"this host lacks containment controls {missing}")
    return WorkerOptions(timeout_s=120.0, profile=p)


@pytest.mark.parametrize("path", ["static", "worker"])
@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3"])
def test_zero_to_fp32_bit_exact(name: str, path: str, options: WorkerOptions, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    with SafeTree.open(FIXTURES / name / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
        digest = fixture_digest(tree)
        ins = ins if path == "static" else _framework(ins)
        assert bool(framework_files(ins)) == (path == "worker")
        enforced = enforce(tree, ins, decision=_decision(digest=digest.digest), fixture_digest=digest,
                           framework_files=framework_files(ins), worker=options)
        assert (enforced.loaded is None) == (path == "static")
        plan = plan_for(ins, decision=_decision(), max_shard_bytes=300, loaded=enforced.loaded)
        fds = {p: tree.open_file(p) for p in plan.source_paths}
        try:
            write_plan(plan, tmp_path, fds, expected=digest.file_hashes())
        finally:
            for fd in fds.values():
                os.close(fd)
    assert all(p.endswith("_optim_states.pt") for p in plan.source_paths)  # fp32 master weights only
    got: dict[str, torch.Tensor] = {}
    for f in tmp_path.glob("*.safetensors"):
        got.update(load_file(str(f)))
    want = load_file(str(FIXTURES / name / "expected.safetensors"))
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype == torch.float32 and got[k].shape == v.shape
        assert torch.equal(got[k].view(torch.int32), v.view(torch.int32)), k
    assert plan.report["shared_params"] == [["head.weight", "embed.weight"]]
    assert plan.report["zero_stage"] == (3 if name.endswith("3") else 2)
    assert plan.report["ds_version"] == "0.19.8"
    assert plan.report["trees_from"] == ("static_reader" if path == "static" else "contained_worker")
    if path == "worker":  # the receipt records what held inside the worker, not only the preflight
        worker = plan.report["worker"]
        assert worker["job"] and worker["wall_s"] > 0
        assert worker["controls"]["no_new_privs"] is True and worker["controls"]["seccomp"] is True
        assert worker["controls"]["ipc_ns"] is True
        m = worker["measured"]  # as the worker measured itself, not as the preflight predicted
        assert (m["seccomp"]["status"], m["seccomp"]["mode"], m["no_new_privs"]) == (2, "allowlist", 1)
        assert m["namespaces"]["ipc"]["worker"] != m["namespaces"]["ipc"]["parent"] == os.readlink("/proc/self/ns/ipc")
    else:
        assert "worker" not in plan.report


@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3"])
def test_static_trees_agree_with_the_worker(name: str, options: WorkerOptions) -> None:
    """What the static reader rebuilds is what DeepSpeed's own load says, for every key the plan reads."""
    with SafeTree.open(FIXTURES / name / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
        digest = fixture_digest(tree)
        rels = deepspeed.zero_files(ins.layout)
        permit = issue_permit(_decision(digest=digest.digest), fixture_digest=digest.digest, loader="deepspeed")
        worker = load_trees(tree, ins, rels, permit=permit, digest=digest, options=options).trees
    static = deepspeed.static_trees({f.path: f for f in ins.files}, rels)
    models = {m["path"] for m in ins.layout["model_states"]}
    assert all("param_shapes" in worker[r] if r in models else "optimizer_state_dict" in worker[r] for r in rels)
    for rel in rels:
        for key in ("param_shapes", "frozen_param_shapes", "shared_params", "buffer_names", "ds_version"):
            if key in worker[rel]:
                assert static[rel][key] == worker[rel][key], (rel, key)
        if "optimizer_state_dict" in worker[rel]:
            w, st = worker[rel]["optimizer_state_dict"], static[rel]["optimizer_state_dict"]
            for key in ("partition_count", "fp32_flat_groups", "single_partition_of_fp32_groups",
                        "param_alignment_paddings"):
                if key in w:
                    strip = lambda v: [{k: x for k, x in d["__tensor__"].items() if k != "parameter"}  # noqa: E731
                                       for d in v] if key.endswith("groups") else v
                    assert strip(st[key]) == strip(w[key]), (rel, key)
            assert st["zero_stage"]["value"] == w["zero_stage"]["value"]


def test_static_plan_refuses_a_file_outside_the_allowlist() -> None:
    with SafeTree.open(FIXTURES / "deepspeed_zero3" / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
    files = {f.path: f for f in ins.files}
    rel = deepspeed.zero_files(ins.layout)[-1]
    files[rel] = replace(files[rel], pickle=replace(files[rel].pickle, inside_allowlist=False))
    with pytest.raises(RuntimeFailure) as e:
        deepspeed.static_trees(files, [rel])
    assert e.value.code == "runtime.plan.not_static"


def test_worker_plan_that_names_an_unknown_storage_is_refused() -> None:
    with SafeTree.open(FIXTURES / "deepspeed_zero3" / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
    files = {f.path: f for f in ins.files}
    rel = deepspeed.zero_files(ins.layout)[-1]
    smap = deepspeed.StorageMap(files)
    desc = {"__tensor__": {"storage_key": "99", "dtype": "float32", "shape": [4], "stride": [1],
                           "storage_offset": 0, "storage_nbytes": 16}}
    with pytest.raises(RuntimeFailure) as e:
        smap.segment(rel, desc, what="fp32_flat_groups[0]")
    assert e.value.code == "runtime.plan.storage_unknown"


def test_a_hostile_worker_description_is_a_typed_error(options: WorkerOptions) -> None:
    """Trees from a framework load are untrusted: a wrong shape raises runtime.plan.bad_value."""
    with SafeTree.open(FIXTURES / "deepspeed_zero3" / "checkpoint") as tree:
        ins = _framework(inspect_open_tree(tree))
        digest = fixture_digest(tree)
        loaded = enforce(tree, ins, decision=_decision(digest=digest.digest), fixture_digest=digest,
                         framework_files=framework_files(ins), worker=options).loaded
    assert loaded is not None
    hostile = replace(loaded, trees={k: {"optimizer_state_dict": {"partition_count": []}} for k in loaded.trees})
    with pytest.raises(RuntimeFailure) as e:
        plan_for(ins, decision=_decision(), max_shard_bytes=300, loaded=hostile)
    assert e.value.code.startswith("runtime.plan.")


def test_a_plan_that_needs_the_worker_is_not_built_without_what_it_loaded() -> None:
    with SafeTree.open(FIXTURES / "deepspeed_zero3" / "checkpoint") as tree:
        ins = _framework(inspect_open_tree(tree))
    with pytest.raises(RuntimeFailure) as e:
        plan_for(ins, decision=_decision(), max_shard_bytes=300, loaded=None)
    assert e.value.code == "runtime.plan.not_loaded"


@pytest.mark.parametrize("bad", [{"buffer_names": 5}, {"shared_params": {"alias": ["not", "a", "name"]}},
                                 {"param_shapes": "nope"}])
def test_a_malformed_static_tree_is_a_typed_error(bad: dict) -> None:
    """Static trees come from untrusted pickles too: an unexpected shape is runtime.plan.*, never a crash."""
    with SafeTree.open(FIXTURES / "deepspeed_zero2" / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
    files = {f.path: f for f in ins.files}
    rels = deepspeed.zero_files(ins.layout)
    trees = deepspeed.static_trees(files, rels)
    trees[rels[0]] = {**trees[rels[0]], **bad}
    with pytest.raises(RuntimeFailure) as e:
        deepspeed.zero_plan(ins.layout, trees, files, max_shard_bytes=300, trees_from="static_reader")
    assert e.value.code.startswith("runtime.plan.")


@pytest.mark.parametrize("shape", [[1 << 62] * 100_000, [1] * 65, [1 << 63]], ids=["wide", "ndim", "int64"])
def test_a_shape_torch_could_not_hold_is_refused_before_its_numel(shape: list[int]) -> None:
    """A worker's torch.Size of 100,000 dims of 2**62 took the plan into a numel product quadratic
    in the dims (the static layout's param_shapes are checked the same way)."""
    with SafeTree.open(FIXTURES / "deepspeed_zero2" / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
    files = {f.path: f for f in ins.files}
    rels = deepspeed.zero_files(ins.layout)
    trees = deepspeed.static_trees(files, rels)
    trees[rels[0]] = {**trees[rels[0]], "param_shapes": [{"w": shape}]}
    with pytest.raises(RuntimeFailure) as e:
        deepspeed.zero_plan(ins.layout, trees, files, max_shard_bytes=300, trees_from="static_reader")
    assert e.value.code == "runtime.plan.bad_value"
    assert "param_shapes group" in str(e.value)


@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3"])
def test_a_runtime_qualification_asks_the_worker_for_every_state_file(name: str) -> None:
    """``framework_files(worker=True)`` (a runtime qualification, issue #31 item 2) names every
    state file the worker job takes, although the static reader covers them; other formats have
    none."""
    with SafeTree.open(FIXTURES / name / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
    assert framework_files(ins) == ()
    assert framework_files(ins, worker=True) == tuple(deepspeed.zero_files(ins.layout))
    assert framework_files(ins, worker=True) == framework_files(_framework(ins))
    with SafeTree.open(FIXTURES / "hf_sharded" / "checkpoint") as tree:
        assert framework_files(inspect_open_tree(tree), worker=True) == ()


def _zero_trees(name: str):
    with SafeTree.open(FIXTURES / name / "checkpoint") as tree:
        ins = inspect_open_tree(tree)
    files = {f.path: f for f in ins.files}
    rels = deepspeed.zero_files(ins.layout)
    return ins, files, rels, deepspeed.static_trees(files, rels)


def _shadow_buffer(m0: dict) -> None:
    m0["buffer_names"] = ["embed.weight"]  # the module's bf16 copy of a trainable param


def _shadow_frozen(m0: dict) -> None:
    m0["frozen_param_shapes"] = {"fc1.bias": [5]}
    m0["frozen_param_fragments"] = {"fc1.bias": m0["module"]["fc1.bias"]}


def _alias_over_param(m0: dict) -> None:
    m0["shared_params"] = {"fc1.bias": "embed.weight"}


def _alias_to_nothing(m0: dict) -> None:
    m0["shared_params"] = {"head.weight": "no.such.param"}


def _name_in_two_groups(m0: dict) -> None:
    m0["param_shapes"] = [*m0["param_shapes"], {"gate": [1, 4]}]


@pytest.mark.parametrize(("mutate", "code"), [
    (_shadow_buffer, "plan.zero.duplicate_name"),
    (_shadow_frozen, "plan.zero.duplicate_name"),
    (_alias_over_param, "plan.zero.duplicate_name"),
    (_alias_to_nothing, "plan.zero.shared_params"),
    (_name_in_two_groups, "plan.zero.duplicate_name"),
])
def test_one_name_from_two_sources_or_a_tie_to_nothing_is_refused(mutate, code: str) -> None:
    """A buffer, frozen param or shared alias named like a trainable param replaced the fp32 master
    weight in the output (the buffer: with the module's bf16 copy, and the tied head followed it),
    and an alias tied to no parameter was dropped from the output: each was published without a word."""
    ins, files, rels, trees = _zero_trees("deepspeed_zero2")
    mutate(trees[rels[0]])
    layout = {**ins.layout, "model_states": [{**ins.layout["model_states"][0],
                                              "param_shapes": trees[rels[0]]["param_shapes"]}]}
    with pytest.raises(PlanError) as e:
        deepspeed.zero_plan(layout, trees, files, max_shard_bytes=1 << 30, trees_from="static_reader")
    assert e.value.code == code


@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3"])
@pytest.mark.parametrize("key", ["zero_stage", "partition_count"])
def test_optimizer_files_that_disagree_on_the_partitioning_are_refused(name: str, key: str) -> None:
    """Only the first optimizer file's zero_stage and partition_count were read: a last file from
    another save (another stage or world size) was partitioned by the first one's word."""
    ins, files, rels, trees = _zero_trees(name)
    sd = trees[rels[-1]]["optimizer_state_dict"]
    sd[key] = {"__enum__": "deepspeed.runtime.zero.config.ZeroStageEnum", "value": 1} if key == "zero_stage" else [7]
    with pytest.raises(PlanError) as e:
        deepspeed.zero_plan(ins.layout, trees, files, max_shard_bytes=1 << 30, trees_from="static_reader")
    assert e.value.code == "plan.zero.ranks_disagree" and rels[-1] in e.value.evidence["files"]
