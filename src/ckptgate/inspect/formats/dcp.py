"""PyTorch DCP: ``.metadata`` + ``__<rank>_<n>.distcp`` (torch_save storage), or the HF storage path
(``shard-<r>-model-<i>-of-<n>.safetensors`` with ``DCP_SHARDING_INFO``) [R01, R18].

Every storage item is located and checked: a plain-basename ``relative_path`` present in the tree,
a byte range inside the file, no two items overlapping, each tensor item a torch zip holding one
tensor whose shape and dtype match its chunk, and each tensor's chunks covering it exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ckptgate._json import JSONRejected, loads_strict
from ckptgate.inspect._threads import map_in_threads
from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.dcp import DcpMetadata, DcpStorageItem, extract_dcp_metadata
from ckptgate.inspect.findings import Finding, error, warning
from ckptgate.inspect.formats._base import Context, FormatResult, plain_basename
from ckptgate.inspect.formats.registry import register_detector
from ckptgate.inspect.pickle import PickleReport, SList
from ckptgate.inspect.safetensors import TORCH_DTYPES
from ckptgate.inspect.torchzip import TorchZipLayout, inspect_torch_zip
from ckptgate.inspect.treefacts import tree_facts
from ckptgate.inspect.zipcheck import CrcMode

__all__ = ["dcp_layout", "detect_dcp", "detect_dcp_hf"]

_SAFETENSORS_DTYPE = {code: name for name, code in TORCH_DTYPES.items()}
_HF_NAME = re.compile(r"^shard-\d{5}-model-\d{5}-of-\d{5}\.safetensors$", re.ASCII)


def empty_value(value: Any) -> bool:
    """Whether a statically read pickle value holds nothing: ``None``, or a list of ``None`` (as
    Megatron's local layer specs save ``_extra_state``, one entry per stacked layer)."""
    if value is None:
        return True
    return isinstance(value, SList) and all(v is None for v in value.items)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def dcp_layout(
    ctx: Context,
    folder: str,
    *,
    verify_crc: CrcMode = True,
    byte_contexts: Mapping[str, str] = MappingProxyType({}),
    kept: dict[str, PickleReport] | None = None,
) -> tuple[dict[str, Any] | None, list[Finding], set[str]]:
    """Layout of the DCP checkpoint in ``folder`` ('' = root); returns (layout, findings, loaders).

    A BYTE_IO item named in ``byte_contexts`` is read against that pickle context (not the plain
    tensor one), and its report is put in ``kept`` (its statically read value, for the format
    that knows what the item is: Megatron's common state)."""
    pre = f"{folder}/" if folder else ""
    mp = pre + ".metadata"
    f = ctx.files.get(mp)
    findings: list[Finding] = []
    loaders: set[str] = set()
    if f is None or f.pickle is None:
        findings.append(error("dcp.metadata_unreadable", mp, ".metadata is missing or not a pickle"))
        return None, findings, loaders
    md, fs = extract_dcp_metadata(f.pickle)
    findings.extend(fs)
    if md is None:
        loaders.add("torch_load")
        return None, findings, loaders
    loaders.add("static_pickle")
    items = _check_items(ctx, pre, md, findings, loaders, verify_crc, byte_contexts, kept)
    _check_chunks(md, mp, findings)
    referenced = {s.relative_path for s in md.storage}
    for p in ctx.files:
        if p.startswith(pre) and p.endswith(".distcp") and p[len(pre) :] not in referenced:
            findings.append(warning("dcp.unreferenced_file", p, ".distcp file is never referenced by .metadata"))
    layout = md.to_json()
    layout["items"] = items
    layout["folder"] = folder
    layout["tree"] = tree_facts(layout["tensors"], layout["bytes_items"])
    return layout, findings, loaders


def _check_items(
    ctx: Context,
    pre: str,
    md: DcpMetadata,
    findings: list[Finding],
    loaders: set[str],
    verify_crc: CrcMode,
    byte_contexts: Mapping[str, str],
    kept: dict[str, PickleReport] | None,
) -> list[dict[str, Any]]:
    tensors = {t.fqn: t for t in md.tensors}
    byfile: dict[str, list[tuple[int, int, str, int]]] = {}
    out: list[dict[str, Any]] = []
    mp = pre + ".metadata"
    items: list[tuple[DcpStorageItem, str]] = []  # (storage item, its file): read below, in parallel
    for s in md.storage:
        bad = plain_basename(s.relative_path, mp, f"storage relative_path for {s.fqn!r}", "dcp")
        if bad:
            findings.append(bad)
            continue
        path = pre + s.relative_path
        entry = ctx.tree.entry(path)
        if entry is None:
            findings.append(
                error(
                    "dcp.storage_file_missing",
                    mp,
                    f"storage file {s.relative_path!r} is not in the checkpoint",
                    fqn=s.fqn,
                )
            )
            continue
        if s.file_offset + s.length > entry.size:
            findings.append(
                error(
                    "dcp.item_out_of_range",
                    path,
                    f"item {s.fqn!r} runs past the end of the file",
                    fqn=s.fqn,
                    offset=s.file_offset,
                    length=s.length,
                    size=entry.size,
                )
            )
            continue
        if s.transforms:
            findings.append(
                error(
                    "dcp.transformed_item",
                    path,
                    f"item {s.fqn!r} has storage transforms {list(s.transforms)}; refused",
                    fqn=s.fqn,
                )
            )
        byfile.setdefault(path, []).append((s.file_offset, s.file_offset + s.length, s.fqn, len(items)))
        items.append((s, path))
    # Overlaps are refused before anything is read, and an item that overlaps an earlier one is not
    # read at all: each byte of a storage file is then read at most once, however many items the
    # metadata lists (otherwise one pickle named a thousand times is read a thousand times).
    overlapping: set[int] = set()
    for path, spans in byfile.items():
        spans.sort()
        end, first = -1, ""
        for b, e, fqn, i in spans:
            if b < end:
                findings.append(
                    error("dcp.items_overlap", path, f"items {first!r} and {fqn!r} overlap", first=first, second=fqn)
                )
                overlapping.add(i)
            if e > end:
                end, first = e, fqn
    unread = [it for i, it in enumerate(items) if i in overlapping]
    items = [it for i, it in enumerate(items) if i not in overlapping]

    def read_item(item: tuple[DcpStorageItem, str]) -> tuple[TorchZipLayout | None, tuple[Finding, ...]]:
        s, path = item
        with ctx.tree.reader(path) as src:
            context = byte_contexts.get(s.fqn, "tensors") if s.offset is None else "tensors"
            return inspect_torch_zip(
                src, s.length, path=path, base=s.file_offset, context=context, verify_crc=verify_crc, work=ctx.work
            )

    for (s, path), (lay, fs) in zip(items, map_in_threads(read_item, items, lambda it: it[0].length), strict=True):
        findings.extend(fs)
        rec: dict[str, Any] = {
            "fqn": s.fqn,
            "path": path,
            "offset": s.file_offset,
            "length": s.length,
            "chunk_offsets": None if s.offset is None else list(s.offset),
        }
        if lay is None:
            out.append(rec)
            continue
        if s.offset is None:  # BYTE_IO
            rec["kind"] = "bytes"
            rec["plain"] = lay.pickle.plain_tensors
            if s.fqn in byte_contexts:
                rec["context"] = byte_contexts[s.fqn]
                rec["inside_allowlist"] = lay.pickle.inside_allowlist
                if kept is not None:
                    kept[s.fqn] = lay.pickle
            rec["empty"] = bool(lay.pickle.complete and not lay.tensors and empty_value(lay.pickle.value))
            static = lay.pickle.plain_tensors or (s.fqn in byte_contexts and lay.pickle.inside_allowlist)
            loaders.add("static_pickle" if static else "torch_load")
            out.append(rec)
            continue
        rec["kind"] = "tensor"
        t = tensors.get(s.fqn)
        if t is None or len(lay.tensors) != 1:
            findings.append(
                error(
                    "dcp.item_mismatch",
                    path,
                    f"tensor item {s.fqn!r} has no tensor metadata or does not hold exactly one tensor",
                    fqn=s.fqn,
                )
            )
            out.append(rec)
            continue
        tr = lay.tensors[0]
        chunk = next((c for c in t.chunks if c.offsets == s.offset), None)
        if chunk is None or tr.shape != chunk.sizes or tr.dtype != t.dtype:
            findings.append(
                error(
                    "dcp.item_mismatch",
                    path,
                    f"tensor item {s.fqn!r} does not match its chunk metadata (shape, dtype or offsets)",
                    fqn=s.fqn,
                    shape=list(tr.shape),
                    dtype=tr.dtype,
                )
            )
        if not lay.pickle.plain_tensors:
            loaders.add("torch_load")
        rec["tensor"] = tr.to_json()
        out.append(rec)
    out.extend(
        {
            "fqn": s.fqn,
            "path": path,
            "offset": s.file_offset,
            "length": s.length,
            "overlaps": True,
            "chunk_offsets": None if s.offset is None else list(s.offset),
        }
        for s, path in unread
    )
    return out


def _check_chunks(md: DcpMetadata, mp: str, findings: list[Finding]) -> None:
    have = {(s.fqn, s.offset) for s in md.storage if s.offset is not None}
    for t in md.tensors:
        total = sum(_numel(c.sizes) for c in t.chunks)
        boxes = [(c.offsets, c.sizes) for c in t.chunks if _numel(c.sizes)]
        overlap = any(
            all(a0 < b0 + bs and b0 < a0 + as_ for a0, as_, b0, bs in zip(ao, asz, bo, bsz, strict=True))
            for i, (ao, asz) in enumerate(boxes)
            for (bo, bsz) in boxes[i + 1 :]
        )
        if overlap or total != _numel(t.size):
            findings.append(
                error(
                    "dcp.chunks_incomplete",
                    mp,
                    f"chunks of {t.fqn!r} do not cover the tensor exactly once",
                    fqn=t.fqn,
                    covered=total,
                    numel=_numel(t.size),
                )
            )
        for c in t.chunks:
            if (t.fqn, c.offsets) not in have:
                findings.append(
                    error(
                        "dcp.chunk_without_item",
                        mp,
                        f"chunk {list(c.offsets)} of {t.fqn!r} has no storage item",
                        fqn=t.fqn,
                    )
                )


def detect_dcp(ctx: Context, *, verify_crc: CrcMode = True) -> FormatResult | None:
    if ".metadata" not in ctx.files:
        return None
    layout, findings, loaders = dcp_layout(ctx, "", verify_crc=verify_crc)
    return FormatResult(
        format="dcp-torch-save",
        layout=layout or {},
        loaders=tuple(sorted(loaders)),
        findings=tuple(findings),
        consolidatable=layout is not None,
    )


def detect_dcp_hf(ctx: Context) -> FormatResult | None:
    files = sorted(p for p in ctx.files if "/" not in p and _HF_NAME.match(p))
    if not files:
        return None
    findings: list[Finding] = []
    tensors: dict[str, dict[str, Any]] = {}
    layout_files = []
    consolidatable = True
    for p in files:
        f = ctx.files[p]
        if f.kind != FileKind.SAFETENSORS or f.safetensors is None:
            findings.append(
                error(
                    "dcp.hf_not_safetensors",
                    p,
                    "a DCP HF-storage shard is not a plain safetensors "
                    f"file (content: {f.kind}); BYTE_IO items may precede the safetensors data "
                    "with nothing recording their fqn",
                )
            )
            consolidatable = False
            continue
        meta = f.safetensors.metadata or {}
        try:
            info = loads_strict(meta.get("DCP_SHARDING_INFO", ""), what="DCP_SHARDING_INFO")
        except JSONRejected:
            info = None
        if not isinstance(info, dict):
            findings.append(error("dcp.hf_sharding_info", p, "DCP_SHARDING_INFO metadata is missing or not JSON"))
            consolidatable = False
            continue
        for t in f.safetensors.tensors:
            si = info.get(t.name)
            offs = si.get("saved_offsets") if isinstance(si, dict) else None
            if (
                not isinstance(offs, list)
                or len(offs) != len(t.shape)
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)
            ):
                findings.append(
                    error("dcp.hf_sharding_info", p, f"no valid saved_offsets for {t.name!r}", tensor=t.name)
                )
                consolidatable = False
                continue
            rec = tensors.setdefault(
                t.name, {"fqn": t.name, "dtype": _SAFETENSORS_DTYPE.get(t.dtype, t.dtype), "chunks": []}
            )
            if rec["dtype"] != _SAFETENSORS_DTYPE.get(t.dtype, t.dtype):
                findings.append(error("dcp.hf_dtype_conflict", p, f"{t.name!r} has different dtypes across shards"))
            rec["chunks"].append(
                {
                    "path": p,
                    "offsets": offs,
                    "sizes": list(t.shape),
                    "data_offsets": [
                        f.safetensors.data_start + t.data_offsets[0],
                        f.safetensors.data_start + t.data_offsets[1],
                    ],
                }
            )
        layout_files.append({"path": p, **f.safetensors.to_json()})
    for rec in tensors.values():
        ndim = len(rec["chunks"][0]["offsets"])
        if any(len(c["offsets"]) != ndim for c in rec["chunks"]):
            findings.append(
                error(
                    "dcp.hf_sharding_info",
                    "",
                    f"chunks of {rec['fqn']!r} disagree on the number of dimensions",
                    fqn=rec["fqn"],
                )
            )
            consolidatable = False
            rec["size"] = None
            continue
        size = [max(c["offsets"][d] + c["sizes"][d] for c in rec["chunks"]) for d in range(ndim)]
        rec["size"] = size
        covered = sum(_numel(tuple(c["sizes"])) for c in rec["chunks"])
        if covered != _numel(tuple(size)):
            findings.append(
                error(
                    "dcp.chunks_incomplete",
                    "",
                    f"chunks of {rec['fqn']!r} do not cover its inferred shape exactly once",
                    fqn=rec["fqn"],
                )
            )
            consolidatable = False
    findings.append(
        warning(
            "dcp.hf_size_inferred",
            "",
            "without .metadata each full shape is inferred as the "
            "maximum of offset + shape; a trailing gap cannot be detected",
        )
    )
    layout = {"files": layout_files, "tensors": sorted(tensors.values(), key=lambda r: r["fqn"])}
    layout["tree"] = tree_facts(layout["tensors"], ())
    return FormatResult(
        format="dcp-hf-safetensors",
        layout=layout,
        loaders=("safetensors",),
        findings=tuple(findings),
        consolidatable=consolidatable,
    )


register_detector("dcp-torch-save", detect_dcp, formats=("dcp-torch-save",), order=40, takes_crc=True)
register_detector("dcp-hf-safetensors", detect_dcp_hf, formats=("dcp-hf-safetensors",), order=50)
