"""Companion and resume-state roles: given by layout and content together, never by name alone."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys

import pytest

from ckptgate.inspect import inspect_tree
from ckptgate.inspect.roles import _protobuf, _tiktoken

ACCELERATE = r'''
import os, random, sys
import numpy as np, torch
out, payload = sys.argv[1], sys.argv[2]
class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))
# what accelerate.checkpointing.save_accelerator_state writes with torch.save
states = {"step": 1, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
          "torch_manual_seed": torch.get_rng_state()}
if payload == "yes":
    states["step"] = Payload()
torch.save(states, os.path.join(out, "random_states_0.pkl"))
torch.save({"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}, os.path.join(out, "optimizer.bin"))
'''


def _accelerate(tmp_path, payload):
    proc = subprocess.run([sys.executable, "-c", ACCELERATE, str(tmp_path), payload], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return inspect_tree(tmp_path)


def test_accelerate_save_state_is_resume_state(tmp_path):
    insp = _accelerate(tmp_path, "no")
    roles = {f.path: f.role for f in insp.files}
    assert roles == {"optimizer.bin": "resume_state", "random_states_0.pkl": "resume_state"}
    assert insp.clean
    assert {p.path: p.context for p in insp.pickles}["random_states_0.pkl"] == "resume_state"


def test_a_payload_in_random_states_is_outside_the_resume_state_allowlist(tmp_path):
    insp = _accelerate(tmp_path, "yes")
    rep = {p.path: p for p in insp.pickles}["random_states_0.pkl"]
    assert not rep.inside_allowlist and "posix.system" in rep.globals
    assert not insp.clean


def test_without_its_layout_marker_a_name_gives_no_role(tmp_path):
    import torch

    torch.save({"state": {}, "param_groups": []}, tmp_path / "optimizer.pt")  # no trainer_state.json beside it
    insp = inspect_tree(tmp_path)
    assert insp.files[0].role is None
    assert insp.pickles[0].context == "tensors"


def test_raw_pickle_named_training_args_is_not_resume_state(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    (tmp_path / "training_args.bin").write_bytes(pickle.dumps({"output_dir": "x"}, protocol=2))
    insp = inspect_tree(tmp_path)
    assert {f.path: f.role for f in insp.files}["training_args.bin"] is None
    assert any(f.code == "resume_state.content_mismatch" for f in insp.findings)
    assert not insp.clean


@pytest.mark.parametrize("raw, ok", [
    (b"\x0a\x08\x0a\x01a\x15\x00\x00\x80\x3f", True),
    (b"\x0a\x09\x0a\x01a\x15\x00\x00\x80\x3f", False),  # a length past the end
    (b"\x07\x00", False),  # field number 0
    (b"\x80\x02}q\x00.", False),  # a pickle
])
def test_sentencepiece_model_check(raw, ok):
    assert _protobuf(raw) is ok


def test_tiktoken_rank_file_check():
    assert _tiktoken(b"IQ== 0\nIg== 1\n")
    assert not _tiktoken(b"import os\n")
    assert not _tiktoken(bytes(random.Random(0).randbytes(64)))


def test_config_json_that_is_not_an_object_is_not_a_companion(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    insp = inspect_tree(tmp_path)
    assert insp.files[0].role is None
    assert any(f.code == "companion.content_mismatch" for f in insp.findings)


@pytest.mark.parametrize("best, flagged", [("/etc/passwd", True), ("../../other/checkpoint-9", True),
                                           ("run/checkpoint-1", False), (None, False)])
def test_best_model_checkpoint_outside_is_a_warning_only(tmp_path, best, flagged):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1, "best_model_checkpoint": best}))
    insp = inspect_tree(tmp_path)
    found = [f for f in insp.findings if f.code == "trainer_state.best_checkpoint_outside"]
    assert bool(found) is flagged
    assert all(f.severity == "warning" for f in found) and insp.clean
