"""The family table across megatron-core releases: the farm's logits fixtures (issue #39 item 6).

``megatron_hf_<family>[_<topology>][_singleton]_mc<release>`` were written by
``tests/fixtures/producers/megatron_hf_family.py`` in a farm environment
(``qualification/locks/megatron-core-<release>-torch-2.13.0.toml``; 0.19.2 runs on Python 3.12 and
keeps its common state in the ``.distcp`` files, not in ``common.pt``), with Megatron's own logits on
fixed tokens.  Each is mapped by the table, written as the intake writes it, loaded by the pinned
transformers with no remote code, and compared with those logits by the qualification's own check
(``ckptgate.evidence.logits.compare_logits``: max |delta| <= 1e-4 in fp32 over the first
``vocab_size`` columns).  No Megatron runs here.  The ``_singleton`` ones were saved with
``singleton_local_shards`` (per-layer and per-expert keys, ``linear_fc1.weight_w`` / ``weight_v``).
With 0.19.2 every row issue #39 requires is here: the four dense families at tp2, Llama and Qwen3 at
pp2 and tp2 x pp2 (Qwen3's tied embeddings across stages), Mixtral and Qwen3-MoE at ep2.

The signed rows these fixtures yield come from ``ckptgate qualify`` (``tests/evidence``), not from here.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptgate.consolidate.adapters import dcp
from ckptgate.consolidate.hf.engine import map_tensors
from ckptgate.consolidate.hf.plan import layout_ep, layout_tp
from ckptgate.consolidate.hf.source import read_hf_config
from ckptgate.consolidate.plan import shard_tensors
from ckptgate.consolidate.writer import write_plan
from ckptgate.evidence.logits import LOGITS_BOUND, compare_logits
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import open_sources

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from pipeline_helpers import FIXTURES  # noqa: E402

FARM_LOGITS = sorted(p.name for p in FIXTURES.glob("megatron_hf_*_mc*") if (p / "hf_config").is_dir())


def _meta(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "meta.json").read_text())


def _convert(name: str, out: Path) -> dict[str, Any]:
    """Map, write and copy the config as the intake publishes them; the plan's report."""
    fx = FIXTURES / name
    hf = read_hf_config(fx / "hf_config")
    out.mkdir()
    with SafeTree.open(fx / "checkpoint") as tree:
        inner = inspect_open_tree(tree).layout["dcp"]
        items = [i for i in inner.get("items", []) if i.get("kind") == "bytes"]
        tensors, report = map_tensors(dcp.torch_save_tensors(inner), items, hf.declared)
        plan = shard_tensors(tensors, max_shard_bytes=4000)
        tree.hold()
        with open_sources(tree, plan) as sources:
            write_plan(plan, out, sources, expected=None)
    shutil.copy(fx / "hf_config" / "config.json", out / "config.json")
    return {**report, "layout_tp": layout_tp(inner), "layout_ep": layout_ep(inner)}


#: (family, tp, pp, ep) of every row issue #39 requires of the newest release: every family at tp2,
#: Llama and Qwen3 at pp2 (tied Qwen3 embeddings across stages) and tp2 x pp2, both MoE families at ep2
ROWS_0192 = {*((f, 2, 1, 1) for f in ("llama", "mistral", "qwen2", "qwen3")),
             ("llama", 1, 2, 1), ("qwen3", 1, 2, 1), ("llama", 2, 2, 1), ("qwen3", 2, 2, 1),
             ("mixtral", 1, 1, 2), ("qwen3_moe", 1, 1, 2)}


def test_the_farm_wrote_logits_fixtures_with_the_newer_releases() -> None:
    releases = {_meta(n)["versions"]["megatron-core"] for n in FARM_LOGITS}
    assert {"0.17.1", "0.18.2", "0.19.2"} <= releases, FARM_LOGITS
    rows = {(m["family"], m["topology"]["tp"], m["topology"]["pp"], m["topology"]["ep"])
            for m in map(_meta, FARM_LOGITS) if m["versions"]["megatron-core"] == "0.19.2"}
    assert rows >= ROWS_0192, sorted(ROWS_0192 - rows)


@pytest.mark.parametrize("name", FARM_LOGITS)
def test_a_farm_fixture_maps_to_megatrons_logits(name: str, tmp_path: Path) -> None:
    meta = _meta(name)
    out = tmp_path / "out"
    report = _convert(name, out)
    assert report["family"] == meta["family"]
    topo = meta["topology"]
    assert report["layout_tp"] == topo["tp"]
    assert report["layout_ep"] == (topo["ep"] if "num_moe_experts" in meta["model"] else None)
    if meta["versions"]["megatron-core"] == "0.19.2":  # no common.pt: the common state is a BYTE_IO item, excluded
        assert report["ledger"]["excluded"] == ["common_state/shard_0_1"]
    singleton = "_singleton_" in name
    assert bool(report["ledger"]["per_layer_keys"]) == singleton
    if singleton:
        fc1 = [k for k in report["ledger"]["per_layer_keys"] if k.endswith("linear_fc1.weight")]
        assert fc1, report["ledger"]["per_layer_keys"]
    result = compare_logits(out, FIXTURES / name / "expected.safetensors", meta["model"]["vocab_size"])
    print(f"{name}: max|logits delta| = {result['max_abs_delta']:.3e}")
    assert result["passed"] and result["max_abs_delta"] <= LOGITS_BOUND
