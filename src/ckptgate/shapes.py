"""The bounds a tensor geometry read from a pickle must keep (torch zip tensors, DCP metadata,
DeepSpeed's parameter shapes): rank, and each dimension.  (Safetensors headers have their own check,
``inspect.safetensors``: a header is JSON, bounded in size, whose shape product is checked as usize.)

torch keeps sizes, strides and offsets as int64 and safetensors as usize; no model tensor has
more than a handful of dimensions.  A geometry outside these bounds is no tensor a loader would
build, and it is costly to handle: the product of n wide dimensions takes time quadratic in n
(a 4 MB pickle held a million-dimension shape whose numel took hours), and a dimension of
thousands of digits cannot even be printed.  Readers refuse such a geometry before any
arithmetic on it.  Any step may import this module; it imports nothing from ckptgate.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_DIM", "MAX_NDIM", "dims_in_bounds"]

#: Dimensions of one tensor: far above any model's (torch itself sets no limit).
MAX_NDIM = 64
#: The largest size, stride or offset: int64's maximum, what torch can hold.
MAX_DIM = (1 << 63) - 1


def dims_in_bounds(dims: Any, *, max_dim: int = MAX_DIM) -> bool:
    """Whether ``dims`` is a sequence of at most :data:`MAX_NDIM` integers (no bools) in
    ``[0, max_dim]``."""
    return len(dims) <= MAX_NDIM and all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= max_dim for d in dims
    )
