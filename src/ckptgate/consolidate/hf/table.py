"""The family table and the declared config: what a ``config.json`` may say, and what it implies.

The table is data (``families.json``); this module reads it and checks a config against it.  A
config is accepted only when its architecture is a family of the table, every key is one the
table knows (a key that affects the forward pass with an allowed value, or one declared not to),
its rope type is allowed, and its shapes are consistent.  Anything else is refused with a typed
reason (``mapping.config.*``), never guessed.  Both spellings of the rope base are accepted: the
pinned transformers' ``rope_parameters`` and the hub's top-level ``rope_theta``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from ckptgate.errors import InputRejected

__all__ = ["Declared", "Family", "MappingRefused", "Rule", "declare", "families", "shared"]


class MappingRefused(InputRejected):
    """The checkpoint or the declared config lies outside the family table, or they disagree:
    nothing is mapped by guess (exit 4)."""

    default_advice = (
        "ckptgate maps Megatron checkpoints only through its declared family table "
        "(docs/consolidation.md, 'Megatron to Hugging Face'); fix the config or the checkpoint, "
        "or take it in without --hf-config to keep Megatron's names."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    dst: str
    rows: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One source tensor (of alternative names) and how its rows split into HF tensors."""

    src: tuple[str, ...]
    parts: tuple[Part, ...]
    cols: tuple[str, ...] = ()
    layers: bool = False
    experts: bool = False
    repeat: str | None = None
    when: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    drop_tail: str | None = None
    short_code: str | None = None
    missing_code: str | None = None
    present_code: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    model_type: str
    features: Mapping[str, Any]
    head_dim_default: int | str
    config: Mapping[str, Mapping[str, Any]]
    symbols: Mapping[str, tuple[str, ...]]
    """Family symbols -> the config keys each is read from (alternative spellings)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Shared:
    config_ignored: frozenset[str]
    config_shape: frozenset[str]
    rope_types: tuple[str, ...]
    rules: tuple[Rule, ...]
    drops: Mapping[str, str]


def _rule(d: Mapping[str, Any]) -> Rule:
    return Rule(
        src=tuple(d["src"]),
        parts=tuple(Part(dst=p["dst"], rows=tuple(p["rows"])) for p in d["parts"]),
        cols=tuple(d.get("cols", ())),
        layers=bool(d.get("layers", False)),
        experts=bool(d.get("experts", False)),
        repeat=d.get("repeat"),
        when=MappingProxyType(dict(d.get("when", {}))),
        drop_tail=d.get("drop_tail"),
        short_code=d.get("short_code"),
        missing_code=d.get("missing_code"),
        present_code=d.get("present_code"),
    )


@cache
def _table() -> Mapping[str, Any]:
    doc: Mapping[str, Any] = json.loads(resources.files(__package__).joinpath("families.json").read_text("utf-8"))
    return doc


@cache
def shared() -> Shared:
    s = _table()["shared"]
    return Shared(
        config_ignored=frozenset(s["config_ignored"]),
        config_shape=frozenset(s["config_shape"]),
        rope_types=tuple(s["rope_types"]),
        rules=tuple(_rule(r) for r in s["rules"]),
        drops=MappingProxyType(dict(s["drops"])),
    )


@cache
def families() -> Mapping[str, Family]:
    return MappingProxyType(
        {
            name: Family(
                name=name,
                architectures=tuple(f["architectures"]),
                model_type=f["model_type"],
                features=MappingProxyType(dict(f["features"])),
                head_dim_default=f["head_dim_default"],
                config=MappingProxyType({k: MappingProxyType(dict(v)) for k, v in f["config"].items()}),
                symbols=MappingProxyType({k: tuple(v["keys"]) for k, v in f.get("symbols", {}).items()}),
            )
            for name, f in _table()["families"].items()
        }
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Declared:
    """A config the table accepts: its family, the symbols the rules use, and the facts that come
    from the config alone ("declared, not measured")."""

    family: str
    symbols: Mapping[str, int]
    facts: Mapping[str, Any]  # features and the config values rules may test (tie_word_embeddings...)
    dtype: str | None
    rope_theta: float
    not_measured: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "symbols": dict(self.symbols),
            "dtype": self.dtype,
            "rope_theta": self.rope_theta,
            "declared_not_measured": list(self.not_measured),
        }


def _refuse(code: str, message: str, **evidence: Any) -> MappingRefused:
    return MappingRefused(code, message, evidence=evidence)


def _family_of(config: Mapping[str, Any]) -> Family:
    archs = config.get("architectures")
    if not (isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str)):
        raise _refuse(
            "mapping.config.architecture",
            "the config must name exactly one architecture in 'architectures'",
            architectures=str(archs)[:200],
            known=sorted(a for f in families().values() for a in f.architectures),
        )
    for fam in families().values():
        if archs[0] in fam.architectures:
            if config.get("model_type", fam.model_type) != fam.model_type:
                raise _refuse(
                    "mapping.config.architecture",
                    f"architecture {archs[0]} with model_type {config.get('model_type')!r}",
                    architecture=archs[0],
                    model_type=str(config.get("model_type")),
                )
            return fam
    raise _refuse(
        "mapping.config.architecture",
        f"architecture {archs[0]!r} is not a family of the mapping table",
        architecture=archs[0],
        known=sorted(a for f in families().values() for a in f.architectures),
    )


def _int(config: Mapping[str, Any], key: str, default: Any = None) -> int:
    v = config.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise _refuse("mapping.config.value", f"{key} must be a positive integer, found {v!r}", key=key, found=v)
    return v


def _rope(config: Mapping[str, Any], allowed: tuple[str, ...]) -> float:
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    top = config.get("rope_theta")
    if params is not None and not isinstance(params, dict):
        raise _refuse("mapping.config.rope", "rope_parameters must be an object", found=str(params)[:200])
    if scaling is not None and not isinstance(scaling, dict):
        raise _refuse("mapping.config.rope", "rope_scaling must be an object or null", found=str(scaling)[:200])
    params = dict(params or {})
    for src in (scaling or {},):
        params.update(src)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in allowed or set(params) - {"rope_type", "type", "rope_theta"}:
        raise _refuse(
            "mapping.config.rope",
            f"rope type {rope_type!r} (parameters {sorted(params)}) is outside the table; allowed: {list(allowed)}",
            rope_type=str(rope_type),
            parameters=sorted(params),
            allowed=list(allowed),
        )
    theta = params.get("rope_theta", top)
    if "rope_theta" in params and top is not None and top != params["rope_theta"]:
        raise _refuse("mapping.config.rope", "rope_theta and rope_parameters.rope_theta disagree", found=[top, theta])
    if theta is None:
        theta = 10000.0  # every family's default in the pinned transformers
    value = _positive_finite(theta)
    if value is None:
        raise _refuse(
            "mapping.config.rope",
            f"rope_theta must be a positive finite number, found {_show(theta)}",
            found=_show(theta),
        )
    return value


def _show(v: Any) -> str:
    return repr(v)[:60]


def _positive_finite(v: Any) -> float | None:
    """``v`` as a float when it is a JSON number, positive and finite as a double, else ``None`` (an
    integer too large for a double is not a number the forward pass can use)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) and f > 0 else None


#: Config values that shape the forward pass but no tensor shows ("declared, not measured"), beside
#: rope_theta: each must be a positive finite number when present (the family's default otherwise).
_DECLARED_NUMBERS = ("rms_norm_eps",)


def _allowed(fam: Family, config: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, rule in fam.config.items():
        v = config.get(key, rule.get("default"))
        ok = True
        if "allowed" in rule and rule["allowed"] != "any":
            ok = any(v == a and type(v) is type(a) for a in rule["allowed"])
        if "allowed_each" in rule and v is not None:
            ok = isinstance(v, list) and all(x in rule["allowed_each"] for x in v)
        if not ok:
            raise _refuse(
                "mapping.config.value",
                f"{fam.name}: {key} = {v!r} is outside the table "
                f"(allowed: {rule.get('allowed', rule.get('allowed_each'))})",
                family=fam.name,
                key=key,
                found=v,
                allowed=rule.get("allowed", rule.get("allowed_each")),
            )
        values[key] = v
    return values


def _family_symbols(fam: Family, config: Mapping[str, Any]) -> dict[str, int]:
    """The family's own symbols (experts...), each from whichever of its spellings the config uses;
    two spellings that disagree, or none, are refused."""
    out: dict[str, int] = {}
    for symbol, keys in fam.symbols.items():
        found = {k: config[k] for k in keys if k in config}
        if len({json.dumps(v) for v in found.values()}) > 1:
            raise _refuse(
                "mapping.config.value",
                f"{fam.name}: {' and '.join(found)} disagree ({found})",
                family=fam.name,
                keys=sorted(found),
                found=list(found.values()),
            )
        if not found:
            raise _refuse(
                "mapping.config.value",
                f"{fam.name}: the config has none of {', '.join(keys)} (symbol {symbol})",
                family=fam.name,
                keys=list(keys),
            )
        out[symbol] = _int(config, next(iter(found)))
    return out


def declare(config: Mapping[str, Any]) -> Declared:
    """The declared model of ``config`` (a parsed ``config.json``), or a typed refusal."""
    fam = _family_of(config)
    sh = shared()
    known = sh.config_ignored | sh.config_shape | set(fam.config) | {k for ks in fam.symbols.values() for k in ks}
    unknown = sorted(set(config) - known)
    if unknown:
        raise _refuse(
            "mapping.config.unknown_key",
            f"{fam.name}: config keys outside the table: {', '.join(unknown[:10])} (they may change the forward "
            "pass; ckptgate does not guess)",
            family=fam.name,
            keys=unknown,
        )
    values = _allowed(fam, config)
    theta = _rope(config, sh.rope_types)
    for key in _DECLARED_NUMBERS:
        if key in config and _positive_finite(config[key]) is None:
            raise _refuse(
                "mapping.config.value",
                f"{key} must be a positive finite number, found {_show(config[key])}",
                key=key,
                found=_show(config[key]),
            )
    hidden = _int(config, "hidden_size")
    heads = _int(config, "num_attention_heads")
    groups = _int(config, "num_key_value_heads", heads)
    if heads % groups:
        raise _refuse(
            "mapping.config.value",
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}",
            heads=heads,
            groups=groups,
        )
    not_measured = ["rms_norm_eps", "rope_theta", "hidden_act"]
    vocab = _int(config, "vocab_size")
    # Megatron pads the vocabulary to a multiple its arguments set; without them the rows at or beyond
    # vocab_size are taken for padding on the config's word, so a smaller vocab_size drops trained rows
    not_measured.append(f"vocab_size ({vocab}): embedding and output rows at or beyond it are dropped as padding")
    if config.get("head_dim") is None:
        d = fam.head_dim_default
        if isinstance(d, int):
            head_dim = d
        elif hidden % heads:
            raise _refuse("mapping.config.value", f"hidden_size {hidden} is not a multiple of {heads} heads")
        else:
            head_dim = hidden // heads
        not_measured.append(f"head_dim (implicit: {head_dim}): how heads split kv_channels")
    else:
        head_dim = _int(config, "head_dim")
        if not fam.features.get("qk_norm"):
            # nothing of head_dim's size is saved without q/k norms: 2 heads of 8 in 1 group give the same
            # shapes as 4 heads of 4 in 2 groups, and a different split of the fused QKV rows
            not_measured.append(f"head_dim (explicit: {head_dim}): how heads split kv_channels")
    dtype = config.get("dtype", config.get("torch_dtype"))
    if "dtype" in config and "torch_dtype" in config and config["dtype"] != config["torch_dtype"]:
        raise _refuse(
            "mapping.config.dtype", "dtype and torch_dtype disagree", found=[config["dtype"], config["torch_dtype"]]
        )
    if dtype is not None and not isinstance(dtype, str):
        raise _refuse("mapping.config.dtype", f"dtype must be a string, found {dtype!r}", found=str(dtype))
    symbols = {
        "hidden_size": hidden,
        "intermediate_size": _int(config, "intermediate_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": groups,
        "heads_per_group": heads // groups,
        "head_dim": head_dim,
        "num_hidden_layers": _int(config, "num_hidden_layers"),
        "vocab_size": vocab,
    }
    symbols.update(_family_symbols(fam, config))
    if symbols.get("num_experts_per_tok", 0) > symbols.get("num_experts", 0):
        raise _refuse(
            "mapping.config.value",
            f"num_experts_per_tok {symbols['num_experts_per_tok']} exceeds the {symbols['num_experts']} experts",
            found=symbols["num_experts_per_tok"],
        )
    if "num_experts_per_tok" in symbols:
        not_measured.append("num_experts_per_tok (the router's top-k)")
    tie = values.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    if not isinstance(tie, bool):
        raise _refuse("mapping.config.value", f"tie_word_embeddings must be a boolean, found {tie!r}", found=tie)
    facts = {**fam.features, "tie_word_embeddings": tie}
    return Declared(
        family=fam.name,
        symbols=MappingProxyType(symbols),
        facts=MappingProxyType(facts),
        dtype=dtype,
        rope_theta=theta,
        not_measured=tuple(not_measured),
    )
