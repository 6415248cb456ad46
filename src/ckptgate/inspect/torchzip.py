"""Tensor layout of a ``torch.save`` zip, read statically (``<prefix>/data.pkl`` + ``data/<key>``).

The zip structure is checked first (:mod:`ckptgate.inspect.zipcheck`, stored entries only), then
``data.pkl`` is read by the static reader and interpreted symbolically: each
``torch._utils._rebuild_tensor_v2/_v3`` call names a storage by key, and the layout records the
dtype, shape, stride, storage offset and the absolute byte range of its storage, so raw bytes can
be moved without unpickling (the tensor records: :mod:`ckptgate.inspect.torchtensors`).  Storages
shorter than the tensor view needs are refused [R29].

Records are resolved exactly as torch's reader resolves them, so the bytes read here are the bytes
``torch.load`` would read (how torch does it, and how a lookup is refused unless its match is
unique and exact: :mod:`ckptgate.inspect.torchrecords`).  Names must all carry the first entry's
prefix.  This module composes those steps (:func:`inspect_torch_zip`) and re-exports the names it
exported before they moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.budget import WorkBudget
from ckptgate.inspect.findings import Finding, error, warning
from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.pickle import Call, Global, PickleLimits, PickleReport, SDict, SList, read_pickle
from ckptgate.inspect.torchrecords import TORCH_READS, _Records
from ckptgate.inspect.torchtensors import TensorRecord, _persistent_storages, _tensor, _tensor_args, walk_value
from ckptgate.inspect.zipcheck import CrcMode, DeferredCrcs, ZipReport, check_zip, verify_crcs

__all__ = ["TensorRecord", "TorchZipLayout", "inspect_torch_zip", "walk_value"]

MAX_DATA_PKL = PickleLimits().max_bytes  # the reader's own cap: data.pkl is read whole
_KNOWN_RECORDS = set(TORCH_READS) - {"data.pkl"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchZipLayout:
    prefix: str
    tensors: tuple[TensorRecord, ...]
    values: dict[str, str]  # non-tensor leaves: key path -> type name
    pickle: PickleReport
    #: every record torch would read that is present, resolved as torch resolves it: record name
    #: (``data.pkl``, ``data/<key>``, ...) -> absolute ``[start, end)`` of its bytes in the file
    records: dict[str, tuple[int, int]]

    def to_json(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "tensors": [t.to_json() for t in self.tensors],
            "values": dict(self.values),
            "pickle": self.pickle.to_json(),
        }


def inspect_torch_zip(
    src: HashedFile,
    size: int,
    *,
    path: str,
    base: int = 0,
    context: str = "tensors",
    verify_crc: CrcMode = True,
    work: WorkBudget | None = None,
) -> tuple[TorchZipLayout | None, tuple[Finding, ...]]:
    """Check and read the torch zip at ``[base, base + size)`` of ``src``; with :class:`DeferredCrcs`
    the CRC pass is left to it (every entry is stored).  ``data.pkl`` is read within a per-file
    budget for its bytes, charged to ``work`` (the whole tree's) too."""
    # structure first; the CRC pass (a full read) runs last, only if everything cheap passed
    zr: ZipReport = check_zip(src, size, path=path, base=base, verify_crc=False, stored_only=True)
    findings: list[Finding] = list(zr.findings)
    if not zr.ok:
        return None, tuple(findings)
    names = zr.by_name()
    first = zr.entries[0].name if zr.entries else ""
    prefix = first.split("/", 1)[0]
    if "/" not in first or any(not n.startswith(prefix + "/") for n in names):
        findings.append(
            error(
                "torch.bad_archive",
                path,
                "torch zip entries do not all sit under the first entry's top-level folder",
                prefix=prefix,
                tops=sorted({n.split("/", 1)[0] for n in names})[:10],
            )
        )
        return None, tuple(findings)
    rel = {n[len(prefix) + 1 :]: e for n, e in names.items()}
    records = _Records(prefix, zr.entries, base, path, findings)
    if "constants.pkl" in rel or any(r.startswith("code/") for r in rel):
        findings.append(
            error(
                "torch.torchscript_archive", path, "a TorchScript archive (code/, constants.pkl) is not a weights file"
            )
        )
        return None, tuple(findings)
    for r in TORCH_READS:
        records.get(r)
    pkl = records.get("data.pkl")
    if pkl is None:
        findings.append(error("torch.no_data_pkl", path, "torch zip without a data.pkl torch would read"))
        return None, tuple(findings)
    if pkl.size > MAX_DATA_PKL:
        findings.append(error("torch.data_pkl_too_large", path, "data.pkl exceeds the size cap", size=pkl.size))
        return None, tuple(findings)
    bo = records.get("byteorder")
    if bo is not None and src.pread(min(bo.size, 16), base + bo.data_offset) != b"little":
        findings.append(error("torch.byteorder", path, "storages are not little-endian"))
    for r in rel:
        if r != "data.pkl" and not r.startswith("data/") and r not in _KNOWN_RECORDS:
            findings.append(
                warning("torch.unknown_record", path, f"unexpected record {r!r} in the torch zip", record=r)
            )
    data = src.pread(pkl.size, base + pkl.data_offset)
    rep = read_pickle(data, path=path, context=context, work=work.file(path, pkl.size) if work is not None else None)
    findings.extend(rep.findings)
    tensors: list[TensorRecord] = []
    values: dict[str, str] = {}
    used: dict[str, str] = {}

    leaves: set[str] = set()  # the names given so far
    named_twice: set[str] = set()

    def leaf(p: str) -> None:
        """A tensor or value is named by its key path: two under one name are never two readings.
        A key the reader could not compare (a call's result, a long or nested tuple) repeats
        there, where torch.load keeps the last value alone; distinct keys such as ``1`` and
        ``'1'``, or ``'a.b'`` and ``a`` -> ``b``, are one name to the layout and to a plan."""
        if p in leaves and p not in named_twice:
            named_twice.add(p)
            findings.append(
                error(
                    "torch.name_repeats",
                    path,
                    f"two values of the pickle are named {p[:200]!r} (a key that repeats, or keys "
                    "written alike): torch.load keeps one value of a repeated key, the layout listed both",
                    name=p[:200],
                )
            )
        leaves.add(p)

    def visit(p: str, v: Any) -> bool:
        if isinstance(v, Call):
            ta = _tensor_args(v)
            if ta is None:
                if v.dict_items is None:
                    leaf(p)
                    values[p] = f"call:{v.func.dotted if isinstance(v.func, Global) else '?'}"
                    return True
                return False
            leaf(p)
            t = _tensor(p, ta, records, base, findings, path, used)
            if t is not None:
                tensors.append(t)
            return True
        if isinstance(v, (SDict, SList, tuple)):
            return False
        leaf(p)
        values[p] = type(v).__name__
        return True

    if rep.value is not None and not walk_value(rep.value, visit, max_nodes=rep.tree_units):
        findings.append(
            error("pickle.expansion_limit", path, "the pickle's object graph exceeds the node budget (memo expansion)")
        )
    named = _persistent_storages(rep, records, used, findings, path)
    for r in rel:
        if r.startswith("data/") and r[5:] not in used and r[5:] not in named:
            findings.append(warning("torch.storage_unreferenced", path, f"storage {r} is never referenced", record=r))
    for r, e in rel.items():
        if r.startswith("data/") and e.size >= 8:
            head = src.pread(4, base + e.data_offset)
            if head == b"PK\x03\x04" or (head[0] == 0x80 and head[1] in (2, 3, 4, 5)):
                findings.append(
                    warning(
                        "torch.storage_looks_like_pickle", path, f"storage {r} starts like a pickle or zip", record=r
                    )
                )
    if isinstance(verify_crc, DeferredCrcs) and not any(f.severity == "error" for f in findings):
        verify_crc.add(path, base, zr.entries)
    elif verify_crc and not any(f.severity == "error" for f in findings):
        findings.extend(verify_crcs(src, size, zr.entries, path=path, base=base))
    layout = TorchZipLayout(prefix=prefix, tensors=tuple(tensors), values=values, pickle=rep, records=records.ranges())
    return layout, tuple(findings)
