"""``ckptgate.inspect.topology``: the topology each format's layout records, measured from the committed
fixtures (their ``meta.json`` says how they were produced), and the contradictions of a declared one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptgate.api import inspect
from ckptgate.inspect.topology import contradictions, measured_topology, rank_state_ranks

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dcp_torchtitan", {"world_size": [2]}),
        ("deepspeed_zero2", {"zero_stage": [1, 2], "dp": [2], "world_size": [2]}),
        ("deepspeed_zero3", {"zero_stage": [3], "dp": [2], "world_size": [2]}),
        ("fsdp_full", {"fsdp_mode": ["full_state_dict"]}),
        ("hf_sharded", {}),
    ],
)
def test_the_layout_records_the_topology_it_was_written_with(name: str, expected: dict) -> None:
    ins = inspect(DATA / name / "checkpoint")
    assert measured_topology(ins.format, ins.layout) == expected
    assert ins.to_facts()["topology"] == expected


def test_megatron_records_world_size_and_tensor_parallel_degree() -> None:
    meta = json.loads((DATA / "megatron_torch_dist" / "meta.json").read_text())["topology"]
    ins = inspect(DATA / "megatron_torch_dist" / "checkpoint")
    assert measured_topology(ins.format, ins.layout) == {"world_size": [meta["world_size"]], "tp": [meta["tp"]]}


def test_contradictions_name_each_field_the_layout_refutes() -> None:
    measured = {"zero_stage": [1, 2], "dp": [2]}
    assert contradictions({"zero_stage": 2, "dp": 2, "tp": 4}, measured) == {}
    assert contradictions({"zero_stage": 3, "dp": 4, "world_size": None}, measured) == {
        "dp": {"declared": 4, "measured": [2]},
        "zero_stage": {"declared": 3, "measured": [1, 2]},
    }


def test_a_dcp_rank_that_wrote_no_item_is_counted_by_its_empty_file() -> None:
    """State replicated across ranks (DDP) is deduplicated to one rank; the other still writes its
    ``__1_0.distcp``, empty, and the metadata never names it: that is still a two-rank save.  A file with
    data that the metadata does not name is an earlier save's, left in the folder: not a writer."""
    layout = {"folder": "", "storage": [{"relative_path": "__0_0.distcp"}]}
    assert measured_topology("dcp-torch-save", layout) == {"world_size": [1]}
    assert measured_topology("dcp-torch-save", layout, ["__1_0.distcp"]) == {"world_size": [2]}
    inner = {"folder": "iter_0000001", "storage": [{"relative_path": "__0_0.distcp"}]}
    assert measured_topology("megatron-torch-dist", {"dcp": inner}, ["iter_0000001/__1_0.distcp"]) == {
        "world_size": [2]
    }
    assert measured_topology("megatron-torch-dist", {"dcp": inner}, ["iter_00000010/__1_0.distcp"]) == {
        "world_size": [1]
    }


def test_a_stale_distcp_file_with_data_is_not_a_rank(tmp_path: Path) -> None:
    """A 2-rank save over an earlier 4-rank save in the same folder leaves ``__2_0`` and ``__3_0`` behind,
    full: the measure stays the metadata's two ranks (an attested world_size=2 is not contradicted)."""
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(DATA / "dcp_torch_save" / "checkpoint", ck)
    expected = inspect(ck).to_facts()["topology"]
    (ck / "__7_0.distcp").write_bytes(b"x" * 64)
    assert inspect(ck).to_facts()["topology"] == expected
    (ck / "__7_0.distcp").write_bytes(b"")
    assert inspect(ck).to_facts()["topology"] == {"world_size": [expected["world_size"][0] + 1]}


_DDP_SAVE = """
import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
def main(rank, path, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dcp.save({"model": {"w": torch.ones(4, 4)}}, checkpoint_id=path)  # one replicated tensor: rank 1 writes none
    dist.barrier()
    dist.destroy_process_group()
if __name__ == "__main__":
    mp.spawn(main, args=(sys.argv[1], sys.argv[2]), nprocs=2)
"""


def test_a_two_rank_dcp_save_of_replicated_state_measures_two_ranks(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.checkpoint")
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    (tmp_path / "save.py").write_text(_DDP_SAVE)
    ck = tmp_path / "ck"
    done = subprocess.run([sys.executable, str(tmp_path / "save.py"), str(ck), port], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (ck / "__1_0.distcp").stat().st_size == 0  # the deduplicated rank's file
    assert inspect(ck).to_facts()["topology"] == {"world_size": [2]}
    from ckptgate.producer.attest import AttestRequest, attest_checkpoint

    # the hook declares the process group's size: the save is attested, not refused as contradicting it
    done_ = attest_checkpoint(AttestRequest(src=ck, dry_run=True, topology={"world_size": 2}, environment=False))
    assert done_.statement["predicate"]["buildDefinition"]["internalParameters"]["topology"] == {"world_size": 2}


def test_rng_state_files_are_not_a_measure_of_the_world_size() -> None:
    """A save into a folder an earlier, larger run wrote holds more RNG state files; one called on the main
    process only holds one: they find gaps (attest), they do not measure the topology."""
    assert measured_topology("safetensors", {}, ["random_states_0.pkl"]) == {}
    assert rank_state_ranks(["model.safetensors", *(f"rng_state_{i}.pth" for i in (3, 0, 1))]) == [0, 1, 3]
    assert rank_state_ranks(["rng_state.pth", "sub/rng_state_3.pth", "random_states_2.pkl"]) == [2]
    ins = inspect(DATA / "trainer_fsdp_sharded" / "checkpoint" / "checkpoint-2")
    assert ins.to_facts()["topology"] == {"world_size": [2]}  # its DCP shards' measure


