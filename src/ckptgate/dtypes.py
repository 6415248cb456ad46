"""The one table of tensor element types: safetensors code, torch name, bits, and who may use each.

Every step takes its view of dtypes from :data:`DTYPES`: the strict safetensors validator (codes
and bits), the static torch-zip reader and its pickle allowlist (torch names, item sizes, legacy
typed-storage classes), consolidation (the codes a plan may write, and the ones it may cast
between) and the contained worker's parent (the torch names a streamed tensor may carry).  The
views are derived here, so they cannot drift apart.  Any step may import this module; it imports
nothing from ckptgate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "CASTABLE",
    "DTYPES",
    "PLAN_ITEMSIZE",
    "SAFETENSORS_BITS",
    "STORAGE_DTYPES",
    "TORCH_ITEMSIZE",
    "TORCH_TO_SAFETENSORS",
    "DType",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class DType:
    """One element type, as each format that knows it spells it."""

    #: The safetensors header code (``"F32"``), or ``None`` where safetensors has none.
    safetensors: str | None
    #: The torch dtype name without ``torch.`` (``"float32"``), or ``None`` where torch has none.
    torch: str | None
    #: Bits per element (4 and 6 for the packed sub-byte safetensors types).
    bits: int
    #: Legacy typed-storage classes a torch pickle may name for this dtype.
    storages: tuple[str, ...] = ()
    #: A consolidation plan may write it (raw bytes, as read).
    plannable: bool = False
    #: A consolidation plan may convert it to and from another castable dtype (on request only).
    castable: bool = False

    def __post_init__(self) -> None:
        if self.safetensors is None and self.torch is None:
            raise ValueError("a dtype needs a safetensors code or a torch name")
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or self.bits <= 0:
            raise ValueError("bits must be a positive int")
        if (self.plannable or self.castable) and (self.safetensors is None or self.torch is None or self.bits % 8):
            raise ValueError("a plannable dtype needs a safetensors code, a torch name and whole bytes")
        if self.castable and not self.plannable:
            raise ValueError("a castable dtype must be plannable")

    @property
    def itemsize(self) -> int | None:
        """Bytes per element; ``None`` for a sub-byte type."""
        return self.bits // 8 if self.bits % 8 == 0 else None


def _d(st: str | None, torch: str | None, bits: int, *storages: str, plan: bool = False, cast: bool = False) -> DType:
    return DType(safetensors=st, torch=torch, bits=bits, storages=storages, plannable=plan, castable=cast)


DTYPES: tuple[DType, ...] = (
    _d("BOOL", "bool", 8, "torch.BoolStorage", plan=True),
    # UntypedStorage is byte-addressed: a pickle that names it holds uint8 storage.
    _d("U8", "uint8", 8, "torch.ByteStorage", "torch.UntypedStorage", "torch.storage.UntypedStorage", plan=True),
    _d("I8", "int8", 8, "torch.CharStorage", plan=True),
    _d("F8_E5M2", "float8_e5m2", 8, plan=True),
    _d("F8_E4M3", "float8_e4m3fn", 8, plan=True),
    _d("F8_E8M0", "float8_e8m0fnu", 8),
    # Accepted as a safetensors code since the validator was written (kept: behaviour unchanged).
    _d("E8M0", None, 8),
    _d(None, "float8_e4m3fnuz", 8),
    _d(None, "float8_e5m2fnuz", 8),
    _d("I16", "int16", 16, "torch.ShortStorage", plan=True),
    _d("U16", "uint16", 16, plan=True),
    _d("F16", "float16", 16, "torch.HalfStorage", plan=True, cast=True),
    _d("BF16", "bfloat16", 16, "torch.BFloat16Storage", plan=True, cast=True),
    _d("I32", "int32", 32, "torch.IntStorage", plan=True),
    _d("U32", "uint32", 32, plan=True),
    _d("F32", "float32", 32, "torch.FloatStorage", plan=True, cast=True),
    _d("I64", "int64", 64, "torch.LongStorage", plan=True),
    _d("U64", "uint64", 64, plan=True),
    _d("F64", "float64", 64, "torch.DoubleStorage", plan=True, cast=True),
    _d(None, "complex32", 32),
    _d("C64", "complex64", 64, "torch.ComplexFloatStorage"),
    _d(None, "complex128", 128, "torch.ComplexDoubleStorage"),
    _d("F4", None, 4),
    _d("F6_E2M3", None, 6),
    _d("F6_E3M2", None, 6),
)


def _unique(key: str) -> None:
    seen: set[str] = set()
    for d in DTYPES:
        v = getattr(d, key)
        if v is not None and v in seen:
            raise ValueError(f"dtype {key} {v!r} is listed twice")
        if v is not None:
            seen.add(v)


_unique("safetensors")
_unique("torch")

#: safetensors code -> bits per element: every code the strict header validator accepts.
SAFETENSORS_BITS: Mapping[str, int] = MappingProxyType(
    {d.safetensors: d.bits for d in DTYPES if d.safetensors is not None}
)
#: torch dtype name -> bytes per element: every dtype the static reader and the worker accept.
TORCH_ITEMSIZE: Mapping[str, int] = MappingProxyType(
    {d.torch: d.itemsize for d in DTYPES if d.torch is not None and d.itemsize is not None}
)
#: torch dtype name -> the safetensors code a consolidation plan writes for it.
TORCH_TO_SAFETENSORS: Mapping[str, str] = MappingProxyType(
    {d.torch: d.safetensors for d in DTYPES if d.plannable and d.torch and d.safetensors}
)
#: safetensors code -> bytes per element, for the codes a consolidation plan may write.
PLAN_ITEMSIZE: Mapping[str, int] = MappingProxyType(
    {d.safetensors: d.itemsize for d in DTYPES if d.plannable and d.safetensors and d.itemsize}
)
#: Floating-point codes a plan can be cast between (on request only): the F8 types are left as they are.
CASTABLE: frozenset[str] = frozenset(d.safetensors for d in DTYPES if d.castable and d.safetensors)
#: Legacy typed-storage class -> torch dtype name.
STORAGE_DTYPES: Mapping[str, str] = MappingProxyType(
    {s: d.torch for d in DTYPES if d.torch is not None for s in d.storages}
)
