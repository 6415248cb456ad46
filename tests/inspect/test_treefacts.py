"""The measured structure of a DCP tree's top-level subtrees (``ckptgate.inspect.treefacts``)."""

from __future__ import annotations

from ckptgate.inspect.treefacts import MAX_CHILDREN, tree_facts


def _t(fqn: str, dtype: str, size: list[int]) -> dict[str, object]:
    return {"fqn": fqn, "dtype": dtype, "size": size}


def test_each_top_level_key_is_measured_by_what_it_holds() -> None:
    facts = {f["key"]: f for f in tree_facts(
        [_t("net.0.weight", "float32", [3, 4]), _t("opt.state.0.weight.exp_avg", "float32", [3, 4]),
         _t("opt.state.0.weight.step", "float32", []), _t("rng.cpu", "uint8", [5056]), _t("top", "int64", [])],
        ["opt.param_groups.0.weight.lr", "progress.step"],
    )}
    assert sorted(facts) == ["net", "opt", "progress", "rng", "top"]
    assert facts["opt"]["children"] == ["param_groups", "state"] and facts["opt"]["optimizer_state_paths"] is True
    assert facts["opt"]["scalar_dtypes"] == ["float32"] and facts["opt"]["bytes_items"] == 1
    assert facts["rng"]["layouts"] == [{"dtype": "uint8", "shape": [5056], "count": 1}]
    assert facts["progress"] == {**facts["progress"], "tensors": 0, "bytes_items": 1, "layouts_count": 0}
    assert facts["top"]["leaf"] is True and facts["net"]["leaf"] is False
    assert facts["net"]["optimizer_state_paths"] is False  # no state child


def test_a_state_entry_without_param_and_moment_is_not_optimizer_shaped() -> None:
    [f] = tree_facts([_t("opt.state.w", "float32", [2])], ["opt.param_groups.lr"])
    assert f["optimizer_state_paths"] is False


def test_wide_subtrees_are_capped_with_their_full_count() -> None:
    [f] = tree_facts([_t(f"m.l{i}.w", "float32", [i + 1]) for i in range(100)], [])
    assert len(f["children"]) == MAX_CHILDREN and f["children_count"] == 100
    assert f["layouts_count"] == 100 and len(f["layouts"]) < 100
