"""megatron-core 0.15's ``.metadata``: its own ``MCoreMetadata(Metadata)`` and ``MCoreSavePlan(SavePlan)``
with one more field, ``mcore_data`` (#31 item 4).  Read in the Megatron context only, as the torch
classes; an ``mcore_data`` entry that reformulates a tensor's global shape is refused, never guessed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ckptgate.inspect import inspect_tree
from ckptgate.inspect.dcp import extract_dcp_metadata
from ckptgate.inspect.pickle import read_pickle
from ckptgate.inspect.pickle.values import SDict

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
MC0153 = DATA / "megatron_tp2_mc0153" / "checkpoint"


def _report(context: str = "megatron_dcp_metadata"):  # type: ignore[no-untyped-def]
    return read_pickle((MC0153 / ".metadata").read_bytes(), path=".metadata", context=context)


def test_a_megatron_core_0_15_checkpoint_is_read_like_the_later_releases() -> None:
    rep = _report()
    assert rep.inside_allowlist
    md, findings = extract_dcp_metadata(rep)
    assert findings == () and md is not None and md.tensors
    inspection = inspect_tree(MC0153)
    assert inspection.format == "megatron-torch-dist" and inspection.clean, inspection.findings


def test_outside_the_megatron_context_the_subclasses_stay_refused() -> None:
    rep = _report("dcp_metadata")
    assert not rep.inside_allowlist
    assert {f.code for f in extract_dcp_metadata(rep)[1]} == {"dcp.metadata_unresolved"}


@pytest.mark.parametrize("entry", [
    SDict(items=[("nd_reformulated_orig_global_shape", (4, 8))]),
    [("not", "a dict")],
])
def test_mcore_data_that_changes_what_the_shapes_mean_is_refused(entry: object) -> None:
    rep = _report()
    state = rep.value.state
    fields = state[1] if isinstance(state, tuple) else state
    items = [(k, SDict(items=[(next(iter(dict(v.items))), entry)]) if k == "mcore_data" else v)
             for k, v in fields.items]
    fields_new = SDict(items=items)
    value = dataclasses.replace(rep.value, state=(state[0], fields_new) if isinstance(state, tuple) else fields_new)
    md, findings = extract_dcp_metadata(dataclasses.replace(rep, value=value))
    assert md is None and [f.code for f in findings] == ["dcp.metadata_shape"]
    assert "mcore_data" in findings[0].message
