"""DCP ``.metadata``, read by symbolic interpretation only (it is a pickle [R18]).

Extracts ``state_dict_metadata`` (fqn -> size, dtype, chunks or BYTE_IO), ``storage_data``
((fqn, offset, index) -> relative_path, offset, length), ``planner_data`` and ``version``, and
refuses anything it cannot resolve against the ``dcp_metadata`` allowlist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.pickle import Call, Global, PickleReport, SDict, SList, key_text
from ckptgate.shapes import MAX_NDIM, dims_in_bounds

__all__ = ["DcpChunk", "DcpMetadata", "DcpStorageItem", "DcpTensor", "extract_dcp_metadata"]

_M = "torch.distributed.checkpoint.metadata."


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpChunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpTensor:
    fqn: str
    dtype: str
    size: tuple[int, ...]
    chunks: tuple[DcpChunk, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpStorageItem:
    fqn: str
    offset: tuple[int, ...] | None  # chunk offsets for tensors, None for BYTE_IO
    index: int | None
    relative_path: str
    file_offset: int
    length: int
    transforms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpMetadata:
    tensors: tuple[DcpTensor, ...]
    bytes_items: tuple[str, ...]
    storage: tuple[DcpStorageItem, ...]
    planner_data: dict[str, tuple[str, ...]]
    version: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "tensors": [
                {
                    "fqn": t.fqn,
                    "dtype": t.dtype,
                    "size": list(t.size),
                    "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in t.chunks],
                }
                for t in self.tensors
            ],
            "bytes_items": list(self.bytes_items),
            "storage": [
                {
                    "fqn": s.fqn,
                    "offset": None if s.offset is None else list(s.offset),
                    "index": s.index,
                    "relative_path": s.relative_path,
                    "file_offset": s.file_offset,
                    "length": s.length,
                    "transforms": list(s.transforms),
                }
                for s in self.storage
            ],
            "planner_data": {k: list(v) for k, v in self.planner_data.items()},
        }


class _Bad(Exception):
    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self.msg = msg


def _cls(v: Any) -> str | None:
    return v.func.dotted if isinstance(v, Call) and isinstance(v.func, Global) else None


def _fields(v: Any, *names: str) -> dict[str, Any]:
    c = _cls(v)
    if c is None or c.rsplit(".", 1)[-1] not in names:
        raise _Bad(f"expected {'/'.join(names)}, found {c or type(v).__name__}")
    st = v.state
    if st is None:
        return {}
    if isinstance(st, tuple) and len(st) == 2 and st[0] is None and isinstance(st[1], SDict):
        st = st[1]
    if not isinstance(st, SDict) or not all(isinstance(k, str) for k, _ in st.items):
        raise _Bad(f"{c} state is not a field map")
    return dict(st.items)


def _ints(v: Any, what: str) -> tuple[int, ...]:
    if _cls(v) == "torch.Size" and isinstance(v.args, tuple) and len(v.args) == 1:
        v = v.args[0]
    if isinstance(v, tuple) and dims_in_bounds(v):
        return v
    raise _Bad(f"{what} is not a tuple of at most {MAX_NDIM} integers in [0, 2^63)")


#: ``TensorProperties`` as each torch release pickles it (``__getstate__``), by tuple length:
#: (dtype, layout, requires_grad, memory_format encoding, pin_memory) up to torch 2.14, and
#: with ``strides`` (the full tensor's, or None) appended from torch 2.15; ``.metadata`` says
#: version "1.0.0" in both.  A dataclass field map (no ``__getstate__``) may hold these names.
_PROPS_TUPLE_LENGTHS = (5, 6)
_PROPS_FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides")


def _dtype(props: Any, size: tuple[int, ...]) -> str:
    """The torch dtype name of a ``TensorProperties``, whose shape must be one a torch release
    writes (:data:`_PROPS_TUPLE_LENGTHS`): any other is refused, never read by position."""
    c = _cls(props)
    if c is None or not c.endswith("TensorProperties"):
        raise _Bad("tensor properties missing")
    st = props.state
    if isinstance(st, tuple):
        if len(st) not in _PROPS_TUPLE_LENGTHS:
            raise _Bad(
                f"tensor properties hold {len(st)} fields; torch writes {' or '.join(map(str, _PROPS_TUPLE_LENGTHS))}"
            )
        fields = dict(zip(_PROPS_FIELDS, st, strict=False))
    elif isinstance(st, SDict) and all(isinstance(k, str) for k, _ in st.items):
        fields = dict(st.items)
        unknown = sorted(set(fields) - set(_PROPS_FIELDS))
        if unknown:
            raise _Bad(f"tensor properties have unknown fields {unknown}")
    else:
        raise _Bad("tensor properties are neither a field tuple nor a field map")
    layout = fields.get("layout")
    if layout is not None and not (
        _cls(layout) == "torch.serialization._get_layout"
        and isinstance(layout.args, tuple)
        and layout.args == ("torch.strided",)
    ):
        raise _Bad("tensor layout is not torch.strided")
    strides = fields.get("strides")
    if strides is not None:
        got = _ints(strides, "tensor strides")
        if len(got) != len(size):
            raise _Bad(f"tensor strides {list(got)} do not match its {len(size)} dimensions")
    dt = fields.get("dtype")
    if not isinstance(dt, Global) or dt.module != "torch":
        raise _Bad("tensor dtype is not a torch dtype")
    return dt.name


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise _Bad(f"{what} is not a string")
    return v


def _int(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _Bad(f"{what} is not a non-negative integer")
    return v


def _check_mcore_data(mcore: Any) -> None:
    """megatron-core 0.15's ``MCoreMetadata.mcore_data``: per tensor, the metadata its ShardedTensor
    carried.  Empty per tensor is the layout the other releases write with no such field.  A
    non-empty entry (``nd_reformulated_orig_global_shape``: a flattened-range tensor saved under
    another global shape) changes what the stored shapes mean, so it is refused, never guessed."""
    if mcore is None:
        return
    if not isinstance(mcore, SDict):
        raise _Bad("mcore_data is not a dict")
    for fqn, entry in mcore.items:
        if not isinstance(entry, SDict):
            raise _Bad(f"mcore_data of {fqn!r} is not a dict")
        if entry.items:
            keys = sorted(str(k) for k, _ in entry.items)
            raise _Bad(f"mcore_data of {fqn!r} holds {keys}: a reformulated global shape is not read")


def extract_dcp_metadata(rep: PickleReport) -> tuple[DcpMetadata | None, tuple[Finding, ...]]:
    """Interpret a read ``.metadata`` pickle; a finding explains any refusal."""
    if rep.value is None or not rep.inside_allowlist:
        return None, (
            error(
                "dcp.metadata_unresolved",
                rep.path,
                "the .metadata pickle did not stay inside the DCP allowlist; its layout is not extracted",
            ),
        )
    try:
        top = _fields(rep.value, "Metadata", "MCoreMetadata")
        _check_mcore_data(top.get("mcore_data"))
        sdm = top.get("state_dict_metadata")
        if not isinstance(sdm, SDict):
            raise _Bad("state_dict_metadata is not a dict")
        tensors: list[DcpTensor] = []
        byte_items: list[str] = []
        for fqn, md in sdm.items:  # an fqn twice is the reader's pickle.duplicate_key: no value
            fqn = _str(fqn, "fqn")
            kind = _cls(md) or ""
            if kind == _M + "BytesStorageMetadata":
                byte_items.append(fqn)
                continue
            f = _fields(md, "TensorStorageMetadata")
            chunks_v = f.get("chunks")
            if not isinstance(chunks_v, SList):
                raise _Bad(f"{fqn}: chunks is not a list")
            chunks = []
            size = _ints(f.get("size"), f"{fqn} size")
            for ch in chunks_v.items:
                cf = _fields(ch, "ChunkStorageMetadata")
                c = DcpChunk(
                    offsets=_ints(cf.get("offsets"), f"{fqn} chunk offsets"),
                    sizes=_ints(cf.get("sizes"), f"{fqn} chunk sizes"),
                )
                if (
                    len(c.offsets) != len(size)
                    or len(c.sizes) != len(size)
                    or any(o + s > d for o, s, d in zip(c.offsets, c.sizes, size, strict=True))
                ):
                    raise _Bad(f"{fqn}: chunk lies outside the tensor")
                chunks.append(c)
            tensors.append(DcpTensor(fqn=fqn, dtype=_dtype(f.get("properties"), size), size=size, chunks=tuple(chunks)))
        sd = top.get("storage_data")
        if not isinstance(sd, SDict):
            raise _Bad("storage_data is not a dict")
        storage: list[DcpStorageItem] = []
        seen_keys: set[tuple[str, tuple[int, ...] | None]] = set()
        for idx, info in sd.items:
            fi = _fields(idx, "MetadataIndex")
            si = _fields(info, "_StorageInfo")
            off = fi.get("offset")
            index = fi.get("index")
            tr = si.get("transform_descriptors") or ()
            if isinstance(tr, SList):
                tr = tuple(tr.items)
            if not isinstance(tr, tuple) or not all(isinstance(t, str) for t in tr):
                raise _Bad("transform_descriptors is not a list of strings")
            storage.append(
                DcpStorageItem(
                    fqn=_str(fi.get("fqn"), "storage fqn"),
                    offset=None if off is None else _ints(off, "index offset"),
                    index=None if index is None else _int(index, "index"),
                    relative_path=_str(si.get("relative_path"), "relative_path"),
                    file_offset=_int(si.get("offset"), "storage offset"),
                    length=_int(si.get("length"), "length"),
                    transforms=tr,
                )
            )
            # MetadataIndex compares (and hashes) by fqn and offset only, not by index: torch's
            # unpickler keeps one value for keys that differ in index alone, which a save never writes
            key = (storage[-1].fqn, storage[-1].offset)
            if key in seen_keys:
                raise _Bad(f"storage_data indexes {key[0]!r} at offset {key[1]} twice")
            seen_keys.add(key)
        pd_v = top.get("planner_data")
        planner: dict[str, tuple[str, ...]] = {}
        if isinstance(pd_v, SDict):
            for k, v in pd_v.items:
                if isinstance(k, str) and isinstance(v, tuple):
                    planner[k] = tuple(key_text(x) for x in v)
        ver = top.get("version")
        md = DcpMetadata(
            tensors=tuple(tensors),
            bytes_items=tuple(byte_items),
            storage=tuple(storage),
            planner_data=planner,
            version=ver if isinstance(ver, str) else None,
        )
    except _Bad as b:
        return None, (error("dcp.metadata_shape", rep.path, f"unexpected .metadata structure: {b.msg}"),)
    return md, ()
