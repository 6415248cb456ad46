"""``ckptgate intake --distributed`` under ``torchrun --standalone`` (gloo on loopback).

Each run launches real ranks of the real CLI (``tests/distributed_rank.py`` records every rank's
exit status), on tiny fixtures: the output must be bit-identical to a single-process intake, and
the receipt equal apart from its topology, its time and what is per-run (the decision's id and the
embedded engine's pid).  Failures (a deny, a wrong HMAC key, a rank SIGKILLed mid-write) must
publish nothing, leave no staging directory and end every surviving rank non-zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_helpers import FIXTURES, Signer, attest, make_signer

from ckptgate.inspect import SafeTree, inspect_open_tree

pytestmark = [pytest.mark.opa, pytest.mark.distributed]

RANK_SCRIPT = Path(__file__).resolve().parent / "distributed_rank.py"
SECRET = "test-secret-0123456789abcdef"
SHARD = 700  # bytes: several output shards, so more than one rank writes


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _attest(name: str, signer: Signer, tmp: Path) -> Path:
    d = FIXTURES / name
    with SafeTree.open(d / "checkpoint") as tree:
        fmt = str(inspect_open_tree(tree).format)
    return attest(signer, d / "checkpoint", tmp / f"{name}.att.json", fmt=fmt,
                  meta=json.loads((d / "meta.json").read_text()))


def _args(src: Path, out: Path, signer: Signer, att: Path | None, *extra: str) -> list[str]:
    args = ["intake", str(src), "--out", str(out), "--trust", str(signer.trust_file), "--json",
            "--max-shard-size", str(SHARD), *extra]
    return args + (["--attestation", str(att)] if att else [])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_TEST_")}
    env.update({"CKPTGATE_DIST_SECRET": SECRET, "PYTHONUNBUFFERED": "1", **extra})
    return env


def _single(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptgate", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def _torchrun(n: int, args: list[str], rcdir: Path, **extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                                               list[int]]:
    rcdir.mkdir()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                           str(RANK_SCRIPT), *args, "--distributed"], capture_output=True, text=True,
                          env=_env(CKPTGATE_TEST_RCDIR=str(rcdir), **extra), timeout=300, check=False)
    rcs = [int((rcdir / f"rank{r}.rc").read_text()) if (rcdir / f"rank{r}.rc").exists() else -9 for r in range(n)]
    return proc, rcs


def _comparable(receipt: dict[str, Any]) -> dict[str, Any]:
    """The receipt without what differs from run to run: the topology, the time, the decision's id,
    the engine's pid, and what a contained worker measured in itself (namespace ids, wall time)."""
    r = {k: v for k, v in receipt.items() if k not in ("topology", "published_at")}
    r["decision"] = {k: v for k, v in r["decision"].items() if k not in ("id", "engine")}
    if r["containment"]["worker"] is not None:
        r["containment"] = {**r["containment"], "worker": {**r["containment"]["worker"], "measured": None}}
        r["plan"] = {**r["plan"], "worker": {k: v for k, v in r["plan"]["worker"].items()
                                             if k not in ("measured", "wall_s")}}
    return r


def _no_staging(parent: Path) -> None:
    assert [p.name for p in parent.iterdir() if ".ckptgate-staging-" in p.name] == []


def _same_output(src: Path, ranks: int, args: tuple[list[str], list[str]], tmp_path: Path,
                 **env: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Take ``src`` in on one process and on ``ranks``; the outputs must be the same bytes, and the
    receipts the same but for what is per run.  Returns both receipts."""
    one = _single(args[0], _env(**env))
    assert one.returncode == 0, one.stdout + one.stderr
    proc, rcs = _torchrun(ranks, args[1], tmp_path / "rc", **env)
    assert proc.returncode == 0 and rcs == [0] * ranks, proc.stdout + proc.stderr
    single, dist = json.loads(one.stdout)["receipt"], json.loads(proc.stdout)["receipt"]
    names = sorted(p.name for p in (tmp_path / "single").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "dist").iterdir())
    for name in names:
        if name != "ckptgate-receipt.json":
            assert (tmp_path / "single" / name).read_bytes() == (tmp_path / "dist" / name).read_bytes(), name
    assert _comparable(single) == _comparable(dist)
    _no_staging(tmp_path)
    return single, dist


# The three layouts the issue names (HF sharded, DCP, ZeRO-3), at 2 and at 4 ranks.
@pytest.mark.parametrize(("fixture", "ranks"), [("hf_sharded", 2), ("dcp_hf_safetensors", 2),
                                                ("deepspeed_zero3", 4)])
def test_distributed_output_is_the_single_process_output(fixture: str, ranks: int, signer: Signer,
                                                         tmp_path: Path) -> None:
    src = FIXTURES / fixture / "checkpoint"
    att = _attest(fixture, signer, tmp_path)
    single, dist = _same_output(src, ranks, (_args(src, tmp_path / "single", signer, att),
                                             _args(src, tmp_path / "dist", signer, att)), tmp_path)
    topo = dist["topology"]
    assert topo["world_size"] == ranks and [r["rank"] for r in topo["ranks"]] == list(range(ranks))
    assert sum(r["bytes_hashed"] for r in topo["ranks"]) == sum(p.stat().st_size for p in src.rglob("*")
                                                               if p.is_file())
    assert sum(r["files_hashed"] for r in topo["ranks"]) == sum(1 for p in src.rglob("*") if p.is_file())
    written = sum(r["bytes_written"] for r in topo["ranks"])
    assert written == sum(o["size"] for o in single["outputs"] if o["file"] != "model.safetensors.index.json")
    shards = [o for o in single["outputs"] if o["file"] != "model.safetensors.index.json"]
    assert sum(1 for r in topo["ranks"] if r["outputs_written"]) == min(ranks, len(shards))  # the writing was split
    assert all(r["worker"] is None for r in topo["ranks"])  # the static reader's plan: no worker anywhere
    assert topo["copy_check"] == "leases"  # one kernel, no writer: each rank copies under its read leases
    assert dist["containment"]["worker"] is None


def test_without_leases_every_copied_chunk_is_checked_against_the_chunk_manifest(signer: Signer,
                                                                                  tmp_path: Path) -> None:
    """A file some process keeps open for writing cannot be leased: the ranks record the chunk
    manifest in the digest pass and check every chunk they copy; the output is the same, and a
    byte changed between the hash and the copy is refused."""
    import shutil
    import struct
    import zipfile

    src = tmp_path / "zero3"
    shutil.copytree(FIXTURES / "deepspeed_zero3" / "checkpoint", src)
    att = _attest("deepspeed_zero3", signer, tmp_path)
    target = src / "global_step2" / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with open(target, "r+b"):  # never written
        single, dist = _same_output(src, 2, (_args(src, tmp_path / "single", signer, att),
                                             _args(src, tmp_path / "dist", signer, att)), tmp_path)
        assert dist["topology"]["copy_check"] == "chunk_manifest"
        # a placed byte changes after it was hashed, before any rank copies: the chunk check refuses it
        with zipfile.ZipFile(target) as z:
            info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 8)
        raw = target.read_bytes()
        name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
        proc, rcs = _torchrun(2, _args(src, tmp_path / "flipped", signer, att), tmp_path / "rc2",
                              CKPTGATE_TEST_FLIP_RANK="1", CKPTGATE_TEST_FLIP_PATH=str(target),
                              CKPTGATE_TEST_FLIP_OFFSET=str(info.header_offset + 30 + name_len + extra_len + 4))
    assert rcs == [7, 7], proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == "runtime.copy.source_changed"
    assert not (tmp_path / "flipped").exists()
    _no_staging(tmp_path)


def test_a_source_opened_for_writing_mid_copy_breaks_the_leases_and_publishes_nothing(signer: Signer,
                                                                                      tmp_path: Path) -> None:
    import shutil

    src = tmp_path / "hf"
    shutil.copytree(FIXTURES / "hf_sharded" / "checkpoint", src)
    att = _attest("hf_sharded", signer, tmp_path)
    target = sorted(src.glob("*.safetensors"))[0]
    proc, rcs = _torchrun(2, _args(src, tmp_path / "dist", signer, att), tmp_path / "rc",
                          CKPTGATE_TEST_WRITER_RANK="1", CKPTGATE_TEST_WRITER_PATH=str(target))
    assert rcs == [7, 7], proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == "runtime.copy.source_changed"
    assert not (tmp_path / "dist").exists()
    _no_staging(tmp_path)


def _needs_the_worker(tmp_path: Path) -> tuple[Path, Path]:
    """A ZeRO-3 checkpoint whose first model-states pickle names a global outside the static reader's
    allowlist (``argparse.Namespace``, as Megatron-DeepSpeed launchers save their ``args``), and a
    team's own policies that let the DeepSpeed loader read it in the contained worker: the bundled
    ones with a finding exception for it, and without the bundled rule that every pickle stays
    inside the static allowlist."""
    import argparse
    import shutil

    import torch

    src = tmp_path / "zero3"
    shutil.copytree(FIXTURES / "deepspeed_zero3" / "checkpoint", src)
    rel = "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt"
    state = torch.load(src / rel, weights_only=False)  # the committed fixture, made by DeepSpeed
    state["args"] = argparse.Namespace(lr=0.1, seed=1)
    torch.save(state, src / rel)
    policies = tmp_path / "policies"
    shutil.copytree(Path(__file__).resolve().parent.parent / "policies", policies)
    rego = policies / "ckptgate" / "intake" / "intake.rego"
    rule = "\tevery report in object.get(input, [\"inspection\", \"pickles\"], {}) {\n\t\t_pickle_report_ok(report)\n\t}\n"
    assert rego.read_text().count(rule) == 1
    rego.write_text(rego.read_text().replace(rule, ""))
    data = policies / "ckptgate" / "config" / "intake" / "data.json"
    doc = json.loads(data.read_text())
    doc["finding_exceptions"].append({"id": "our-launcher-args", "formats": ["deepspeed-zero3"],
                                      "code": "pickle.global_not_allowed", "paths": [rel],
                                      "why": "our launcher pickles its argparse.Namespace into the model states"})
    data.write_text(json.dumps(doc))
    return src, policies


def test_the_framework_plane_runs_one_contained_worker_per_rank(signer: Signer, tmp_path: Path) -> None:
    src, policies = _needs_the_worker(tmp_path)
    with SafeTree.open(src) as tree:
        from ckptgate.consolidate import framework_files

        needed = framework_files(inspect_open_tree(tree))
    assert len(needed) == 4  # every ZeRO file: one static read is not enough for the plan
    att = attest(signer, src, tmp_path / "att.json", fmt="deepspeed-zero3",
                 meta=json.loads((FIXTURES / "deepspeed_zero3" / "meta.json").read_text()))
    extra = ("--policies", str(policies))
    single, dist = _same_output(src, 2, (_args(src, tmp_path / "single", signer, att, *extra),
                                         _args(src, tmp_path / "dist", signer, att, *extra)), tmp_path)
    assert single["plan"]["trees_from"] == dist["plan"]["trees_from"] == "contained_worker"
    workers = [r["worker"] for r in dist["topology"]["ranks"]]
    assert all(w is not None for w in workers)  # each rank loaded the files it owns, in its own worker
    assert sorted(f for w in workers for f in w["files"]) == sorted(needed)
    for w in workers:
        assert w["controls"]["seccomp"] is True and w["controls"]["no_new_privs"] is True
        assert w["measured"]["seccomp"]["mode"] == "allowlist"
    held = dist["containment"]["worker"]["controls"]
    assert held == {c: all(w["controls"][c] for w in workers) for c in held}  # held only where held on every rank


def test_a_deny_publishes_nothing_and_every_rank_fails(signer: Signer, tmp_path: Path) -> None:
    src = FIXTURES / "hf_sharded" / "checkpoint"
    one = _single(_args(src, tmp_path / "single", signer, None), _env())
    assert one.returncode == 3, one.stdout + one.stderr
    proc, rcs = _torchrun(2, _args(src, tmp_path / "dist", signer, None), tmp_path / "rc")
    assert rcs == [one.returncode] * 2 and proc.returncode != 0
    assert json.loads(proc.stdout)["error"]["code"] == json.loads(one.stdout)["error"]["code"]
    assert not (tmp_path / "dist").exists()
    _no_staging(tmp_path)


def test_a_structure_the_precheck_refuses_is_refused_with_the_single_process_reasons(signer: Signer,
                                                                                     tmp_path: Path) -> None:
    """Rank 0 asks the policy's precheck before it hashes, as one process does beside its digest: an
    fsdp-local checkpoint is refused with the same code, class and reasons (before the digest) on
    every rank, not with the full decision's longer list."""
    src = FIXTURES / "fsdp_local" / "checkpoint"
    att = _attest("fsdp_local", signer, tmp_path)
    one = _single(_args(src, tmp_path / "single", signer, att), _env())
    assert one.returncode == 4, one.stdout + one.stderr
    proc, rcs = _torchrun(2, _args(src, tmp_path / "dist", signer, att), tmp_path / "rc")
    assert rcs == [one.returncode] * 2, proc.stdout + proc.stderr
    single, dist = json.loads(one.stdout)["error"], json.loads(proc.stdout)["error"]
    assert dist["code"] == single["code"] == "input.refused_by_policy"
    assert dist["reasons"] == single["reasons"] and dist["evidence"]["before_digest"] is True
    assert not (tmp_path / "dist").exists()
    _no_staging(tmp_path)


def test_a_wrong_hmac_key_on_one_rank_is_refused(signer: Signer, tmp_path: Path) -> None:
    src = FIXTURES / "hf_sharded" / "checkpoint"
    att = _attest("hf_sharded", signer, tmp_path)
    proc, rcs = _torchrun(2, _args(src, tmp_path / "dist", signer, att), tmp_path / "rc",
                          CKPTGATE_TEST_SECRET_RANK1="another-secret-0123456789")
    assert rcs == [7, 7], proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == "runtime.distributed.unauthenticated"
    assert not (tmp_path / "dist").exists()
    _no_staging(tmp_path)


def test_one_rank_killed_mid_write_publishes_nothing_and_nothing_hangs(signer: Signer, tmp_path: Path) -> None:
    src = FIXTURES / "hf_sharded" / "checkpoint"
    att = _attest("hf_sharded", signer, tmp_path)
    start = time.monotonic()
    proc, rcs = _torchrun(2, _args(src, tmp_path / "dist", signer, att, "--dist-timeout", "60"), tmp_path / "rc",
                          CKPTGATE_TEST_KILL_RANK="1")
    assert time.monotonic() - start < 60 + 90  # the deadline, plus start-up on a loaded 2-core machine
    assert rcs[1] == -9  # killed: it never recorded a status
    assert rcs[0] == 7, proc.stdout + proc.stderr  # runtime failure: the peer was lost, or the launcher stopped it
    assert json.loads(proc.stdout)["error"]["code"] in ("runtime.distributed.peer_lost",
                                                         "runtime.distributed.terminated")
    assert proc.returncode != 0
    assert not (tmp_path / "dist").exists()
    _no_staging(tmp_path)


def test_a_rank_that_stops_answering_fails_every_rank_at_the_deadline(signer: Signer, tmp_path: Path) -> None:
    src = FIXTURES / "hf_sharded" / "checkpoint"
    att = _attest("hf_sharded", signer, tmp_path)
    start = time.monotonic()
    proc, rcs = _torchrun(2, _args(src, tmp_path / "dist", signer, att, "--dist-timeout", "15"), tmp_path / "rc",
                          CKPTGATE_TEST_STALL_RANK="1")
    assert time.monotonic() - start < 15 + 90  # the deadline, plus start-up on a loaded 2-core machine
    assert rcs == [7, 7], proc.stdout + proc.stderr  # rank 0 at the deadline; rank 1 when the launcher stops it
    assert json.loads(proc.stdout)["error"]["code"] == "runtime.distributed.peer_lost"
    assert not (tmp_path / "dist").exists()
    _no_staging(tmp_path)


def test_a_missing_secret_is_refused_before_any_work(tmp_path: Path) -> None:
    env = {k: v for k, v in _env().items() if k != "CKPTGATE_DIST_SECRET"}
    proc = _single(["intake", str(FIXTURES / "hf_sharded" / "checkpoint"), "--out", str(tmp_path / "o"), "--json",
                    "--distributed"], env)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["code"] == "usage.distributed.secret"
    assert not (tmp_path / "o").exists()


def test_a_selection_is_refused_with_distributed(tmp_path: Path) -> None:
    proc = _single(["intake", str(FIXTURES / "hf_sharded" / "checkpoint"), "--out", str(tmp_path / "o"), "--json",
                    "--select", "model", "--distributed"], _env())
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["code"] == "usage.distributed.select"
    assert not (tmp_path / "o").exists()


def test_distributed_outside_a_launcher_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in _env().items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = _single(["intake", str(FIXTURES / "hf_sharded" / "checkpoint"), "--out", str(tmp_path / "o"), "--json",
                    "--distributed"], env)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["error"]["code"] == "usage.distributed.no_launcher"


def test_files_are_assigned_by_size_deterministically() -> None:
    from ckptgate.consolidate.shares import assign_by_size

    items = [(f"f{i}", s) for i, s in enumerate([100, 90, 80, 70, 60, 50, 40, 30])]
    a = assign_by_size(items, 2)
    assert a == assign_by_size(list(reversed(items)), 2)
    loads = [sum(dict(items)[n] for n in names) for names in a]
    assert sorted(n for names in a for n in names) == sorted(n for n, _ in items)
    assert max(loads) / min(loads) <= 1.15
    # files that need a framework load are spread first: each rank loads a share, whatever the rest weighs
    first = assign_by_size([("big.py", 1000), *[(f"s{i}.pt", 10) for i in range(4)]], 2, first=[f"s{i}.pt" for i in range(4)])
    assert [sorted(n for n in names if n.endswith(".pt")) for names in first] == [["s0.pt", "s2.pt"], ["s1.pt", "s3.pt"]]


def test_the_decision_crosses_ranks_as_json_unchanged() -> None:
    from ckptgate.decide.decision import Decision, Reason, Selection
    from ckptgate.decide.decision import decision_from_json
    from ckptgate.digest import Digest

    allow = Decision(allow=True, plane="pure_data", permitted_loaders=("json", "safetensors"),
                     required_controls=("seccomp",), reasons=(Reason(code="w", message="m", severity="warn"),),
                     decision_id="id", policy_revision="sha256:" + "0" * 64, engine="e", companions=("c.json",),
                     selection=Selection(prefix="app.model", layout="dcp", source="policy", excluded=("app.model.x",)),
                     fixture_digest=Digest.parse("sha256:" + "ab" * 32))
    deny = Decision(allow=False, plane=None, permitted_loaders=(), required_controls=(),
                    reasons=(Reason(code="x", message="m", evidence={"a": [1]}),), decision_id="id",
                    policy_revision="r", engine="e", refusal="input")
    for d in (allow, deny):
        back = decision_from_json(json.loads(json.dumps(d.to_json())))
        assert back == d and back.exit_code == d.exit_code  # the same typed record, not only the same JSON
        assert back.selection is None or isinstance(back.selection, Selection)
    assert decision_from_json(json.loads(json.dumps(allow.to_json()))).fixture_digest == allow.fixture_digest


def test_a_staging_directory_this_rank_cannot_see_means_dst_is_not_shared(tmp_path: Path) -> None:
    """Rank 0 made its staging directory beside DST; a rank on a node whose DST parent is another
    (local) file system does not find it, and says why."""
    from ckptgate.publish import open_stage
    from ckptgate.errors import RuntimeFailure
    from ckptgate.publish import open_destination, staging

    with open_destination(tmp_path / "out") as dest:
        with pytest.raises(RuntimeFailure) as e:
            open_stage(dest, ".out.ckptgate-staging-" + "0" * 32)
        assert e.value.code == "runtime.distributed.not_shared"
        with staging(dest) as stage:  # the one rank 0 made is found
            os.close(open_stage(dest, stage.name))


def test_gathered_worker_trees_must_be_exactly_what_each_rank_owns() -> None:
    from ckptgate.enforce.load import merge_loaded
    from ckptgate.errors import RuntimeFailure

    def w(*files: str, seccomp: bool = True) -> dict[str, Any]:
        return {"trees": {f: {"k": f} for f in files}, "job": "deepspeed", "controls": {"seccomp": seccomp},
                "measured": {"pid": 1}, "wall_s": 0.5, "pid": 1}

    merged = merge_loaded([w("a", "b"), w("c", seccomp=False)], [["a", "b"], ["c"]])
    assert dict(merged.trees) == {"a": {"k": "a"}, "b": {"k": "b"}, "c": {"k": "c"}}
    assert dict(merged.controls) == {"seccomp": False}  # held only where it held on every rank
    for workers, owned in (([w("a"), w("c")], [["a", "b"], ["c"]]),  # a file nobody loaded
                           ([w("a", "b"), w("b", "c")], [["a", "b"], ["c"]]),  # a file loaded twice
                           ([w("a", "b"), None], [["a", "b"], ["c"]]),  # a rank that loaded nothing
                           ([{**w("a", "b"), "job": "torch_load"}, w("c")], [["a", "b"], ["c"]])):  # two jobs
        with pytest.raises(RuntimeFailure) as e:
            merge_loaded(workers, owned)
        assert e.value.code == "runtime.distributed.load_mismatch"


def test_a_bad_zip_crc_found_by_any_rank_refuses_as_in_one_process(signer: Signer, tmp_path: Path) -> None:
    """The CRC-32 of a torch zip's entries is checked in the digest's read, by the rank that streams
    the file; its findings join every rank's inspection before the decision, as in one process."""
    import shutil
    import struct
    import zipfile

    src = tmp_path / "fsdp"
    shutil.copytree(FIXTURES / "fsdp_full" / "checkpoint", src)
    path = next(p for p in src.rglob("*") if p.is_file() and zipfile.is_zipfile(p))
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size > 8)
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + 4] ^= 0xFF  # a tensor byte: the layout is intact
    path.write_bytes(bytes(raw))
    att = attest(signer, src, tmp_path / "att.json", fmt="fsdp-full",
                 meta=json.loads((FIXTURES / "fsdp_full" / "meta.json").read_text()))
    one = _single(_args(src, tmp_path / "single", signer, att), _env())
    assert one.returncode == 4, one.stdout + one.stderr
    codes = [f["code"] for r in json.loads(one.stdout)["error"]["reasons"] for f in r["evidence"].get("findings", [])]
    assert "zip.bad_crc" in codes
    proc, rcs = _torchrun(2, _args(src, tmp_path / "dist", signer, att), tmp_path / "rc")
    assert rcs == [4, 4], proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["error"] == {**json.loads(one.stdout)["error"],
                                                "evidence": json.loads(proc.stdout)["error"]["evidence"]}
    assert not (tmp_path / "dist").exists()
    _no_staging(tmp_path)


def test_trust_rank_0_cannot_load_fails_every_rank_as_one_process_does(tmp_path: Path) -> None:
    """Rank 0 opens its trust data and engine before the process group (OPA starts while torch
    imports); a failure there is raised in the decide phase, so every rank ends with it, not at
    the rendezvous deadline."""
    src = FIXTURES / "hf_sharded" / "checkpoint"
    bad = tmp_path / "trust.json"
    bad.write_text("{")
    args = ["intake", str(src), "--out", str(tmp_path / "o"), "--trust", str(bad), "--json"]
    one = _single(args, _env())
    assert one.returncode not in (0, 1) and json.loads(one.stdout)["error"]["code"] == "verify.trust.json"
    start = time.monotonic()
    proc, rcs = _torchrun(2, [*args, "--dist-timeout", "120"], tmp_path / "rc")
    assert time.monotonic() - start < 90  # well before the deadline
    assert rcs == [one.returncode] * 2, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == "verify.trust.json"
    assert not (tmp_path / "o").exists()
    _no_staging(tmp_path)



def test_leases_bind_only_the_same_inodes_on_one_kernel_on_a_local_file_system() -> None:
    """A lease is on this rank's inode: ranks that opened other inodes under the same names (a
    directory swapped between their opens, or per-container copies), other kernels, a network file
    system or a rank without leases all fall back to the chunk manifest."""
    from ckptgate.inspect.leases import leases_bind

    rank = {"held": True, "local_fs": True, "kernel": "k", "inodes": [[1, 2], ["a", 1, 10], ["b", 1, 11]]}
    assert leases_bind([rank, dict(rank)])
    for change in ({"inodes": [[1, 2], ["a", 1, 10], ["b", 1, 99]]}, {"inodes": [[1, 3], ["a", 1, 10], ["b", 1, 11]]},
                   {"kernel": "other"}, {"kernel": None}, {"local_fs": False}, {"held": False}):
        assert not leases_bind([rank, {**rank, **change}]), change
    assert not leases_bind([])


class _Wire:
    """An in-memory ``all_gather`` for ranks that run as threads of this process; ``tamper(phase_no,
    sender, payload)`` may replace what a sender put on the wire (a replaying attacker)."""

    def __init__(self, world: int, tamper: Any = None) -> None:
        import threading

        self.world, self.tamper, self.round = world, tamper, 0
        self.slots: list[Any] = [None] * world
        self.barrier = threading.Barrier(world, timeout=30)  # a rank that stopped early breaks it
        self.sent: list[list[bytes]] = []  # what every rank sent, per all_gather of payloads

    def dist(self, rank: int) -> Any:
        import torch

        wire = self

        class Dist:
            def get_rank(self) -> int:
                return rank

            def get_world_size(self) -> int:
                return wire.world

            def all_gather(self, out: list[Any], mine: Any) -> None:
                wire.slots[rank] = mine.clone()
                if wire.barrier.wait() == 0:  # one thread records and tampers, between the two barriers
                    if wire.slots[0].dtype == torch.uint8:
                        wire.sent.append([bytes(s.numpy().tobytes()) for s in wire.slots])
                        if wire.tamper is not None:
                            wire.tamper(len(wire.sent) - 1, wire.slots)
                wire.barrier.wait()
                for o, s in zip(out, wire.slots, strict=True):
                    o.copy_(s)
                wire.barrier.wait()

        return Dist()


def _job(wire: _Wire, secret: bytes, phases: list[tuple[str, Any]], fixture: str) -> list[Any]:
    """Run the exchange of every rank of one job (as threads): the nonce, one message per phase, the
    fixture digest bound after the first phase.  Returns each rank's results, or the error it raised."""
    import threading

    import torch

    from ckptgate.distributed import TorchGroup

    results: list[Any] = [None] * wire.world

    def rank(r: int) -> None:
        comm = TorchGroup(wire.dist(r), torch, secret)
        try:
            comm.start()
            got = []
            for i, (phase, data) in enumerate(phases):
                got.append(comm.exchange(phase, data))
                if i == 0:
                    comm.bind_fixture(fixture)
            results[r] = got
        except BaseException as e:  # the test reads it
            results[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(wire.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_a_message_recorded_in_one_job_is_refused_in_another_with_the_same_secret() -> None:
    """The HMAC binds the job's nonce (rank 0 picks one, every rank adds its own) and the fixture
    digest: a message replayed from a job that shares the secret is ``runtime.distributed.unauthenticated``."""
    from ckptgate.errors import RuntimeFailure

    secret = SECRET.encode()
    phases = [("digest", {"ok": True, "data": {"entries": []}}), ("decide", {"ok": True, "data": {"allow": True}})]
    fixture = "sha256:" + "1" * 64
    first = _Wire(2)
    results = _job(first, secret, phases, fixture)
    assert all(isinstance(r, list) for r in results), results  # the job itself runs through
    assert results[0] == results[1] == [[d, d] for _, d in phases]
    recorded = first.sent  # [nonce hellos, sizes..., digest payloads, decide payloads]: payloads only

    for phase_no in (1, 2):  # rank 1's digest message, then its decide message, replayed into a second job
        def replay(n: int, slots: list[Any], phase_no: int = phase_no) -> None:
            import torch

            if n == phase_no:
                old = recorded[phase_no][1]
                slots[1] = torch.zeros(len(slots[1]), dtype=torch.uint8)
                slots[1][: len(old)] = torch.frombuffer(bytearray(old), dtype=torch.uint8)

        second = _job(_Wire(2, tamper=replay), secret, phases, fixture)  # same secret, same fixture
        assert isinstance(second[0], RuntimeFailure), second
        assert second[0].code == "runtime.distributed.unauthenticated"
        assert second[0].evidence == {"phase": phases[phase_no - 1][0], "rank": 1}


def test_the_fixture_digest_is_bound_into_every_later_message() -> None:
    """Two ranks that formed different fixture digests refuse each other's next message."""
    import threading

    import torch

    from ckptgate.distributed import TorchGroup
    from ckptgate.errors import RuntimeFailure

    wire = _Wire(2)
    errors: list[Any] = [None, None]

    def rank(r: int) -> None:
        comm = TorchGroup(wire.dist(r), torch, SECRET.encode())
        try:
            comm.start()
            comm.bind_fixture(f"sha256:{r}")
            comm.exchange("decide", {"ok": True})
        except RuntimeFailure as e:
            errors[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [e.code for e in errors] == ["runtime.distributed.unauthenticated"] * 2


def test_a_model_signing_signature_under_a_key_is_verified_on_rank_0_as_on_one_process(tmp_path: Path) -> None:
    """``--signature --key`` (and ``--certificate-chain``): rank 0 reads the verification material with
    its trust data, as one process does; it read none, so every --distributed intake with a Model
    Signing signature failed with usage.signature_needs_key (review2 A5)."""
    import shutil

    from tests.verify.oms_helpers import HF, keypair, sign

    ck = tmp_path / "ck"
    shutil.copytree(HF, ck)
    priv, pub = keypair(tmp_path, "signer")
    sig = sign(ck, priv, tmp_path / "model.sig")

    def args(out: str) -> list[str]:
        return ["intake", str(ck), "--out", str(tmp_path / out), "--json", "--max-shard-size", str(SHARD),
                "--signature", str(sig), "--key", str(pub)]

    single, dist = _same_output(ck, 2, (args("single"), args("dist")), tmp_path)
    (att,) = dist["attestations"]
    assert att["signers"][0]["offered"] == str(pub) and dist["decision"]["allow"] is True


def test_an_engine_read_for_other_signatures_is_never_used(tmp_path: Path) -> None:
    """grouped_intake refuses rank 0's engine when its verification material was read for other
    --signature/--key/--certificate-chain than the intake offers (they would verify under no key)."""
    import contextlib

    from ckptgate.decide.options import EngineOptions
    from ckptgate.errors import Error
    from ckptgate.group import LocalGroup
    from ckptgate.grouped import EarlyEngine, grouped_intake

    with contextlib.ExitStack() as stack:
        engine = EarlyEngine(EngineOptions(), stack, start=False)
        with pytest.raises(Error) as e:
            grouped_intake(LocalGroup(), stack, FIXTURES / "hf_sharded" / "checkpoint", tmp_path / "o",
                           attestations=(), options=EngineOptions(), engine=engine, max_shard_bytes=SHARD,
                           signatures=(tmp_path / "model.sig",), key=tmp_path / "pub.pem", certificate_chain=(),
                           receipt_signer=None, backend=None)
    assert e.value.code == "internal.unexpected" and not (tmp_path / "o").exists()


@pytest.mark.parametrize(("launch", "named"), [
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_PORT": "29511"}, "RANK='x'"),
    ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_PORT": "29511"}, "RANK='3'"),
    ({"RANK": "1", "WORLD_SIZE": "0", "MASTER_PORT": "29511"}, "WORLD_SIZE='0'"),
    ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "99999"}, "MASTER_PORT='99999'"),
])
def test_a_launch_environment_that_names_no_rank_is_refused_before_the_rendezvous(
        launch: dict[str, str], named: str, tmp_path: Path) -> None:
    """A RANK that is no rank of WORLD_SIZE, or a port that is none, used to wait for the rendezvous
    deadline and end as runtime.distributed.peer_lost (exit 7), with torch's C++ frames and, on a
    rank other than 0, no --json document at all."""
    proc = _single(["intake", str(FIXTURES / "hf_sharded" / "checkpoint"), "--out", str(tmp_path / "o"), "--json",
                    "--distributed"], _env(MASTER_ADDR="127.0.0.1", **launch))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "usage.distributed.launcher_env"
    assert named in error["message"]
    assert not (tmp_path / "o").exists()


def test_a_launch_error_every_rank_meets_is_printed_by_rank_0_alone(tmp_path: Path) -> None:
    """Review (session 49): every rank printed usage.distributed.launcher_env, so N processes sharing stdout
    wrote N --json documents.  A rank of a well-formed RANK/WORLD_SIZE leaves a bad port to rank 0, and exits
    with the same code, printing nothing."""
    proc = _single(["intake", str(FIXTURES / "hf_sharded" / "checkpoint"), "--out", str(tmp_path / "o"), "--json",
                    "--distributed"], _env(MASTER_ADDR="127.0.0.1", RANK="1", WORLD_SIZE="2", MASTER_PORT="99999"))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert not (tmp_path / "o").exists()
