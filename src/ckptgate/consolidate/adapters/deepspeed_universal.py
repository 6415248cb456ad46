"""DeepSpeed Universal checkpoints into HF safetensors [R09]: one ``zero/<param>/fp32.pt`` per
parameter, whose ``param`` tensor is the full fp32 parameter; tied aliases take their target's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptgate.consolidate.adapters._common import record_segment, segment_tensor
from ckptgate.consolidate.adapters.registry import Static, register
from ckptgate.consolidate.plan import (
    DTYPE_SIZES,
    ConsolidationPlan,
    OutputTensor,
    PlanError,
    no_tensors,
    numel,
    shard_tensors,
    st_dtype,
)
from ckptgate.inspect.formats.deepspeed import param_shapes


def universal_aliases(layout: Mapping[str, Any], files: Mapping[str, Any]) -> dict[str, str]:
    """Tied aliases of a Universal checkpoint: ``{alias: target}``.

    ``ds_to_universal`` of DeepSpeed 0.19.8 writes a ``zero/<alias>/fp32.pt`` for a tied alias too,
    holding the bf16 model weights up-cast, not the fp32 master weights; the alias must take its
    target's ``fp32.pt``.  DeepSpeed 0.17.6 and 0.18.9 write no folder for the alias at all; the alias is
    still in the model states, and takes its target's ``fp32.pt`` the same way.  An alias is a key
    of ``shared_params`` in the folder's ``*model_states.pt``; its target is the one *other* param
    in ``param_shapes`` whose saved tensor is the same view of the same storage (static reader
    only).  Anything else is refused, not guessed.
    """
    folders = {rec.get("folder", "") for rec in layout.get("params", {}).values()}
    out: dict[str, str] = {}
    for folder in sorted(folders):
        pre = f"{folder}/" if folder else ""
        states = [
            f
            for p, f in files.items()
            if p.startswith(pre) and "/" not in p[len(pre) :] and p.endswith("model_states.pt")
        ]
        for f in states:
            if f.torch is None:
                continue
            aliases = [k.removeprefix("shared_params.") for k in f.torch.values if k.startswith("shared_params.")]
            if not aliases:
                continue
            trainable = {
                k.split(".", 2)[2] for k in f.torch.values if k.startswith("param_shapes.") and k.count(".") >= 2
            }
            views = {
                r.name.removeprefix("module."): (r.storage_key, r.storage_offset, r.shape, r.stride, r.dtype)
                for r in f.torch.tensors
                if r.name.startswith("module.")
            }
            for alias in aliases:
                view = views.get(alias)
                targets = [n for n, v in views.items() if n != alias and v == view and n in trainable]
                if view is None or len(targets) != 1:
                    raise PlanError(
                        "plan.universal.alias_unresolved",
                        f"{f.path}: tied alias {alias!r} has no single trainable parameter sharing its storage",
                        evidence={"alias": alias, "candidates": targets},
                    )
                out[alias] = targets[0]
    return out


def universal_shapes(layout: Mapping[str, Any], files: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """``param_shapes`` of the Universal folders' ``*model_states.pt`` (static reader only): name -> shape.

    Converted from ZeRO-3, ``ds_to_universal`` (DeepSpeed 0.17.6, 0.18.9, 0.19.8) saves each ``fp32.pt`` as the bare
    merged tensor, flat; the shape is the one the model states record.  Files that disagree are refused,
    and so is a folder with no model states' param_shapes.
    """
    folders = {rec.get("folder", "") for rec in layout.get("params", {}).values()}
    out: dict[str, tuple[int, ...]] = {}
    for folder in sorted(folders):
        pre = f"{folder}/" if folder else ""
        states = [
            (p, param_shapes(f.pickle.value if f.pickle is not None else None))
            for p, f in sorted(files.items())
            if p.startswith(pre) and "/" not in p[len(pre) :] and p.endswith("model_states.pt")
        ]
        if not any(groups for _, groups in states):
            # without them a flat fp32.pt (ZeRO-3) has no shape, and a tied alias no name: never guessed
            raise PlanError(
                "plan.universal.no_param_shapes",
                f"the Universal folder {folder or '.'!r} holds no *model_states.pt with param_shapes",
                evidence={"folder": folder},
            )
        for p, found in states:
            groups = found or []
            for g in groups:
                for name, shape in g.items():
                    if out.setdefault(name, tuple(shape)) != tuple(shape):
                        raise PlanError(
                            "plan.universal.shape_conflict",
                            f"{p}: param_shapes gives {name!r} shape {list(shape)}, another model states file "
                            f"{list(out[name])}",
                            evidence={"param": name, "path": p},
                        )
    return out


def universal_tensors(
    layout: Mapping[str, Any],
    aliases: Mapping[str, str] | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> list[OutputTensor]:
    """Output tensors of a Universal checkpoint: the ``param`` tensor of each ``zero/<name>/fp32.pt``
    (an alias takes its target's, whether or not the release wrote a folder for the alias).  A flat
    tensor takes the shape ``shapes`` (the model states' ``param_shapes``) gives it when the element
    counts are equal; the bytes are the same row-major elements either way.  Any other disagreement
    with ``shapes``, and a parameter of ``shapes`` with no tensor, is refused."""
    aliases = aliases or {}
    shapes = shapes or {}
    params = layout.get("params", {})
    out = []
    for name in sorted({*params, *(a for a, t in aliases.items() if t in params)}):
        rec = params[aliases.get(name, name)] if aliases.get(name, name) in params else params[name]
        info = rec.get("files", {}).get("fp32")
        if info is None or "tensors" not in info:
            raise PlanError(
                "plan.universal.no_fp32", f"parameter {name!r} has no readable fp32.pt", evidence={"param": name}
            )
        tensors = info["tensors"]
        chosen = [t for t in tensors if t["name"] == "param"] or (tensors if len(tensors) == 1 else [])
        if len(chosen) != 1:
            raise PlanError(
                "plan.universal.ambiguous",
                f"{info['path']}: no single 'param' tensor",
                evidence={"param": name, "tensors": [t["name"] for t in tensors]},
            )
        t = chosen[0]
        seg = record_segment(info["path"], t, what=name)
        dtype = st_dtype(t["dtype"], what=name)
        if DTYPE_SIZES[dtype] != seg.itemsize:
            raise PlanError("plan.tensor.dtype", f"{name}: dtype size mismatch")
        shape = t["shape"]
        recorded = shapes.get(aliases.get(name, name))
        if recorded is not None and tuple(shape) != recorded:
            if len(shape) != 1 or numel(recorded) != numel(shape):
                raise PlanError(
                    "plan.universal.shape_mismatch",
                    f"{info['path']}: {name!r} holds shape {list(shape)}, the model states' param_shapes "
                    f"record {list(recorded)}",
                    evidence={"param": name, "shape": list(shape), "param_shapes": list(recorded)},
                )
            shape = list(recorded)  # a flat ZeRO-3 fp32.pt: the same row-major elements
        out.append(segment_tensor(name, dtype, shape, seg))
    written = {t.name for t in out}
    missing = sorted(n for n in shapes if n not in written and aliases.get(n, n) not in written)
    if missing:
        raise PlanError(
            "plan.universal.param_missing",
            f"the model states' param_shapes name {len(missing)} parameter(s) with no zero/<name>/fp32.pt: "
            f"{missing[:5]}",
            evidence={"params": missing[:50]},
        )
    return out


def universal_plan(layout: Mapping[str, Any], files: Mapping[str, Any], *, max_shard_bytes: int) -> ConsolidationPlan:
    aliases = universal_aliases(layout, files)
    tensors = universal_tensors(layout, aliases, universal_shapes(layout, files))
    if not tensors:
        raise no_tensors("parameters")
    return shard_tensors(
        tensors,
        max_shard_bytes=max_shard_bytes,
        report={
            "adapter": "deepspeed-universal",
            "params": len(tensors),
            "shared_params": [[a, t] for a, t in sorted(aliases.items())],
        },
    )


#: ``deepspeed-universal``: Universal Checkpointing's per-parameter ``fp32.pt`` files.
register(
    Static(
        "deepspeed-universal",
        ("deepspeed-universal",),
        lambda i, size, _m, _s: universal_plan(i.layout, {f.path: f for f in i.files}, max_shard_bytes=size),
    )
)
