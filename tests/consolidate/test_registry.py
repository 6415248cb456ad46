"""The adapter registry: its format table against the gates data, the one lookup in ``plan_for``,
and a toy eighth format added from this file alone (detector, adapter, data row)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from ckptgate.consolidate import framework_files, plan_for
from ckptgate.consolidate.adapters import registry
from ckptgate.consolidate.adapters.registry import Adapter, RegistryError, StaticAdapter
from ckptgate.consolidate.plan import ConsolidationPlan, OutputTensor, Placement, PlanError, shard_tensors
from ckptgate.consolidate.writer import write_plan
from ckptgate.decide.decision import Decision
from ckptgate.errors import RuntimeFailure
from ckptgate.evidence.qualify import adapter_for_format
from ckptgate.inspect import Inspection, SafeTree, inspect_open_tree
from ckptgate.inspect.formats import FormatResult
from ckptgate.inspect.formats import registry as detectors
from ckptgate.inspect.formats._base import Context

REPO = Path(__file__).resolve().parents[2]
GATES_DATA = REPO / "policies" / "ckptgate" / "config" / "gates" / "data.json"
ALLOW = Decision(allow=True, plane="pure_data", permitted_loaders=("safetensors", "json", "static_pickle"),
                 required_controls=(), reasons=(), decision_id="t", policy_revision="t", engine="t")
TOY = "toy-raw-f32"


def table_mismatches(gates: Mapping[str, Any]) -> list[str]:
    """Where the registry and a gates data document disagree (empty when they agree).

    The gates data lists every format policy knows, each with the adapter that consolidates it
    (``null``: none); every registered adapter must have a version gate under ``adapters``."""
    out = []
    formats = gates.get("formats") or {}
    for fmt, row in sorted(formats.items()):
        if registry.adapter_name_for(fmt) != row.get("adapter"):
            out.append(f"format {fmt}: gates data {row.get('adapter')!r}, registry {registry.adapter_name_for(fmt)!r}")
    for fmt, name in registry.format_table().items():
        if fmt not in formats:
            out.append(f"format {fmt}: planned by {name!r}, absent from the gates data")
    for name in sorted(set(registry.adapters()) ^ set(gates.get("adapters") or {})):
        out.append(f"adapter {name}: in {'the registry' if name in registry.adapters() else 'the gates data'} only")
    return out


def test_the_registry_table_is_the_gates_data_table() -> None:
    gates = json.loads(GATES_DATA.read_text(encoding="utf-8"))
    assert table_mismatches(gates) == []
    assert len(registry.adapters()) == 7
    assert registry.adapter_name_for("fsdp-local") is None  # refused at inspection; the data names no adapter


def test_the_check_sees_a_row_that_differs() -> None:
    gates = json.loads(GATES_DATA.read_text(encoding="utf-8"))
    gates["formats"]["dcp-torch-save"]["adapter"] = "fsdp-full"
    del gates["adapters"]["peft"]
    assert table_mismatches(gates) == ["format dcp-torch-save: gates data 'fsdp-full', registry 'dcp'",
                                       "adapter peft: in the registry only"]


def test_every_adapter_is_an_adapter_and_every_planned_format_has_a_detector() -> None:
    detected = {f for d in detectors.detectors() for f in d.formats}
    for name, a in registry.adapters().items():
        assert isinstance(a, Adapter) and a.name == name
        assert set(a.formats) <= detected, name


def test_qualify_reads_format_to_adapter_from_the_registry() -> None:
    gates = json.loads(GATES_DATA.read_text(encoding="utf-8"))
    for fmt, row in gates["formats"].items():
        assert adapter_for_format(REPO, fmt) == row["adapter"]
    assert adapter_for_format(REPO, "no-such-format") is None


def test_a_second_adapter_for_a_planned_format_is_refused() -> None:
    class Again(StaticAdapter):
        name = "again"
        formats = ("dcp-torch-save",)

    with pytest.raises(RegistryError):
        registry.register(Again())
    assert registry.adapter_name_for("dcp-torch-save") == "dcp"
    assert "again" not in registry.adapters()


# -- a toy eighth format, defined here only ---------------------------------------------------------

def detect_toy(ctx: Context) -> FormatResult | None:
    """A toy layout: exactly one ``*.toy`` file of raw little-endian float32 values."""
    toys = [f for p, f in ctx.files.items() if p.endswith(".toy")]
    if len(toys) != 1 or len(ctx.files) != 1 or toys[0].size % 4:
        return None
    return FormatResult(format=TOY, layout={"file": toys[0].path, "count": toys[0].size // 4}, loaders=())


class ToyAdapter(StaticAdapter):
    name = "toy-raw"
    formats = (TOY,)

    def plan(self, inspection: Inspection, *, max_shard_bytes: int, mapping: str | None = None,
             selection: Any = None, loaded: Any = None) -> ConsolidationPlan:
        src, n = inspection.layout["file"], inspection.layout["count"]
        t = OutputTensor(name="toy.weight", dtype="F32", shape=(n,),
                         placements=(Placement(src=src, src_offset=0, dst_offset=0, length=4 * n),))
        return shard_tensors([t], max_shard_bytes=max_shard_bytes, report={"adapter": self.name})


class ToyFrameworkAdapter(ToyAdapter):
    """The same toy, as if its loader were a framework's: the worker must read the file."""

    def framework_files(self, inspection: Inspection) -> tuple[str, ...]:
        return (inspection.layout["file"],)


@pytest.fixture
def toy_detector() -> Iterator[None]:
    detectors.register_detector("toy", detect_toy, formats=(TOY,), order=85)
    try:
        yield
    finally:
        detectors.unregister_detector("toy")


@pytest.fixture
def toy_adapter(toy_detector: None) -> Iterator[Adapter]:
    a = registry.register(ToyAdapter())
    try:
        yield a
    finally:
        registry.unregister(a.name)


@pytest.fixture
def toy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "weights.toy").write_bytes(np.arange(6, dtype="<f4").tobytes())
    return root


def _toy_gates(tmp_path: Path) -> dict[str, Any]:
    """A temporary copy of the policy's gates data with the toy's data row and version gate."""
    gates = json.loads(GATES_DATA.read_text(encoding="utf-8"))
    gates["formats"][TOY] = {"adapter": "toy-raw"}
    gates["adapters"]["toy-raw"] = {"producer": "*", "versions": {"any": True, "exact": [], "ranges": []},
                                    "note": "test only"}
    copy = tmp_path / "gates" / "data.json"
    copy.parent.mkdir()
    copy.write_text(json.dumps(gates), encoding="utf-8")
    return json.loads(copy.read_text(encoding="utf-8"))


def test_a_toy_format_is_detected_planned_and_written_through_the_registries(
        toy_adapter: Adapter, toy_tree: Path, tmp_path: Path) -> None:
    """Capability: format registry (a format is detected, planned and written through the registries)."""
    assert table_mismatches(_toy_gates(tmp_path)) == []
    assert table_mismatches(json.loads(GATES_DATA.read_text(encoding="utf-8"))) == [
        f"format {TOY}: planned by 'toy-raw', absent from the gates data", "adapter toy-raw: in the registry only"]
    with SafeTree.open(toy_tree) as tree:
        ins = inspect_open_tree(tree)
        assert (ins.format, ins.consolidatable) == (TOY, True)
        plan = plan_for(ins, decision=ALLOW, max_shard_bytes=1 << 20)
    assert plan.report["adapter"] == "toy-raw"
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(toy_tree / "weights.toy", os.O_RDONLY)
    try:
        write_plan(plan, out, {"weights.toy": fd}, expected=None)
    finally:
        os.close(fd)
    [shard] = [s.filename for s in plan.shards]
    got = safetensors.numpy.load_file(out / shard)
    assert list(got) == ["toy.weight"]
    np.testing.assert_array_equal(got["toy.weight"], np.arange(6, dtype="<f4"))


def test_a_detected_format_without_an_adapter_is_unsupported(toy_detector: None, toy_tree: Path) -> None:
    with SafeTree.open(toy_tree) as tree:
        ins = inspect_open_tree(tree)
        assert ins.format == TOY
        with pytest.raises(PlanError) as e:
            plan_for(ins, decision=ALLOW, max_shard_bytes=1 << 20)
    assert e.value.code == "plan.format.unsupported"


def test_a_mapping_for_an_adapter_without_mappings_is_refused(toy_adapter: Adapter, toy_tree: Path) -> None:
    with SafeTree.open(toy_tree) as tree:
        ins = inspect_open_tree(tree)
        with pytest.raises(PlanError) as e:
            plan_for(ins, decision=ALLOW, max_shard_bytes=1 << 20,
                     mapping="megatron-unstack-layers")
    assert e.value.code == "plan.mapping.unknown"


def test_an_adapter_that_names_framework_files_is_planned_only_from_what_enforce_loaded(
        toy_detector: None, toy_tree: Path) -> None:
    a = registry.register(ToyFrameworkAdapter())
    try:
        with SafeTree.open(toy_tree) as tree:
            ins = inspect_open_tree(tree)
            assert a.framework_files(ins) == ("weights.toy",)
            assert framework_files(ins) == ("weights.toy",)  # what the pipeline hands to enforce
            with pytest.raises(RuntimeFailure) as e:  # nothing loaded: no plan from the files alone
                plan_for(ins, decision=ALLOW, max_shard_bytes=1 << 20)
    finally:
        registry.unregister(a.name)
    assert e.value.code == "runtime.plan.not_loaded"
