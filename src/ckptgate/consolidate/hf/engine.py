"""The one engine: family rules -> windows over the planner's placements, and a source ledger.

Each rule of the table names a Megatron tensor (global coordinates, as the DCP chunks place it;
a stacked ``decoder.layers.*`` tensor has a leading layer axis) and splits the rows of each
layer into parts, ``repeat`` times over (``linear_qkv``: per query group, heads/groups Q heads,
then one K and one V, each ``head_dim`` rows; a gated ``linear_fc1``: ``[gate; up]``).  Each part
of each repetition is a *window*: a contiguous byte range of the global tensor, whose placements
are :func:`~ckptgate.consolidate.adapters._common.slice_placements` of the tensor's own (strided
TP chunks stay strided).  An HF tensor is its windows, in order.  Nothing is read here: the plan
is byte ranges, and the writer streams them (memory bounded by its chunks, never a whole tensor).

The ledger records, for every byte range of every source tensor, which window consumed it or
which declared drop (vocabulary padding) it is; every model tensor must be tiled exactly once,
and every non-tensor item must be a declared drop (an empty ``_extra_state``).  The output must be
exactly the names and shapes the table expects from the config (:func:`expected_parameters`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckptgate.consolidate.adapters._common import slice_placements
from ckptgate.consolidate.hf.stacking import stack_per_layer
from ckptgate.consolidate.hf.table import Declared, MappingRefused, Rule, shared
from ckptgate.consolidate.plan import DTYPE_SIZES, OutputTensor, Placement, merge_placements

__all__ = ["EXCLUDED", "expected_parameters", "map_tensors"]

#: Keys that are training state, never the model: excluded and listed in the report.  The common
#: state (megatron-core 0.19's BYTE_IO item; inspection reads it, and the args in it) is not the model.
EXCLUDED = re.compile(r"^(optimizer\.|optimizer$|rng_state|rerun_state_machine|common_state/shard_0_1$)")
_EXTRA_STATE = re.compile(r"\._extra_state(/shard_[0-9._]+)?$")  # shard_L_N, or shard_L.E_N.M (experts)


def _refuse(code: str, message: str, **evidence: Any) -> MappingRefused:
    return MappingRefused(code, message, evidence=evidence)


def _active(rule: Rule, facts: Mapping[str, Any]) -> bool:
    return all(facts.get(k) == v for k, v in rule.when.items())


def _prod(names: Sequence[str], symbols: Mapping[str, int]) -> int:
    return math.prod(symbols[n] for n in names)


def _lead(rule: Rule, d: Declared) -> tuple[int, ...]:
    """The leading axes of the rule's source tensor: layers, then experts (global offsets)."""
    s = d.symbols
    return (*((s["num_hidden_layers"],) if rule.layers else ()), *((s["num_experts"],) if rule.experts else ()))


def _layers(rule: Rule, d: Declared) -> list[dict[str, int]]:
    """Every index of the leading axes, in the source's row-major order, as format fields."""
    lead = _lead(rule, d)
    names = [n for n, on in (("layer", rule.layers), ("expert", rule.experts)) if on]
    return [dict(zip(names, idx, strict=True)) for idx in itertools.product(*(range(n) for n in lead))]


def _dst(part_dst: str, index: Mapping[str, int]) -> str:
    return part_dst.format(**index) if index else part_dst


def _shape(rows: int, cols: int | None) -> tuple[int, ...]:
    return (rows,) if cols is None else (rows, cols)


def expected_parameters(d: Declared) -> dict[str, tuple[int, ...]]:
    """HF name -> shape that the table expects for ``d``, from the config alone (no checkpoint,
    no torch): what the pinned transformers' ``save_pretrained`` writes for a model of this config
    (checked against it in the tests)."""
    out: dict[str, tuple[int, ...]] = {}
    s = d.symbols
    for rule in shared().rules:
        if not _active(rule, d.facts):
            continue
        reps = s[rule.repeat] if rule.repeat else 1
        cols = _prod(rule.cols, s) if rule.cols else None
        for layer in _layers(rule, d):
            for p in rule.parts:
                out[_dst(p.dst, layer)] = _shape(reps * _prod(p.rows, s), cols)
    return out


class _Ledger:
    """Byte ranges of each source tensor: consumed by a window, or a declared drop."""

    def __init__(self) -> None:
        self.ranges: dict[str, list[tuple[int, int, str]]] = {}

    def add(self, name: str, start: int, end: int, what: str) -> None:
        if end > start:
            self.ranges.setdefault(name, []).append((start, end, what))

    def prove(self, t: OutputTensor) -> None:
        size = DTYPE_SIZES[t.dtype]
        row = math.prod(t.shape[1:]) * size if t.shape else size
        covered = 0
        for start, end, what in sorted(self.ranges.get(t.name, [])):
            if start < covered:
                raise _refuse(
                    "mapping.source.overlap",
                    f"{t.name}: elements from {start // size} are consumed twice (by {what})",
                    tensor=t.name,
                    element=start // size,
                )
            if start > covered:
                break
            covered = end
        if covered != t.nbytes:
            raise _refuse(
                "mapping.source.unmapped",
                f"{t.name} (shape {list(t.shape)}): elements from {covered // size} (row {covered // row} of dim 0) "
                "are not mapped by the family table and are not a declared drop",
                tensor=t.name,
                shape=list(t.shape),
                first_unmapped_element=covered // size,
            )

    def drops(self, drop: str) -> int:
        return sum(e - s for rs in self.ranges.values() for s, e, w in rs if w == drop)


def _source(rule: Rule, by_name: Mapping[str, OutputTensor], d: Declared) -> OutputTensor | None:
    present = [n for n in rule.src if n in by_name]
    if len(present) > 1:
        raise _refuse(
            "mapping.source.ambiguous",
            f"both {present[0]} and {present[1]} are present; the table maps one of them",
            tensors=present,
        )
    active = _active(rule, d.facts)
    if not active:
        if present and rule.present_code:
            raise _refuse(
                rule.present_code,
                f"{present[0]} is present, but the config says {dict(rule.when)} does not hold "
                f"({', '.join(f'{k}={d.facts.get(k)!r}' for k in rule.when)})",
                tensor=present[0],
                config={k: d.facts.get(k) for k in rule.when},
            )
        return None
    if not present:
        expected = [p.dst for p in rule.parts]
        raise _refuse(
            rule.missing_code or "mapping.source.missing",
            f"no {' or '.join(rule.src)} in the checkpoint: the HF parameters {', '.join(expected)} "
            "the config declares have no source",
            tensors=list(rule.src),
            hf_parameters=expected,
        )
    return by_name[present[0]]


def _check_shape(rule: Rule, t: OutputTensor, d: Declared) -> tuple[int, int]:
    """(rows per layer in the source, bytes per row); a shape the config does not declare is refused."""
    s = d.symbols
    reps = s[rule.repeat] if rule.repeat else 1
    need = reps * sum(_prod(p.rows, s) for p in rule.parts)
    cols = _prod(rule.cols, s) if rule.cols else None
    lead = _lead(rule, d)
    expected = (*lead, need, *(() if cols is None else (cols,)))
    found = t.shape
    ok = (
        len(found) == len(expected)
        and found[: len(lead)] == lead
        and found[len(lead) + 1 :] == expected[len(lead) + 1 :]
    )
    rows = found[len(lead)] if len(found) == len(expected) else -1
    if ok and rule.drop_tail is not None and rows < need:
        raise _refuse(
            rule.short_code or "mapping.shape.rows_short",
            f"{t.name}: {rows} rows, fewer than the {need} the config declares (expected at least {list(expected)}, "
            f"found {list(found)})",
            tensor=t.name,
            expected=list(expected),
            found=list(found),
        )
    if not ok or (rule.drop_tail is None and rows != need):
        raise _refuse(
            "mapping.shape.mismatch",
            f"{t.name}: expected shape {list(expected)} from the config ({_explain(rule, d)}), found {list(found)}",
            tensor=t.name,
            expected=list(expected),
            found=list(found),
            config={k: s[k] for k in sorted(_symbols(rule))},
        )
    return rows, (cols or 1) * DTYPE_SIZES[t.dtype]


def _symbols(rule: Rule) -> set[str]:
    names = set(rule.cols) | {n for p in rule.parts for n in p.rows}
    if rule.layers:
        names.add("num_hidden_layers")
    if rule.experts:
        names.add("num_experts")
    if rule.repeat:
        names.add(rule.repeat)
    return names


def _explain(rule: Rule, d: Declared) -> str:
    return ", ".join(f"{k}={d.symbols[k]}" for k in sorted(_symbols(rule)))


def _shifted(placements: Iterable[Placement], by: int) -> list[Placement]:
    return [dataclasses.replace(p, dst_offset=p.dst_offset + by) for p in placements]


def map_tensors(
    tensors: Sequence[OutputTensor], bytes_items: Sequence[Mapping[str, Any]], d: Declared
) -> tuple[list[OutputTensor], dict[str, Any]]:
    """The HF tensors of a Megatron checkpoint's global tensors, and the report of the ledger.

    :param tensors: the global tensors, with their placements (the DCP adapter's).
    :param bytes_items: the checkpoint's non-tensor items (``fqn``, ``empty``).

    Per-layer and per-expert keys (``singleton_local_shards``) are read through their stacked
    view (:func:`~ckptgate.consolidate.hf.stacking.stack_per_layer`).
    """
    tensors, gathered = stack_per_layer(tensors, d)
    excluded = sorted(t.name for t in tensors if EXCLUDED.match(t.name))
    by_name = {t.name: t for t in tensors if not EXCLUDED.match(t.name)}
    ledger = _Ledger()
    out: list[OutputTensor] = []
    for rule in shared().rules:
        t = _source(rule, by_name, d)
        if t is None:
            continue
        rows, row_bytes = _check_shape(rule, t, d)
        reps = d.symbols[rule.repeat] if rule.repeat else 1
        sizes = [_prod(p.rows, d.symbols) * row_bytes for p in rule.parts]
        layer_bytes = rows * row_bytes
        for i, layer in enumerate(_layers(rule, d)):
            base = i * layer_bytes
            placed: list[list[Placement]] = [[] for _ in rule.parts]
            off = base
            for g in range(reps):
                for k, n in enumerate(sizes):
                    placed[k] += _shifted(slice_placements(t.placements, off, n), g * n)
                    ledger.add(t.name, off, off + n, f"{rule.parts[k].dst} (repetition {g})")
                    off += n
            if rule.drop_tail is not None:
                ledger.add(t.name, off, base + layer_bytes, rule.drop_tail)
            cols = _prod(rule.cols, d.symbols) if rule.cols else None
            for k, p in enumerate(rule.parts):
                out.append(
                    OutputTensor(
                        name=_dst(p.dst, layer),
                        dtype=t.dtype,
                        shape=_shape(reps * _prod(p.rows, d.symbols), cols),
                        placements=merge_placements(placed[k]),
                    )
                )
    for t in by_name.values():
        ledger.prove(t)
    dropped_state, refused = [], []
    for item in bytes_items:
        name = str(item.get("fqn"))
        if EXCLUDED.match(name):
            excluded.append(name)
        elif _EXTRA_STATE.search(name) and item.get("empty") is True:
            dropped_state.append(name)
        else:
            refused.append(name)
    if refused:
        code = "mapping.extra_state.not_empty" if _EXTRA_STATE.search(refused[0]) else "mapping.source.unmapped"
        raise _refuse(
            code,
            f"{refused[0]}: a non-tensor item that is not a declared drop (an _extra_state must be empty: FP8 or "
            "other extra state is not mapped)",
            items=sorted(refused)[:20],
        )
    _check_outputs(out, d)
    report = {
        "family": d.family,
        "declared": d.to_json(),
        "ledger": {
            "tensors": sorted(by_name),
            "drops": {
                "vocab_padding": {"bytes": ledger.drops("vocab_padding"), "why": shared().drops["vocab_padding"]},
                "empty_extra_state": {"items": sorted(dropped_state), "why": shared().drops["empty_extra_state"]},
            },
            "excluded": sorted(excluded),
            "per_layer_keys": {name: len(keys) for name, keys in sorted(gathered.items())},
        },
    }
    return out, report


def _check_outputs(out: Sequence[OutputTensor], d: Declared) -> None:
    got = {t.name: t.shape for t in out}
    want = expected_parameters(d)
    if got != want:
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        bad = sorted(n for n in set(got) & set(want) if got[n] != want[n])
        raise _refuse(
            "mapping.output.mismatch",
            "the mapped tensors are not the HF parameters the config declares",
            missing=missing[:20],
            unexpected=extra[:20],
            shape_mismatch=bad[:20],
        )
