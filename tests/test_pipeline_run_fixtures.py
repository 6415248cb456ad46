"""The real training-run fixtures taken in end to end (issue 25): a ``Trainer`` output directory
(tiny Llama, two ``checkpoint-N``), ``Trainer`` with PEFT LoRA, DeepSpeed or FSDP,
``Accelerator.save_state``; the project's own and those the farm's environments wrote with other
transformers and Accelerate releases (issue 31).

Each is attested for its measured digest with a throwaway key and taken in through the real
embedded OPA; the published weights are compared with the producer's ``expected.safetensors`` bit
for bit, and every resume file is listed in the receipt with its digest and never published.
The tiny Llama is then loaded by ``transformers`` from DST, offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptgate.digest import fixture_digest
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.inspect.runs import select_checkpoint
from ckptgate.pipeline import intake
from ckptgate.publish import RECEIPT_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import FIXTURES, Signer, attest, ckptgate_json, make_signer  # noqa: E402

pytestmark = pytest.mark.opa

#: generator spec -> (the checkpoint folder inside checkpoint/, the resume files the producer wrote)
RUN_SPECS: dict[str, tuple[str | None, set[str]]] = {
    "trainer_llama": ("checkpoint-2", {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"}),
    "trainer_peft_lora": ("checkpoint-2", {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"}),
    "accelerate_save_state": (None, {"optimizer.bin", "scheduler.bin", "random_states_0.pkl"}),
    # the optimizer state is DeepSpeed's, inside global_step2/ (what the deepspeed adapter reads)
    "trainer_deepspeed_zero2": ("checkpoint-2", {"scheduler.pt", "rng_state_0.pth", "rng_state_1.pth",
                                                 "training_args.bin"}),
    "trainer_deepspeed_zero3": ("checkpoint-2", {"scheduler.pt", "rng_state_0.pth", "rng_state_1.pth",
                                                 "training_args.bin"}),
}


def _spec(name: str) -> str:
    """The generator spec that made a committed fixture: its own name, or for one written by another
    release in a farm environment (``trainer_llama_tf5250``), the spec its meta.json records."""
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    return str((meta.get("farm") or {}).get("spec") or name)


_ALL = sorted(p.name for p in FIXTURES.iterdir() if (p / "meta.json").is_file())
#: fixture -> (checkpoint folder, resume files): every release's Trainer and Accelerate outputs
RUNS: dict[str, tuple[str | None, set[str]]] = {n: RUN_SPECS[_spec(n)] for n in _ALL if _spec(n) in RUN_SPECS}
#: the Trainer + FSDP (SHARDED_STATE_DICT) outputs of every release
FSDP_RUNS = [n for n in _ALL if _spec(n) == "trainer_fsdp_sharded"]


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _src(name: str) -> Path:
    sub = RUNS[name][0]
    root = FIXTURES / name / "checkpoint"
    return root / sub if sub else root


def _attest(name: str, src: Path, signer: Signer, tmp: Path) -> Path:
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    with SafeTree.open(src) as tree:
        fmt = str(inspect_open_tree(tree).format)
    return attest(signer, src, tmp / "att.json", fmt=fmt, meta=meta)


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _raw(t: Any) -> bytes:
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensors(files: list[Path]) -> dict[str, Any]:
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _assert_bit_exact(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert (got[k].dtype, tuple(got[k].shape)) == (v.dtype, tuple(v.shape)), k
        assert _raw(got[k]) == _raw(v), k


@pytest.mark.parametrize("name", sorted(RUNS))
def test_run_fixture_is_published_bit_exact_with_its_resume_state_listed(name: str, signer: Signer,
                                                                          tmp_path: Path) -> None:
    pytest.importorskip("torch")
    src = _src(name)
    att = _attest(name, src, signer, tmp_path)
    dst = tmp_path / "out"
    res = intake(src, dst, attestations=[att], options=signer.options)
    receipt = json.loads((dst / RECEIPT_NAME).read_text())
    assert receipt["decision"]["allow"] is True
    resume = RUNS[name][1]
    listed = {r["path"]: r for r in receipt["resume_state"]}
    assert set(listed) == resume
    assert all(r["sha256"] == _sha256(src / p) for p, r in listed.items())
    published = {p.name for p in dst.iterdir()}
    assert not published & (resume | {"trainer_state.json", "training_args.bin"})
    assert "resume_state_excluded" in {r.code for r in res.evaluation.decision.reasons}
    _assert_bit_exact(_tensors(sorted(dst.glob("*.safetensors"))),
                      _tensors([FIXTURES / name / "expected.safetensors"]))
    if _spec(name).startswith("trainer"):
        for companion in ("tokenizer.json", "tokenizer_config.json"):
            assert (dst / companion).read_bytes() == (src / companion).read_bytes(), companion


def test_the_digest_covers_only_the_selected_checkpoint(tmp_path: Path) -> None:
    root = FIXTURES / "trainer_llama" / "checkpoint"
    digests = {}
    for choice in ("1", "2"):
        with SafeTree.open(select_checkpoint(root, choice)) as tree:
            d = fixture_digest(tree)
        assert d.file_count == len(list((root / f"checkpoint-{choice}").iterdir()))
        digests[choice] = d.digest
    assert digests["1"] != digests["2"]
    assert select_checkpoint(root, "latest") == root / "checkpoint-2"


def test_cli_refuses_an_output_directory_with_several_checkpoints_and_takes_the_chosen_one(
        signer: Signer, tmp_path: Path) -> None:
    root = FIXTURES / "trainer_llama" / "checkpoint"
    proc = ckptgate_json("intake", root, "--out", tmp_path / "none", "--trust", signer.trust_file)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "usage.checkpoint.ambiguous"
    assert err["evidence"]["checkpoints"] == ["checkpoint-1", "checkpoint-2"]
    assert not (tmp_path / "none").exists()
    proc = ckptgate_json("inspect", root, "--checkpoint", "latest")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    paths = {f["path"] for f in json.loads(proc.stdout)["inspection"]["files"]}
    assert "model.safetensors" in paths and not any(p.startswith("checkpoint-") for p in paths)
    att = _attest("trainer_llama", root / "checkpoint-2", signer, tmp_path)
    dst = tmp_path / "out"
    proc = ckptgate_json("intake", root, "--checkpoint", "latest", "--out", dst, "--attestation", att,
                         "--trust", signer.trust_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    receipt = json.loads((dst / RECEIPT_NAME).read_text())
    assert receipt["source"] == str(root / "checkpoint-2")


def test_transformers_loads_the_published_tiny_llama_offline_bit_exact(signer: Signer, tmp_path: Path) -> None:
    """A real client: ``AutoModelForCausalLM`` and ``AutoTokenizer`` from DST with the hub offline,
    in a fresh interpreter; the loaded state dict equals the producer's bit for bit."""
    pytest.importorskip("transformers")
    src = _src("trainer_llama")
    dst = tmp_path / "out"
    intake(src, dst, attestations=[_attest("trainer_llama", src, signer, tmp_path)], options=signer.options)
    script = r'''
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
dst, expected = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(dst)
tok = AutoTokenizer.from_pretrained(dst)
want = load_file(expected)
got = model.state_dict()
raw = lambda t: t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
print(json.dumps({"class": type(model).__name__, "names_equal": sorted(got) == sorted(want),
                  "bit_exact": all(got[k].dtype == v.dtype and raw(got[k]) == raw(v) for k, v in want.items()),
                  "ids": tok("w1 w2 w27")["input_ids"]}))
'''
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", script, str(dst), str(FIXTURES / "trainer_llama" / "expected.safetensors")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"class": "LlamaForCausalLM", "names_equal": True, "bit_exact": True, "ids": [5, 6, 31]}


# -- a DCP training-state tree (torchtitan style): only the model subtree is written -----------------
def _dcp_intake(signer: Signer, tmp: Path, **kw: Any) -> tuple[Any, Path, dict[str, Any]]:
    src = FIXTURES / "dcp_torchtitan" / "checkpoint"
    att = _attest("dcp_torchtitan", src, signer, tmp)
    dst = tmp / "out"
    res = intake(src, dst, attestations=[att], options=signer.options, **kw)
    return res, dst, json.loads((dst / RECEIPT_NAME).read_text())


def test_torchtitan_tree_publishes_only_the_model_subtree_bit_exact(signer: Signer, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    res, dst, receipt = _dcp_intake(signer, tmp_path)
    _assert_bit_exact(_tensors(sorted(dst.glob("*.safetensors"))),
                      _tensors([FIXTURES / "dcp_torchtitan" / "expected.safetensors"]))
    sel = receipt["plan"]["selection"]
    assert sel["prefix"] == "model" and sel["layout"] == "resume_state_structure" and sel["source"] == "policy"
    assert sel["excluded"] == ["lr_scheduler", "optimizer", "train_state"]
    assert sel["excluded_tensors"] == 20 and sel["excluded_bytes_items"] == 80
    assert "skipped_bytes_items" not in receipt["plan"]  # the optimizer's param_groups are not "model" items
    assert res.evaluation.decision.selection is not None and res.evaluation.decision.selection.prefix == "model"
    assert "training_state_selected" in {r.code for r in res.evaluation.decision.reasons}


def test_select_overrides_the_default_and_drops_its_prefix(signer: Signer, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    res, dst, receipt = _dcp_intake(signer, tmp_path, select="optimizer.state")
    got = _tensors(sorted(dst.glob("*.safetensors")))
    assert "gate.exp_avg" in got and "fc1.weight.step" in got and not any(k.startswith("model") for k in got)
    sel = receipt["plan"]["selection"]
    assert (sel["prefix"], sel["source"], sel["layout"]) == ("optimizer.state", "request", None)


@pytest.mark.parametrize(("fixture", "select", "code"), [
    ("dcp_torchtitan", "nothing", "selection_matches_nothing"),
    ("accelerate_save_state", "model", "selection_not_applicable"),
])
def test_a_select_that_does_not_apply_is_denied(signer: Signer, tmp_path: Path, fixture: str, select: str,
                                                 code: str) -> None:
    from ckptgate.errors import Error

    src = FIXTURES / fixture / "checkpoint"
    att = _attest(fixture, src, signer, tmp_path)
    with pytest.raises(Error) as e:
        intake(src, tmp_path / "out", attestations=[att], options=signer.options, select=select)
    assert code in {r["code"] for r in e.value.reasons}, e.value.reasons
    assert not (tmp_path / "out").exists()


def test_a_plain_dcp_model_tree_is_written_whole_with_its_top_level_keys_named(signer: Signer,
                                                                               tmp_path: Path) -> None:
    src = FIXTURES / "dcp_torch_save" / "checkpoint"
    meta = json.loads((FIXTURES / "dcp_torch_save" / "meta.json").read_text())
    att = attest(signer, src, tmp_path / "att.json", fmt="dcp-torch-save", meta=meta)
    res = intake(src, tmp_path / "out", attestations=[att], options=signer.options)
    receipt = json.loads((tmp_path / "out" / RECEIPT_NAME).read_text())
    assert "selection" not in receipt["plan"] and res.evaluation.decision.selection is None
    unknown = [r for r in res.evaluation.decision.reasons if r.code == "training_state_layout_unknown"]
    assert [list(r.evidence["top_level_keys"]) for r in unknown] == [["embed", "fc1", "fc2", "gate", "head", "token_ids"]]


# -- Trainer under FSDP (SHARDED_STATE_DICT): DCP folders of the model and of the optimizer --------------
@pytest.mark.parametrize("name", FSDP_RUNS)
def test_trainer_fsdp_checkpoint_publishes_the_model_folder_only_bit_exact(name: str, signer: Signer,
                                                                           tmp_path: Path) -> None:
    """``checkpoint-2/`` holds ``pytorch_model_fsdp_0/`` ({"model": ...}) and ``optimizer_0/``
    ({"optimizer": ...}): read together as one training-state tree, the optimizer is resume state by
    its structure and is never written, the model subtree is published bit-exact without its prefix,
    and the rng and scheduler files are listed as resume state (FSDP2 under transformers 5.x, FSDP1
    under 4.57)."""
    pytest.importorskip("torch")
    src = FIXTURES / name / "checkpoint" / "checkpoint-2"
    att = _attest(name, src, signer, tmp_path)
    dst = tmp_path / "out"
    res = intake(src, dst, attestations=[att], options=signer.options)
    receipt = json.loads((dst / RECEIPT_NAME).read_text())
    assert receipt["decision"]["allow"] is True
    assert {r["path"] for r in receipt["resume_state"]} == {"scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"}
    sel = receipt["plan"]["selection"]
    assert (sel["prefix"], sel["layout"], sel["source"]) == ("model", "resume_state_structure", "policy")
    assert sel["excluded"] == ["optimizer"] and sel["excluded_tensors"] == 36
    assert "training_state_selected" in {r.code for r in res.evaluation.decision.reasons}
    got = _tensors(sorted(dst.glob("*.safetensors")))
    assert not any("exp_avg" in k or k.startswith(("optimizer", "model.model")) for k in got)
    _assert_bit_exact(got, _tensors([FIXTURES / name / "expected.safetensors"]))
    assert not {p.name for p in dst.iterdir()} & {"optimizer_0", "pytorch_model_fsdp_0", "trainer_state.json"}


@pytest.mark.parametrize("name", FSDP_RUNS)
def test_trainer_fsdp_optimizer_folder_alone_is_refused_never_published_as_weights(name: str, signer: Signer,
                                                                                   tmp_path: Path) -> None:
    """Without the model folder, the tree is resume state beside no model: refused, nothing written."""
    import shutil

    from ckptgate.errors import Error

    src = tmp_path / "checkpoint-2"
    shutil.copytree(FIXTURES / name / "checkpoint" / "checkpoint-2", src,
                    ignore=shutil.ignore_patterns("pytorch_model_fsdp_0"))
    att = _attest(name, src, signer, tmp_path)
    with pytest.raises(Error) as e:
        intake(src, tmp_path / "out", attestations=[att], options=signer.options)
    assert "training_state_ambiguous" in {r["code"] for r in e.value.reasons}, e.value.reasons
    assert not (tmp_path / "out").exists()
