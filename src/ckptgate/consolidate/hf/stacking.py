"""Per-layer and per-expert keys gathered into the stacked tensors the family table reads.

megatron-core saves a homogeneous decoder as stacked tensors (``decoder.layers.<name>``, a
leading layer axis at global offsets, and ``decoder.layers.mlp.experts.experts.<name>`` with an
expert axis after it).  A save with ``singleton_local_shards`` (and a decoder of non-homogeneous
layers) writes one key per layer, ``decoder.layers.<i>.<name>`` with the global layer number
``i``, and, with ``singleton_local_shards``, one key per expert,
``decoder.layers.<i>.mlp.experts.experts.<e>.<name>`` with the global expert number ``e``; a gated
``linear_fc1`` then becomes two keys, ``<name>_w`` (the gate rows) and ``<name>_v`` (the up rows),
each TP-split on its own (megatron-core's ``apply_swiglu_sharded_factory``, checked with 0.19.2).

Each family of such keys is a *view*: one stacked tensor whose placements are the members' own,
shifted to the member's row-major position (``[gate; up]`` for the halves), so the table's rules
and the engine's source ledger apply unchanged, and every element of every member is consumed
exactly once because the view is a bijection.  Nothing is read.  A family that does not tile its
stacked shape exactly (a missing layer, expert or half, members of different shapes or dtypes, a
layer number beyond the config's ``num_hidden_layers``), a key present both stacked and per
layer, or two keys naming one member (``decoder.layers.1.`` and ``decoder.layers.01.``), is refused
with a typed reason.  A layer or expert number of more than 18 digits makes no per-layer key: the
name stays a tensor of its own, which no rule maps (``mapping.source.unmapped``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ckptgate.consolidate.hf.table import Declared, MappingRefused
from ckptgate.consolidate.plan import DTYPE_SIZES, OutputTensor, merge_placements

__all__ = ["stack_per_layer"]

_LAYER = re.compile(r"^decoder\.layers\.([0-9]{1,18})\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.experts\.([0-9]{1,18})\.(.+)$")
#: the two halves of a gated linear_fc1 saved with singleton_local_shards: _w (gate), then _v (up)
_HALF = re.compile(r"^(.*linear_fc1\.(?:weight|bias))_([wv])$")
_HALVES = ("w", "v")


@dataclasses.dataclass(slots=True)
class _Group:
    """The members of one stacked tensor: (layer, expert or None, half or None) -> tensor."""

    experts: bool
    members: dict[tuple[int, int | None, str | None], OutputTensor] = dataclasses.field(default_factory=dict)


def _refuse(code: str, message: str, **evidence: Any) -> MappingRefused:
    return MappingRefused(code, message, evidence=evidence)


def _parse(name: str) -> tuple[str, int, int | None, str | None] | None:
    """(stacked name, layer, expert, half) of a per-layer key, or ``None`` for any other name."""
    m = _LAYER.match(name)
    if m is None:
        return None
    layer, rest = int(m.group(1)), m.group(2)
    expert = None
    e = _EXPERT.match(rest)
    if e is not None:
        expert, rest = int(e.group(1)), "mlp.experts.experts." + e.group(2)
    half = None
    h = _HALF.match(rest)
    if h is not None:
        rest, half = h.group(1), h.group(2)
    return f"decoder.layers.{rest}", layer, expert, half


def _stack(name: str, group: _Group, d: Declared) -> OutputTensor:
    layers = d.symbols["num_hidden_layers"]
    experts = d.symbols.get("num_experts", 0) if group.experts else None
    halves = {k[2] for k in group.members}
    split = halves != {None}
    if split and halves != set(_HALVES):
        raise _refuse(
            "mapping.per_layer.halves",
            f"{name}: the gated halves are mixed with whole tensors",
            tensor=name,
            halves=sorted(str(h) for h in halves),
        )
    first = group.members[min(group.members, key=str)]
    if any(t.dtype != first.dtype or t.shape != first.shape for t in group.members.values()):
        shapes = sorted({f"{t.dtype}{list(t.shape)}" for t in group.members.values()})
        raise _refuse(
            "mapping.per_layer.shape",
            f"{name}: its per-layer keys differ in shape or dtype ({shapes[:4]})",
            tensor=name,
            shapes=shapes[:20],
        )
    # the members must be exactly every (layer, expert, half) the config declares: checked member by
    # member and by count, never by listing what the config declares (a config may declare 10**12 layers)
    per_layer = (experts if experts is not None else 1) * (2 if split else 1)
    extra = sorted((k for k in group.members if not _declared(k, layers, experts, split)), key=str)
    if extra or len(group.members) != layers * per_layer:
        missing = [] if extra else _first_missing(group.members, layers, experts, split)
        short = layers * per_layer - len(group.members)
        what = f"{len(extra)} beyond the config, first" if extra else f"{short} missing, first"
        raise _refuse(
            "mapping.per_layer.incomplete",
            f"{name}: its per-layer keys do not tile {layers} layers"
            + (f" x {experts} experts" if experts is not None else "")
            + f" ({what} {(extra or missing)[0]} as (layer, expert, half))",
            tensor=name,
            missing=[list(k) for k in missing[:20]],
            unexpected=[list(k) for k in extra[:20]],
        )
    member = math.prod(first.shape) * DTYPE_SIZES[first.dtype]
    inner = (2 * first.shape[0], *first.shape[1:]) if split and first.shape else first.shape
    per = member * (2 if split else 1)
    placements = []
    for (i, e, h), t in group.members.items():
        at = (i * (experts or 1) + (e or 0)) * per + (member if h == "v" else 0)
        placements += [dataclasses.replace(p, dst_offset=p.dst_offset + at) for p in t.placements]
    lead = (layers, experts) if experts is not None else (layers,)
    return OutputTensor(name=name, dtype=first.dtype, shape=(*lead, *inner), placements=merge_placements(placements))


def _declared(key: tuple[int, int | None, str | None], layers: int, experts: int | None, split: bool) -> bool:
    """Whether ``key`` (layer, expert, half) is a member the config declares."""
    i, e, h = key
    in_experts = e is None if experts is None else e is not None and 0 <= e < experts
    return 0 <= i < layers and in_experts and (h in _HALVES if split else h is None)


def _first_missing(
    members: Mapping[tuple[int, int | None, str | None], Any], layers: int, experts: int | None, split: bool
) -> list[tuple[int, int | None, str | None]]:
    """The first declared members absent from ``members`` (all of them declared), in row-major order:
    among the first ``len(members) + 20`` declared keys, so never more than that is listed."""
    keys = (  # a generator: itertools.product would first make a tuple of range(layers)
        (i, e, h)
        for i in range(layers)
        for e in (range(experts) if experts is not None else (None,))
        for h in (_HALVES if split else (None,))
    )
    return [k for k in itertools.islice(keys, len(members) + 20) if k not in members][:20]


def stack_per_layer(tensors: Sequence[OutputTensor], d: Declared) -> tuple[list[OutputTensor], dict[str, list[str]]]:
    """``tensors`` with every family of per-layer keys replaced by its stacked view, and
    stacked name -> the per-layer keys it gathers (for the report)."""
    groups: dict[str, _Group] = {}
    out: list[OutputTensor] = []
    for t in tensors:
        parsed = _parse(t.name)
        if parsed is None:
            out.append(t)
            continue
        name, layer, expert, half = parsed
        group = groups.setdefault(name, _Group(experts=expert is not None))
        if group.experts != (expert is not None):
            raise _refuse(
                "mapping.per_layer.mixed", f"{name}: per-expert and per-layer keys of the same tensor", tensor=name
            )
        twin = group.members.setdefault((layer, expert, half), t)
        if twin is not t:  # decoder.layers.1. and decoder.layers.01.: two keys for one member, never one dropped
            both = sorted((twin.name, t.name))
            raise _refuse(
                "mapping.source.ambiguous", f"{both[0]} and {both[1]} are the same member of {name}", tensors=both
            )
    stacked = {t.name for t in out}
    both = sorted(stacked & set(groups))
    if both:
        raise _refuse("mapping.source.ambiguous", f"{both[0]} is saved both stacked and per layer", tensors=both[:20])
    gathered: Mapping[str, list[str]] = {n: sorted(t.name for t in g.members.values()) for n, g in groups.items()}
    out += [_stack(n, g, d) for n, g in sorted(groups.items())]
    return out, dict(gathered)
