"""The producer-side hooks with the real libraries: a tiny ``Trainer`` run with ``AttestCallback`` and a
2-rank ``torch.distributed.checkpoint.save`` with ``after_dcp_save`` each produce attested checkpoints that
``ckptgate intake --trust`` takes in with no other step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_helpers import ckptgate_json

ROOT = Path(__file__).resolve().parents[2]
BUILDER = "https://ci.example/trainer"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("keys")
    res = ckptgate_json("attest", "keygen", "--out", d / "k", "--trust-out", d / "trust.json", "--builder-id", BUILDER)
    assert res.returncode == 0, res.stderr
    return {"key": d / "k.pem", "trust": d / "trust.json"}


def _intake(ck: Path, keys: dict[str, Path], out: Path, att: Path | None = None) -> dict:
    att = att or ck.parent / (ck.name + ".intoto.dsse.json")
    res = ckptgate_json("intake", ck, "--out", out, "--attestation", att, "--trust", keys["trust"])
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["receipt"]


def test_trainer_callback_attests_each_checkpoint_and_intake_takes_it_in(tmp_path: Path, keys: dict) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "CKPTGATE_SIGNING_KEY": str(keys["key"]), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "train_with_attestation.py"), str(run),
                          "--builder-id", BUILDER], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2", "checkpoint-2.intoto.dsse.json"]
    ck = run / "checkpoint-2"
    receipt = _intake(ck, keys, tmp_path / "published")
    assert receipt["decision"]["allow"] is True
    assert (tmp_path / "published" / "config.json").is_file()
    res = ckptgate_json("verify", ck, "--attestation", run / "checkpoint-2.intoto.dsse.json", "--trust", keys["trust"])
    assert res.returncode == 0, res.stderr
    (att,) = json.loads(res.stdout)["attestations"]  # the reviewer report
    training = att["training"]
    assert training["builder_id"] == BUILDER and training["step"] == 2
    assert training["topology"] == {"world_size": 1}
    assert {p["name"] for p in training["producers"]} >= {"torch", "transformers"}
    head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
    assert training["code"]["commit"] == head  # git in the working directory of the job


def test_dcp_save_on_two_ranks_is_attested_by_rank_zero_and_taken_in(tmp_path: Path, keys: dict) -> None:
    ck = tmp_path / "dcp"
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(Path(__file__).with_name("dcp_save_attest.py")), str(ck), str(keys["key"]), BUILDER],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    receipt = _intake(ck, keys, tmp_path / "published")
    assert receipt["decision"]["allow"] is True
    assert receipt["decision"]["plane"] == "static_pickle"  # DCP metadata read by the static pickle reader
    res = ckptgate_json("verify", ck, "--attestation", tmp_path / "dcp.intoto.dsse.json", "--trust", keys["trust"])
    (att,) = json.loads(res.stdout)["attestations"]
    assert att["training"]["topology"] == {"world_size": 2}  # measured from the two ranks' .distcp files


def test_accelerate_save_state_is_attested_and_taken_in(tmp_path: Path, keys: dict) -> None:
    ck = tmp_path / "state"
    res = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("accelerate_save_attest.py")), str(ck), str(keys["key"]),
         BUILDER],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    receipt = _intake(ck, keys, tmp_path / "published")
    assert receipt["decision"]["allow"] is True
    assert (tmp_path / "published" / "model.safetensors.index.json").is_file()


@pytest.mark.producers  # DeepSpeed on two gloo ranks: about 30 s (its shm comm op is built on first use)
def test_deepspeed_save_checkpoint_is_attested_by_rank_zero_and_taken_in_on_the_framework_plane(
    tmp_path: Path, keys: dict
) -> None:
    ck = tmp_path / "ds"
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(Path(__file__).with_name("deepspeed_save_attest.py")), str(ck), str(keys["key"]), BUILDER],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (envelope,) = tmp_path.glob("ds.global_step*.intoto.dsse.json")  # one statement per save, named by its tag
    receipt = _intake(ck, keys, tmp_path / "published", envelope)
    assert receipt["decision"]["allow"] is True
    assert receipt["decision"]["plane"] == "framework"
    res = ckptgate_json("verify", ck, "--attestation", envelope, "--trust", keys["trust"])
    (att,) = json.loads(res.stdout)["attestations"]
    assert att["training"]["topology"] == {"dp": 2, "world_size": 2, "zero_stage": 2}


@pytest.mark.producers  # a Trainer on DeepSpeed ZeRO-2 over two gloo ranks: about 30 s warm, longer on first build
def test_trainer_callback_under_deepspeed_attests_each_checkpoint_and_intake_takes_it_in_on_the_framework_plane(
    tmp_path: Path, keys: dict
) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "CKPTGATE_SIGNING_KEY": str(keys["key"]), "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
           "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(ROOT / "examples" / "train_with_attestation.py"), str(run), "--builder-id", BUILDER,
                          "--deepspeed"], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2", "checkpoint-2.intoto.dsse.json"]
    assert (run / "checkpoint-2" / "global_step2").is_dir()  # DeepSpeed's own partitions, in the Trainer's folder
    receipt = _intake(run / "checkpoint-2", keys, tmp_path / "published")
    assert receipt["decision"]["allow"] is True
    assert receipt["decision"]["plane"] == "framework"
    res = ckptgate_json("verify", run / "checkpoint-2", "--attestation", run / "checkpoint-2.intoto.dsse.json",
                        "--trust", keys["trust"])
    (att,) = json.loads(res.stdout)["attestations"]
    assert att["training"]["format"] == "deepspeed-zero2"
    assert att["training"]["topology"]["world_size"] == 2 and att["training"]["topology"]["zero_stage"] == 2
    assert {p["name"] for p in att["training"]["producers"]} >= {"deepspeed", "transformers", "torch"}


@pytest.mark.producers  # megatron-core on two gloo ranks: its import alone is about 20 s per rank
def test_megatron_dist_checkpointing_save_is_attested_per_the_documented_snippet_and_taken_in(
    tmp_path: Path, keys: dict
) -> None:
    save = tmp_path / "save"
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(Path(__file__).with_name("megatron_save_attest.py")), str(save), str(keys["key"]), BUILDER],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ck = save / "iter_0000001"
    receipt = _intake(ck, keys, tmp_path / "published")
    assert receipt["decision"]["allow"] is True
    res = ckptgate_json("verify", ck, "--attestation", save / "iter_0000001.intoto.dsse.json", "--trust", keys["trust"])
    (att,) = json.loads(res.stdout)["attestations"]
    training = att["training"]
    assert training["format"] == "megatron-torch-dist" and training["step"] == 1
    assert training["topology"] == {"tp": 2, "world_size": 2}  # tp declared, and consistent with the layout
    assert {p["name"] for p in training["producers"]} == {"megatron-core", "torch"}


def test_trainer_callback_attests_a_peft_adapter_with_its_base_model(tmp_path: Path, keys: dict) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "CKPTGATE_SIGNING_KEY": str(keys["key"]), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(ROOT / "examples" / "train_with_attestation.py"), str(run),
                          "--builder-id", BUILDER, "--peft"], capture_output=True, text=True, timeout=300, env=env,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    receipt = _intake(run / "checkpoint-2", keys, tmp_path / "published")
    assert receipt["decision"]["allow"] is True
    res = ckptgate_json("verify", run / "checkpoint-2", "--attestation", run / "checkpoint-2.intoto.dsse.json",
                        "--trust", keys["trust"])
    (att,) = json.loads(res.stdout)["attestations"]
    assert att["training"]["format"] in ("peft", "peft-lora")
    assert att["training"]["base_model"]["repo"] == "example/tiny-llama"
    assert att["training"]["base_model"]["revision"] == "0123456789abcdef0123456789abcdef01234567"
    assert any(p["name"] == "peft" for p in att["training"]["producers"])


def test_after_deepspeed_save_attests_each_save_into_the_same_save_dir(tmp_path: Path, keys: dict) -> None:
    """A job saves into one save_dir again and again: the second save used to be refused (usage.exists: the
    first save's <save_dir>.intoto.dsse.json), raising out of the training loop.  Each save gets its own
    statement, named by the tag ``latest`` names, with that tag's step."""
    import shutil

    from ckptgate.hooks import after_deepspeed_save

    class Engine:
        def zero_optimization_stage(self) -> int:
            return 2

    sd = tmp_path / "ds"
    shutil.copytree(ROOT / "tests" / "fixtures" / "data" / "deepspeed_zero2" / "checkpoint", sd)
    first = after_deepspeed_save(Engine(), sd, key=keys["key"], builder_id=BUILDER)
    assert first is not None and first.path == tmp_path / "ds.global_step2.intoto.dsse.json"
    shutil.copytree(sd / "global_step2", sd / "global_step4")  # the next save
    (sd / "latest").write_text("global_step4")
    second = after_deepspeed_save(Engine(), sd, key=keys["key"], builder_id=BUILDER)
    assert second is not None and second.path == tmp_path / "ds.global_step4.intoto.dsse.json"
    assert second.statement["predicate"]["buildDefinition"]["internalParameters"]["step"] == 4
    assert _intake(sd, keys, tmp_path / "published", second.path)["decision"]["allow"] is True


def test_after_deepspeed_save_names_the_save_by_the_engine_step_when_latest_is_stale(
    tmp_path: Path, keys: dict
) -> None:
    """``save_checkpoint(dir, save_latest=False)`` leaves ``latest`` naming the previous tag: the save is the
    engine's own default tag, ``global_step<global_steps>``, not the one ``latest`` names."""
    import shutil

    from ckptgate.hooks import after_deepspeed_save

    class Engine:
        global_steps = 6

        def zero_optimization_stage(self) -> int:
            return 2

    sd = tmp_path / "ds"
    shutil.copytree(ROOT / "tests" / "fixtures" / "data" / "deepspeed_zero2" / "checkpoint", sd)
    shutil.copytree(sd / "global_step2", sd / "global_step6")  # saved with save_latest=False: latest still says 2
    done = after_deepspeed_save(Engine(), sd, key=keys["key"], builder_id=BUILDER)
    assert done is not None and done.path == tmp_path / "ds.global_step6.intoto.dsse.json"
    assert done.statement["predicate"]["buildDefinition"]["internalParameters"]["step"] == 6


_TWO_RANK_SAVE = """
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
def main(rank, path, port, report, key, saves):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from ckptgate.errors import Error
    from ckptgate.hooks import after_dcp_save
    out = os.open(f"{report}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for i in range(int(saves)):
        dcp.save({"w": torch.ones(2, 2) * rank}, checkpoint_id=f"{path}{i}")
        try:
            done = after_dcp_save(f"{path}{i}", key=key, builder_id="b")
            code = "signed" if done is not None else "none"
        except Error as e:
            code = e.code
        os.write(out, f"{code} ".encode())
    if rank == 0:
        os._exit(0)  # the job's last save: the main process leaves at once (it hosts the store)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=tuple(sys.argv[1:6]), nprocs=2)
"""


def _two_ranks(tmp_path: Path, key: Path, saves: int) -> tuple[str, str]:
    """Run :data:`_TWO_RANK_SAVE`: what each rank's hook calls gave."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "save.py").write_text(_TWO_RANK_SAVE)
    done = subprocess.run([sys.executable, str(tmp_path / "save.py"), str(tmp_path / "ck"), port,
                           str(tmp_path / "code"), str(key), str(saves)], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return (tmp_path / "code.0").read_text().strip(), (tmp_path / "code.1").read_text().strip()


def test_a_refusal_on_the_main_process_is_raised_on_every_rank(tmp_path: Path) -> None:
    """Rank 0 cannot attest (here: no key file): every rank raises, instead of the others training on into a
    collective rank 0 never reaches."""
    codes = _two_ranks(tmp_path, tmp_path / "no-such-key.pem", 1)
    assert codes == ("usage.signing_key_unreadable", "runtime.attest.failed_on_main")
    assert not list(tmp_path.glob("ck*.*"))


def test_the_main_process_returns_once_every_rank_has_read_the_outcome(tmp_path: Path, keys: dict) -> None:
    """Rank 0 hosts the store and leaves at once after the job's last save: rank 1 has read the outcome by
    then, every time (it used to read it from a store already gone, in most runs), and each of several saves
    has its own outcome."""
    for run in range(2):
        codes = _two_ranks(tmp_path / str(run), keys["key"], 3)
        assert codes == ("signed signed signed", "none none none")
        assert len(list((tmp_path / str(run)).glob("ck*.intoto.dsse.json"))) == 3
