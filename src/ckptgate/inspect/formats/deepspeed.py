"""DeepSpeed ZeRO-1/2/3 checkpoints and DeepSpeed Universal checkpoints [R08, R09, R10].

``latest`` is validated as a plain basename before it names a folder.  ``zero_to_fp32.py`` and
``zero_to_torch.py`` are code copied into the checkpoint; they are reported, never run.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.formats._base import Context, FormatResult, plain_basename
from ckptgate.inspect.formats.registry import register_detector
from ckptgate.inspect.pickle import Call, Global, SDict, SList, key_text

__all__ = ["detect_deepspeed", "detect_universal", "param_shapes"]

_MODEL = re.compile(r"^(zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$", re.ASCII)
_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$", re.ASCII)
_UNIVERSAL = re.compile(r"^(?:(.*)/)?zero/([^/]+)/(fp32|exp_avg|exp_avg_sq|step)\.pt$")


def param_shapes(value: Any) -> list[dict[str, list[int]]] | None:
    """``param_shapes`` of a ZeRO ``*model_states.pt`` pickle's symbolic value: per param group,
    name -> shape (``torch.Size`` calls only); None when it is not that shape."""
    if not isinstance(value, SDict):
        return None
    ps = {k: v for k, v in value.items if isinstance(k, str)}.get("param_shapes")
    groups = ps.items if isinstance(ps, SList) else [ps] if ps is not None else []
    out = []
    for g in groups:
        items = g.dict_items if isinstance(g, Call) else g.items if isinstance(g, SDict) else None
        if items is None:
            return None
        shapes = {}
        for k, v in items:
            if (
                isinstance(v, Call)
                and isinstance(v.func, Global)
                and v.func.dotted == "torch.Size"
                and isinstance(v.args, tuple)
                and len(v.args) == 1
                and isinstance(v.args[0], tuple)
            ):
                shapes[key_text(k)] = list(v.args[0])
            else:
                return None
        out.append(shapes)
    return out


def _recorded(f: Any, key: str) -> int | None:
    """``dp_world_size`` or ``mp_world_size`` as a ``*model_states.pt`` pickle records it (a plain int), else None."""
    value = f.pickle.value if f.pickle is not None else None
    if not isinstance(value, SDict):
        return None
    v = {k: v for k, v in value.items if isinstance(k, str)}.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 20 else None


def _missing_states(
    models: dict[str, re.Match[str]], optims: dict[str, re.Match[str]], model_files: dict[str, Any], pre: str
) -> list[Finding]:
    """Completeness of a tag folder: every model-parallel rank the files name (and ``0..mp_world_size-1`` as a
    model-states file records it) has its model-states file(s), and, once any optimizer-state partition is
    there, its partitions of every data-parallel rank ``0..N-1``, N being the largest the files name or record
    (``dp_world_size``; under ZeRO-3 also the ``zero_pp_rank_<r>`` model-states files).  A rank whose files are
    missing (a node's files not yet copied, a save cut short) is ``deepspeed.model_states_missing`` or
    ``deepspeed.ranks_incomplete``."""
    recorded = [_recorded(f, k) for f in model_files.values() for k in ("dp_world_size", "mp_world_size")]
    dp_recorded = [w for w in recorded[0::2] if w is not None]
    mp_recorded = [w for w in recorded[1::2] if w is not None]
    mp_named = {int(m.group(3)) for m in (*models.values(), *optims.values())}
    mp_world = max([*mp_named, *(w - 1 for w in mp_recorded)]) + 1
    stage3: dict[int, set[int]] = {}  # ZeRO-3 model states: mp rank -> dp ranks
    for m in models.values():
        if m.group(1):
            stage3.setdefault(int(m.group(3)), set()).add(int(m.group(2)))
    dp_by_mp: dict[int, set[int]] = {}
    for m in optims.values():
        dp_by_mp.setdefault(int(m.group(3)), set()).add(int(m.group(2)))
    dp_world = max([0, *dp_recorded, *(r + 1 for rs in (*dp_by_mp.values(), *stage3.values()) for r in rs)])
    # counted, and the first 64 named, without a list as long as the largest rank a file name claims
    findings = []
    have_model = {int(m.group(3)) for m in models.values() if not m.group(1)}
    if stage3:
        n_models = mp_world * dp_world - sum(len(rs) for rs in stage3.values())
        absent_models = (
            f"zero_pp_rank_{r}_mp_rank_{mp:02d}_model_states.pt"
            for mp in range(mp_world)
            for r in range(dp_world)
            if r not in stage3.get(mp, ())
        )
    else:
        n_models = mp_world - len(have_model)
        absent_models = (f"mp_rank_{mp:02d}_model_states.pt" for mp in range(mp_world) if mp not in have_model)
    if n_models:
        named = list(itertools.islice(absent_models, 64))
        findings.append(
            error(
                "deepspeed.model_states_missing",
                pre,
                f"{n_models} model-states file(s) of the {mp_world} model-parallel rank(s) are missing, "
                f"first {named[:4]}",
                missing=named,
            )
        )
    n_optims = mp_world * dp_world - sum(len(rs) for rs in dp_by_mp.values())
    if optims and n_optims:
        bf16 = "bf16_" if all(m.group(1) for m in optims.values()) else ""
        named = list(
            itertools.islice(
                (
                    f"{bf16}zero_pp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt"
                    for mp in range(mp_world)
                    for r in range(dp_world)
                    if r not in dp_by_mp.get(mp, ())
                ),
                64,
            )
        )
        findings.append(
            error(
                "deepspeed.ranks_incomplete",
                pre,
                f"{n_optims} optimizer-state partition(s) of {dp_world} data-parallel x {mp_world} "
                f"model-parallel rank(s) are missing, first {named[:4]}",
                missing=named,
                ranks=sorted(r for rs in dp_by_mp.values() for r in rs)[:64],
            )
        )
    return findings


def detect_deepspeed(ctx: Context) -> FormatResult | None:
    latest = ctx.files.get("latest")
    findings: list[Finding] = []
    tag = ""
    if latest is not None:
        t = (latest.text or "").strip()
        bad = plain_basename(t, "latest", "latest tag")
        if bad:
            findings.append(
                error(
                    "deepspeed.bad_latest_tag",
                    "latest",
                    f"the latest tag {t[:80]!r} is not a plain folder name",
                    value=t[:200],
                )
            )
            return FormatResult(
                format="deepspeed-zero2",
                layout={"tag": None},
                loaders=("deepspeed",),
                findings=tuple(findings),
                consolidatable=False,
            )
        tag = t
    files = ctx.under(tag) if tag else ctx.files
    models = {p: m for p in files if "/" not in p and (m := _MODEL.match(p))}
    optims = {p: m for p in files if "/" not in p and (m := _OPTIM.match(p))}
    if not models and not optims:
        if latest is not None:
            findings.append(
                error("deepspeed.tag_missing", "latest", f"the tag folder {tag!r} holds no DeepSpeed states")
            )
            return FormatResult(
                format="deepspeed-zero2",
                layout={"tag": tag},
                loaders=("deepspeed",),
                findings=tuple(findings),
                consolidatable=False,
            )
        return None
    stage3 = any(m.group(1) for m in models.values())
    pre = f"{tag}/" if tag else ""
    model_layout = []
    for p in sorted(models):
        f = ctx.files[pre + p]
        entry: dict[str, Any] = {"path": f.path}
        if f.torch is not None:
            entry["tensors"] = [t.to_json() for t in f.torch.tensors]
            entry["param_shapes"] = param_shapes(f.pickle.value if f.pickle else None)
            entry["inside_allowlist"] = bool(f.pickle and f.pickle.inside_allowlist)
        model_layout.append(entry)
    optim_layout = []
    for p in sorted(optims, key=lambda q: int(optims[q].group(2))):
        f = ctx.files[pre + p]
        optim_layout.append(
            {
                "path": f.path,
                "dp_rank": int(optims[p].group(2)),
                "bf16": bool(optims[p].group(1)),
                "tensors": [t.to_json() for t in f.torch.tensors] if f.torch else None,
                "inside_allowlist": bool(f.pickle and f.pickle.inside_allowlist),
            }
        )
    ranks = sorted(int(m.group(2)) for m in optims.values())
    missing = _missing_states(models, optims, {p: ctx.files[pre + p] for p in models}, pre)
    findings.extend(missing)
    code = sorted(p for p, f in ctx.files.items() if f.kind == FileKind.CODE)
    layout = {
        "tag": tag or None,
        "stage": 3 if stage3 else "1/2",
        "world_size": len(ranks),
        "model_states": model_layout,
        "optim_states": optim_layout,
        "code_files": code,
    }
    fmt = "deepspeed-zero3" if stage3 else "deepspeed-zero2"
    # a rank's states missing: nothing whole to consolidate
    return FormatResult(
        format=fmt, layout=layout, loaders=("deepspeed",), findings=tuple(findings), consolidatable=not missing
    )


def detect_universal(ctx: Context) -> FormatResult | None:
    params: dict[str, dict[str, Any]] = {}
    loaders = set()
    findings: list[Finding] = []
    for p, f in ctx.files.items():
        m = _UNIVERSAL.match(p)
        if not m:
            continue
        rec = params.setdefault(m.group(2), {"folder": m.group(1) or "", "files": {}})
        info: dict[str, Any] = {"path": p, "kind": str(f.kind)}
        if f.torch is not None and f.pickle is not None:
            info["tensors"] = [t.to_json() for t in f.torch.tensors]
            info["plain"] = f.pickle.plain_tensors
            loaders.add("static_pickle" if f.pickle.plain_tensors else "torch_load")
        else:
            findings.append(
                error("deepspeed.universal_unreadable", p, "universal state file is not a readable torch zip")
            )
        rec["files"][m.group(3)] = info
    if not params:
        return None
    for name, rec in params.items():
        if "fp32" not in rec["files"]:
            findings.append(error("deepspeed.universal_no_fp32", f"zero/{name}", "parameter has no fp32.pt"))
    return FormatResult(
        format="deepspeed-universal",
        layout={"params": dict(sorted(params.items()))},
        loaders=tuple(sorted(loaders)) or ("torch_load",),
        findings=tuple(findings),
    )


register_detector("deepspeed-universal", detect_universal, formats=("deepspeed-universal",), order=60)
register_detector("deepspeed-zero", detect_deepspeed, formats=("deepspeed-zero2", "deepspeed-zero3"), order=70)
