"""Tensor layout of a ``torch.save`` zip, read statically (``<prefix>/data.pkl`` + ``data/<key>``).

The zip structure is checked first (:mod:`ckptgate.inspect.zipcheck`, stored entries only), then
``data.pkl`` is read by the static reader and interpreted symbolically: each
``torch._utils._rebuild_tensor_v2/_v3`` call names a storage by key, and the layout records the
dtype, shape, stride, storage offset and the absolute byte range of its storage, so raw bytes can
be moved without unpickling.  Storages shorter than the tensor view needs are refused [R29].

Records are resolved exactly as torch's reader resolves them, so the bytes read here are the bytes
``torch.load`` would read.  How torch does it (``caffe2/serialize/inline_container.cc``,
``PyTorchStreamReader``, over miniz; checked against the installed torch by
``tests/inspect/test_torchzip_differential.py``):

* The archive's prefix is the part before the first ``/`` of the *first central-directory entry*
  (``init``: an entry without ``/`` is an error).  ``getAllRecords`` then requires every name to
  start with ``prefix + "/"`` (``strncmp``: exact, case-sensitive).
* ``getRecord(name)`` / ``hasRecord(name)`` / ``getRecordOffset(name)`` call
  ``mz_zip_reader_locate_file(archive, prefix + "/" + name, NULL, 0)``.  With flags 0 miniz takes
  its sorted path: a binary search over the central directory sorted by ``mz_zip_reader_filename_less``,
  both comparing with ``MZ_TOLOWER``, i.e. **ASCII case-insensitively** (non-ASCII bytes compare
  exactly).  Among several entries that are equal under that folding it returns whichever the
  binary search meets over an unstable heap sort: neither the first nor the last in record order.
  So ``archive/data.pkl`` then ``archive/DATA.PKL`` is read as ``DATA.PKL`` (issue #16).  The
  name is a C string: the lookup stops at a NUL byte.
* The data of an entry starts at its *local* header offset + 30 + the *local* header's name and
  extra lengths (miniz's extract and ``getRecordOffset`` alike); miniz does not compare the local
  name with the central one.  :mod:`ckptgate.inspect.zipcheck` requires them to agree, and the
  sizes and CRC too, for every entry.
* What ``torch.load`` reads: in ``init``, ``.data/serialization_id`` (if present) and
  ``.data/version`` or else ``version``; in ``torch.serialization._load``, ``byteorder``,
  ``.format_version`` and ``.storage_alignment`` (each if present), ``data.pkl``, and
  ``data/<key>`` for each storage the pickle names (``get_storage_from_record``, or
  ``get_record_offset`` with ``mmap=True``).  A zip whose records include ``constants.pkl`` (exact
  name) is handed to ``torch.jit.load``.  ``persistent_load`` builds the name as ``f"data/{key}"``
  from the pickled key, whatever its type.
* Records ending ``.debug_pkl`` are hidden only when the reader's ``load_debug_symbol_`` is off; it
  is on by default, and ``torch.load`` reads them like any other (checked on torch 2.13).

Here each of those records is resolved the same way (:class:`_Records`), and refused unless the
match is unique and exact: two entries one lookup could open (``zip.name_collision`` from the zip
check, and ``torch.ambiguous_record`` here) or an entry that answers for a record only under case
folding or NUL truncation (``torch.record_name_mismatch``).  Names must all carry the first entry's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.allowlist import DTYPE_ITEMSIZE, STORAGE_DTYPES
from ckptgate.inspect.budget import WorkBudget
from ckptgate.inspect.findings import Finding, error, warning
from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.pickle import (
    Call,
    Global,
    PersId,
    PickleLimits,
    PickleReport,
    SDict,
    SList,
    key_text,
    read_pickle,
)
from ckptgate.inspect.zipcheck import CrcMode, DeferredCrcs, ZipEntry, ZipReport, check_zip, verify_crcs

__all__ = ["TensorRecord", "TorchZipLayout", "inspect_torch_zip", "walk_value"]

MAX_DATA_PKL = PickleLimits().max_bytes  # the reader's own cap: data.pkl is read whole
_MAX_NODES = 5_000_000
#: Records ``torch.load`` reads when present, besides ``data/<key>`` (see the module docstring).
TORCH_READS = (
    "data.pkl",
    "byteorder",
    "version",
    ".data/version",
    ".data/serialization_id",
    ".format_version",
    ".storage_alignment",
)
_KNOWN_RECORDS = set(TORCH_READS) - {"data.pkl"}


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


class _Records:
    """Record name -> the zip entry torch's reader opens for it (miniz's ASCII case-insensitive
    lookup of ``prefix/name``), refusing ambiguous and inexact matches with findings."""

    def __init__(
        self, prefix: str, entries: tuple[ZipEntry, ...], base: int, path: str, findings: list[Finding]
    ) -> None:
        self.prefix, self.base, self.path, self.findings = prefix, base, path, findings
        self.folded: dict[bytes, list[ZipEntry]] = {}
        for e in entries:
            self.folded.setdefault(e.name.encode("utf-8").lower(), []).append(e)  # bytes.lower: ASCII only
        self.resolved: dict[str, ZipEntry | None] = {}

    def get(self, record: str) -> ZipEntry | None:
        if record in self.resolved:
            return self.resolved[record]
        want = f"{self.prefix}/{record}"
        # miniz compares C strings: a NUL ends the name torch looks up
        found = self.folded.get(want.encode("utf-8", "surrogatepass").split(b"\0", 1)[0].lower(), [])
        entry = None
        if len(found) > 1:
            self.findings.append(
                error(
                    "torch.ambiguous_record",
                    self.path,
                    f"record {record!r} matches "
                    f"{len(found)} entries under torch's case-insensitive lookup; which one "
                    "torch reads is miniz's choice",
                    record=record,
                    entries=[e.name for e in found][:10],
                )
            )
        elif found and found[0].name != want:
            self.findings.append(
                error(
                    "torch.record_name_mismatch",
                    self.path,
                    f"torch reads entry {found[0].name!r} for record {record!r} (its lookup "
                    "ignores ASCII case and stops at a NUL)",
                    record=record,
                    entry=found[0].name,
                )
            )
        elif found:
            entry = found[0]
        self.resolved[record] = entry
        return entry

    def ranges(self) -> dict[str, tuple[int, int]]:
        return {
            r: (self.base + e.data_offset, self.base + e.data_offset + e.size)
            for r, e in self.resolved.items()
            if e is not None
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

    def visit(p: str, v: Any) -> bool:
        if isinstance(v, Call):
            ta = _tensor_args(v)
            if ta is None:
                if v.dict_items is None:
                    values[p] = f"call:{v.func.dotted if isinstance(v.func, Global) else '?'}"
                    return True
                return False
            t = _tensor(p, ta, records, base, findings, path, used)
            if t is not None:
                tensors.append(t)
            return True
        if isinstance(v, (SDict, SList, tuple)):
            return False
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
