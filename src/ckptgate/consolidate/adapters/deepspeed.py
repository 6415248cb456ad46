"""DeepSpeed ZeRO-2/3 to fp32, into HF safetensors [R08, R10].

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
* One name, one source: a name that two of the param groups, the frozen params, the buffers and
  the aliases give is refused (``plan.zero.duplicate_name``), and so is an alias of no parameter
  (``plan.zero.shared_params``) and optimizer files that disagree on ``zero_stage`` or
  ``partition_count`` (``plan.zero.ranks_disagree``).

Universal checkpoints: :mod:`ckptgate.consolidate.adapters.deepspeed_universal`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ckptgate.consolidate.adapters._common import Segment, record_segment, segment_tensor, take
from ckptgate.consolidate.adapters.deepspeed_static import static_trees, statically_readable
from ckptgate.consolidate.adapters.registry import register
from ckptgate.consolidate.plan import (
    ConsolidationPlan,
    OutputTensor,
    PlanError,
    no_tensors,
    numel,
    shard_tensors,
    st_dtype,
)
from ckptgate.errors import RuntimeFailure
from ckptgate.shapes import MAX_NDIM, dims_in_bounds

if TYPE_CHECKING:
    from ckptgate.decide.decision import Selection
    from ckptgate.enforce.load import LoadedTrees
    from ckptgate.inspect import Inspection


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
        # a shape torch could not hold is refused before its numel (quadratic in the dims) is taken
        if not isinstance(g, Mapping) or not all(isinstance(v, list) and dims_in_bounds(v) for v in g.values()):
            raise RuntimeFailure(
                "runtime.plan.bad_value",
                f"{what}: a param_shapes group is not name -> shape (at most {MAX_NDIM} dims, each in int64)",
            )
        out.append({str(k): tuple(v) for k, v in g.items()})
    return out


def _add(out: dict[str, OutputTensor], t: OutputTensor, source: str, sources: dict[str, str]) -> None:
    """Put ``t`` into ``out``; a name that one source (trainable param, frozen param, buffer, shared
    alias) already gave is refused, never one of the two silently kept."""
    if t.name in out:
        raise PlanError(
            "plan.zero.duplicate_name",
            f"{t.name} is both a {sources[t.name]} and a {source} of the checkpoint",
            evidence={"name": t.name, "sources": [sources[t.name], source]},
            advice=f"Save the model again so that {t.name} names one tensor; ckptgate does not choose between "
            f"the {sources[t.name]} and the {source} (`ckptgate inspect SRC` lists them).",
        )
    out[t.name] = t
    sources[t.name] = source


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
    for p, sd in zip(optims[1:], osd[1:], strict=True):
        other = (_int(_get(sd, "zero_stage", what=p), "zero_stage"), _get(sd, "partition_count", what=p))
        if other != (stage, pc):
            raise PlanError(
                "plan.zero.ranks_disagree",
                f"{p} says ZeRO stage {other[0]}, partition_count {other[1]!r}; {optims[0]} says stage {stage}, "
                f"partition_count {pc!r}",
                evidence={"files": [optims[0], p]},
                advice=f"Give SRC the optimizer state files of one save: {optims[0]} and {p} disagree on how the "
                "parameters were partitioned.",
            )
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
    sources: dict[str, str] = {}
    report: dict[str, Any] = {
        "adapter": "deepspeed-zero",
        "zero_stage": stage,
        "world_size": world,
        "output_dtype": "F32 for trainable params (fp32 master weights)",
    }
    if isinstance(m0.get("ds_version"), str):
        report["ds_version"] = m0["ds_version"]
    names = [name for g in shapes for name in g]
    if len(set(names)) != len(names):  # a name in two groups would be walked twice and published once
        twice = sorted(n for n, k in Counter(names).items() if k > 1)
        raise PlanError(
            "plan.zero.duplicate_name",
            f"{twice[0]} is in more than one param_shapes group",
            evidence={"names": twice[:20]},
            advice=f"Save the model again so that {twice[0]} names one parameter (`ckptgate inspect SRC` lists "
            "the param_shapes groups).",
        )
    if stage == 3:
        _zero3(shapes, groups, world, out, sources)
    else:
        paddings = osd[0].get("param_alignment_paddings") if isinstance(osd[0], Mapping) else None
        _zero2(shapes, groups, world, paddings, out, sources)
    _frozen(models, trees, smap, stage, world, out, sources, report)
    _buffers(models[0], m0, smap, out, sources, report)
    shared = m0.get("shared_params") or {}
    if not isinstance(shared, Mapping) or not all(isinstance(v, str) for v in shared.values()):
        raise RuntimeFailure("runtime.plan.bad_value", f"{models[0]}: shared_params is not name -> name")
    for alias, target in shared.items():
        src = out.get(target)
        if src is None or sources.get(target) == "shared alias":
            raise PlanError(
                "plan.zero.shared_params",
                f"shared_params links {alias} to {target[:200]}, which is no parameter of the checkpoint",
                evidence={"alias": alias, "target": target[:200]},
                advice=f"Save the model again: {alias} is tied to {target[:80]!r}, which param_shapes, "
                "frozen_param_shapes and buffer_names do not hold (`ckptgate inspect SRC` lists them).",
            )
        tied = OutputTensor(name=alias, dtype=src.dtype, shape=src.shape, placements=src.placements)
        _add(out, tied, "shared alias", sources)
    report["shared_params"] = [[a, t] for a, t in shared.items()]
    return list(out.values()), report


def _zero2(
    shapes: list[dict[str, tuple[int, ...]]],
    groups: list[list[Segment]],
    world: int,
    paddings: Any,
    out: dict[str, OutputTensor],
    sources: dict[str, str],
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
            _add(
                out,
                OutputTensor(name=name, dtype="F32", shape=shape, placements=tuple(placements)),
                "trainable param",
                sources,
            )
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
    shapes: list[dict[str, tuple[int, ...]]],
    groups: list[list[Segment]],
    world: int,
    out: dict[str, OutputTensor],
    sources: dict[str, str],
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
        _add(
            out,
            OutputTensor(name=name, dtype="F32", shape=shape, placements=tuple(placements)),
            "trainable param",
            sources,
        )
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
    sources: dict[str, str],
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
        placements = tuple(take(segs, 0, n, what=name)) if n else ()
        _add(out, OutputTensor(name=name, dtype=dtype, shape=shape, placements=placements), "frozen param", sources)
    report["frozen_params"] = sorted(shapes)


def _buffers(
    rel: str, m0: Any, smap: StorageMap, out: dict[str, OutputTensor], sources: dict[str, str], report: dict[str, Any]
) -> None:
    names = m0.get("buffer_names") or []
    module = m0.get("module") or {}
    kept = []
    for name in names:
        desc = module.get(name) if isinstance(module, Mapping) else None
        if desc is None:
            continue
        seg = smap.segment(rel, desc, what=name)
        t = desc["__tensor__"]
        _add(out, segment_tensor(name, st_dtype(t["dtype"], what=name), t["shape"], seg), "buffer", sources)
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


register(ZeroAdapter())
