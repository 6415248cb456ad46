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
def main(rank, path, port, report, key, saves, mains, alias):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    path = alias if alias != "-" and rank == 1 else path  # rank 1 may reach the folder another way
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from ckptgate.errors import Error
    from ckptgate.hooks import after_dcp_save
    out = os.open(f"{report}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for i in range(int(saves)):
        dcp.save({"w": torch.ones(2, 2) * rank}, checkpoint_id=f"{path}{i}")
        try:
            main = None if mains == "-" else mains[rank] == "1"
            done = after_dcp_save(f"{path}{i}", key=key, builder_id="b", main_process=main)
            code = "signed" if done is not None else "none"
        except Error as e:
            code = e.code
        os.write(out, f"{code} ".encode())
    if rank == 0:
        os._exit(0)  # the job's last save: the main process leaves at once (it hosts the store)
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=tuple(sys.argv[1:8]), nprocs=2)
"""


def _two_ranks(tmp_path: Path, key: Path, saves: int, mains: str = "-", alias: str = "-") -> tuple[str, str]:
    """Run :data:`_TWO_RANK_SAVE` (``mains``: each rank's ``main_process=``, ``"1"``/``"0"``; ``"-"``: unset;
    ``alias``: how rank 1 spells ``<tmp_path>/ck``, ``"-"``: alike): what each rank's hook calls gave."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "save.py").write_text(_TWO_RANK_SAVE)
    done = subprocess.run([sys.executable, str(tmp_path / "save.py"), str(tmp_path / "ck"), port,
                           str(tmp_path / "code"), str(key), str(saves), mains, alias], capture_output=True, text=True,
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


def _misuse(tmp_path: Path, mains: str) -> tuple[str, str, float]:
    """Run :data:`_TWO_RANK_SAVE` with ``main_process=`` per rank (``mains``: ``"00"``, ``"11"``)."""
    import time

    start = time.monotonic()
    codes = _two_ranks(tmp_path, tmp_path / "no-key-needed.pem", 1, mains)
    return *codes, time.monotonic() - start


def test_no_rank_that_says_it_is_the_main_process_fails_every_rank_at_once(tmp_path: Path) -> None:
    """Every rank passes ``main_process=False``: each used to wait for an outcome nobody would give, until the
    store's timeout (30 minutes); now every rank raises the typed code once all have arrived."""
    *codes, took = _misuse(tmp_path, "00")
    assert tuple(codes) == ("runtime.attest.main_process", "runtime.attest.main_process")
    assert took < 60
    assert not list(tmp_path.glob("ck*.*"))  # nothing signed


def test_two_ranks_that_say_they_are_the_main_process_fail_every_rank(tmp_path: Path) -> None:
    """Both ranks pass ``main_process=True``: both used to attest the same checkpoint, their store keys
    colliding; now neither signs and both raise the typed code."""
    *codes, took = _misuse(tmp_path, "11")
    assert tuple(codes) == ("runtime.attest.main_process", "runtime.attest.main_process")
    assert took < 60
    assert not list(tmp_path.glob("ck*.*"))


def test_two_gloo_ranks_that_reach_the_checkpoint_by_two_paths_fail_in_seconds(tmp_path: Path, keys: dict) -> None:
    """The real store (TCPStore under ``init_process_group``): rank 1 saves and attests through a link to the
    folder rank 0 names; both used to wait at their own key until the store's timeout (30 minutes), now
    both raise ``runtime.attest.path_mismatch`` in seconds and nothing is signed."""
    import time

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "link").symlink_to(tmp_path)
    start = time.monotonic()
    codes = _two_ranks(tmp_path, keys["key"], 1, alias=str(tmp_path / "link" / "ck"))
    assert codes == ("runtime.attest.path_mismatch", "runtime.attest.path_mismatch")
    assert time.monotonic() - start < 60  # torch's start-up included: the wait itself is seconds
    assert not list(tmp_path.glob("ck*.*"))


class _FakeStore:
    """A process group's store as TCPStore behaves: ``get`` and ``wait`` block until the keys are set,
    ``add`` returns the new value; a wait past ``timeout`` raises, as the real store does."""

    def __init__(self, timeout: float = 20.0) -> None:
        import threading

        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.timeout = timeout

    def _until(self, keys: list[str]) -> None:
        if not self.cond.wait_for(lambda: all(k in self.data for k in keys), self.timeout):
            raise RuntimeError(f"Wait timeout for {keys}")

    def set(self, key: str, value: str | bytes) -> None:
        with self.cond:
            self.data[key] = value.encode() if isinstance(value, str) else bytes(value)
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            self._until([key])
            return self.data[key]

    def add(self, key: str, n: int) -> int:
        with self.cond:
            value = int(self.data.get(key, b"0")) + n
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def wait(self, keys: list[str], timeout=None) -> None:  # timeout: a timedelta, as TCPStore takes it
        with self.cond:
            if timeout is None:
                self._until(list(keys))
            elif not self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds()):
                raise RuntimeError(f"Wait timeout for {keys}")

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None


class _FakeRanks:
    """``torch.distributed`` for ranks that are threads of this process: each thread says which rank it is
    (and so which process's hook-call keys it has) with :meth:`as_rank`."""

    def __init__(self, world: int) -> None:
        import threading
        import types

        from ckptgate.hooks import _attest

        self.world = world
        self.store = _FakeStore()
        self.local = threading.local()
        self.keys = [_attest._CallKeys() for _ in range(world)]  # one process's keys per rank
        self.distributed_c10d = types.SimpleNamespace(_get_default_store=lambda: self.store)

    def as_rank(self, rank: int) -> None:
        self.local.rank = rank

    def get_rank(self) -> int:
        return int(self.local.rank)

    def get_world_size(self) -> int:
        return self.world

    def next(self, path: Path | str) -> str:  # stands in for the module's _KEYS: this thread's rank's
        return self.keys[self.get_rank()].next(path)

    def opened(self, store, rank: int, key: str, spelling: str) -> None:
        self.keys[rank].opened(store, rank, key, spelling)

    def closed(self, store, rank: int, key: str) -> None:
        self.keys[rank].closed(store, rank, key)


@pytest.fixture
def fake_ranks(monkeypatch: pytest.MonkeyPatch):
    from ckptgate.hooks import _attest

    def make(world: int, attested: list[str], refuse: frozenset[str] = frozenset()) -> _FakeRanks:
        ranks = _FakeRanks(world)

        def attest_main(dist, path, _fields):  # the main process "signs" ``path`` (refusing those in ``refuse``)
            from ckptgate.errors import UsageError

            if Path(path).name in refuse:
                raise UsageError("usage.signing_key_unreadable", f"no key for {path}", advice=f"give a key for {path}")
            attested.append(Path(path).name)
            return Path(path).name

        monkeypatch.setattr(_attest, "_dist", lambda: ranks)
        monkeypatch.setattr(_attest, "_KEYS", ranks)
        monkeypatch.setattr(_attest, "_attest_main", attest_main)
        return ranks

    return make


def _left(ranks: _FakeRanks) -> dict[str, bytes]:
    """What the calls left in the store besides each rank's record of the calls it waits in (one key per rank,
    which another rank may be reading), once every such record is empty."""
    opened = {k: v for k, v in ranks.store.data.items() if "/open/" in k}
    assert all(v == b"{}" for v in opened.values()), opened
    return {k: v for k, v in ranks.store.data.items() if k not in opened}


def _run_ranks(ranks: _FakeRanks, jobs: dict[tuple[int, str], object]) -> dict[tuple[int, str], object]:
    """Run each ``(rank, name): callable`` on its own thread as that rank: what each returned or raised."""
    import threading

    got: dict[tuple[int, str], object] = {}

    def run(rank: int, name: str, job) -> None:
        ranks.as_rank(rank)
        try:
            got[(rank, name)] = job()
        except Exception as e:  # recorded for the test to judge
            got[(rank, name)] = getattr(e, "code", repr(e))

    threads = [threading.Thread(target=run, args=(r, n, j)) for (r, n), j in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank never returned"
    return got


def test_the_store_key_names_the_checkpoint_and_the_call_for_that_checkpoint(tmp_path: Path, monkeypatch) -> None:
    import threading

    from ckptgate.hooks._attest import _CallKeys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    keys = _CallKeys()
    first, second = keys.next("ck"), keys.next(tmp_path / "ck")  # the same checkpoint, named two ways
    assert first.startswith("ckptgate/attest/3/") and first.endswith("/0") and second.endswith("/1")
    assert first.rsplit("/", 1)[0] == second.rsplit("/", 1)[0]
    assert keys.next(tmp_path / "other").endswith("/0")  # another checkpoint counts its own calls

    got: list[str] = []
    lock = threading.Lock()

    def many(name: str) -> None:
        for _ in range(200):
            k = keys.next(tmp_path / name)
            with lock:
                got.append(k)

    threads = [threading.Thread(target=many, args=(f"ck{i % 4}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == len(got) == 1600  # no two calls share a key
    by_checkpoint: dict[str, list[int]] = {}
    for k in got:
        prefix, n = k.rsplit("/", 1)
        by_checkpoint.setdefault(prefix, []).append(int(n))
    assert len(by_checkpoint) == 4  # each checkpoint's calls are numbered 0..399, none skipped
    assert all(sorted(ns) == list(range(400)) for ns in by_checkpoint.values())


def test_concurrent_saves_of_different_checkpoints_each_get_their_own_outcome(tmp_path: Path, fake_ranks) -> None:
    """Two threads per rank save different checkpoints at once, in whatever order they run: each call meets
    the other rank's call for the same checkpoint (a process-wide call count paired them by arrival, so rank 1's
    call for one checkpoint could raise the refusal of another)."""
    attested: list[str] = []
    ranks = fake_ranks(2, attested, refuse=frozenset({"b0", "b2"}))
    from ckptgate.hooks import attest_saved

    def saves(name: str, order: range):
        return lambda: [_code(lambda i=i: attest_saved(tmp_path / f"{name}{i}")) for i in order]

    got = _run_ranks(ranks, {(0, "a"): saves("a", range(3)), (0, "b"): saves("b", range(3)),
                             (1, "a"): saves("a", range(3)), (1, "b"): saves("b", range(3))})
    assert got[(0, "a")] == ["a0", "a1", "a2"] and got[(1, "a")] == [None, None, None]
    assert got[(0, "b")] == ["usage.signing_key_unreadable", "b1", "usage.signing_key_unreadable"]
    assert got[(1, "b")] == ["runtime.attest.failed_on_main", None, "runtime.attest.failed_on_main"]
    assert sorted(attested) == ["a0", "a1", "a2", "b1"]
    assert _left(ranks) == {}  # rank 0 removed every key once every rank had read


def _code(call):
    from ckptgate.errors import Error

    try:
        return call()
    except Error as e:
        return e.code


def _later(path: Path, delay: float):
    """A rank's call: after ``delay`` seconds, ``attest_saved(path)``'s outcome (its error code on a refusal)."""

    def call():
        import time

        from ckptgate.hooks import attest_saved

        time.sleep(delay)
        return _code(lambda: attest_saved(path))

    return call


@pytest.mark.parametrize("mains", [(False, False, False), (True, True, False), (None, True, False)])
def test_unless_exactly_one_rank_is_the_main_process_every_rank_raises_and_nothing_is_signed(
    tmp_path: Path, fake_ranks, mains: tuple[bool | None, ...]
) -> None:
    attested: list[str] = []
    ranks = fake_ranks(len(mains), attested)
    from ckptgate.hooks import attest_saved

    got = _run_ranks(ranks, {(r, "ck"): (lambda m=m: _code(lambda: attest_saved(tmp_path / "ck", main_process=m)))
                             for r, m in enumerate(mains)})
    assert set(got.values()) == {"runtime.attest.main_process"}
    assert attested == [] and _left(ranks) == {}
    # the next save of that checkpoint, with one main process, is attested
    got = _run_ranks(ranks, {(r, "ck"): (lambda: attest_saved(tmp_path / "ck")) for r in range(len(mains))})
    assert got == {(0, "ck"): "ck", (1, "ck"): None, (2, "ck"): None}


def test_the_main_process_on_another_rank_than_zero_attests_and_rank_zero_tidies(tmp_path: Path, fake_ranks) -> None:
    attested: list[str] = []
    ranks = fake_ranks(2, attested)
    from ckptgate.hooks import attest_saved

    got = _run_ranks(ranks, {(r, "ck"): (lambda m=m: attest_saved(tmp_path / "ck", main_process=m))
                             for r, m in enumerate((False, True))})
    assert got == {(0, "ck"): None, (1, "ck"): "ck"} and attested == ["ck"]
    assert _left(ranks) == {}


def test_a_rank_that_never_arrives_is_a_typed_store_failure(tmp_path: Path, fake_ranks) -> None:
    ranks = fake_ranks(2, [])
    ranks.store.timeout = 0.5
    from ckptgate.hooks import attest_saved

    got = _run_ranks(ranks, {(0, "ck"): lambda: _code(lambda: attest_saved(tmp_path / "ck"))})
    assert got == {(0, "ck"): "runtime.attest.store"}



def _timed(ranks: _FakeRanks, jobs: dict) -> tuple[dict, float]:
    import time

    start = time.monotonic()
    got = _run_ranks(ranks, jobs)
    return got, time.monotonic() - start


def test_ranks_that_spell_the_checkpoint_two_ways_fail_in_seconds_naming_both(tmp_path: Path, fake_ranks) -> None:
    """Rank 2 reaches the checkpoint through a link (another node's mount): the ranks met at a key per spelling,
    so both groups waited until the store's timeout (30 minutes) and then failed as ``runtime.attest.store``.
    Now every rank raises ``runtime.attest.path_mismatch`` within seconds, naming both spellings, and
    nothing is signed."""
    (tmp_path / "shared" / "ck").mkdir(parents=True)
    (tmp_path / "mnt").symlink_to(tmp_path / "shared")
    attested: list[str] = []
    ranks = fake_ranks(3, attested)
    ranks.store.timeout = 60.0
    from ckptgate.errors import Error
    from ckptgate.hooks import attest_saved

    def save(path: Path):
        def call():
            try:
                return attest_saved(path)
            except Error as e:
                return e.code, e.message

        return call

    spelled = {0: tmp_path / "shared" / "ck", 1: tmp_path / "shared" / "ck", 2: tmp_path / "mnt" / "ck"}
    got, took = _timed(ranks, {(r, "ck"): save(p) for r, p in spelled.items()})
    assert took < 10
    assert {code for code, _ in got.values()} == {"runtime.attest.path_mismatch"}
    for _, message in got.values():
        assert str(tmp_path / "shared" / "ck") in message and str(tmp_path / "mnt" / "ck") in message
    assert attested == []


def test_a_rank_whose_spelling_is_not_on_this_node_fails_every_rank_in_seconds(tmp_path: Path, fake_ranks) -> None:
    """Rank 1 names the checkpoint by a mount point this node lacks (``/data/...`` there, ``.../shared/...``
    here): found after two looks a poll apart, not at the store's timeout."""
    (tmp_path / "shared" / "ck").mkdir(parents=True)
    ranks = fake_ranks(2, [])
    ranks.store.timeout = 60.0
    from ckptgate.hooks import attest_saved

    spelled = {0: tmp_path / "shared" / "ck", 1: tmp_path / "data-on-another-node" / "ck"}
    got, took = _timed(ranks, {(r, "ck"): (lambda p=p: _code(lambda: attest_saved(p))) for r, p in spelled.items()})
    assert got == {(0, "ck"): "runtime.attest.path_mismatch", (1, "ck"): "runtime.attest.path_mismatch"}
    assert took < 15


def test_threads_saving_different_checkpoints_out_of_step_are_not_a_path_mismatch(tmp_path: Path, fake_ranks) -> None:
    """Rank 0 saves A then (another thread) B; rank 1 saves B first and A seconds later: each rank waits in a
    call the other has not made yet, for a checkpoint that is there, for longer than a poll; every call is
    attested, none is taken for a path mismatch."""
    for name in ("A", "B"):
        (tmp_path / name).mkdir()
    attested: list[str] = []
    ranks = fake_ranks(2, attested)
    ranks.store.timeout = 60.0
    got = _run_ranks(ranks, {(0, "A"): _later(tmp_path / "A", 0), (0, "B"): _later(tmp_path / "B", 3.5),
                             (1, "B"): _later(tmp_path / "B", 0), (1, "A"): _later(tmp_path / "A", 3.5)})
    assert got == {(0, "A"): "A", (0, "B"): "B", (1, "B"): None, (1, "A"): None}
    assert sorted(attested) == ["A", "B"] and _left(ranks) == {}


def test_a_torch_without_the_default_store_is_a_typed_refusal(tmp_path: Path, fake_ranks) -> None:
    """torch has no public accessor for the default group's store; the private one the hook reads, where a torch
    lacks it, is ``runtime.attest.no_store``, not an AttributeError."""
    import types

    ranks = fake_ranks(2, [])
    ranks.distributed_c10d = types.SimpleNamespace()
    from ckptgate.hooks import attest_saved

    got = _run_ranks(ranks, {(0, "ck"): lambda: _code(lambda: attest_saved(tmp_path / "ck"))})
    assert got == {(0, "ck"): "runtime.attest.no_store"}


def test_a_later_checkpoint_not_yet_on_this_node_is_not_a_path_mismatch(tmp_path: Path, fake_ranks) -> None:
    """Node-local checkpoint folders, saves on two threads: rank 1's thread for ``step-200`` reaches the hook before
    its thread for ``step-100``, while rank 0 waits in ``step-100`` and has not written ``step-200`` on its node
    yet.  That other checkpoint is absent here because it is not written yet, not because rank 1 spells
    ``step-100`` by a mount point this node lacks: it was taken for a path mismatch after two polls and both
    saves failed.  Now a spelling absent here counts only where it names a folder of the same name."""
    import threading

    (tmp_path / "step-100").mkdir()
    attested: list[str] = []
    ranks = fake_ranks(2, attested)
    ranks.store.timeout = 60.0
    timer = threading.Timer(4.0, lambda: (tmp_path / "step-200").mkdir())  # rank 0 writes step-200 later
    timer.start()
    got = _run_ranks(ranks, {(0, "100"): _later(tmp_path / "step-100", 0), (0, "200"): _later(tmp_path / "step-200", 4.5),
                             (1, "200"): _later(tmp_path / "step-200", 0), (1, "100"): _later(tmp_path / "step-100", 4.5)})
    timer.join()
    assert got == {(0, "100"): "step-100", (0, "200"): "step-200", (1, "200"): None, (1, "100"): None}
    assert sorted(attested) == ["step-100", "step-200"] and _left(ranks) == {}
