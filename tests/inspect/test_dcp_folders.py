"""DCP saves in top-level folders (an Accelerate FSDP SHARDED_STATE_DICT checkpoint): read as one
training-state tree whose subtrees keep their folders' top-level keys; folders whose keys collide,
or a pickle beside the folders, are not this layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptgate.inspect import inspect_tree

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
FIXTURE = DATA / "trainer_fsdp_sharded"
STEP = FIXTURE / "checkpoint" / "checkpoint-2"
#: every release's Trainer + FSDP SHARDED_STATE_DICT output: the project's (FSDP2, transformers 5.24) and
#: the farm's (``farm.spec`` in meta.json: FSDP1 under transformers 4.57, FSDP2 under 5.25)
RELEASES = sorted(p.name for p in DATA.iterdir() if (p / "meta.json").is_file() and (
    p.name == "trainer_fsdp_sharded"
    or (json.loads((p / "meta.json").read_text()).get("farm") or {}).get("spec") == "trainer_fsdp_sharded"))


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "checkpoint-2"
    shutil.copytree(STEP, dest)
    return dest


@pytest.mark.parametrize("name", RELEASES)
def test_the_model_and_optimizer_folders_make_one_tree(name: str) -> None:
    ins = inspect_tree(DATA / name / "checkpoint" / "checkpoint-2")
    assert ins.format == "dcp-torch-save" and ins.consolidatable
    assert not [f for f in ins.findings if f.severity.value == "error"]
    layout = ins.layout
    assert [(f["folder"], f["keys"]) for f in layout["folders"]] == [
        ("optimizer_0", ["optimizer"]), ("pytorch_model_fsdp_0", ["model"])]
    tree = {t["key"]: t for t in layout["tree"]}
    assert sorted(tree) == ["model", "optimizer"]
    assert tree["optimizer"]["children"] == ["param_groups", "state"] and tree["optimizer"]["optimizer_state_paths"]
    # every storage item keeps its folder, so a chunk is read from its own folder's file
    assert {i["path"].split("/", 1)[0] for i in layout["items"]} == {"optimizer_0", "pytorch_model_fsdp_0"}
    for item in layout["items"]:
        folder = "pytorch_model_fsdp_0" if item["fqn"].startswith("model.") else "optimizer_0"
        assert item["path"].startswith(folder + "/"), item["fqn"]


def test_folders_whose_top_level_keys_collide_are_refused(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    shutil.copytree(src / "pytorch_model_fsdp_0", src / "pytorch_model_fsdp_1")
    ins = inspect_tree(src)
    assert not ins.consolidatable
    [clash] = [f for f in ins.findings if f.code == "dcp.folders_overlap"]
    assert clash.path == "pytorch_model_fsdp_1/.metadata"


def test_a_pickle_beside_the_folders_is_not_this_layout(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    shutil.copyfile(src / "pytorch_model_fsdp_0" / ".metadata", src / "stray.pkl")
    assert inspect_tree(src).format != "dcp-torch-save"


def test_a_root_metadata_is_plain_dcp_not_folders(tmp_path: Path) -> None:
    src = _copy(tmp_path)
    shutil.rmtree(src / "optimizer_0")
    for p in (src / "pytorch_model_fsdp_0").iterdir():
        p.rename(src / p.name)
    ins = inspect_tree(src)
    assert ins.format == "dcp-torch-save" and "folders" not in ins.layout
