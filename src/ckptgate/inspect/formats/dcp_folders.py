"""DCP saves in top-level folders, one ``dcp.save`` each: an Accelerate FSDP ``SHARDED_STATE_DICT``
checkpoint (``pytorch_model_fsdp_0/`` holding ``{"model": ...}`` and ``optimizer_0/`` holding
``{"optimizer": ...}``, as a ``transformers.Trainer`` under FSDP writes into each ``checkpoint-N/``)
[R01, R19, R20].

Each folder is read as the DCP checkpoint it is (:func:`~ckptgate.inspect.formats.dcp.dcp_layout`),
and the folders are put together into one training-state tree: their tensors, BYTE_IO items and
storage items, under their own top-level keys.  Which key is the model is then decided as for any
training-state tree, from each subtree's measured structure (``inspect/treefacts.py``,
``intake/selection.rego``), never from a folder's or a key's name: the optimizer folder is resume
state by what it holds, and is reported, never written.  Folders whose top-level keys collide
cannot be told apart, and are refused.
"""

from __future__ import annotations

from typing import Any

from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.formats.dcp import dcp_layout
from ckptgate.inspect.formats.registry import register_detector
from ckptgate.inspect.treefacts import tree_facts
from ckptgate.inspect.zipcheck import CrcMode

__all__ = ["detect_dcp_folders"]

#: File kinds that may sit beside the DCP folders (trainer_state.json, companions): pure data.
_BESIDE = frozenset({FileKind.JSON, FileKind.TEXT, FileKind.EMPTY})


def _folders(ctx: Context) -> list[str] | None:
    """The top-level folders that hold a DCP ``.metadata``, when every other file is pure data
    beside them (resume state is not in ``ctx.files``); else None."""
    if ".metadata" in ctx.files:
        return None
    folders = sorted(p.split("/", 1)[0] for p in ctx.files if p.count("/") == 1 and p.endswith("/.metadata"))
    if not folders:
        return None
    for path, facts in ctx.files.items():
        inside = "/" in path and path.split("/", 1)[0] in folders
        if not inside and facts.kind not in _BESIDE:
            return None
    return folders


def detect_dcp_folders(ctx: Context, *, verify_crc: CrcMode = True) -> FormatResult | None:
    folders = _folders(ctx)
    if folders is None:
        return None
    findings: list[Finding] = []
    loaders: set[str] = set()
    merged: dict[str, Any] = {"tensors": [], "bytes_items": [], "storage": [], "items": [], "folders": []}
    owner: dict[str, str] = {}  # top-level key -> the folder that holds it
    consolidatable = True
    for folder in folders:
        layout, fs, used = dcp_layout(ctx, folder, verify_crc=verify_crc)
        findings.extend(fs)
        loaders |= used
        if layout is None:
            consolidatable = False
            continue
        keys = {str(t["fqn"]).split(".", 1)[0] for t in layout["tensors"]}
        keys |= {str(b).split(".", 1)[0] for b in layout["bytes_items"]}
        clash = sorted(k for k in keys if k in owner)
        if clash:
            findings.append(
                error(
                    "dcp.folders_overlap",
                    f"{folder}/.metadata",
                    f"top-level keys {clash} are also saved in {owner[clash[0]]}/; the folders cannot be "
                    "told apart as one tree",
                    keys=clash,
                )
            )
            consolidatable = False
            continue
        owner.update(dict.fromkeys(keys, folder))
        for field in ("tensors", "bytes_items", "items"):
            merged[field].extend(layout[field])
        merged["storage"].extend({**s, "folder": folder} for s in layout["storage"])
        merged["folders"].append({"folder": folder, "version": layout.get("version"), "keys": sorted(keys)})
    merged["tree"] = tree_facts(merged["tensors"], merged["bytes_items"])
    return FormatResult(
        format="dcp-torch-save",
        layout=merged,
        loaders=tuple(sorted(loaders)),
        findings=tuple(findings),
        consolidatable=consolidatable and bool(merged["tensors"]),
    )


register_detector("dcp-folders", detect_dcp_folders, formats=("dcp-torch-save",), order=45, takes_crc=True)
