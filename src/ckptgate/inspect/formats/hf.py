"""Hugging Face safetensors: sharded with an index, or a single file [R12, R13]."""

from __future__ import annotations

from typing import Any

from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.findings import Finding, error, warning
from ckptgate.inspect.formats._base import Context, FormatResult, plain_basename
from ckptgate.inspect.formats.registry import register_detector

__all__ = ["detect_hf_sharded", "detect_single_safetensors", "safetensors_layout"]


def safetensors_layout(ctx: Context, path: str) -> dict[str, Any] | None:
    f = ctx.files.get(path)
    if f is None or f.safetensors is None:
        return None
    return f.safetensors.to_json()


def _index_path(ctx: Context) -> str | None:
    idx = sorted(p for p in ctx.files if "/" not in p and p.endswith(".safetensors.index.json"))
    return idx[0] if idx else None


def _targets(
    ctx: Context, ip: str, wm: dict[str, Any], *, require_present: bool
) -> tuple[dict[str, list[str]], list[Finding]]:
    """The index's shards (target -> its tensors) among the checkpoint's files, and findings: every
    target must be a plain basename, and, if ``require_present``, a file of the checkpoint."""
    shards: dict[str, list[str]] = {}
    findings: list[Finding] = []
    for tensor, target in wm.items():
        bad = plain_basename(target, ip, f"weight_map[{tensor!r}]")
        if bad:
            findings.append(bad)
        elif target in ctx.files:
            shards.setdefault(target, []).append(tensor)
        elif require_present:
            findings.append(
                error(
                    "index.missing_shard",
                    ip,
                    f"weight_map names {target!r}, which is not in the checkpoint",
                    shard=target,
                    tensor=tensor,
                )
            )
    return shards, findings


def _other_indexes(ctx: Context, ip: str) -> list[Finding]:
    """Every other index beside the one consolidated: a loader could follow it instead (two
    safetensors indexes leave the choice to whoever named them; ``pytorch_model.bin.index.json``
    is what transformers reads with ``use_safetensors=False``), so its targets must be safe.
    Targets it names but the checkpoint lacks are left alone (a download of only the safetensors
    keeps the ``.bin`` index), unless it is a second safetensors index."""
    findings: list[Finding] = []
    for p in sorted(p for p in ctx.files if "/" not in p and p.endswith(".index.json") and p != ip):
        safetensors_index = p.endswith(".safetensors.index.json")
        if safetensors_index:
            findings.append(
                error(
                    "index.ambiguous",
                    p,
                    f"a second safetensors index beside {ip!r}; which one a loader reads is not defined",
                    index=ip,
                )
            )
        doc = ctx.files[p].json
        wm = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(wm, dict):
            continue
        findings += _targets(ctx, p, wm, require_present=safetensors_index)[1]
        if not safetensors_index:
            findings.append(
                warning(
                    "index.not_consolidated",
                    p,
                    f"an index beside {ip!r} that intake does not follow; it is not published",
                )
            )
    return findings


def detect_hf_sharded(ctx: Context) -> FormatResult | None:
    ip = _index_path(ctx)
    if ip is None:
        return None
    findings: list[Finding] = _other_indexes(ctx, ip)
    doc = ctx.files[ip].json
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        findings.append(error("index.invalid", ip, "index has no weight_map object"))
        return FormatResult(
            format="hf-sharded-safetensors",
            layout={"index": ip},
            loaders=("json",),
            findings=tuple(findings),
            consolidatable=False,
        )
    wm: dict[str, Any] = doc["weight_map"]
    shards, found = _targets(ctx, ip, wm, require_present=True)
    findings += found
    seen: dict[str, str] = {}
    total = 0
    layout_shards = []
    for shard in sorted(shards):
        f = ctx.files[shard]
        if f.kind != FileKind.SAFETENSORS or f.safetensors is None:
            findings.append(error("index.shard_not_safetensors", shard, "shard is not a valid safetensors file"))
            continue
        names = {t.name for t in f.safetensors.tensors}
        for t in f.safetensors.tensors:
            total += t.nbytes
            if t.name in seen:
                findings.append(
                    error(
                        "index.duplicate_tensor",
                        shard,
                        f"tensor {t.name!r} is in two shards",
                        tensor=t.name,
                        other=seen[t.name],
                    )
                )
            seen[t.name] = shard
            if wm.get(t.name) != shard:
                findings.append(
                    error(
                        "index.tensor_not_indexed",
                        shard,
                        f"tensor {t.name!r} is in this shard but the index maps it elsewhere",
                        tensor=t.name,
                        index=wm.get(t.name),
                    )
                )
        for mapped in shards[shard]:
            if mapped not in names:
                findings.append(
                    error(
                        "index.tensor_missing",
                        shard,
                        f"index maps {mapped!r} to this shard but it is not there",
                        tensor=mapped,
                    )
                )
        layout_shards.append({"path": shard, **f.safetensors.to_json()})
    unnamed = sorted(p for p, f in ctx.files.items() if p.endswith(".safetensors") and p not in shards and "/" not in p)
    for p in unnamed:
        findings.append(error("index.unnamed_shard", p, "safetensors file the index never names"))
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    ts = meta.get("total_size")
    if ts is not None and (not isinstance(ts, int) or isinstance(ts, bool) or ts != total):
        findings.append(
            error(
                "index.total_size",
                ip,
                "metadata.total_size does not match the shards' tensor bytes",
                declared=ts if isinstance(ts, int) else repr(ts)[:40],
                actual=total,
            )
        )
    elif ts is None:
        findings.append(warning("index.no_total_size", ip, "index has no metadata.total_size"))
    layout = {
        "index": ip,
        "total_size": total,
        "weight_map": dict(sorted((k, v) for k, v in wm.items() if isinstance(v, str))),
        "shards": layout_shards,
        "metadata": {k: v for k, v in meta.items() if isinstance(v, (str, int))},
    }
    return FormatResult(
        format="hf-sharded-safetensors", layout=layout, loaders=("json", "safetensors"), findings=tuple(findings)
    )


def detect_single_safetensors(ctx: Context) -> FormatResult | None:
    st = [p for p, f in ctx.files.items() if f.kind == FileKind.SAFETENSORS and "/" not in p]
    if len(st) != 1:
        return None
    return FormatResult(
        format="safetensors",
        layout={"files": [{"path": st[0], **(safetensors_layout(ctx, st[0]) or {})}]},
        loaders=("safetensors",),
    )


register_detector("hf-sharded-safetensors", detect_hf_sharded, formats=("hf-sharded-safetensors",), order=10)
register_detector("safetensors", detect_single_safetensors, formats=("safetensors",), order=90)
