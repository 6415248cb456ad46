"""The plan encoder, run in this process on objects built here (the worker runs it on a load)."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")

from ckptgate.enforce.plan_encoder import PlanBudget, PlanEncoder, StorageRecord, dtype_name  # noqa: E402
from ckptgate.enforce.protocol import WorkerError  # noqa: E402


def test_tensors_become_records_without_data_and_are_listed_in_tree_order() -> None:
    w = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    obj = {"w": w, "t": w.t(), "meta": collections.OrderedDict(step=3, lr=float("inf")), 1: b"ab"}
    enc = PlanEncoder({w.untyped_storage()._cdata: StorageRecord("0", None)}, PlanBudget(100, 10))
    tree = enc.encode(obj, [])
    rec = tree["__map__"][0][1]["__tensor__"]
    assert rec == {"storage_key": "0", "dtype": "float16", "shape": [2, 3], "stride": [3, 1], "storage_offset": 0,
                   "storage_nbytes": 12, "parameter": False}
    assert tree["__map__"][1][1]["__tensor__"]["stride"] == [1, 3]
    assert tree["__map__"][2][1] == {"step": 3, "lr": {"__float__": "inf"}}
    assert [p for p, _ in enc.tensors] == [["w"], ["t"]]
    assert dtype_name(torch.bfloat16) == "bfloat16"


def test_the_declared_storage_size_is_reported_not_the_allocation() -> None:
    """torch 2.10's ``skip_data`` allocates ``numel x itemsize**2`` bytes: the plan reports the size
    the pickle declared, which the parent compares with the zip record; with no declared size, the
    storage's own."""
    w = torch.zeros(51, dtype=torch.float32)  # 204 bytes, as a 2.10 load would over-allocate to 816
    big = torch.zeros(204, dtype=torch.float32)[:51]
    declared = PlanEncoder({big.untyped_storage()._cdata: StorageRecord("3", 204)}, PlanBudget(100, 10))
    assert declared.encode({"w": big}, [])["w"]["__tensor__"]["storage_nbytes"] == 204
    own = PlanEncoder({w.untyped_storage()._cdata: StorageRecord("3", None)}, PlanBudget(100, 10))
    assert own.encode({"w": w}, [])["w"]["__tensor__"]["storage_nbytes"] == 204
    unknown = PlanEncoder({}, PlanBudget(100, 10)).encode({"w": big}, [])["w"]["__tensor__"]
    assert unknown["storage_key"] is None and unknown["storage_nbytes"] == 816


def test_the_budget_bounds_nodes_and_depth() -> None:
    with pytest.raises(WorkerError) as ei:
        PlanEncoder({}, PlanBudget(5, 100)).encode(list(range(10)), [])
    assert ei.value.code == "runtime.worker.plan_too_large"
    deep: list = []
    for _ in range(20):
        deep = [deep]
    with pytest.raises(WorkerError, match="deeper"):
        PlanEncoder({}, PlanBudget(1000, 5)).encode(deep, [])


Point = collections.namedtuple("Point", ["x", "y"])


class _Slotted:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a = 1  # b is never set: a slot without a value is left out


def test_named_tuples_keep_their_field_names_and_slots_their_values() -> None:
    """The branches the typed rewrite touched: a named tuple's ``_fields``, a class's ``__slots__``."""
    enc = PlanEncoder({}, PlanBudget(100, 10))
    tree = enc.encode({"p": Point(1, (2, 3)), "plain": (4, 5), "s": _Slotted()}, [])
    assert tree["p"] == {"__object__": f"{__name__}.Point", "state": {"x": 1, "y": [2, 3]}}
    assert tree["plain"] == [4, 5]
    assert tree["s"] == {"__object__": f"{__name__}._Slotted", "state": {"a": 1}}


class _Short(tuple):
    _fields = ("only",)  # a pickle's class may say anything: two items, one field name


class _Twice(tuple):
    _fields = ("a", "a")


@pytest.mark.parametrize("obj", [_Short((1, 2)), _Twice((1, 2))])
def test_a_named_tuple_whose_fields_do_not_name_each_item_once_is_refused_not_truncated(obj) -> None:
    with pytest.raises(WorkerError) as e:
        PlanEncoder({}, PlanBudget(100, 10)).encode({"x": obj}, [])
    assert e.value.code == "runtime.worker.unencodable"
