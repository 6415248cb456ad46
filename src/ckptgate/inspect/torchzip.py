"""Tensor layout of a ``torch.save`` zip, read statically (``<prefix>/data.pkl`` + ``data/<key>``).

The zip structure is checked first (:mod:`ckptgate.inspect.zipcheck`, stored entries only), then
``data.pkl`` is read by the static reader and interpreted symbolically: each
``torch._utils._rebuild_tensor_v2/_v3`` call names a storage by key, and the layout records the
dtype, shape, stride, storage offset and the absolute byte range of its storage, so raw bytes can
be moved without unpickling.  Storages shorter than the tensor view needs are refused [R29].
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.allowlist import DTYPE_ITEMSIZE, STORAGE_DTYPES
from ckptgate.inspect.budget import WorkBudget
from ckptgate.inspect.findings import Finding, error, warning
from ckptgate.inspect.pickle import (Call, Global, PersId, PickleLimits, PickleReport, SDict, SList, key_text,
                                     read_pickle)
from ckptgate.inspect.zipcheck import CrcMode, DeferredCrcs, ZipReport, check_zip, verify_crcs

__all__ = ["TensorRecord", "TorchZipLayout", "inspect_torch_zip", "walk_value"]

MAX_DATA_PKL = PickleLimits().max_bytes  # the reader's own cap: data.pkl is read whole
_MAX_NODES = 5_000_000
_KNOWN_RECORDS = {"byteorder", "version", ".format_version", ".storage_alignment", ".data/serialization_id",
                  ".data/version"}


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
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "stride": list(self.stride),
                "storage_offset": self.storage_offset, "storage_key": self.storage_key,
                "storage_dtype": self.storage_dtype, "storage_nbytes": self.storage_nbytes,
                "storage_range": list(self.storage_range), "contiguous": self.contiguous}


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchZipLayout:
    prefix: str
    tensors: tuple[TensorRecord, ...]
    values: dict[str, str]  # non-tensor leaves: key path -> type name
    pickle: PickleReport

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "tensors": [t.to_json() for t in self.tensors],
                "values": dict(self.values), "pickle": self.pickle.to_json()}


def _ints(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, Call) and isinstance(v.func, Global) and v.func.dotted == "torch.Size" \
            and isinstance(v.args, tuple) and len(v.args) == 1:
        v = v.args[0]
    if isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    return None


def _tensor_args(c: Call) -> tuple[str, tuple[Any, ...]] | None:
    """Return (rebuild function, its args) for a tensor-rebuilding call, else None."""
    f = c.func.dotted if isinstance(c.func, Global) else None
    if f in ("torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3") and isinstance(c.args, tuple):
        return f, c.args
    if f == "torch._utils._rebuild_parameter" and isinstance(c.args, tuple) and c.args \
            and isinstance(c.args[0], Call):
        return _tensor_args(c.args[0])
    if f == "torch._tensor._rebuild_from_type_v2" and isinstance(c.args, tuple) and len(c.args) >= 3 \
            and isinstance(c.args[0], Global) and isinstance(c.args[2], tuple) \
            and isinstance(c.args[1], Global) and c.args[1].dotted in ("torch.Tensor", "torch.nn.parameter.Parameter"):
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


def inspect_torch_zip(fd: int, size: int, *, path: str, base: int = 0, context: str = "tensors",
                      verify_crc: CrcMode = True,
                      work: WorkBudget | None = None) -> tuple[TorchZipLayout | None, tuple[Finding, ...]]:
    """Check and read the torch zip at ``[base, base + size)`` of ``fd``; with :class:`DeferredCrcs`
    the CRC pass is left to it (every entry is stored).  ``data.pkl`` is read within a per-file
    budget for its bytes, charged to ``work`` (the whole tree's) too."""
    # structure first; the CRC pass (a full read) runs last, only if everything cheap passed
    zr: ZipReport = check_zip(fd, size, path=path, base=base, verify_crc=False, stored_only=True)
    findings: list[Finding] = list(zr.findings)
    if not zr.ok:
        return None, tuple(findings)
    names = zr.by_name()
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1:
        findings.append(error("torch.bad_archive", path, "torch zip entries do not share one top-level folder",
                              tops=sorted(tops)[:10]))
        return None, tuple(findings)
    prefix = next(iter(tops))
    rel = {n[len(prefix) + 1:]: e for n, e in names.items()}
    if "constants.pkl" in rel or any(r.startswith("code/") for r in rel):
        findings.append(error("torch.torchscript_archive", path,
                              "a TorchScript archive (code/, constants.pkl) is not a weights file"))
        return None, tuple(findings)
    pkl = rel.get("data.pkl")
    if pkl is None:
        findings.append(error("torch.no_data_pkl", path, "torch zip without data.pkl"))
        return None, tuple(findings)
    if pkl.size > MAX_DATA_PKL:
        findings.append(error("torch.data_pkl_too_large", path, "data.pkl exceeds the size cap", size=pkl.size))
        return None, tuple(findings)
    bo = rel.get("byteorder")
    if bo is not None and os.pread(fd, min(bo.size, 16), base + bo.data_offset) != b"little":
        findings.append(error("torch.byteorder", path, "storages are not little-endian"))
    for r in rel:
        if r != "data.pkl" and not r.startswith("data/") and r not in _KNOWN_RECORDS:
            findings.append(warning("torch.unknown_record", path, f"unexpected record {r!r} in the torch zip",
                                    record=r))
    data = os.pread(fd, pkl.size, base + pkl.data_offset)
    rep = read_pickle(data, path=path, context=context, work=work.file(path, pkl.size) if work is not None else None)
    findings.extend(rep.findings)
    tensors: list[TensorRecord] = []
    values: dict[str, str] = {}
    used: dict[str, str] = {}

    def visit(p: str, v: Any) -> bool:
        if isinstance(v, Call):
            ta = _tensor_args(v)
            if ta is None:
                if v.dict_items is None:
                    values[p] = f"call:{v.func.dotted if isinstance(v.func, Global) else '?'}"
                    return True
                return False
            t = _tensor(p, ta, rel, base, findings, path, used)
            if t is not None:
                tensors.append(t)
            return True
        if isinstance(v, (SDict, SList, tuple)):
            return False
        values[p] = type(v).__name__
        return True

    if rep.value is not None:
        if not walk_value(rep.value, visit, max_nodes=rep.tree_units):
            findings.append(error("pickle.expansion_limit", path, "the pickle's object graph exceeds the "
                                  "node budget (memo expansion)"))
    for r in rel:
        if r.startswith("data/") and r[5:] not in used:
            findings.append(warning("torch.storage_unreferenced", path, f"storage {r} is never referenced",
                                    record=r))
    for r, e in rel.items():
        if r.startswith("data/") and e.size >= 8:
            head = os.pread(fd, 4, base + e.data_offset)
            if head == b"PK\x03\x04" or (head[0] == 0x80 and head[1] in (2, 3, 4, 5)):
                findings.append(warning("torch.storage_looks_like_pickle", path,
                                        f"storage {r} starts like a pickle or zip", record=r))
    if isinstance(verify_crc, DeferredCrcs) and not any(f.severity == "error" for f in findings):
        verify_crc.add(path, base, zr.entries)
    elif verify_crc and not any(f.severity == "error" for f in findings):
        findings.extend(verify_crcs(fd, size, zr.entries, path=path, base=base))
    layout = TorchZipLayout(prefix=prefix, tensors=tuple(tensors), values=values, pickle=rep)
    return layout, tuple(findings)


def _tensor(name: str, ta: tuple[str, tuple[Any, ...]], rel: dict[str, Any], base: int,
            findings: list[Finding], path: str, used: dict[str, str]) -> TensorRecord | None:
    fn, args = ta
    bad = error("torch.unrecognised_tensor", path, f"tensor {name!r} is not in a recognised form", name=name)
    if len(args) < 6 or not isinstance(args[0], PersId):
        findings.append(bad)
        return None
    pid = args[0].pid
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], Global)
            and isinstance(pid[2], str) and isinstance(pid[4], int)):
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
    if sdtype is None or dtype not in DTYPE_ITEMSIZE or not isinstance(off, int) or shape is None \
            or stride is None or len(shape) != len(stride) or off < 0 or any(s < 0 for s in stride + shape):
        findings.append(bad)
        return None
    key = pid[2]
    if used.setdefault(key, sdtype) != sdtype:
        findings.append(error("torch.storage_dtype_conflict", path, f"storage {key} is used with two dtypes",
                              key=key))
    entry = rel.get(f"data/{key}")
    if entry is None:
        findings.append(error("torch.storage_missing", path, f"tensor {name!r} names storage {key}, which is "
                              "not in the archive", name=name, key=key))
        return None
    snbytes = pid[4] * DTYPE_ITEMSIZE[sdtype]
    if entry.size != snbytes:
        findings.append(error("torch.storage_size_mismatch", path, f"storage {key} holds {entry.size} bytes "
                              f"but declares {snbytes}", key=key, size=entry.size, declared=snbytes))
        return None
    isz = DTYPE_ITEMSIZE[dtype]
    numel = 1
    for d in shape:
        numel *= d
    if numel:
        last = off + sum((d - 1) * s for d, s in zip(shape, stride, strict=True))
        if (last + 1) * isz > entry.size:
            findings.append(error("torch.tensor_out_of_bounds", path, f"tensor {name!r} reads past the end of "
                                  f"storage {key}", name=name, key=key, need=(last + 1) * isz, size=entry.size))
            return None
    start = base + entry.data_offset
    return TensorRecord(name=name, dtype=dtype, shape=shape, stride=stride, storage_offset=off, storage_key=key,
                        storage_dtype=sdtype, storage_nbytes=entry.size, storage_range=(start, start + entry.size))
