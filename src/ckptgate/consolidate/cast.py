"""Floating-point conversion of raw little-endian tensor bytes, bit for bit as torch's ``.to()``
for every value but NaN.

Used only when the user asks for a cast (``ckptgate intake --dtype``); otherwise the writer moves
bytes unchanged.  Conversions go through float32, as torch's do (``c10::Half`` and
``c10::BFloat16`` are built from a float), so F64 to F16 or BF16 rounds twice, as in torch.
Rounding is to nearest, ties to even; overflow gives infinity.  A NaN stays a NaN with its sign and
the top bits of its payload (quieted for BF16); torch's own NaN bits differ between its scalar and
vectorised paths, so no NaN pattern is promised beyond that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptgate.consolidate.plan import DTYPE_SIZES
from ckptgate.dtypes import CASTABLE

if TYPE_CHECKING:
    import numpy as np

__all__ = ["convert"]

_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}


def _wide(data: memoryview, src: str) -> np.ndarray:
    """``data`` as float32 (float64 for F64), exactly."""
    import numpy as np  # noqa: PLC0415 — numpy, heavy optional (not in the core install): only a cast needs it

    if src == "BF16":
        return (np.frombuffer(data, "<u2").astype("<u4") << 16).view("<f4")
    a = np.frombuffer(data, _NUMPY[src])
    return a if src == "F64" else a.astype("<f4", copy=False)


def convert(data: memoryview | bytes, src: str, dst: str) -> bytes:
    """Whole elements of ``src`` in ``data``, as ``dst`` bytes."""
    # numpy, heavy optional (not in the core install); measured start-up cost 200-290 ms: only a cast needs it
    import numpy as np  # noqa: PLC0415

    if src not in CASTABLE or dst not in CASTABLE:
        raise ValueError(f"cannot convert {src} to {dst}")
    if len(data) % DTYPE_SIZES[src]:
        raise ValueError("data ends inside an element")
    a = _wide(memoryview(data), src)
    if dst == "F64":
        with np.errstate(invalid="ignore"):
            return a.astype("<f8").tobytes()
    a = a.astype("<f4", copy=False)  # F64 narrows to float32 first, as in torch
    if dst == "F32":
        return a.tobytes()
    if dst == "F16":
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype("<f2").tobytes()
    u = a.view("<u4")
    out = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype("<u2")  # BF16: round to nearest even
    nan = np.isnan(a)
    out[nan] = (u[nan] >> 16 | 0x0040).astype("<u2")
    return bytes(out.tobytes())
