"""Tensor records of a torch zip, read from the symbolic value of its ``data.pkl``.

Each ``torch._utils._rebuild_tensor_v2/_v3`` call (bare, inside ``_rebuild_parameter`` or
``_rebuild_from_type_v2``) names a storage by key; :class:`TensorRecord` keeps the dtype, shape,
stride, storage offset and the absolute byte range of that storage (``data/<key>``, resolved as torch
resolves it: :mod:`ckptgate.inspect.torchrecords`), so raw bytes can be moved without unpickling.
Storages shorter than the tensor view needs are refused [R29].  :func:`walk_value` is the bounded
depth-first walk of a symbolic value that finds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.allowlist import DTYPE_ITEMSIZE, STORAGE_DTYPES
from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.pickle import Call, Global, PersId, PickleReport, SDict, SList, key_text
from ckptgate.inspect.torchrecords import _Records
from ckptgate.shapes import MAX_DIM, MAX_NDIM, dims_in_bounds

__all__ = ["TensorRecord", "walk_value"]

_MAX_NODES = 5_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorRecord:
    name: str  # dotted key path
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int  # in elements
    storage_key: str
    storage_dtype: str
    storage_nbytes: int
    storage_range: tuple[int, int]  # absolute [start, end) in the file

    @property
    def contiguous(self) -> bool:
        expect = 1
        for d, s in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if d != 1 and s != expect:
                return False
            expect *= d
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "stride": list(self.stride),
            "storage_offset": self.storage_offset,
            "storage_key": self.storage_key,
            "storage_dtype": self.storage_dtype,
            "storage_nbytes": self.storage_nbytes,
            "storage_range": list(self.storage_range),
            "contiguous": self.contiguous,
        }


def _ints(v: Any) -> tuple[int, ...] | None:
    if (
        isinstance(v, Call)
        and isinstance(v.func, Global)
        and v.func.dotted == "torch.Size"
        and isinstance(v.args, tuple)
        and len(v.args) == 1
    ):
        v = v.args[0]
    if isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    return None


def _tensor_args(c: Call) -> tuple[str, tuple[Any, ...]] | None:
    """Return (rebuild function, its args) for a tensor-rebuilding call, else None."""
    f = c.func.dotted if isinstance(c.func, Global) else None
    if f in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3") and isinstance(c.args, tuple):
        return f, c.args
    if f == "torch._utils._rebuild_parameter" and isinstance(c.args, tuple) and c.args and isinstance(c.args[0], Call):
        return _tensor_args(c.args[0])
    if (
        f == "torch._tensor._rebuild_from_type_v2"
        and isinstance(c.args, tuple)
        and len(c.args) >= 3
        and isinstance(c.args[0], Global)
        and isinstance(c.args[2], tuple)
        and isinstance(c.args[1], Global)
        and c.args[1].dotted in ("torch.Tensor", "torch.nn.parameter.Parameter")
    ):
        return _tensor_args(Call(opcode="REDUCE", func=c.args[0], args=c.args[2]))
    return None


_key = key_text


def walk_value(value: Any, visit: Any, *, max_nodes: int = _MAX_NODES) -> bool:
    """Depth-first walk calling ``visit(path, node)``; ``visit`` returns True to stop descending.

    Returns False when the node budget ran out (memo-expansion guard).  Pass a report's
    :attr:`~ckptgate.inspect.pickle.PickleReport.tree_units`: the reader measured and charged the
    tree before it kept the value, so a walk within it is paid for.
    """
    budget = [max_nodes]
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if visit(path, v):
            continue
        children: list[tuple[str, Any]] = []
        if isinstance(v, SDict):
            children = [(f"{path}.{_key(k)}" if path else _key(k), x) for k, x in v.items]
        elif isinstance(v, Call) and v.dict_items is not None:
            children = [(f"{path}.{_key(k)}" if path else _key(k), x) for k, x in v.dict_items]
        elif isinstance(v, (SList, tuple)):
            items = v.items if isinstance(v, SList) else v
            children = [(f"{path}.{i}" if path else str(i), x) for i, x in enumerate(items)]
        stack.extend(reversed(children))
    return True


def _persistent_storages(
    rep: PickleReport, records: _Records, used: dict[str, str], findings: list[Finding], path: str
) -> set[str]:
    """Resolve ``data/<key>`` for every persistent id the pickle holds, as ``torch.load``'s
    ``persistent_load`` does for each one it reads (``("storage", type, key, location, numel)``,
    ``f"data/{key}"``), wherever it ends up: inside a recognised tensor (already resolved, in
    ``used``), an unrecognised call, or nowhere.  Returns the keys named."""
    named: set[str] = set()
    for pid in rep.persistent_ids:
        key = pid[2] if isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage") else None
        if not isinstance(key, str) and not (isinstance(key, int) and not isinstance(key, bool)):
            findings.append(
                error(
                    "torch.unrecognised_persistent_id",
                    path,
                    "a persistent id is not a storage reference torch.load would resolve",
                    pid=repr(pid)[:200],
                )
            )
            continue
        key = str(key)
        if key in used or key in named:
            continue
        named.add(key)
        if records.get(f"data/{key}") is None:
            findings.append(
                error(
                    "torch.storage_missing",
                    path,
                    f"the pickle names storage {key}, which is not in the archive",
                    key=key,
                )
            )
    return named


def _tensor(
    name: str,
    ta: tuple[str, tuple[Any, ...]],
    records: _Records,
    base: int,
    findings: list[Finding],
    path: str,
    used: dict[str, str],
) -> TensorRecord | None:
    fn, args = ta
    bad = error("torch.unrecognised_tensor", path, f"tensor {name!r} is not in a recognised form", name=name)
    if len(args) < 6 or not isinstance(args[0], PersId):
        findings.append(bad)
        return None
    pid = args[0].pid
    if not (
        isinstance(pid, tuple)
        and len(pid) == 5
        and pid[0] == "storage"
        and isinstance(pid[1], Global)
        and isinstance(pid[2], str)
        and isinstance(pid[4], int)
    ):
        findings.append(bad)
        return None
    sdtype = STORAGE_DTYPES.get(pid[1].dotted)
    off, shape, stride = args[1], _ints(args[2]), _ints(args[3])
    dtype = sdtype
    if fn.endswith("_v3"):
        if len(args) < 7 or not isinstance(args[6], Global) or args[6].module != "torch":
            findings.append(bad)
            return None
        dtype = args[6].name
    if (
        sdtype is None
        or dtype is None
        or dtype not in DTYPE_ITEMSIZE
        or not isinstance(off, int)
        or shape is None
        or stride is None
        or len(shape) != len(stride)
        or off < 0
        or any(s < 0 for s in stride + shape)
    ):
        findings.append(bad)
        return None
    if not (dims_in_bounds(shape) and dims_in_bounds(stride) and dims_in_bounds((off, pid[4]))):
        findings.append(
            error(
                "torch.tensor_geometry",
                path,
                f"tensor {name!r} has {len(shape)} dimensions or a size, stride, offset or storage numel "
                f"outside int64; torch holds at most {MAX_NDIM} here, each at most {MAX_DIM}",
                name=name,
                ndim=len(shape),
            )
        )
        return None
    key = pid[2]
    if used.setdefault(key, sdtype) != sdtype:
        findings.append(error("torch.storage_dtype_conflict", path, f"storage {key} is used with two dtypes", key=key))
    entry = records.get(f"data/{key}")
    if entry is None:
        findings.append(
            error(
                "torch.storage_missing",
                path,
                f"tensor {name!r} names storage {key}, which is not in the archive",
                name=name,
                key=key,
            )
        )
        return None
    snbytes = pid[4] * DTYPE_ITEMSIZE[sdtype]
    if entry.size != snbytes:
        findings.append(
            error(
                "torch.storage_size_mismatch",
                path,
                f"storage {key} holds {entry.size} bytes but declares {snbytes}",
                key=key,
                size=entry.size,
                declared=snbytes,
            )
        )
        return None
    isz = DTYPE_ITEMSIZE[dtype]
    numel = 1
    for d in shape:
        numel *= d
    if numel:
        last = off + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))
        if (last + 1) * isz > entry.size:
            findings.append(
                error(
                    "torch.tensor_out_of_bounds",
                    path,
                    f"tensor {name!r} reads past the end of storage {key}",
                    name=name,
                    key=key,
                    need=(last + 1) * isz,
                    size=entry.size,
                )
            )
            return None
    start = base + entry.data_offset
    return TensorRecord(
        name=name,
        dtype=dtype,
        shape=shape,
        stride=stride,
        storage_offset=off,
        storage_key=key,
        storage_dtype=sdtype,
        storage_nbytes=entry.size,
        storage_range=(start, start + entry.size),
    )
