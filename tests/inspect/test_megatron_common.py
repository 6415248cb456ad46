"""Megatron's common state read statically: ``args`` of a Megatron-LM save, in ``common.pt``
(megatron-core <= 0.16) or in the BYTE_IO item ``common_state/shard_0_1`` (0.19).

The fixtures ``megatron_lm_run`` and ``megatron_lm_run_common_item`` hold Megatron-LM's own
``parse_args()`` Namespace (tests/fixtures/producers/megatron_lm_run.py).
"""

from __future__ import annotations

import argparse
import enum
import io
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.inspect.allowlist import MEGATRON_ARGS_CLASSES
from ckptgate.inspect.megatron_common import COMMON_ITEM, read_common_state
from ckptgate.inspect.pickle import read_pickle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
RUN = FIXTURES / "megatron_lm_run" / "checkpoint"
RUN_019 = FIXTURES / "megatron_lm_run_common_item" / "checkpoint"
ITER = "iter_0000010"
#: the non-plain classes a real Megatron-LM core_v0.16.1 save pickles into its common state
REAL_GLOBALS = ["argparse.Namespace", "megatron.core.enums.ModelType", "megatron.core.transformer.enums.AttnBackend",
                "signal.Signals", "torch.float32"]


def _inspect(root: Path) -> Any:
    with SafeTree.open(root) as tree:
        return inspect_open_tree(tree)


def _codes(insp: Any) -> list[str]:
    return [f.code for f in insp.findings]


@pytest.mark.parametrize(("root", "source"), [(RUN / ITER, "common.pt"), (RUN_019 / ITER, COMMON_ITEM)])
def test_a_megatron_lm_save_is_read_statically_with_its_args(root: Path, source: str) -> None:
    """Both layouts: clean, the static plane only (no framework load), the args as data."""
    insp = _inspect(root)
    assert insp.format == "megatron-torch-dist"
    assert insp.clean, _codes(insp)
    assert insp.loaders == ("json", "static_pickle")  # no torch_load: the args need no framework plane
    common = insp.layout["common"]
    assert common["source"] == source and common["inside_allowlist"] is True
    assert common["globals"] == REAL_GLOBALS
    state = common["state"]
    assert state["keys"] == ["args", "checkpoint_version", "content_metadata", "iteration",
                             "num_floating_point_operations_so_far"]
    assert state["iteration"] == 10 and state["checkpoint_version"] == 3.0
    args = state["args"]
    assert len(args) == 656  # the whole Namespace, as Megatron-LM core_v0.16.1 builds it
    assert args["attention_backend"] == {"module": "megatron.core.transformer.enums", "qualname": "AttnBackend",
                                         "value": 5}
    assert args["model_type"] == {"module": "megatron.core.enums", "qualname": "ModelType", "value": 1}
    assert args["exit_signal"] == {"module": "signal", "qualname": "Signals", "value": 15}
    assert args["params_dtype"] == "torch.float32"
    assert (args["num_query_groups"], args["kv_channels"], args["padded_vocab_size"]) == (2, 4, 32)
    assert args["layernorm_epsilon"] == 1e-5 and args["swiglu"] is True
    assert not [k for k, v in args.items() if isinstance(v, dict) and "not_data" in v]


def test_the_019_common_state_is_a_pickle_report_of_its_own() -> None:
    """The BYTE_IO item's globals reach the policy's allowlist check, named apart from its .distcp."""
    insp = _inspect(RUN_019 / ITER)
    reports = {p.path: p for p in insp.pickles}
    rep = reports[f"__0_0.distcp#{COMMON_ITEM}"]
    assert rep.context == "megatron_common" and rep.inside_allowlist
    assert list(rep.globals) == REAL_GLOBALS
    assert "megatron.common_missing" not in _codes(insp)


def test_the_run_directory_is_read_at_its_latest_iteration() -> None:
    insp = _inspect(RUN)
    assert insp.layout["folder"] == ITER and insp.layout["common"]["state"]["iteration"] == 10


def test_neither_layout_is_refused(tmp_path: Path) -> None:
    shutil.copytree(RUN / ITER, tmp_path / "c")
    (tmp_path / "c" / "common.pt").unlink()
    insp = _inspect(tmp_path / "c")
    assert "megatron.common_missing" in _codes(insp) and not insp.clean


def test_both_layouts_at_once_are_refused(tmp_path: Path) -> None:
    shutil.copytree(RUN_019 / ITER, tmp_path / "c")
    shutil.copy(RUN / ITER / "common.pt", tmp_path / "c" / "common.pt")
    insp = _inspect(tmp_path / "c")
    assert "megatron.common_ambiguous" in _codes(insp) and not insp.clean
    assert insp.layout["common"] is None


class _Foreign(enum.Enum):
    A = 1


def _common_pt(path: Path, state: dict[str, Any]) -> None:
    torch.save(state, path)


@pytest.mark.parametrize("value", [_Foreign.A, argparse.ArgumentParser, torch.nn.Linear(1, 1)])
def test_a_class_outside_the_megatron_args_allowlist_is_refused(value: Any, tmp_path: Path) -> None:
    """Exactly the Megatron-LM classes: any other global in args leaves the static plane."""
    shutil.copytree(RUN / ITER, tmp_path / "c")
    _common_pt(tmp_path / "c" / "common.pt", {"args": argparse.Namespace(hidden_size=16, x=value), "iteration": 10})
    insp = _inspect(tmp_path / "c")
    assert "pickle.global_not_allowed" in _codes(insp)
    assert not insp.clean and "torch_load" in insp.loaders
    assert insp.layout["common"]["state"] is None  # never interpreted


def test_the_args_allowlist_holds_only_for_megatrons_common_state(tmp_path: Path) -> None:
    """A Namespace in a model file (no metadata.json beside it) is outside the tensors allowlist."""
    torch.save({"args": argparse.Namespace(a=1)}, tmp_path / "common.pt")
    insp = _inspect(tmp_path)
    assert "pickle.global_not_allowed" in _codes(insp) and not insp.clean
    assert {p.context for p in insp.pickles} == {"tensors"}
    assert "argparse.Namespace" in MEGATRON_ARGS_CLASSES


def _read(obj_bytes: bytes) -> Any:
    rep = read_pickle(obj_bytes, path="p", context="megatron_common")
    assert rep.complete
    return rep.value


def _enum_with_state() -> bytes:
    """``{"args": Namespace(attention_backend=AttnBackend(5) with BUILD state)}``, handwritten: a
    BUILD on an enum member would set attributes on a process-wide singleton if loaded."""
    return (b"\x80\x02}q\x00X\x04\x00\x00\x00argsq\x01cargparse\nNamespace\nq\x02)\x81q\x03}q\x04"
            b"X\x11\x00\x00\x00attention_backendq\x05cmegatron.core.transformer.enums\nAttnBackend\nq\x06"
            b"K\x05\x85q\x07Rq\x08}q\tX\x01\x00\x00\x00xK\x01sbsbs.")


def test_an_enum_with_state_is_not_data() -> None:
    state, findings = read_common_state(_read(_enum_with_state()), source="common.pt", path="p")
    assert findings == [] and state is not None and state.args is not None
    assert state.args["attention_backend"] == {"not_data": "Call"}


@pytest.mark.parametrize(("obj", "code"), [
    ({"args": {"hidden_size": 16}}, "megatron.args_unreadable"),   # a dict, not a Namespace
    ([1, 2], "megatron.common_unreadable"),                        # not a dict at all
])
def test_a_common_state_no_megatron_writes_is_refused(obj: Any, code: str) -> None:
    value = _read(pickle.dumps(obj, protocol=2))
    state, findings = read_common_state(value, source="common.pt", path="p")
    assert state is None and [f.code for f in findings] == [code]


def test_the_019_item_must_be_the_one_item_list_megatron_writes() -> None:
    buf = io.BytesIO()
    pickle.dump({"args": None}, buf, protocol=2)  # the dict itself, not [dict]
    state, findings = read_common_state(_read(buf.getvalue()), source=COMMON_ITEM, path="p")
    assert state is None and [f.code for f in findings] == ["megatron.common_unreadable"]
    wrapped = _read(pickle.dumps([{"iteration": 3}], protocol=2))
    state, findings = read_common_state(wrapped, source=COMMON_ITEM, path="p")
    assert findings == [] and state is not None and state.args is None and state.scalars == {"iteration": 3}


@pytest.mark.parametrize("name", ["common.pt", "model.pt"])
def test_a_metadata_json_beside_a_model_file_does_not_widen_its_allowlist(name: str, tmp_path: Path) -> None:
    """A ``common.pt`` (or DCP ``.metadata``) takes the Megatron contexts only where the detected format
    is the Megatron save that claims it: an unrelated ``metadata.json`` beside a model file named
    ``common.pt`` left a Namespace in it clean (review2 A1)."""
    torch.save({"weight": torch.ones(2, 2), "args": argparse.Namespace(a=1)}, tmp_path / name)
    (tmp_path / "metadata.json").write_text('{"anything": 1}')
    insp = _inspect(tmp_path)
    assert insp.format != "megatron-torch-dist"
    assert "pickle.global_not_allowed" in _codes(insp) and not insp.clean
    assert {p.context for p in insp.pickles} == {"tensors"}


def test_a_common_pt_outside_the_saves_folder_is_not_its_common_state(tmp_path: Path) -> None:
    """Inside a Megatron save, only the save's own ``common.pt`` is read against the args allowlist."""
    shutil.copytree(RUN / ITER, tmp_path / "c")
    (tmp_path / "c" / "extra").mkdir()
    shutil.copy(RUN / ITER / "metadata.json", tmp_path / "c" / "extra" / "metadata.json")
    _common_pt(tmp_path / "c" / "extra" / "common.pt", {"args": argparse.Namespace(hidden_size=16)})
    insp = _inspect(tmp_path / "c")
    assert insp.format == "megatron-torch-dist"
    contexts = {p.path: p.context for p in insp.pickles}
    assert contexts["common.pt"] == "megatron_common" and contexts["extra/common.pt"] == "tensors"
    assert "pickle.global_not_allowed" in _codes(insp) and not insp.clean


def test_a_dcp_metadata_beside_a_foreign_metadata_json_is_read_as_plain_dcp(tmp_path: Path) -> None:
    """megatron-core 0.15's MCoreMetadata is read only in a Megatron save: a ``metadata.json`` that
    makes no Megatron save (not torch_dist) leaves ``.metadata`` in the plain DCP context."""
    shutil.copytree(FIXTURES / "megatron_tp2_mc0153" / "checkpoint", tmp_path / "c")
    assert "megatron_dcp_metadata" in {p.context for p in _inspect(tmp_path / "c").pickles}
    (tmp_path / "c" / "metadata.json").write_text('{"sharded_backend": "zarr"}')
    insp = _inspect(tmp_path / "c")
    assert insp.format != "megatron-torch-dist"
    assert {p.context for p in insp.pickles if p.path == ".metadata"} == {"dcp_metadata"}
    assert "pickle.global_not_allowed" in _codes(insp) and not insp.clean
