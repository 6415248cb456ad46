"""Megatron Core ``torch_dist``: ``metadata.json``, ``common.pt`` and a DCP checkpoint [R04, R05].

Homogeneous layers are stacked on a prepended layer axis (``decoder.layers.<sub>`` with global
shape ``[num_layers, ...]``); the layout marks those tensors.  Placement is not model-family
mapping (e.g. SwiGLU ``linear_fc1`` stores W then V) [R04, R07].
"""

from __future__ import annotations

import re

from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.formats.dcp import dcp_layout
from ckptgate.inspect.formats.registry import register_detector
from ckptgate.inspect.zipcheck import CrcMode

__all__ = ["detect_megatron"]

_LAYER_STACKED = re.compile(r"(^|\.)layers\.(?!\d+\.)[A-Za-z_]")


def _folder(ctx: Context) -> tuple[str, list[Finding]]:
    f = ctx.files.get("latest_checkpointed_iteration.txt")
    if f is None:
        return "", []
    txt = (f.text or "").strip()
    if not (txt.isascii() and txt.isdigit()):
        return "", [
            error("megatron.bad_latest", f.path, "latest_checkpointed_iteration.txt is not an integer", value=txt[:40])
        ]
    return f"iter_{int(txt):07d}", []


def detect_megatron(ctx: Context, *, verify_crc: CrcMode = True) -> FormatResult | None:
    folder, findings = _folder(ctx)
    pre = f"{folder}/" if folder else ""
    mj = ctx.files.get(pre + "metadata.json")
    if mj is None or not isinstance(mj.json, dict) or mj.json.get("sharded_backend") != "torch_dist":
        return None
    loaders = {"json"}
    layout, fs, ld = dcp_layout(ctx, folder, verify_crc=verify_crc)
    findings.extend(fs)
    loaders |= ld
    common = ctx.files.get(pre + "common.pt")
    common_info = None
    if common is None:
        findings.append(error("megatron.common_missing", pre + "common.pt", "common.pt is missing"))
    else:
        common_info = {
            "path": common.path,
            "plain": bool(common.pickle and common.pickle.plain_tensors),
            "globals": list(common.pickle.globals) if common.pickle else [],
        }
        if not common_info["plain"]:
            loaders.add("torch_load")
    stacked = []
    if layout:
        stacked = [t["fqn"] for t in layout["tensors"] if _LAYER_STACKED.search(t["fqn"])]
    out = {
        "folder": folder,
        "metadata": mj.json,
        "common": common_info,
        "dcp": layout,
        "layer_stacked": sorted(stacked),
    }
    return FormatResult(
        format="megatron-torch-dist",
        layout=out,
        loaders=tuple(sorted(loaders)),
        findings=tuple(findings),
        consolidatable=layout is not None,
    )


register_detector("megatron-torch-dist", detect_megatron, formats=("megatron-torch-dist",), order=30, takes_crc=True)
