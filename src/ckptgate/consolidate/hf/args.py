"""Megatron-LM's ``args`` against the declared config, through a declared table (``args.json``).

A Megatron-LM save records its training arguments in the common state (read statically by
:mod:`ckptgate.inspect.megatron_common`).  Every argument with a config counterpart must agree
with the ``--hf-config`` it is mapped by: a contradiction is refused with the argument, the
config key and both values (``mapping.args.contradicts_config``, exit 4), before anything is
planned or published.  Arguments the families fix (``normalization`` RMSNorm, no linear bias...)
must have that value (``mapping.args.outside_table``).

What the tensors cannot show (``rms_norm_eps``, ``rope_theta``, how heads split ``kv_channels``
when ``head_dim`` is implicit) is then recorded by the producer's own arguments and agreed; a
save without ``args`` (a bare megatron-core save) leaves it "declared, not measured", and the
decision and the receipt say so in those words.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ckptgate.consolidate.hf.table import Declared, MappingRefused

__all__ = ["DECLARED_NOT_MEASURED", "ArgsAgreement", "agree", "common_args", "rows"]

DECLARED_NOT_MEASURED = "declared, not measured"
_MISSING = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    arg: str
    config: str | None = None
    layout: str | None = None
    compare: str = "equal"
    default: Any = None
    expect: Any = _MISSING
    when: Mapping[str, Any] | None = None
    resolves: str | None = None
    null_is_value: bool = False


@cache
def rows() -> tuple[Row, ...]:
    doc = json.loads(resources.files(__package__).joinpath("args.json").read_text("utf-8"))
    return tuple(Row(**r) for r in doc["rows"])


@dataclass(frozen=True, slots=True, kw_only=True)
class ArgsAgreement:
    """What the arguments settled: the rows compared, those the save could not answer, and what
    stays declared, not measured."""

    present: bool
    agreed: tuple[dict[str, Any], ...]
    not_compared: tuple[str, ...]
    not_measured: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "args": "present: compared with the config" if self.present else f"absent: {DECLARED_NOT_MEASURED}",
            "agreed": list(self.agreed),
            "not_compared": list(self.not_compared),
            "declared_not_measured": list(self.not_measured),
        }


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps booleans and numbers apart (``True`` is not ``1``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


def _config_value(row: Row, d: Declared, config: Mapping[str, Any]) -> tuple[str, Any]:
    assert row.config is not None
    kind, _, name = row.config.partition(":")
    if kind == "symbol":
        return name, d.symbols[name]
    if kind == "fact":
        return name, d.facts.get(name, False)
    if kind == "declared":
        return name, getattr(d, name)
    keys = name.split("|")
    for k in keys:
        if k in config:
            return k, config[k]
    return keys[0], row.default


def _holds(row: Row, args: Mapping[str, Any]) -> bool:
    for k, want in (row.when or {}).items():
        v = args.get(k)
        if want == "not_null":
            if v is None:
                return False
        elif not _same(v, want):
            return False
    return True


def _agrees(compare: str, arg: Any, cfg: Any) -> bool:
    if compare == "equal":
        return _same(arg, cfg)
    if compare == "negated":
        return isinstance(arg, bool) and isinstance(cfg, bool) and arg is not cfg
    if compare == "at_least":
        return isinstance(arg, int) and isinstance(cfg, int) and not isinstance(arg, bool) and arg >= cfg
    if compare == "swiglu_is_silu":  # a gated SiLU MLP (SwiGLU) is hidden_act silu in every family
        return isinstance(arg, bool) and arg == (cfg == "silu")
    raise ValueError(f"unknown comparison {compare!r} in args.json")


def _contradiction(row: Row, key: str, arg: Any, cfg: Any, where: str) -> MappingRefused:
    return MappingRefused(
        "mapping.args.contradicts_config",
        f"Megatron-LM argument {row.arg} = {arg!r} contradicts {where} {key} = {cfg!r} ({row.compare})",
        evidence={"arg": row.arg, "arg_value": arg, "config_key": key, "config_value": cfg, "compare": row.compare},
        advice=f"Give --hf-config the config of the model this checkpoint was trained as (its args say {row.arg} = "
        f"{arg!r}), or fix {key} in it; ckptgate does not choose between them.",
    )


def agree(
    args: Mapping[str, Any] | None, d: Declared, config: Mapping[str, Any], *, layout_tp: int | None
) -> ArgsAgreement:
    """Compare ``args`` (the common state's, as JSON; ``None`` when the save holds none) with the
    declared config ``d`` (parsed ``config``) row by row; refuse the first contradiction."""
    if args is None:
        return ArgsAgreement(
            present=False,
            agreed=(),
            not_compared=(),
            not_measured=tuple(f"{n}: {DECLARED_NOT_MEASURED}" for n in d.not_measured),
        )
    agreed: list[dict[str, Any]] = []
    skipped: list[str] = []
    resolved: set[str] = set()
    for row in rows():
        if row.arg not in args or (args[row.arg] is None and row.expect is _MISSING and not row.null_is_value):
            skipped.append(row.arg)
            continue
        if not _holds(row, args):
            continue
        value = args[row.arg]
        if isinstance(value, Mapping):  # an enum or a value the static reader kept as not data
            raise MappingRefused(
                "mapping.args.unreadable",
                f"Megatron-LM argument {row.arg} is not plain data in the common state ({value!r:.120})",
                evidence={"arg": row.arg},
            )
        if row.expect is not _MISSING:
            if not _same(value, row.expect):
                raise MappingRefused(
                    "mapping.args.outside_table",
                    f"Megatron-LM argument {row.arg} = {value!r}; every family of the mapping table has {row.expect!r}",
                    evidence={"arg": row.arg, "arg_value": value, "expected": row.expect},
                )
            agreed.append({"arg": row.arg, "value": value, "expected": row.expect})
            continue
        if row.layout is not None:
            if layout_tp is None:
                skipped.append(row.arg)
                continue
            if not _same(value, layout_tp):
                raise _contradiction(row, f"layout.{row.layout}", value, layout_tp, "what the layout shows,")
            agreed.append({"arg": row.arg, "value": value, "layout": row.layout})
            continue
        key, cfg = _config_value(row, d, config)
        if not _agrees(row.compare, value, cfg):
            raise _contradiction(row, key, value, cfg, "the config's")
        agreed.append({"arg": row.arg, "value": value, "config_key": key, "config_value": cfg})
        if row.resolves:
            resolved.add(row.resolves)
    not_measured = tuple(
        f"{n}: {DECLARED_NOT_MEASURED}" for n in d.not_measured if not any(n.startswith(r) for r in resolved)
    )
    return ArgsAgreement(present=True, agreed=tuple(agreed), not_compared=tuple(skipped), not_measured=not_measured)


def common_args(layout: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``args`` that inspection read from a Megatron layout's common state, or ``None``."""
    common = layout.get("common")
    state = common.get("state") if isinstance(common, Mapping) else None
    args = state.get("args") if isinstance(state, Mapping) else None
    return args if isinstance(args, Mapping) else None
