"""Megatron's common state, read statically: where it lives, and the ``args`` a Megatron-LM save puts in it.

Two layouts, by megatron-core release [R04, R05]:

* up to 0.16.x, ``dist_checkpointing.save`` writes the common (non-sharded) state dict with
  ``torch.save`` to ``common.pt`` beside ``metadata.json``;
* from 0.19 there is no ``common.pt``: ``save`` wraps the common state dict in a ``ShardedObject``
  (key ``common_state``, global shape ``(1,)``, offset ``(0,)``, replica id the rank;
  megatron/core/dist_checkpointing/serialization.py at tag core_v0.19.0, lines 439-445), which the
  torch_dist strategy writes once (main replica only) as the BYTE_IO item ``common_state/shard_0_1``
  of rank 0's ``.distcp`` file: the bytes of ``torch.save([state])`` (strategies/torch.py lines
  316-320, ``_mcore_to_torch_sharded_object``: a one-item list, which ``load_common_state_dict``
  unwraps with ``loaded[0]``, serialization.py lines 227-237).

Megatron-LM's ``generate_state_dict`` (megatron/training/checkpointing.py) puts ``args`` there: the
``argparse.Namespace`` of its arguments, holding enums (``AttnBackend``, ``ModelType``,
``signal.Signals``...) and torch dtypes (the ``megatron_common`` allowlist).  The static reader
gives a symbolic value; this module turns it into JSON without constructing anything: a
Namespace becomes its dict, an enum ``{"module", "qualname", "value"}``, a dtype its dotted name.
A value that is none of these (a tensor, say) is kept as ``{"not_data": <what>}``: reported,
never interpreted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ckptgate.inspect.allowlist import DTYPE_ITEMSIZE, MEGATRON_ARGS_CLASSES
from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.pickle import Call, Global, SDict, SList, key_text

__all__ = ["COMMON_FILE", "COMMON_ITEM", "CommonState", "read_common_state"]

COMMON_FILE = "common.pt"
COMMON_ITEM = "common_state/shard_0_1"
_NAMESPACE = "argparse.Namespace"
_ENUMS = MEGATRON_ARGS_CLASSES - {_NAMESPACE}
_DTYPES = frozenset(f"torch.{d}" for d in DTYPE_ITEMSIZE)
_DEPTH = 8  # args values are flat: a list of enums at most


@dataclass(frozen=True, slots=True, kw_only=True)
class CommonState:
    """What the common state holds, as JSON: its top-level keys and, when present, ``args``."""

    source: str  # "common.pt" or the BYTE_IO item's key
    path: str
    keys: tuple[str, ...]
    args: dict[str, Any] | None  # every argument as JSON; None when the save holds no args
    scalars: dict[str, Any] = field(default_factory=dict)  # checkpoint_version, iteration

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "path": self.path,
            "keys": list(self.keys),
            "args": self.args,
            **self.scalars,
        }


class _Unreadable(Exception):
    pass


def _json(v: Any, depth: int = 0) -> Any:
    """A statically read argument value as JSON, or :class:`_Unreadable`."""
    if depth > _DEPTH:
        raise _Unreadable("nested too deep")
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, int):
        if v.bit_length() > 63:
            raise _Unreadable("an integer beyond 64 bits")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _Unreadable("a non-finite float")
        return v
    if isinstance(v, tuple | SList):
        return [_json(x, depth + 1) for x in (v.items if isinstance(v, SList) else v)]
    if isinstance(v, SDict):
        return {key_text(k): _json(x, depth + 1) for k, x in v.items}
    if isinstance(v, Global) and v.dotted in _DTYPES:
        return v.dotted
    if (
        isinstance(v, Call)
        and isinstance(v.func, Global)
        and v.func.dotted in _ENUMS
        and v.opcode == "REDUCE"
        and isinstance(v.args, tuple)
        and len(v.args) == 1
        and (v.args[0] is None or isinstance(v.args[0], bool | int | float | str))
        and v.kwargs is None
        and v.state is None
        and v.dict_items is None
        and v.list_items is None
    ):
        return {"module": v.func.module, "qualname": v.func.name, "value": v.args[0]}
    raise _Unreadable(type(v).__name__)


def _namespace(v: Any) -> dict[str, Any] | None:
    """The attribute dict of a statically read ``argparse.Namespace`` (NEWOBJ of the class with
    no arguments, then BUILD of its ``__dict__``), or ``None`` for any other shape."""
    if not (
        isinstance(v, Call)
        and isinstance(v.func, Global)
        and v.func.dotted == _NAMESPACE
        and v.opcode in ("NEWOBJ", "REDUCE")
        and v.args == ()
        and v.kwargs is None
        and isinstance(v.state, SDict)
        and v.dict_items is None
        and v.list_items is None
        and all(isinstance(k, str) for k, _ in v.state.items)
    ):
        return None
    return dict(v.state.items)


def read_common_state(value: Any, *, source: str, path: str) -> tuple[CommonState | None, list[Finding]]:
    """The common state of a statically read ``common.pt`` root (``source`` = :data:`COMMON_FILE`)
    or BYTE_IO item (a one-item list), with findings for a shape no Megatron release writes."""
    if source == COMMON_ITEM:
        if not (isinstance(value, SList) and len(value.items) == 1):
            return None, [
                error(
                    "megatron.common_unreadable",
                    path,
                    f"the BYTE_IO item {COMMON_ITEM} is not the one-item list megatron-core writes",
                    item=COMMON_ITEM,
                )
            ]
        value = value.items[0]
    if not isinstance(value, SDict) or not all(isinstance(k, str) for k, _ in value.items):
        return None, [
            error("megatron.common_unreadable", path, f"the common state ({source}) is not a dict with string keys")
        ]
    top = dict(value.items)
    keys = tuple(sorted(top))
    scalars = {
        k: top[k]
        for k in ("checkpoint_version", "iteration")
        if k in top and isinstance(top[k], int | float) and not isinstance(top[k], bool)
    }
    if "args" not in top:
        return CommonState(source=source, path=path, keys=keys, args=None, scalars=scalars), []
    ns = _namespace(top["args"])
    if ns is None:
        return None, [
            error(
                "megatron.args_unreadable",
                path,
                f"'args' in the common state ({source}) is not an argparse.Namespace read as data",
            )
        ]
    args: dict[str, Any] = {}
    for name in sorted(ns):
        try:
            args[name] = _json(ns[name])
        except _Unreadable as e:
            args[name] = {"not_data": str(e)}
    return CommonState(source=source, path=path, keys=keys, args=args, scalars=scalars), []
