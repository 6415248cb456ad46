"""Megatron Core ``torch_dist``: ``metadata.json``, the common state and a DCP checkpoint [R04, R05].

The common state is ``common.pt`` up to megatron-core 0.16 and the BYTE_IO item
``common_state/shard_0_1`` of the ``.distcp`` files from 0.19 (:mod:`ckptgate.inspect.megatron_common`);
the static reader interprets either against the ``megatron_common`` allowlist (the training ``args``).

Homogeneous layers are stacked on a prepended layer axis (``decoder.layers.<sub>`` with global
shape ``[num_layers, ...]``); the layout marks those tensors.  Placement is not model-family
mapping (e.g. SwiGLU ``linear_fc1`` stores W then V) [R04, R07].
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.formats._base import Context, FormatResult
from ckptgate.inspect.formats.dcp import dcp_layout
from ckptgate.inspect.formats.registry import register_detector
from ckptgate.inspect.megatron_common import COMMON_FILE, COMMON_ITEM, read_common_state
from ckptgate.inspect.pickle import PickleReport
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


def _common(
    ctx: Context, pre: str, item: PickleReport | None
) -> tuple[dict[str, Any] | None, tuple[PickleReport, ...], list[Finding]]:
    """The common state, from ``common.pt`` (megatron-core up to 0.16) or the BYTE_IO item
    ``common_state/shard_0_1`` (0.19): exactly one of them, read statically."""
    f = ctx.files.get(pre + COMMON_FILE)
    if f is not None and item is not None:
        return (
            None,
            (),
            [
                error(
                    "megatron.common_ambiguous",
                    f.path,
                    f"both {COMMON_FILE} and the BYTE_IO item {COMMON_ITEM} are present; megatron-core writes one",
                )
            ],
        )
    if f is None and item is None:
        return (
            None,
            (),
            [
                error(
                    "megatron.common_missing",
                    pre + COMMON_FILE,
                    f"neither {COMMON_FILE} (megatron-core <= 0.16) nor the BYTE_IO item {COMMON_ITEM} (0.19)",
                )
            ],
        )
    rep = f.pickle if f is not None else item
    source = COMMON_FILE if f is not None else COMMON_ITEM
    path = f.path if f is not None else (item.path if item is not None else "")
    pickles: tuple[PickleReport, ...] = ()
    if item is not None:  # named apart from its .distcp file, which holds the model's items too
        pickles = (dataclasses.replace(item, path=f"{item.path}#{COMMON_ITEM}"),)
    info: dict[str, Any] = {
        "source": source,
        "path": path,
        "plain": bool(rep and rep.plain_tensors),
        "inside_allowlist": bool(rep and rep.inside_allowlist),
        "globals": list(rep.globals) if rep else [],
        "state": None,
    }
    findings: list[Finding] = []
    if rep is not None and rep.inside_allowlist and rep.value is not None:
        state, findings = read_common_state(rep.value, source=source, path=path)
        info["state"] = state.to_json() if state is not None else None
    return info, pickles, findings


def detect_megatron(ctx: Context, *, verify_crc: CrcMode = True) -> FormatResult | None:
    folder, findings = _folder(ctx)
    pre = f"{folder}/" if folder else ""
    mj = ctx.files.get(pre + "metadata.json")
    if mj is None or not isinstance(mj.json, dict) or mj.json.get("sharded_backend") != "torch_dist":
        return None
    loaders = {"json"}
    kept: dict[str, PickleReport] = {}
    layout, fs, ld = dcp_layout(
        ctx, folder, verify_crc=verify_crc, byte_contexts={COMMON_ITEM: "megatron_common"}, kept=kept
    )
    findings.extend(fs)
    loaders |= ld
    common_info, pickles, fs = _common(ctx, pre, kept.get(COMMON_ITEM))
    findings.extend(fs)
    if common_info is not None and not common_info["inside_allowlist"]:
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
        pickles=pickles,
        claims=((pre + ".metadata", "megatron_dcp_metadata"), (pre + COMMON_FILE, "megatron_common")),
    )


register_detector("megatron-torch-dist", detect_megatron, formats=("megatron-torch-dist",), order=30, takes_crc=True)
