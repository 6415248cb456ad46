"""DeepSpeed ZeRO-2/3 to fp32, and DeepSpeed Universal, into HF safetensors [R08, R09, R10].

ZeRO checkpoints are pickles with DeepSpeed objects in them; the policy classes their loader,
``deepspeed``, as a framework deserializer, and gates them as such (attestation, containment).
The plan needs JSON trees of them: ``param_shapes``, ``shared_params``, ``buffer_names``,
``partition_count``, ``zero_stage`` and, for each flat fp32 group, its storage key and element
offset.  Those trees come from one of two places:

* every state file a torch zip whose pickle stayed inside the static reader's DeepSpeed
  allowlist (:func:`statically_readable`): :func:`static_trees` builds them from the static
  reader's symbolic values.  Nothing is imported or called and no worker starts: less than the
  decision permits.
* otherwise the files are loaded only in the contained worker, under a permit, which returns the
  same trees.

Either way, storage keys become byte ranges only through the torch-zip layout inspection read
statically (the worker's word is never taken for a byte range), and ``param_shapes`` must equal
what the static reader saw.  The rules follow DeepSpeed 0.19.8's ``zero_to_fp32.py`` [R10]:

* ZeRO-1/2: per param group, the ranks' ``single_partition_of_fp32_groups`` are concatenated in
  rank order; params are walked in ``param_shapes`` order, each ``numel`` elements, plus its
  ``param_alignment_paddings`` entry when present; the group's end is padding up to a multiple
  of ``2 * world_size``, and the walk must consume exactly the aligned group.
* ZeRO-3: each param is ``ceil(numel / world_size)`` elements from each rank's flat buffer (the
  rank's ``fp32_flat_groups`` concatenated), at the same offset on every rank, concatenated in
  rank order and cut to ``numel``: the padding sits on the last rank.
* ``shared_params`` are re-linked (written once per name); frozen params come from
  ``frozen_param_fragments`` in their saved dtype.  Buffers keep their saved dtype (zero_to_fp32
  up-casts floating buffers to fp32; ckptgate preserves dtypes and says so in the report).

Universal checkpoints hold one ``zero/<param>/fp32.pt`` per parameter: the ``param`` tensor in it
is the full fp32 parameter [R09].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckptgate.consolidate.adapters._common import Segment, record_segment, segment_tensor, take
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
from ckptgate.errors import RuntimeFailure
from ckptgate.inspect.formats.deepspeed import param_shapes
from ckptgate.inspect.pickle import Call, Global, SDict, SList, SSet, key_text

if TYPE_CHECKING:
    from ckptgate.decide.decision import Selection
    from ckptgate.enforce.load import LoadedTrees
    from ckptgate.inspect import Inspection


#: Classes a ZeRO pickle rebuilds as ``REDUCE(cls, (value,))`` that are enums [R10].
_ENUMS = frozenset({"deepspeed.runtime.zero.config.ZeroStageEnum"})
_MAX_NODES = 5_000_000
_MAX_DEPTH = 200


def statically_readable(files: Mapping[str, Any], rels: Sequence[str]) -> bool:
    """Whether every file in ``rels`` is a torch zip whose pickle the static reader read completely
    inside its allowlist."""
    return all(
        (f := files.get(rel)) is not None
        and f.torch is not None
        and f.pickle is not None
        and f.pickle.complete
        and f.pickle.inside_allowlist
        and f.pickle.value is not None
        for rel in rels
    )


def static_trees(files: Mapping[str, Any], rels: Sequence[str]) -> dict[str, Any]:
    """The worker's JSON trees for ``rels``, built from the static reader's symbolic values.

    Tensors become ``__tensor__`` records from the statically read torch-zip layout; an
    OrderedDict becomes a dict, ``torch.Size`` a list, a known enum ``{"__enum__", "value"}``, and
    any other call ``{"__object__", "state"}`` (its arguments are never interpreted).
    """
    out: dict[str, Any] = {}
    for rel in rels:
        if not statically_readable(files, [rel]):
            raise RuntimeFailure(
                "runtime.plan.not_static",
                f"{rel} was not read statically inside the allowlist, "
                "so no plan can be built from it without a framework load",
                evidence={"path": rel},
            )
        f = files[rel]
        tensors = {t.name: t for t in f.torch.tensors}
        # the reader measured (and charged) the value as a tree before keeping it: no walk exceeds that
        out[rel] = _json(f.pickle.value, "", tensors, [min(_MAX_NODES, f.pickle.tree_units)], 0, rel)
    return out


def _json(v: Any, path: str, tensors: Mapping[str, Any], budget: list[int], depth: int, rel: str) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_DEPTH:
        raise RuntimeFailure(
            "runtime.plan.too_large",
            f"{rel}: the pickle's object tree is too large or too deep to plan from",
            evidence={"path": rel},
        )

    def sub(k: Any, x: Any) -> Any:
        key = key_text(k)
        return _json(x, f"{path}.{key}" if path else key, tensors, budget, depth + 1, rel)

    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (bytes, bytearray)):
        return {"__bytes__": None, "len": len(v)}
    if isinstance(v, tuple):
        return [sub(i, x) for i, x in enumerate(v)]
    if isinstance(v, SList):
        return [sub(i, x) for i, x in enumerate(v.items)]
    if isinstance(v, SSet):
        return {"__set__": [sub(i, x) for i, x in enumerate(v.items)]}
    if isinstance(v, SDict) or (
        isinstance(v, Call)
        and (
            v.dict_items is not None
            or (isinstance(v.func, Global) and v.func.dotted == "collections.OrderedDict" and not v.args)
        )
    ):
        items = v.items if isinstance(v, SDict) else v.dict_items or []
        if all(isinstance(k, str) for k, _ in items):
            return {k: sub(k, x) for k, x in items}
        return {"__map__": [[sub(i, k), sub(k, x)] for i, (k, x) in enumerate(items)]}
    if isinstance(v, Call):
        if path in tensors:
            t = tensors[path]
            return {
                "__tensor__": {
                    "storage_key": t.storage_key,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "stride": list(t.stride),
                    "storage_offset": t.storage_offset,
                    "storage_nbytes": t.storage_nbytes,
                }
            }
        func = v.func.dotted if isinstance(v.func, Global) else "?"
        if func == "torch.Size" and isinstance(v.args, tuple) and len(v.args) == 1 and isinstance(v.args[0], tuple):
            return [sub(i, x) for i, x in enumerate(v.args[0])]
        if func in _ENUMS and isinstance(v.args, tuple) and len(v.args) == 1:
            return {"__enum__": func, "value": sub(0, v.args[0])}
        return {"__object__": func, "state": sub("state", v.state) if v.state is not None else {}}
    return {"__unknown__": type(v).__name__}


class StorageMap:
    """Storage key -> absolute byte range, per file, from inspection's static torch-zip reader."""

    def __init__(self, files: Mapping[str, Any]) -> None:
        self._files = files
        self._maps: dict[str, dict[str, tuple[int, int]]] = {}

    def ranges(self, rel: str) -> dict[str, tuple[int, int]]:
        if rel not in self._maps:
            f = self._files.get(rel)
            if f is None or f.torch is None:
                raise RuntimeFailure(
                    "runtime.plan.storage_unknown",
                    f"{rel} has no statically read torch zip layout, so no storage key can be mapped to bytes",
                    evidence={"path": rel},
                )
            self._maps[rel] = {t.storage_key: tuple(t.storage_range) for t in f.torch.tensors}
        return self._maps[rel]

    def segment(self, rel: str, desc: Any, *, what: str) -> Segment:
        """The bytes of a worker ``__tensor__`` record, through the static storage map."""
        t = desc.get("__tensor__") if isinstance(desc, Mapping) else None
        if not isinstance(t, Mapping):
            raise RuntimeFailure(
                "runtime.plan.not_a_tensor",
                f"{rel}: {what} is not a tensor in the worker's plan",
                evidence={"path": rel, "what": what},
            )
        key = t.get("storage_key")
        rng = self.ranges(rel).get(key) if isinstance(key, str) else None
        if rng is None:
            raise RuntimeFailure(
                "runtime.plan.storage_unknown",
                f"{rel}: {what} names storage {key!r}, which the static reader did not see",
                evidence={"path": rel, "storage_key": key},
            )
        if t.get("storage_nbytes") != rng[1] - rng[0]:
            raise RuntimeFailure(
                "runtime.plan.worker_disagrees",
                f"{rel}: storage {key!r} has "
                f"{rng[1] - rng[0]} bytes in the file, the worker says {t.get('storage_nbytes')}",
                evidence={"path": rel, "storage_key": key},
            )
        rec = {
            "dtype": t.get("dtype"),
            "storage_dtype": t.get("dtype"),
            "shape": t.get("shape"),
            "stride": t.get("stride"),
            "storage_offset": t.get("storage_offset"),
            "storage_range": rng,
        }
        try:
            return record_segment(rel, rec, what=what)
        except (KeyError, TypeError, ValueError) as e:
            raise RuntimeFailure("runtime.plan.bad_tensor", f"{rel}: malformed tensor record for {what}") from e


def _get(tree: Any, *path: str, what: str) -> Any:
    node = tree
    for k in path:
        if not isinstance(node, Mapping) or k not in node:
            raise RuntimeFailure(
                "runtime.plan.missing_key",
                f"{what}: no {'.'.join(path)} in the worker's plan",
                evidence={"what": what, "key": ".".join(path)},
            )
        node = node[k]
    return node


def _int(v: Any, what: str) -> int:
    if isinstance(v, Mapping) and "__enum__" in v:
        v = v.get("value")
    if not isinstance(v, int) or isinstance(v, bool):
        raise RuntimeFailure("runtime.plan.bad_value", f"{what} is not an integer", evidence={"what": what})
    return v


def _shapes(groups: Any, what: str) -> list[dict[str, tuple[int, ...]]]:
    if not isinstance(groups, list):
        raise RuntimeFailure("runtime.plan.bad_value", f"{what}: param_shapes is not a list")
    out = []
    for g in groups:
        if not isinstance(g, Mapping) or not all(
            isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v)
            for v in g.values()
        ):
            raise RuntimeFailure("runtime.plan.bad_value", f"{what}: a param_shapes group is not name -> shape")
        out.append({str(k): tuple(v) for k, v in g.items()})
    return out


def _paths(layout: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    models = [m["path"] for m in layout.get("model_states", [])]
    optims = [o["path"] for o in sorted(layout.get("optim_states", []), key=lambda o: o.get("dp_rank", 0))]
    if not models or not optims:
        raise PlanError("plan.zero.layout", "the ZeRO layout lists no model_states or no optim_states files")
    return models, optims


def zero_files(layout: Mapping[str, Any]) -> list[str]:
    """The files the worker must load: every model_states and optim_states file."""
    models, optims = _paths(layout)
    return models + optims


def zero_tensors(
    layout: Mapping[str, Any], trees: Mapping[str, Any], files: Mapping[str, Any]
) -> tuple[list[OutputTensor], dict[str, Any]]:
    """Output tensors of a ZeRO checkpoint from the worker's trees; also the report."""
    models, optims = _paths(layout)
    smap = StorageMap(files)
    m0 = trees[models[0]]
    shapes = _shapes(_get(m0, "param_shapes", what=models[0]), models[0])
    static = layout["model_states"][0].get("param_shapes")
    if static is not None and _shapes(static, "static layout") != shapes:
        raise RuntimeFailure(
            "runtime.plan.worker_disagrees",
            "the worker's param_shapes differ from what the static reader saw in the same file",
            evidence={"path": models[0]},
        )
    osd = [_get(trees[p], "optimizer_state_dict", what=p) for p in optims]
    stage = _int(_get(osd[0], "zero_stage", what=optims[0]), "zero_stage")
    pc = _get(osd[0], "partition_count", what=optims[0])
    world = max(_int(x, "partition_count") for x in pc) if isinstance(pc, list) else _int(pc, "partition_count")
    if world != len(optims) or world != layout.get("world_size", world):
        raise PlanError(
            "plan.zero.world_size",
            f"partition_count is {world} but there are {len(optims)} optimizer state files",
            evidence={"partition_count": world, "files": optims},
        )
    key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    if stage not in (1, 2, 3):
        raise PlanError("plan.zero.stage", f"unknown ZeRO stage {stage}")
    groups: list[list[Segment]] = []  # [rank][group]
    for p, sd in zip(optims, osd, strict=True):
        descs = _get(sd, key, what=p)
        if not isinstance(descs, list):
            raise RuntimeFailure("runtime.plan.bad_value", f"{p}: {key} is not a list")
        segs = [smap.segment(p, d, what=f"{key}[{i}]") for i, d in enumerate(descs)]
        if any(d["__tensor__"].get("dtype") != "float32" or len(d["__tensor__"].get("shape", [])) != 1 for d in descs):
            raise PlanError("plan.zero.flat_group", f"{p}: {key} holds a tensor that is not flat fp32")
        groups.append(segs)
    if len({len(g) for g in groups}) != 1:
        raise PlanError("plan.zero.groups", "ranks hold different numbers of fp32 groups")
    out: dict[str, OutputTensor] = {}
    report: dict[str, Any] = {
        "adapter": "deepspeed-zero",
        "zero_stage": stage,
        "world_size": world,
        "output_dtype": "F32 for trainable params (fp32 master weights)",
    }
    if isinstance(m0.get("ds_version"), str):
        report["ds_version"] = m0["ds_version"]
    if stage == 3:
        _zero3(shapes, groups, world, out)
    else:
        paddings = osd[0].get("param_alignment_paddings") if isinstance(osd[0], Mapping) else None
        _zero2(shapes, groups, world, paddings, out)
    _frozen(models, trees, smap, stage, world, out, report)
    _buffers(models[0], m0, smap, out, report)
    shared = m0.get("shared_params") or {}
    if isinstance(shared, Mapping):
        for alias, target in shared.items():
            if target in out and alias not in out:
                src = out[target]
                out[alias] = OutputTensor(name=alias, dtype=src.dtype, shape=src.shape, placements=src.placements)
        report["shared_params"] = [[a, t] for a, t in shared.items()]
    return list(out.values()), report


def _zero2(
    shapes: list[dict[str, tuple[int, ...]]],
    groups: list[list[Segment]],
    world: int,
    paddings: Any,
    out: dict[str, OutputTensor],
) -> None:
    if len(shapes) != len(groups[0]):
        raise PlanError("plan.zero.groups", f"{len(shapes)} param_shapes groups but {len(groups[0])} fp32 groups")
    align = 2 * world
    for gi, group_shapes in enumerate(shapes):
        merged = [groups[r][gi] for r in range(world)]  # rank order
        avail = sum(s.count for s in merged)
        pads = paddings[gi] if isinstance(paddings, list) else None
        if pads is not None and (not isinstance(pads, list) or len(pads) != len(group_shapes)):
            raise PlanError("plan.zero.padding", f"group {gi}: param_alignment_paddings does not match its params")
        offset = 0
        for pi, (name, shape) in enumerate(group_shapes.items()):
            n = numel(shape)
            placements = take(merged, offset, n, what=name) if n else []
            out[name] = OutputTensor(name=name, dtype="F32", shape=shape, placements=tuple(placements))
            offset += n + (_int(pads[pi], "padding") if pads is not None else 0)
        aligned_off, aligned_avail = align * math.ceil(offset / align), align * math.ceil(avail / align)
        if aligned_off != aligned_avail:
            raise PlanError(
                "plan.zero.padding_mismatch",
                f"group {gi}: params consume {offset} elements of "
                f"{avail} (aligned to {align}: {aligned_off} != {aligned_avail})",
                evidence={"group": gi, "consumed": offset, "available": avail, "align": align},
            )


def _zero3(
    shapes: list[dict[str, tuple[int, ...]]], groups: list[list[Segment]], world: int, out: dict[str, OutputTensor]
) -> None:
    sizes = [[s.count for s in rank] for rank in groups]
    if any(sz != sizes[0] for sz in sizes):
        raise PlanError("plan.zero.groups", "ranks hold fp32 flat groups of different sizes", evidence={"sizes": sizes})
    flat = {name: shape for g in shapes for name, shape in g.items()}
    offset = 0
    for name, shape in flat.items():
        n = numel(shape)
        part = math.ceil(n / world)
        placements = []
        got = 0
        for r in range(world):
            k = min(part, n - got)
            if k > 0:
                placements += take(groups[r], offset, k, dst_elem=got, what=name)
                got += k
        out[name] = OutputTensor(name=name, dtype="F32", shape=shape, placements=tuple(placements))
        offset += part
    if offset != sum(sizes[0]):
        raise PlanError(
            "plan.zero.padding_mismatch",
            f"params consume {offset} elements per rank, each rank holds {sum(sizes[0])}",
            evidence={"consumed": offset, "available": sum(sizes[0])},
        )


def _frozen(
    models: Sequence[str],
    trees: Mapping[str, Any],
    smap: StorageMap,
    stage: int,
    world: int,
    out: dict[str, OutputTensor],
    report: dict[str, Any],
) -> None:
    fshapes = trees[models[0]].get("frozen_param_shapes")
    if not fshapes:
        return
    shapes = _shapes([fshapes], "frozen_param_shapes")[0]
    for name, shape in shapes.items():
        n = numel(shape)
        if stage == 3:
            if len(models) != world:
                raise PlanError("plan.zero.world_size", "ZeRO-3 frozen params need one model_states file per rank")
            segs = [smap.segment(m, _get(trees[m], "frozen_param_fragments", name, what=m), what=name) for m in models]
        else:
            segs = [
                smap.segment(
                    models[0], _get(trees[models[0]], "frozen_param_fragments", name, what=models[0]), what=name
                )
            ]
        desc = _get(trees[models[0]], "frozen_param_fragments", name, what=models[0])["__tensor__"]
        dtype = st_dtype(str(desc.get("dtype")), what=name)
        out[name] = OutputTensor(
            name=name, dtype=dtype, shape=shape, placements=tuple(take(segs, 0, n, what=name)) if n else ()
        )
    report["frozen_params"] = sorted(shapes)


def _buffers(rel: str, m0: Any, smap: StorageMap, out: dict[str, OutputTensor], report: dict[str, Any]) -> None:
    names = m0.get("buffer_names") or []
    module = m0.get("module") or {}
    kept = []
    for name in names:
        desc = module.get(name) if isinstance(module, Mapping) else None
        if desc is None:
            continue
        seg = smap.segment(rel, desc, what=name)
        t = desc["__tensor__"]
        out[name] = segment_tensor(name, st_dtype(t["dtype"], what=name), t["shape"], seg)
        kept.append(name)
    if kept:
        report["buffers_saved_dtype_kept"] = kept


def zero_plan(
    layout: Mapping[str, Any],
    trees: Mapping[str, Any],
    files: Mapping[str, Any],
    *,
    max_shard_bytes: int,
    trees_from: str,
    worker: Mapping[str, Any] | None = None,
) -> ConsolidationPlan:
    """The plan from JSON trees; ``trees_from`` (``static_reader`` or ``contained_worker``) and,
    for the worker, what it reported about itself (``worker``) go into the report.

    The trees describe untrusted bytes either way: a shape the rules do not expect is an input
    problem (``runtime.plan.bad_value``), never a crash.
    """
    try:
        tensors, report = zero_tensors(layout, trees, files)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise RuntimeFailure(
            "runtime.plan.bad_value",
            f"the {trees_from.replace('_', ' ')}'s description of "
            f"the ZeRO checkpoint has an unexpected shape: {type(e).__name__}",
            evidence={"trees_from": trees_from},
        ) from None
    report["trees_from"] = trees_from
    if worker is not None:
        report["worker"] = dict(worker)
    if not tensors:
        raise no_tensors("parameters")
    return shard_tensors(tensors, max_shard_bytes=max_shard_bytes, report=report)


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


class ZeroAdapter:
    """``deepspeed-zero``: ZeRO-2/3 partitions.  Gated as a framework load; when every state file
    stayed inside the static reader's allowlist, the plan is built from the static reader and no
    worker runs (:meth:`framework_files` is ``()``)."""

    name = "deepspeed-zero"
    formats = ("deepspeed-zero2", "deepspeed-zero3")
    mappings: tuple[str, ...] = ()
    selects = False

    def framework_files(self, inspection: Inspection) -> tuple[str, ...]:
        rels = zero_files(inspection.layout)
        files = {f.path: f for f in inspection.files}
        return () if statically_readable(files, rels) else tuple(rels)

    def worker_files(self, inspection: Inspection) -> tuple[str, ...]:
        """Every state file, for a load that must go through the contained worker (a runtime
        qualification: it is about the worker's torch) even where the static reader could read them."""
        return tuple(zero_files(inspection.layout))

    def plan(
        self,
        inspection: Inspection,
        *,
        max_shard_bytes: int,
        mapping: str | None = None,
        selection: Selection | None = None,
        loaded: LoadedTrees | None = None,
    ) -> ConsolidationPlan:
        layout, files = inspection.layout, {f.path: f for f in inspection.files}
        if loaded is None:  # less than the decision permits: no worker at all
            return zero_plan(
                layout,
                static_trees(files, zero_files(layout)),
                files,
                max_shard_bytes=max_shard_bytes,
                trees_from="static_reader",
            )
        return zero_plan(
            layout,
            loaded.trees,
            files,
            max_shard_bytes=max_shard_bytes,
            trees_from="contained_worker",
            worker={
                "job": loaded.job,
                "controls": dict(loaded.controls),
                "measured": dict(loaded.measured),
                "wall_s": round(loaded.wall_s, 3),
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
register(ZeroAdapter())
