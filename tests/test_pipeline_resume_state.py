"""Resume state is never published as weights, whatever its key names (issue 31, item 7).

Each tree is written here by real ``torch.distributed.checkpoint.save`` in one process (no
torchrun), as torchtitan's ``CheckpointManager`` saves a step: the model, the optimizer
(``get_optimizer_state_dict``, flattened), the loop counters and an ``extra`` subtree of RNG
state (torch's CPU generator state, a CUDA generator's 16 bytes and Python's ``random`` state).
The same tree under other names is recognised the same way, by its structure; a tree of resume
state with no model subtree is refused with a typed error that lists its top-level keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.errors import Error, ExitCode
from ckptgate.pipeline import intake
from ckptgate.publish import RECEIPT_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import FIXTURES, Signer, attest, ckptgate_json, make_signer

pytestmark = pytest.mark.opa

PRODUCER = r"""
import json, os, random, sys
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from safetensors.torch import save_file

out, names = sys.argv[1], json.loads(sys.argv[2])
torch.manual_seed(0)
random.seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(2):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
msd = model.state_dict()
osd = get_optimizer_state_dict(model, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))
parts = {
    "model": msd,
    "optimizer": osd,
    "train_state": {"step": 2, "ntokens_seen": torch.tensor(16)},
    "extra": {"rng": torch.get_rng_state(), "cuda_rng": torch.zeros(16, dtype=torch.uint8),
              "python": random.getstate()},
}
state = {names[k]: v for k, v in parts.items() if k in names}
dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(out, "checkpoint")))
save_file({k: v.contiguous() for k, v in msd.items()}, os.path.join(out, "expected.safetensors"))
"""

TITAN = {"model": "model", "optimizer": "optimizer", "train_state": "train_state", "extra": "extra"}
RENAMED = {"model": "net", "optimizer": "opt", "train_state": "progress", "extra": "rng"}
NO_MODEL = {"optimizer": "opt", "train_state": "progress", "extra": "rng"}


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _produce(out: Path, names: dict[str, str]) -> Path:
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", PRODUCER, str(out), json.dumps(names)], capture_output=True,
                          text=True, timeout=300, env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "checkpoint"


def _attest(signer: Signer, src: Path, tmp: Path) -> Path:
    meta = json.loads((FIXTURES / "dcp_torchtitan" / "meta.json").read_text())
    return attest(signer, src, tmp / "att.json", fmt="dcp-torch-save", meta=meta)


def _tensors(paths: list[Path]) -> dict[str, bytes]:
    import torch
    from safetensors.torch import load_file

    out: dict[str, bytes] = {}
    for p in paths:
        for k, t in load_file(p).items():
            out[k] = repr(t.dtype).encode() + t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return out


@pytest.mark.parametrize("names", [TITAN, RENAMED], ids=["torchtitan", "renamed"])
def test_only_the_model_is_published_and_the_resume_state_is_reported(signer: Signer, tmp_path: Path,
                                                                     names: dict[str, str]) -> None:
    src = _produce(tmp_path / "prod", names)
    dst = tmp_path / "out"
    res = intake(src, dst, attestations=[_attest(signer, src, tmp_path)], options=signer.options)
    got = _tensors(sorted(dst.glob("*.safetensors")))
    want = _tensors([tmp_path / "prod" / "expected.safetensors"])
    assert got == want  # the model's tensors, named without the prefix, bit for bit; nothing else
    assert not any("exp_avg" in k or "rng" in k for k in got)
    receipt = json.loads((dst / RECEIPT_NAME).read_text())
    sel = receipt["plan"]["selection"]
    model, rest = names["model"], sorted(v for k, v in names.items() if k != "model")
    assert (sel["prefix"], sel["source"], sel["layout"]) == (model, "policy", "resume_state_structure")
    assert sel["excluded"] == rest and sel["excluded_tensors"] > 0
    assert "skipped_bytes_items" not in receipt["plan"]
    [reason] = [r for r in res.evaluation.decision.reasons if r.code == "training_state_selected"]
    assert reason.evidence["resume_state"] == {names["optimizer"]: "optimizer", names["train_state"]: "loop_state",
                                               names["extra"]: "generator_state"}


def test_resume_state_with_no_model_subtree_is_refused_with_the_top_level_keys(signer: Signer,
                                                                              tmp_path: Path) -> None:
    src = _produce(tmp_path / "prod", NO_MODEL)
    att = _attest(signer, src, tmp_path)
    with pytest.raises(Error) as e:
        intake(src, tmp_path / "out", attestations=[att], options=signer.options)
    assert e.value.exit_code == ExitCode.INPUT_REJECTED
    assert "training_state_ambiguous" in {r["code"] for r in e.value.reasons}
    assert not (tmp_path / "out").exists()
    res = ckptgate_json("intake", src, "--out", tmp_path / "out2", "--attestation", att,
                        "--trust", signer.trust_file)
    assert res.returncode == ExitCode.INPUT_REJECTED, res.stdout + res.stderr
    err = json.loads(res.stdout)["error"]
    [reason] = [r for r in err["reasons"] if r["code"] == "training_state_ambiguous"]
    assert reason["evidence"]["top_level_keys"] == ["opt", "progress", "rng"]
    assert "--select" in reason["message"] and "opt, progress, rng" in reason["message"]
    assert not (tmp_path / "out2").exists()
    # the user's choice is honoured: --select names what to publish
    ok = intake(src, tmp_path / "out3", attestations=[att], options=signer.options, select="opt.state")
    assert ok.evaluation.decision.selection is not None and ok.evaluation.decision.selection.source == "request"
