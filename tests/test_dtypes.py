"""The one dtype table, checked against torch's own dtypes and the safetensors spec names."""

from __future__ import annotations

import pytest

from ckptgate import dtypes as D
from ckptgate.consolidate import plan
from ckptgate.enforce import protocol
from ckptgate.inspect import allowlist, safetensors

torch = pytest.importorskip("torch")

#: The dtype codes of the safetensors format (safetensors 0.8's ``Dtype``), and "E8M0", which
#: ckptgate's validator has accepted since it was written.
SPEC_CODES = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16", "I32", "U32",
              "F32", "I64", "U64", "F64", "C64", "F4", "F6_E2M3", "F6_E3M2"}


def test_itemsizes_are_torchs_own():
    checked = 0
    for d in D.DTYPES:
        if d.torch is None:
            continue
        t = getattr(torch, d.torch, None)
        if not isinstance(t, torch.dtype):
            continue  # this torch lacks it
        assert t.itemsize * 8 == d.bits, d
        assert str(t) == f"torch.{d.torch}"
        checked += 1
    assert checked >= 15  # every torch this project supports has at least the 15 plannable dtypes


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_storage_classes_are_torchs_own():
    for name, dtype in D.STORAGE_DTYPES.items():
        cls = getattr(torch, name.rsplit(".", 1)[1])
        if name.rsplit(".", 1)[1] != "UntypedStorage":
            assert cls(0).dtype == getattr(torch, dtype), name


def test_safetensors_codes_are_the_specs():
    assert set(D.SAFETENSORS_BITS) - {"E8M0"} == SPEC_CODES
    st = pytest.importorskip("safetensors.torch")
    types = getattr(st, "_TYPES", {})
    for d in D.DTYPES:  # where the safetensors package maps a code to torch, it is our torch name
        if d.safetensors in types and d.torch is not None:
            assert types[d.safetensors] == getattr(torch, d.torch), d


def test_every_view_is_derived_from_the_table():
    assert safetensors.DTYPE_BITS is D.SAFETENSORS_BITS
    assert safetensors.TORCH_DTYPES is D.TORCH_TO_SAFETENSORS
    assert plan.DTYPE_SIZES is D.PLAN_ITEMSIZE and plan.CASTABLE is D.CASTABLE
    assert allowlist.DTYPE_ITEMSIZE is D.TORCH_ITEMSIZE and allowlist.STORAGE_DTYPES is D.STORAGE_DTYPES
    assert protocol.TORCH_ITEMSIZE is D.TORCH_ITEMSIZE
    # the worker's parent now knows the two dtypes its own table lacked
    assert {"complex32", "float8_e8m0fnu"} <= set(D.TORCH_ITEMSIZE)
    assert D.CASTABLE == {"F64", "F32", "F16", "BF16"}
    assert set(D.PLAN_ITEMSIZE) == set(D.TORCH_TO_SAFETENSORS.values())


def test_a_bad_record_is_refused():
    with pytest.raises(ValueError):
        D.DType(safetensors=None, torch=None, bits=8)
    with pytest.raises(ValueError):
        D.DType(safetensors="F4", torch=None, bits=4, plannable=True)
    with pytest.raises(ValueError):
        D.DType(safetensors="F32", torch="float32", bits=32, castable=True)
    assert D.DType(safetensors="F4", torch=None, bits=4).itemsize is None
